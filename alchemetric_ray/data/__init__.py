"""Market data -> validated bars -> features and labels -> Parquet shards -> Ray Data loaders.

The canonical *bars* frame, passed between modules one ticker at a time (so memory stays
bounded): a pandas DataFrame with columns ``date`` (datetime64[ns], midnight), ``open``,
``high``, ``low``, ``close``, ``volume`` (float64), sorted by date with unique dates, prices
already adjusted (by Adj Close / Close where the source had Adj Close).  Sources yield
``(ticker, bars)`` pairs: ``ingest.iter_bars`` (files), ``builtin.builtin_bars`` (the sample
data installed with the package) and ``synthetic.synthetic_bars`` (a seeded market).

Nothing in this package knows about models or devices.
"""
