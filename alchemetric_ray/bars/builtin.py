"""Real daily bars that ship with the environment: four US large caps, 2000-2013.

The prices come from the ``bokeh-sampledata`` package (module ``bokeh_sampledata.stocks``),
which carries an archived copy of Quandl WIKI Prices, declared public domain by Quandl.  The
source's open/high/low/close are unadjusted, with a split- and dividend-adjusted close beside
them; :func:`builtin_bars` scales all four prices by ``adj_close / close`` so the output follows
the canonical bars contract (see :mod:`alchemetric_ray.data`).  FB is left out: it has only
196 days (2012-05-18 onwards), too short next to the others' 2000-2013 histories.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from alchemetric_ray.errors import UserError

BUILTIN_TICKERS: tuple[str, ...] = ("AAPL", "GOOG", "IBM", "MSFT")
BUILTIN_DESCRIPTION: str = (
    "Daily split/dividend-adjusted OHLCV bars of AAPL, GOOG, IBM and MSFT (2000-2013, GOOG from 2004) "
    "from Quandl WIKI Prices via the bokeh-sampledata package; public domain."
)

_PRICES = ("open", "high", "low", "close")
_COLUMNS = ("date", *_PRICES, "volume")


def _load_stocks_module():
    try:
        from bokeh_sampledata import stocks
    except ImportError as err:  # the package itself, or its data file, is missing
        raise UserError(
            f"built-in sample data needs the 'bokeh-sampledata' package: pip install bokeh-sampledata ({err})"
        ) from None
    return stocks


def _to_bars(raw: dict) -> pd.DataFrame:
    """One source dict (lists of date strings, prices, volumes, adj_close) -> canonical bars."""
    frame = pd.DataFrame(
        {
            "date": pd.to_datetime(pd.Series(raw["date"]), format="%Y-%m-%d").astype("datetime64[ns]"),
            **{col: np.asarray(raw[col], dtype=np.float64) for col in (*_PRICES, "volume", "adj_close")},
        }
    )
    frame["date"] = frame["date"].dt.normalize()
    prices = frame[list(_PRICES)].to_numpy()
    adj = frame["adj_close"].to_numpy()
    close = frame["close"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = adj / close
    good = (
        np.isfinite(prices).all(axis=1)
        & np.isfinite(factor)
        & (prices > 0).all(axis=1)
        & (factor > 0)
        & np.isfinite(frame["volume"].to_numpy())
        & (frame["volume"].to_numpy() > 0)
        & frame["date"].notna().to_numpy()
    )
    frame = frame.loc[good]
    factor = factor[good]
    # One factor per row scales all four prices: multiplying by the same positive number keeps
    # the row's ordering (rounding is monotone), so the inequalities are checked once, after.
    for col in _PRICES:
        frame[col] = frame[col].to_numpy() * factor
    o, h, lo, c = (frame[col].to_numpy() for col in _PRICES)
    consistent = (h >= lo) & (h >= np.maximum(o, c)) & (lo <= np.minimum(o, c))
    frame = frame.loc[consistent, list(_COLUMNS)]
    frame = frame.sort_values("date", kind="stable").drop_duplicates("date", keep="last")
    return frame.reset_index(drop=True)


def builtin_bars() -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield ``(ticker, bars)`` for :data:`BUILTIN_TICKERS`, in that order, as canonical bars.

    Raises :class:`~alchemetric_ray.errors.UserError` at the call (not at first iteration)
    when ``bokeh-sampledata`` is not installed.
    """
    stocks = _load_stocks_module()
    return ((ticker, _to_bars(getattr(stocks, ticker))) for ticker in BUILTIN_TICKERS)
