"""The columns of one raw table: which column means what, and its cells as numbers and dates.

Columns are matched ignoring case, spaces, underscores, hyphens and dots (``Adj Close``,
``adj_close`` and ``AdjClose`` are the same); extra columns are ignored.  A cell that is no number
(or no date) is a :class:`~alchemetric_ray.bars.messages.DataError` naming the file, the column and
the row; ``nan``/``inf`` written out are numbers, which the cleaning rules then judge.

Speed: numbers already numeric and dates already dates (Parquet, a DataFrame) or written as
``YYYY-MM-DD`` (a CSV, a Parquet ``date32``) are converted with numpy/pyarrow in one vectorized step
that gives what the general path gives; anything else (text numbers, other date spellings, a date
out of range, ...) takes the general path, which decides and words every error.  A long table's
columns are converted once for all its tickers (:class:`_LongTable`); each ticker takes its rows.  A
per-ticker Parquet file of plain number and timestamp columns is converted straight from Arrow
(:func:`_arrow_columns`), without a DataFrame in between.
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
    return _resolve_names(raw.columns, source)


def _resolve_names(columns, source: str) -> dict[str, str]:
    lookup = {alias: canon for canon, aliases in COLUMN_ALIASES.items() for alias in aliases}
    cols: dict[str, str] = {}
    for col in columns:
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
    if isinstance(s.dtype, np.dtype) and s.dtype.kind == "M":
        return _midnights(s.to_numpy())
    if not _is_text(s):
        return None
    parsed = _iso_days(s)
    if parsed is None:
        return None
    days, empty = parsed
    return _in_range(days, empty)


def _midnights(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """tz-naive datetime64 values (any unit) at midnight, as datetime64[ns], and where they are NaT."""
    empty = np.isnat(values)
    return _in_range(values.astype("datetime64[D]"), empty)  # numpy rounds toward -inf: normalize()


def _in_range(days: np.ndarray, empty: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    present = days[~empty]
    if len(present) and ((present < _FIRST_DAY).any() or (present > _LAST_DAY).any()):
        return None
    return days.astype("datetime64[ns]"), empty


def _iso_days(s: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Days of a text column whose every cell is a valid ``YYYY-MM-DD`` date exactly as written (ten
    ASCII bytes), or of ``datetime.date`` objects; None otherwise."""
    import pyarrow as pa

    empty = s.isna().to_numpy()
    try:
        arr = pa.array(s, from_pandas=True)  # an Arrow-backed column as it is; objects by their type
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if arr.null_count != int(empty.sum()) or (arr.null_count and not np.array_equal(
                arr.is_null().to_numpy(zero_copy_only=False), empty)):
            return None
        if pa.types.is_date32(arr.type):  # datetime.date objects (a Parquet date32 column)
            return arr.to_numpy(zero_copy_only=False).astype("datetime64[D]"), empty
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return None
        present = _ymd_days(arr.filter(arr.is_valid()) if arr.null_count else arr)
    except Exception:  # not plain dates: the general path decides (and words any error)
        return None
    if present is None:
        return None
    days = np.full(len(empty), np.datetime64("NaT"), dtype="datetime64[D]")
    days[~empty] = present
    return days, empty


_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9])  # byte positions of YYYY-MM-DD's digits


def _ymd_days(arr) -> np.ndarray | None:
    """The dates of an Arrow string array without nulls whose every value is a valid YYYY-MM-DD."""
    import pyarrow as pa

    k = len(arr)
    width = 8 if pa.types.is_large_string(arr.type) else 4
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if width == 8 else np.int32, count=k + 1,
                            offset=arr.offset * width)
    if k == 0 or not (np.diff(offsets) == 10).all():
        return None
    text = np.frombuffer(arr.buffers()[2], dtype=np.uint8, count=10 * k, offset=int(offsets[0])).reshape(k, 10)
    digits = text[:, _DIGITS].astype(np.int64) - ord("0")
    if not ((digits >= 0) & (digits <= 9)).all() or not ((text[:, 4] == ord("-")) & (text[:, 7] == ord("-"))).all():
        return None
    year = digits[:, 0] * 1000 + digits[:, 1] * 100 + digits[:, 2] * 10 + digits[:, 3]
    month = digits[:, 4] * 10 + digits[:, 5]
    day = digits[:, 6] * 10 + digits[:, 7]
    if not ((month >= 1) & (month <= 12) & (day >= 1)).all():
        return None
    months = ((year - 1970) * 12 + month - 1).astype("datetime64[M]")
    days = months.astype("datetime64[D]") + (day - 1).astype("timedelta64[D]")
    if not (days.astype("datetime64[M]") == months).all():  # past the month's last day (2013-02-29)
        return None
    return days


