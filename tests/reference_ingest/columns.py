"""The columns of one raw table: which column means what, and its cells as numbers and dates.

Columns are matched ignoring case, spaces, underscores, hyphens and dots (``Adj Close``,
``adj_close`` and ``AdjClose`` are the same); extra columns are ignored.  A cell that is no number
(or no date) is a :class:`~alchemetric_ray.bars.messages.DataError` naming the file, the column and
the row; ``nan``/``inf`` written out are numbers, which the cleaning rules then judge.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd

from alchemetric_ray.errors import DataError
from reference_ingest.messages import _row_ref

# Non-finite numbers written out: values (the cleaning rules drop them), not text that is no number.
NONFINITE_TEXTS = frozenset({"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity",
                             "-infinity"})

# Canonical column -> normalized spellings accepted in a file.
COLUMN_ALIASES = {
    "date": ("date",),
    "open": ("open",),
    "high": ("high",),
    "low": ("low",),
    "close": ("close",),
    "adj_close": ("adjclose", "adjustedclose"),
    "volume": ("volume",),
}
REQUIRED = ("date", "open", "high", "low", "close", "volume")
DISPLAY = {"date": "Date", "open": "Open", "high": "High", "low": "Low", "close": "Close",
           "volume": "Volume", "adj_close": "Adj Close"}
TICKER_COLUMNS = ("ticker", "symbol")  # normalized; the first one present wins


def _norm(name) -> str:
    return re.sub(r"[\s_.\-]+", "", str(name).lstrip("\ufeff")).lower()


def _resolve_columns(raw: pd.DataFrame, source: str) -> dict[str, str]:
    lookup = {alias: canon for canon, aliases in COLUMN_ALIASES.items() for alias in aliases}
    cols: dict[str, str] = {}
    for col in raw.columns:
        canon = lookup.get(_norm(col))
        if canon is None:
            continue
        if canon in cols:
            raise DataError(f"{source}: columns '{cols[canon]}' and '{col}' both mean {DISPLAY[canon]!r}")
        cols[canon] = col
    return cols


def _ticker_column(raw: pd.DataFrame) -> str | None:
    keys = {_norm(c): c for c in reversed(list(raw.columns))}
    for key in TICKER_COLUMNS:
        if key in keys:
            return keys[key]
    return None


def _required_columns(raw: pd.DataFrame, source: str) -> tuple[pd.DataFrame, dict]:
    """The file's columns by canonical name (a date index becomes a column); a missing one is an error."""
    cols = _resolve_columns(raw, source)
    if "date" not in cols and _norm(raw.index.name or "") == "date":
        raw = raw.reset_index()
        cols = _resolve_columns(raw, source)
    missing = [DISPLAY[c] for c in REQUIRED if c not in cols]
    if missing:
        found = [str(c) for c in raw.columns]
        shown = ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")
        raise DataError(f"{source}: missing required column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(m) for m in missing)} (found: {shown or 'no columns'})")
    return raw, cols


def _to_float(s: pd.Series, source: str, col, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 and the mask of empty cells; text that is no number is an error."""
    if pd.api.types.is_bool_dtype(s) or not (pd.api.types.is_numeric_dtype(s) or _is_text(s)):
        raise DataError(f"{source}: column '{col}' holds {s.dtype} values, not numbers")
    if pd.api.types.is_numeric_dtype(s):
        values = s.to_numpy(dtype="float64", na_value=np.nan)
        return values, np.isnan(values)
    empty = s.isna().to_numpy()
    text = s.astype("string").str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    unparsed = np.isnan(values) & ~empty
    if unparsed.any():
        spelled = text[unparsed].str.lower().isin(NONFINITE_TEXTS).to_numpy()
        junk = np.flatnonzero(unparsed)[~spelled]
        if len(junk):
            i = junk[0]
            raise DataError(f"{source}: not a number in column '{col}' at {_row_ref(source, labels[i])}: "
                            f"{s.iloc[i]!r}")
    return values, empty


def _is_text(s: pd.Series) -> bool:
    return pd.api.types.is_object_dtype(s) or pd.api.types.is_string_dtype(s)


def _to_dates(s: pd.Series, source: str, col, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dates as datetime64[ns] at midnight (NaT where empty) and the mask of empty cells."""
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        s = s.dt.tz_localize(None)
    empty = s.isna().to_numpy()
    if pd.api.types.is_datetime64_dtype(s):
        parsed = s
    else:
        if pd.api.types.is_numeric_dtype(s):  # 20120904 -> YYYYMMDD
            try:
                text = s.astype("Int64").astype("string")
            except (TypeError, ValueError):  # fractional or non-finite numbers
                text = s.astype("string")
            fmt = "%Y%m%d"
        else:
            text, fmt = s.astype("string").str.strip(), "ISO8601"
        parsed = _parse_dates(text, fmt)
        bad = parsed.isna().to_numpy() & ~empty
        if bad.any() and fmt == "ISO8601":
            parsed = _parse_dates(text, None)
            bad = parsed.isna().to_numpy() & ~empty
        if bad.any():
            i = np.flatnonzero(bad)[0]
            raise DataError(f"{source}: unparseable date in column '{col}' at {_row_ref(source, labels[i])}: "
                            f"{s.iloc[i]!r}")
    parsed = parsed.dt.normalize()
    out = ((parsed < pd.Timestamp.min.ceil("D")) | (parsed > pd.Timestamp.max.floor("D"))).to_numpy()
    if out.any():  # beyond what datetime64[ns] holds (1677..2262): junk, not history
        i = np.flatnonzero(out)[0]
        raise DataError(f"{source}: date out of range in column '{col}' at {_row_ref(source, labels[i])}: "
                        f"{s.iloc[i]!r}")
    return parsed.astype("datetime64[ns]").to_numpy(), empty


def _parse_dates(text: pd.Series, fmt: str | None) -> pd.Series:
    try:
        with warnings.catch_warnings():  # "could not infer format": the caller reports failures
            warnings.simplefilter("ignore")
            parsed = pd.to_datetime(text, format=fmt, errors="coerce")
    except (ValueError, TypeError, OverflowError):
        return pd.Series(pd.NaT, index=text.index, dtype="datetime64[ns]")
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        parsed = parsed.dt.tz_localize(None)
    if not pd.api.types.is_datetime64_dtype(parsed):  # mixed time zones
        return pd.Series(pd.NaT, index=text.index, dtype="datetime64[ns]")
    return parsed
