"""Market data in: validated daily bars from files, the packaged stocknet prices, the built-in sample
data or a seeded synthetic market.

The canonical *bars* frame, passed on one ticker at a time (so memory stays bounded): a pandas
DataFrame with columns ``date`` (datetime64[ns], midnight), ``open``, ``high``, ``low``, ``close``,
``volume`` (float64), sorted by date with unique dates, prices already adjusted (by Adj Close / Close
where the source had Adj Close).  Sources yield ``(ticker, bars)`` pairs: ``ingest.iter_bars``
(files), ``builtin.builtin_bars`` (the sample data installed with the package) and
``synthetic.synthetic_bars`` (a seeded market); ``sources.open_source`` picks one by the config.

Nothing in this package knows about features, models or devices.
"""