@dataclass(eq=False)  # holds arrays: compared by identity
class _LongTable:
    """A long table's frame whose columns are converted once, for all the tickers it holds."""

    frame: pd.DataFrame
    _floats: dict = field(default_factory=dict)
    _dates: dict = field(default_factory=dict)

    def floats(self, col) -> tuple[np.ndarray, np.ndarray] | None:
        """:func:`_numeric_float` of the whole column (None: each ticker's rows go the general way)."""
        if col not in self._floats:
            s = self.frame[col]
            try:
                self._floats[col] = _numeric_float(s) if isinstance(s, pd.Series) else None
            except Exception:  # each ticker's rows raise it as they always did
                self._floats[col] = None
        return self._floats[col]

    def dates(self, col) -> tuple[np.ndarray, np.ndarray] | None:
        if col not in self._dates:
            s = self.frame[col]
            got = None
            try:
                if isinstance(s, pd.Series):
                    if isinstance(s.dtype, pd.DatetimeTZDtype):
                        s = s.dt.tz_localize(None)
                    got = _plain_dates(s)
            except Exception:  # each ticker's rows raise it as they always did
                got = None
            self._dates[col] = got
        return self._dates[col]


@dataclass(eq=False)  # holds arrays: compared by identity
class _Rows:
    """One ticker's rows of a long table: positions (in file order) into :class:`_LongTable`'s frame."""

    table: _LongTable
    rows: np.ndarray

    def frame(self) -> pd.DataFrame:
        """The rows as a frame of their own (what a ticker of a long table was before)."""
        return self.table.frame.iloc[self.rows]


@dataclass(eq=False)  # holds arrays: compared by identity
class _Columns:
    """A per-ticker file's columns converted straight from Arrow (:func:`_arrow_columns`): what
    :func:`_required_columns`, :func:`_to_float` and :func:`_to_dates` give its DataFrame."""

    n: int
    cols: dict[str, str]  # canonical -> the file's column
    values: dict[str, np.ndarray]
    empty: dict[str, np.ndarray]


# pandas' dtype names for a number column in a Parquet file's pandas metadata (numpy_type)
_NUMBER_TYPES = frozenset({"float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                           "uint64", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
                           "Float32", "Float64"})


def _pandas_types(table) -> dict[str, str] | None:
    """Column -> pandas' numpy_type from the table's pandas metadata (empty without it); None where
    that metadata makes ``to_pandas`` more than a column per field under the field's name with a
    plain range index (a saved index, renamed columns, non-text column labels)."""
    import json

    meta = (table.schema.metadata or {}).get(b"pandas")
    if meta is None:
        return {}
    try:
        info = json.loads(meta)
        ranges = all(isinstance(ix, dict) and ix.get("kind") == "range" and ix.get("name") is None
                     for ix in info.get("index_columns", []))
        plain_labels = all(ci.get("name") is None and ci.get("pandas_type") == "unicode"
                           for ci in info.get("column_indexes", []))
        types: dict[str, str] = {}
        for c in info.get("columns", []):
            if c.get("name") != c.get("field_name") or not isinstance(c.get("name"), str):
                return None
            types[c["name"]] = str(c.get("numpy_type"))
    except (ValueError, TypeError, AttributeError):
        return None
    if not (ranges and plain_labels) or set(types) != set(table.schema.names):
        return None
    return types


def _plain_kinds(table) -> dict[str, str] | None:
    """Column -> "number" / "date" where every column of the table is a number (an integer or
    float32/64) or a tz-naive timestamp, named uniquely, that ``to_pandas`` converts as such."""
    import pyarrow as pa

    names = table.schema.names
    types = _pandas_types(table)
    if types is None or len(set(names)) != len(names):
        return None
    kinds = {}
    for col in table.schema:
        t = col.type
        if (pa.types.is_integer(t) or t in (pa.float32(), pa.float64())) and \
                types.get(col.name, "float64") in _NUMBER_TYPES:
            kinds[col.name] = "number"
        elif pa.types.is_timestamp(t) and t.tz is None and types.get(col.name, "datetime64").startswith("datetime64"):
            kinds[col.name] = "date"
        else:
            return None
    return kinds


def _arrow_columns(table) -> _Columns | None:
    """The columns of a per-ticker Parquet table whose every column is a number or a tz-naive
    timestamp, with no saved pandas index but a plain range and no ticker column: converted as
    ``to_pandas`` and :func:`_to_float` / :func:`_to_dates` would convert them.  None for any other
    table (or a date out of range, a missing or ambiguous column): it goes through pandas, as always."""
    names = table.schema.names
    kinds = _plain_kinds(table)
    if kinds is None or any(_norm(name) in TICKER_COLUMNS for name in names):
        return None
    try:
        cols = _resolve_names(names, "")
    except DataError:
        return None
    if any(c not in cols for c in REQUIRED) or kinds[cols["date"]] != "date" or \
            any(kinds[cols[c]] != "number" for c in cols if c != "date"):
        return None
    values: dict[str, np.ndarray] = {}
    empty: dict[str, np.ndarray] = {}
    for canon, name in cols.items():
        column = table.column(name).to_numpy()  # nulls: NaN (numbers, ints as float64), NaT (timestamps)
        if canon == "date":
            dates = _midnights(column)
            if dates is None:
                return None
            values[canon], empty[canon] = dates
        else:
            values[canon] = np.asarray(column, dtype="float64")
            empty[canon] = np.isnan(values[canon])
    return _Columns(table.num_rows, cols, values, empty)
