"""A long table's bars, every ticker at once, where ingest's cleaning would change nothing.

A daily feed is one file of every ticker's new bars (a ``Ticker`` column).  Ingest validates such a
file a ticker at a time (``bars/cleaning.py``: ~0.4 ms a ticker, 1.2 s for 3,000 tickers here), which
for the few bars of an append costs more than the features.  :func:`clean_long_table` reads the file
as ingest does (``bars/files.py``: the same columns, conversions and ticker names) and asks every
question of the cleaning rules of all its rows at once: an empty cell, a date twice or out of order
within a ticker, a price that is not finite and positive, a volume that is not finite and >= 0, a high
below the low, an open or close outside [low, high], two zero-volume days in a row, five flat bars at
one close.  Where every answer is "none", ingest would keep every row as it is, and the bars are the
converted columns themselves (scaled by Adj Close where the file has one, as ingest scales them), by
ticker then date.  Where any rule would drop a row, warn or fail, it returns None: the caller then
takes ingest's own path, which says what and why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from alchemetric_ray.bars.cleaning import OHLC_TOLERANCE, STALE_RUN, ZERO_VOLUME_RUN
from alchemetric_ray.bars.columns import _LongTable, _required_columns, _ticker_column
from alchemetric_ray.bars.files import DATA_SUFFIXES, _is_safe_ticker, _read_file
from alchemetric_ray.bars.report import IngestReport
from alchemetric_ray.errors import DataError

_NUMBERS = ("open", "high", "low", "close", "adj_close", "volume")
ColumnBars = tuple[list[str], np.ndarray, dict[str, np.ndarray]]  # tickers (sorted), their row counts, columns


def clean_long_table(path: Path, report: IngestReport) -> ColumnBars | None:
    """The bars of the long table ``path`` (every ticker, in one set of columns: date, open, high, low,
    close, volume, rows by ticker then date), where ingest would keep each row as it is; None otherwise
    (or where the file is not one long table).  ``report`` is filled in as ingest fills it."""
    if not path.is_file() or path.suffix.lower() not in DATA_SUFFIXES:
        return None
    try:
        raw = _read_file(path, long_table=True)
        frame, cols = _required_columns(raw, path.name)
    except DataError:  # ingest's own path says it, as it always did
        return None
    tcol = _ticker_column(raw)
    if tcol is None or frame is not raw:
        return None
    names = raw[tcol].astype("string").str.strip()
    if (names.isna() | (names == "")).any():
        return None
    codes, uniques = pd.factorize(names, sort=True)
    tickers = [str(u) for u in uniques]
    if not all(_is_safe_ticker(t) for t in tickers) or len({t.upper() for t in tickers}) < len(tickers):
        return None
    table = _LongTable(raw)
    order = np.argsort(codes, kind="stable")  # each ticker's rows in file order
    values: dict[str, np.ndarray] = {}
    for name in ("date", *(c for c in _NUMBERS if c in cols)):
        got = table.dates(cols[name]) if name == "date" else table.floats(cols[name])
        if got is None or got[1].any():  # a column ingest converts ticker by ticker, or an empty cell
            return None
        values[name] = got[0][order]
    if not _clean(values, codes[order]):
        return None
    bars = {"date": values["date"].astype("datetime64[ns]")}
    if "adj_close" in values:  # as ingest scales them (cleaning._Table.bars)
        factor = values["adj_close"] / values["close"]
        bars.update(open=values["open"] * factor, high=values["high"] * factor, low=values["low"] * factor,
                    close=values["adj_close"])
    else:
        bars.update({c: values[c] for c in ("open", "high", "low", "close")})
    bars["volume"] = values["volume"]
    n = len(order)
    report.files += 1
    report.rows_read += n
    report.rows_kept += n
    report.tickers += len(tickers)
    return tickers, np.bincount(codes, minlength=len(tickers)).astype(np.int64), bars


def _clean(v: dict[str, np.ndarray], code: np.ndarray) -> bool:
    """Whether no cleaning rule would drop a row of any ticker (rows by ticker, in file order)."""
    same = code[1:] == code[:-1]  # a row and the one before it belong to one ticker
    dates = v["date"].view(np.int64)
    if not (dates[1:][same] > dates[:-1][same]).all():  # a date twice, or not in date order
        return False
    prices = [v[c] for c in ("open", "high", "low", "close", "adj_close") if c in v]
    with np.errstate(invalid="ignore"):
        if not all(((p > 0) & (p < np.inf)).all() for p in prices):
            return False
        if not ((v["volume"] >= 0) & (v["volume"] < np.inf)).all():
            return False
    o, h, lo, c = v["open"], v["high"], v["low"], v["close"]
    top, bottom = h * (1 + OHLC_TOLERANCE), lo * (1 - OHLC_TOLERANCE)
    if (h < lo).any() or ((o > top) | (o < bottom) | (c > top) | (c < bottom)).any():
        return False
    zero = v["volume"] == 0
    if _longest_run(zero[1:] & zero[:-1] & same) >= ZERO_VOLUME_RUN - 1:
        return False
    flat = (o == h) & (h == lo) & (lo == c)
    return _longest_run(flat[1:] & flat[:-1] & (c[1:] == c[:-1]) & same) < STALE_RUN - 1


def _longest_run(mask: np.ndarray) -> int:
    """The longest run of consecutive Trues in ``mask``."""
    if not mask.any():
        return 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return int((edges[1::2] - edges[::2]).max())
