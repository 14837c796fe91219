"""The columns of one raw table: which column means what, and its cells as numbers and dates.

Columns are matched ignoring case, spaces, underscores, hyphens and dots (``Adj Close``,
``adj_close`` and ``AdjClose`` are the same); extra columns are ignored.  A cell that is no number
(or no date) is a :class:`~alchemetric_ray.bars.messages.DataError` naming the file, the column and
the row; ``nan``/``inf`` written out are numbers, which the cleaning rules then judge.

Speed: numbers already numeric and dates already dates (Parquet, a DataFrame) or written as
``YYYY-MM-DD`` (a CSV, a Parquet ``date32``) are converted with numpy/pyarrow in one vectorized step
that gives what the general path gives; anything else (text numbers, other date spellings, a date
out of range, ...) takes the general path, which decides and words every error.  A long table's
columns are converted once for all its tickers (:class:`_LongTable`); each ticker takes its rows.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from alchemetric_ray.bars.messages import _row_ref
from alchemetric_ray.errors import DataError

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
    fast = _numeric_float(s)
    if fast is not None:
        return fast
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


def _numeric_float(s: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_to_float` of a numeric (not bool) column, elementwise; None for any other column."""
    dtype = s.dtype
    if isinstance(dtype, np.dtype):
        if dtype.kind not in "fiu":
            return None
        values = np.asarray(s, dtype="float64")  # what to_numpy(float64, na_value=nan) gives a numpy column
    elif pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
        values = s.to_numpy(dtype="float64", na_value=np.nan)  # nullable Int64/Float64: <NA> as NaN
    else:
        return None
    return values, np.isnan(values)


def _to_dates(s: pd.Series, source: str, col, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dates as datetime64[ns] at midnight (NaT where empty) and the mask of empty cells."""
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        s = s.dt.tz_localize(None)
    fast = _plain_dates(s)
    if fast is not None:
        return fast
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


# The days a datetime64[ns] holds at midnight: what the general path accepts after normalizing.
_FIRST_DAY = np.datetime64(pd.Timestamp.min.ceil("D").date(), "D")
_LAST_DAY = np.datetime64(pd.Timestamp.max.floor("D").date(), "D")


def _plain_dates(s: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_to_dates` of a tz-naive datetime64 column or a text/object column of ``YYYY-MM-DD``
    dates (or ``datetime.date`` values), elementwise and vectorized; None where the general path must
    decide (other spellings, other types, a date out of range: it also words the errors)."""
    if s.dtype.kind == "M":
        values = s.to_numpy()
        empty = np.isnat(values)
        days = values.astype("datetime64[D]")  # numpy rounds toward -inf: normalize()
    elif _is_text(s):
        parsed = _iso_days(s)
        if parsed is None:
            return None
        days, empty = parsed
    else:
        return None
    present = days[~empty]
    if len(present) and ((present < _FIRST_DAY).any() or (present > _LAST_DAY).any()):
        return None
    return days.astype("datetime64[ns]"), empty


def _iso_days(s: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Days of a text column whose every cell is a ``YYYY-MM-DD`` date exactly as written (checked by
    writing the parsed dates back), or of ``datetime.date`` objects; None otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = s.isna().to_numpy()
    try:
        arr = pa.array(s, from_pandas=True)  # an Arrow-backed column as it is; objects by their type
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if arr.null_count != int(empty.sum()) or (arr.null_count and not np.array_equal(
                arr.is_null().to_numpy(zero_copy_only=False), empty)):
            return None
        if pa.types.is_date32(arr.type):  # datetime.date objects (a Parquet date32 column)
            days = arr.to_numpy(zero_copy_only=False).astype("datetime64[D]")
            return days, empty
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return None
        parsed = pc.strptime(arr, format="%Y-%m-%d", unit="s", error_is_null=True)
        if parsed.null_count != arr.null_count:
            return None
        same = pc.equal(pc.strftime(parsed, format="%Y-%m-%d"), arr.cast(pa.string()))
        if not pc.all(same, skip_nulls=True).as_py():  # strptime is lenient ("2012-02-30", " 2012-9-4")
            return None
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
    return parsed.to_numpy(zero_copy_only=False).astype("datetime64[D]"), empty


@dataclass
class _LongTable:
    """A long table's frame whose columns are converted once, for all the tickers it holds."""

    frame: pd.DataFrame
    _floats: dict = field(default_factory=dict)
    _dates: dict = field(default_factory=dict)

    def floats(self, col) -> tuple[np.ndarray, np.ndarray] | None:
        """:func:`_numeric_float` of the whole column (None: each ticker's rows go the general way)."""
        if col not in self._floats:
            s = self.frame[col]
            self._floats[col] = _numeric_float(s) if isinstance(s, pd.Series) else None
        return self._floats[col]

    def dates(self, col) -> tuple[np.ndarray, np.ndarray] | None:
        if col not in self._dates:
            s = self.frame[col]
            got = None
            if isinstance(s, pd.Series):
                if isinstance(s.dtype, pd.DatetimeTZDtype):
                    s = s.dt.tz_localize(None)
                got = _plain_dates(s)
            self._dates[col] = got
        return self._dates[col]


@dataclass
class _Rows:
    """One ticker's rows of a long table: positions (in file order) into :class:`_LongTable`'s frame."""

    table: _LongTable
    rows: np.ndarray

    def frame(self) -> pd.DataFrame:
        """The rows as a frame of their own (what a ticker of a long table was before)."""
        return self.table.frame.iloc[self.rows]
