"""Read daily OHLCV files and turn them into validated, canonical bars, one ticker at a time.

Inputs (``iter_bars(path)``):

* a folder of ``.csv`` / ``.parquet`` / ``.pq`` files, one per ticker (ticker = file stem),
  read in sorted order; other files, sub-folders and dotfiles are ignored;
* a single file that is one long table with a ``ticker`` (or ``symbol``) column, grouped by
  ticker (the whole table is read once; the tickers are still yielded one at a time);
* a single per-ticker file (ticker = file stem).

Columns are matched ignoring case, spaces, underscores, hyphens and dots (``Adj Close``,
``adj_close`` and ``AdjClose`` are the same); extra columns are ignored.  Where ``Adj Close`` is
present, open/high/low/close are multiplied row-wise by ``Adj Close / Close`` (the adjusted close
is then exactly the ``Adj Close`` column).

Cleaning rules, applied in this order; each dropped row is counted once, under the first rule
that drops it (``IngestReport.dropped``), and each rule that drops anything adds one warning
naming the file, the column and the date(s):

``empty_cell``
    a missing value (blank, ``null``, ``NA``, ``N/A``, ``None``, ``-``) in Date, Open, High, Low,
    Close, Volume or Adj Close (when that column exists): the row is dropped.
``duplicate_row``
    a later exact copy of a row (same date and the same value in every column ingest reads, for
    the same ticker): dropped, always.  Public daily files repeat rows when a vendor's pages or
    snapshots overlap; a copy says nothing new, so refusing the file for it helps nobody.
``duplicate_date``
    rows of one date whose values differ (a revised bar next to the original: one S&P 500 name's
    two 2017-10-30 rows differed by 22 shares of volume) follow ``on_duplicate``
    (``data.on_duplicate``): ``last`` (the default) / ``first`` keep the ticker's last / first
    such row in file order and count the others here; ``skip_ticker`` leaves the ticker out (a
    reason in ``IngestReport.skipped_tickers``); ``refuse`` is a :class:`DataError` naming both
    rows.  Rows already dropped as ``empty_cell`` take no part: they were never a candidate bar.
``nonfinite_price`` / ``nonpositive_price`` / ``nonfinite_volume`` / ``negative_volume``
    a price (Adj Close included) that is ``inf``/``nan`` *written as a value*, or ``<= 0``; a
    volume that is non-finite or ``< 0``.  At most ``max(2, 1% of the ticker's rows)`` such rows
    per rule are dropped; more than that is a :class:`DataError` (a broken file, not noise).
    (In a column that is already numeric -- Parquet, a DataFrame -- NaN can only mean empty.)
``high_below_low``
    High < Low: dropped.
``ohlc_inconsistent``
    Open or Close outside [Low, High] by more than a relative 1e-6: dropped.
``zero_volume``
    runs of 2 or more consecutive zero-volume days (halted / not yet listed) are dropped.  An
    isolated zero-volume day is kept: thinly traded names (SPLP in stocknet has ~40) have genuine
    no-trade days, and dropping them would only punch holes into the series.
``stale_price``
    runs of 5 or more consecutive flat bars (open == high == low == close) at exactly the same
    (unadjusted) close are dropped: pre-listing placeholder rows.  Real days that happen to close
    at the same price but trade a range are kept (SPLP in stocknet has five such days).  Rows
    of such a run already dropped as ``zero_volume`` are counted there.

Errors (:class:`DataError`, one line naming the file and the column, date, row or value): a
path that does not exist or holds no data files, an unreadable file, a missing required column,
an unparseable date or number, differing rows for one date (with ``on_duplicate="refuse"``),
too many bad values (above), an unsafe ticker
name, an unknown requested ticker, or no ticker left at all.  Unsorted rows are sorted, with a
warning.  A ticker with fewer than ``min_history`` clean rows (or none at all) is skipped with a
warning and a reason in ``IngestReport.skipped_tickers``.

Problems with the path itself (missing, empty folder, unsafe file names, unknown ``tickers=``
in a folder) are raised when :func:`iter_bars` is called; problems inside files while iterating.
"""

from __future__ import annotations

import re
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from alchemetric_ray.config import DataConfig, DuplicatePolicy
from alchemetric_ray.errors import UserError

DATA_SUFFIXES = (".csv", ".parquet", ".pq")
# Cell texts that mean "no value" in a CSV.  "nan"/"inf" are deliberately not here: written out,
# they are values (a broken upstream computation) and fall under the non-finite rules.
MISSING_MARKERS = ("", "null", "NULL", "Null", "NA", "N/A", "n/a", "#N/A", "None", "none", "-", "--")
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

DROP_LIMIT_ROWS = 2  # bad-value rows ingest may always drop per ticker and rule ...
DROP_LIMIT_FRACTION = 0.01  # ... or this share of the ticker's rows, whichever is larger
OHLC_TOLERANCE = 1e-6  # relative slack for Open/Close against [Low, High]
ZERO_VOLUME_RUN = 2  # consecutive zero-volume days that are dropped (a single one is kept)
STALE_RUN = 5  # consecutive identical closes that are dropped

RULES = ("empty_cell", "duplicate_row", "duplicate_date", "nonfinite_price", "nonpositive_price", "nonfinite_volume",
         "negative_volume", "high_below_low", "ohlc_inconsistent", "zero_volume", "stale_price")
DUPLICATE_POLICIES = typing.get_args(DuplicatePolicy)
# Written once, in config.py: a caller of iter_bars without a config gets what the CLI gets.
ON_DUPLICATE_DEFAULT: str = DataConfig().on_duplicate

_SAFE_TICKER = re.compile(r"[A-Za-z0-9._^=-]+")
_LIST_MAX = 5  # dates / runs / names shown in one message


class DataError(UserError, ValueError):
    """Market data that cannot be used. The message is one line naming the file, column, date or value."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", " ").replace("\n", " "))


@dataclass
class IngestReport:
    """What ingest read, kept, dropped (by rule) and skipped; filled in while iterating."""

    files: int = 0
    tickers: int = 0  # tickers yielded
    rows_read: int = 0
    rows_kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    skipped_tickers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    on_duplicate: str = ON_DUPLICATE_DEFAULT  # how dates with differing rows were resolved
    conflicting_dates: int = 0  # (ticker, date) pairs with differing rows, under any policy
    duplicate_skipped: list[str] = field(default_factory=list)  # tickers left out by skip_ticker

    def duplicates(self) -> dict:
        """The duplicate counts as the manifest (``ingest.duplicates``) and an evaluation of new
        data carry them: kept apart from ``dropped`` as well as counted there, because a reader
        deciding whether to trust the bars wants to see how conflicts were resolved, not only how
        many rows went."""
        return {"exact_rows_dropped": self.dropped.get("duplicate_row", 0),
                "conflicting_dates": self.conflicting_dates,
                "conflicting_rows_dropped": self.dropped.get("duplicate_date", 0),
                "resolved_by": self.on_duplicate,
                "tickers_skipped": list(self.duplicate_skipped)}

    def summary(self) -> str:
        lines = [f"ingested {self.tickers} ticker{'s' if self.tickers != 1 else ''} from {self.files} "
                 f"file{'s' if self.files != 1 else ''}: "
                 f"{self.rows_kept:,} of {self.rows_read:,} rows kept"]
        drops = [f"{rule} {n:,}" for rule, n in self.dropped.items() if n]
        if drops:
            lines.append("dropped rows: " + ", ".join(drops))
        dup = self.duplicates()
        if dup["exact_rows_dropped"] or dup["conflicting_dates"]:
            lines.append(f"duplicates: {_rows(dup['exact_rows_dropped'])} repeating another exactly dropped; "
                         f"{dup['conflicting_dates']} date(s) with differing rows, resolved by "
                         f"data.on_duplicate={self.on_duplicate}"
                         + (f" ({len(self.duplicate_skipped)} ticker(s) skipped)" if self.duplicate_skipped else ""))
        if self.skipped_tickers:
            shown = [f"{t} ({why})" for t, why in list(self.skipped_tickers.items())[:_LIST_MAX]]
            more = len(self.skipped_tickers) - len(shown)
            lines.append(f"skipped {len(self.skipped_tickers)} tickers: " + "; ".join(shown)
                         + (f"; and {more} more" if more else ""))
        if self.warnings:
            lines.append(f"{len(self.warnings)} warnings (first: {self.warnings[0]})")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Files -> (ticker, raw table)
# --------------------------------------------------------------------------------------------


def iter_bars(path: str | Path, *, tickers: list[str] | None = None, min_history: int = 0,
              report: IngestReport | None = None,
              on_duplicate: str = ON_DUPLICATE_DEFAULT) -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield (ticker, bars) one ticker at a time (bounded memory), validated.

    ``tickers`` restricts to those tickers (case-insensitive; an empty list means all).  Tickers
    left with fewer than ``min_history`` clean rows are skipped; if none is left at the end of
    the iteration, :class:`DataError` is raised.  ``report`` (if given) is filled in as it goes.
    ``on_duplicate`` says what a date with differing rows becomes (module docstring,
    ``duplicate_date``); it is checked here, before any file is read.
    """
    if min_history < 0:
        raise DataError(f"min_history must be >= 0, got {min_history}")
    _check_policy(on_duplicate)
    report = IngestReport() if report is None else report
    report.on_duplicate = on_duplicate
    root = Path(path)
    wanted = _wanted(tickers)
    if not root.exists():
        raise DataError(f"data path {root}: not found")
    if root.is_dir():
        files = _folder_files(root, wanted)
        pairs: Iterator[tuple[str, pd.DataFrame, str]] = _per_ticker_files(files, report)
    elif root.is_file():
        if root.suffix.lower() not in DATA_SUFFIXES:
            raise DataError(f"{root.name}: not a CSV or Parquet file (expected one of "
                            f"{', '.join(DATA_SUFFIXES)}, or a folder of them)")
        pairs = _single_file(root, wanted, report)
    else:
        raise DataError(f"data path {root}: not a file or folder")
    return _validated(pairs, root, min_history, report, on_duplicate)


def _check_policy(on_duplicate: str) -> None:
    if on_duplicate not in DUPLICATE_POLICIES:
        raise DataError(f"on_duplicate {on_duplicate!r} is not one of {', '.join(DUPLICATE_POLICIES)} "
                        "(data.on_duplicate)")


def _validated(pairs, root: Path, min_history: int, report: IngestReport, on_duplicate: str):
    yielded = 0
    for ticker, raw, source in pairs:
        bars = validate_bars(raw, ticker=ticker, source=source, report=report, min_history=min_history,
                             on_duplicate=on_duplicate)
        del raw
        if bars is not None:
            yielded += 1
            yield ticker, bars
    if yielded == 0:
        skipped = "; ".join(f"{t}: {why}" for t, why in list(report.skipped_tickers.items())[:3])
        raise DataError(f"no ticker has at least {max(min_history, 1)} rows of clean history in {root}"
                        + (f" (skipped {len(report.skipped_tickers)}, e.g. {skipped})" if skipped else ""))


def _wanted(tickers: list[str] | None) -> list[str] | None:
    if tickers is None:
        return None
    if isinstance(tickers, str):
        tickers = [tickers]
    names = list(dict.fromkeys(str(t).strip() for t in tickers if str(t).strip()))
    return names or None


def _folder_files(root: Path, wanted: list[str] | None) -> list[tuple[str, Path]]:
    files = sorted((p for p in root.iterdir()
                    if p.suffix.lower() in DATA_SUFFIXES and not p.name.startswith(".") and p.is_file()),
                   key=lambda p: p.name)
    if not files:
        raise DataError(f"no CSV or Parquet files in {root}")
    by_key: dict[str, Path] = {}
    for p in files:
        _check_ticker_name(p.stem, p.name)
        other = by_key.setdefault(p.stem.upper(), p)
        if other is not p:
            raise DataError(f"{root}: two files for ticker {p.stem}: {other.name} and {p.name}")
    if wanted is not None:
        _check_wanted(wanted, [p.stem for p in files], str(root))
        keys = {w.upper() for w in wanted}
        files = [p for p in files if p.stem.upper() in keys]
    return [(p.stem, p) for p in files]


def _per_ticker_files(files: list[tuple[str, Path]], report: IngestReport):
    for ticker, p in files:
        raw = _read_file(p)
        report.files += 1
        tcol = _ticker_column(raw)
        if tcol is not None:
            distinct = raw[tcol].dropna().astype(str).str.strip().unique()
            if len(distinct) > 1:
                raise DataError(f"{p.name}: has a '{tcol}' column with {len(distinct)} tickers; a folder "
                                "must hold one file per ticker (pass a long table as a single file)")
        yield ticker, raw, p.name


def _single_file(p: Path, wanted: list[str] | None, report: IngestReport):
    raw = _read_file(p, long_table=True)
    report.files += 1
    tcol = _ticker_column(raw)
    if tcol is None:
        _check_ticker_name(p.stem, p.name)
        if wanted is not None:
            _check_wanted(wanted, [p.stem], p.name)
        yield p.stem, raw, p.name
        return
    names = raw[tcol].astype("string").str.strip()
    empty = names.isna() | (names == "")
    if empty.any():
        rows = raw.index[empty.to_numpy()]
        report.rows_read += int(empty.sum())
        report.dropped["empty_cell"] += int(empty.sum())
        report.warnings.append(f"{p.name}: dropped {int(empty.sum())} rows with an empty '{tcol}' cell "
                               f"({_rows_text(p.name, rows)})")
        raw, names = raw[~empty.to_numpy()], names[~empty]
    codes, uniques = pd.factorize(names, sort=True)
    uniques = [str(u) for u in uniques]
    seen: dict[str, str] = {}
    for i, name in enumerate(uniques):
        if not _is_safe_ticker(name):
            first = raw.index[np.flatnonzero(codes == i)[0]]
            _check_ticker_name(name, f"{p.name} ({_row_ref(p.name, first)}, column '{tcol}')")
        other = seen.setdefault(name.upper(), name)
        if other != name:
            raise DataError(f"{p.name}: tickers {other!r} and {name!r} differ only by case")
    selected = list(range(len(uniques)))
    if wanted is not None:
        _check_wanted(wanted, uniques, p.name)
        keys = {w.upper() for w in wanted}
        selected = [i for i in selected if uniques[i].upper() in keys]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
    for i in selected:
        rows = order[bounds[i]:bounds[i + 1]]
        yield uniques[i], raw.iloc[np.sort(rows)], f"{p.name} (ticker {uniques[i]})"


def _check_wanted(wanted: list[str], available: list[str], where: str) -> None:
    have = {a.upper() for a in available}
    missing = [w for w in wanted if w.upper() not in have]
    if missing:
        some = ", ".join(sorted(available)[:8]) + (", ..." if len(available) > 8 else "")
        raise DataError(f"requested ticker{'s' if len(missing) > 1 else ''} {', '.join(missing)} not in "
                        f"{where} (it has {len(available)}: {some})")


def _is_safe_ticker(name: str) -> bool:
    return bool(_SAFE_TICKER.fullmatch(name)) and not name.startswith(".") and ".." not in name


def _check_ticker_name(name: str, where: str) -> None:
    if not _is_safe_ticker(name):
        raise DataError(f"{where}: unsafe ticker name {name!r}: use only letters, digits and . _ ^ = -, "
                        "not starting with '.' and without '..'")


def _ticker_column(raw: pd.DataFrame) -> str | None:
    keys = {_norm(c): c for c in reversed(list(raw.columns))}
    for key in TICKER_COLUMNS:
        if key in keys:
            return keys[key]
    return None


def _read_file(p: Path, *, long_table: bool = False) -> pd.DataFrame:
    if p.suffix.lower() == ".csv":
        return _read_csv(p, long_table)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        df = pq.read_table(p).to_pandas()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{p.name}: not a readable Parquet file ({_first_line(exc)})") from None
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        # a pandas index saved with the table: keep it as a column when named (e.g. Date),
        # so that row numbers in messages are positions in the file
        df = df.reset_index(drop=all(name is None for name in df.index.names))
    return df


def _read_csv(p: Path, long_table: bool) -> pd.DataFrame:
    try:
        with open(p, "rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        raise DataError(f"{p.name}: cannot read ({_first_line(exc)})") from None
    if not head.strip():
        raise DataError(f"{p.name}: empty file")
    if b"\x00" in head:
        raise DataError(f"{p.name}: not a text CSV file (binary data)")
    kwargs: dict = {"keep_default_na": False, "na_values": list(MISSING_MARKERS), "encoding": "utf-8-sig"}
    try:
        if long_table:
            # A ticker column is read as text, verbatim: "NA" and "NONE" are tickers there.
            header = pd.read_csv(p, nrows=0, encoding="utf-8-sig").columns
            tcol = _ticker_column(pd.DataFrame(columns=header))
            if tcol is not None:
                kwargs["na_values"] = {c: list(MISSING_MARKERS) for c in header if c != tcol}
                kwargs["dtype"] = {tcol: str}
        return pd.read_csv(p, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{p.name}: cannot parse as CSV ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


# --------------------------------------------------------------------------------------------
# Raw table -> canonical bars
# --------------------------------------------------------------------------------------------


def validate_bars(raw: pd.DataFrame, *, ticker: str, source: str, report: IngestReport,
                  min_history: int = 0, on_duplicate: str = ON_DUPLICATE_DEFAULT) -> pd.DataFrame | None:
    """Turn one ticker's raw table into canonical bars, or None if the ticker is skipped.

    ``source`` names the file in messages (row references are file lines for CSV sources).  The
    report is updated only when this returns: a :class:`DataError` leaves it untouched.
    """
    _check_policy(on_duplicate)
    raw, cols = _required_columns(raw, source)
    table = _Table.parse(raw, cols, source)
    # Each pass drops what it must from the rows the previous one kept, counting and saying why.
    kept = table.drop_empty_cells()
    kept = table.resolve_duplicates(kept, on_duplicate)
    skipped_for_duplicates = bool(table.conflicts) and on_duplicate == "skip_ticker"
    if skipped_for_duplicates:  # the other passes would only count drops of rows that all go anyway
        bars, skip_reason = None, f"{table.conflict_text()} (data.on_duplicate=skip_ticker)"
    else:
        kept = table.in_date_order(kept)
        kept = table.drop_bad_values(kept)
        kept = table.drop_inconsistent_ohlc(kept)
        kept = table.drop_placeholder_runs(kept)
        bars = table.bars(kept, adjusted="adj_close" in cols)
        skip_reason = table.skip_reason(len(bars), min_history)
    if skip_reason is not None:
        table.warns.append(f"{source}: skipped ticker {ticker}: {skip_reason}")
    # committed to the report only now: a DataError above leaves it as it was
    report.rows_read += table.n
    for rule, count in table.drops.items():
        report.dropped[rule] = report.dropped.get(rule, 0) + count
    report.warnings.extend(table.warns)
    report.on_duplicate = on_duplicate
    report.conflicting_dates += table.conflicts
    if skip_reason is not None:
        report.skipped_tickers[ticker] = skip_reason
        if skipped_for_duplicates:
            report.duplicate_skipped.append(ticker)
        return None
    report.tickers += 1
    report.rows_kept += len(bars)
    return bars


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


@dataclass
class _Table:
    """One ticker's parsed columns and what the validation passes dropped; ``kept`` arrays of row
    positions say which rows are still in."""

    source: str
    n: int  # rows read
    labels: np.ndarray  # each row's reference in messages (file line or index label)
    names: dict[str, str]  # canonical -> the file's spelling, for messages
    values: dict[str, np.ndarray]  # canonical -> values of every row
    empty: dict[str, np.ndarray]  # canonical -> which cells were empty
    numeric: list[str]
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    warns: list[str] = field(default_factory=list)
    conflicts: int = 0  # dates with differing rows
    first_conflict: tuple[int, int] | None = None  # positions of the earliest such date's first two rows

    @classmethod
    def parse(cls, raw: pd.DataFrame, cols: dict, source: str) -> _Table:
        n = len(raw)
        labels = raw.index.to_numpy() if pd.api.types.is_integer_dtype(raw.index) else np.arange(n)
        numeric = [c for c in ("open", "high", "low", "close", "adj_close", "volume") if c in cols]
        values: dict[str, np.ndarray] = {}
        empty: dict[str, np.ndarray] = {}
        for name in numeric:
            values[name], empty[name] = _to_float(raw[cols[name]], source, cols[name], labels)
        values["date"], empty["date"] = _to_dates(raw[cols["date"]], source, cols["date"], labels)
        return cls(source, n, labels, {c: str(cols[c]) for c in cols}, values, empty, numeric)

    @property
    def dates(self) -> np.ndarray:
        return self.values["date"]

    @property
    def prices(self) -> list[str]:
        return [c for c in self.numeric if c != "volume"]

    def drop_empty_cells(self) -> np.ndarray:
        columns = ("date", *self.numeric)
        is_empty = np.logical_or.reduce([self.empty[c] for c in columns])
        if is_empty.any():
            gone = np.flatnonzero(is_empty)
            in_cols = [self.names[c] for c in columns if self.empty[c].any()]
            where = [_row_ref(self.source, self.labels[i]) if self.empty["date"][i] else _day(self.dates[i])
                     for i in gone[:_LIST_MAX]]
            self.drops["empty_cell"] = len(gone)
            self.warns.append(f"{self.source}: dropped {_rows(len(gone))} with empty cells in column(s) "
                              f"{', '.join(in_cols)} ({_more(where, len(gone))})")
        return np.flatnonzero(~is_empty)

    def resolve_duplicates(self, kept: np.ndarray, on_duplicate: str) -> np.ndarray:
        """Exact copies of a row go (``duplicate_row``); a date left with differing rows keeps one
        row by file order or is refused, per ``on_duplicate`` (``skip_ticker``: the caller skips).

        ``kept`` is in file order here (before any sorting), so "first" and "last" are the file's:
        a vendor's correction appended after its bar is the last row of that date."""
        if len(kept) < 2:
            return kept
        columns = ("date", *self.numeric)
        frame = pd.DataFrame({c: self.values[c][kept] for c in columns})
        copies = frame.duplicated(keep="first").to_numpy()  # NaN equals NaN here: a copy is a copy
        if copies.any():
            self.drops["duplicate_row"] = int(copies.sum())
            self.warns.append(f"{self.source}: dropped {_rows(int(copies.sum()))} that repeat an earlier row "
                              f"exactly ({_dates_text(np.unique(self.dates[kept[copies]]))})")
            kept, frame = kept[~copies], frame[~copies]
        dates = frame["date"]
        differing = dates.duplicated(keep=False).to_numpy()
        if not differing.any():
            return kept
        days = np.unique(self.dates[kept[differing]])
        self.conflicts = len(days)
        rows = kept[differing & (self.dates[kept] == days[0])]
        self.first_conflict = (int(rows[0]), int(rows[1]))
        if on_duplicate == "refuse":
            raise DataError(f"{self.source}: {self.conflict_text()}; set data.on_duplicate=first|last|skip_ticker "
                            "to keep one")
        if on_duplicate == "skip_ticker":
            return kept
        keep = ~dates.duplicated(keep=on_duplicate).to_numpy()
        self.drops["duplicate_date"] = int((~keep).sum())
        self.warns.append(f"{self.source}: kept the {on_duplicate} row of each of {self.conflicts} date(s) with "
                          f"differing rows, dropped {_rows(self.drops['duplicate_date'])} "
                          f"(data.on_duplicate={on_duplicate}); first: {self.conflict_text()}")
        return kept[keep]

    def conflict_text(self) -> str:
        """The earliest date with differing rows: both rows and the first column where they differ."""
        a, b = self.first_conflict
        col = next(c for c in self.numeric
                   if not (self.values[c][a] == self.values[c][b]
                           or (np.isnan(self.values[c][a]) and np.isnan(self.values[c][b]))))
        more = f" ({self.conflicts} dates with differing rows)" if self.conflicts > 1 else ""
        return (f"duplicate date {_day(self.dates[a])} at {_row_ref(self.source, self.labels[a])} and "
                f"{_row_ref(self.source, self.labels[b])} with different values (column '{self.names[col]}': "
                f"{_value(self.values[col][a])} vs {_value(self.values[col][b])}){more}")

    def in_date_order(self, kept: np.ndarray) -> np.ndarray:
        if len(kept) > 1 and (np.diff(self.dates[kept]) < np.timedelta64(0)).any():
            kept = kept[np.argsort(self.dates[kept], kind="stable")]
            self.warns.append(f"{self.source}: rows not in date order (column '{self.names['date']}'); sorted them")
        return kept

    def drop_bad_values(self, kept: np.ndarray) -> np.ndarray:
        """Non-finite or non-positive prices, non-finite or negative volumes: a few rows are
        dropped, more than the limit is an error (a broken file, not a few bad ticks)."""
        limit = max(DROP_LIMIT_ROWS, int(DROP_LIMIT_FRACTION * self.n))
        prices = self.prices
        price = np.column_stack([self.values[c][kept] for c in prices])
        volume = self.values["volume"][kept]
        finite_price, finite_volume = np.isfinite(price), np.isfinite(volume)
        with np.errstate(invalid="ignore"):
            bad_rules = (
                ("nonfinite_price", ~finite_price, prices, "a non-finite price"),
                ("nonpositive_price", finite_price & (price <= 0), prices, "a non-positive price"),
                ("nonfinite_volume", ~finite_volume[:, None], ["volume"], "a non-finite volume"),
                ("negative_volume", (finite_volume & (volume < 0))[:, None], ["volume"], "a negative volume"),
            )
        bad_any = np.zeros(len(kept), dtype=bool)
        for rule, cells, in_cols, what in bad_rules:
            cells = cells & ~bad_any[:, None]  # a row is counted under its first rule only
            rows = cells.any(axis=1)
            if not rows.any():
                continue
            i, j = np.argwhere(cells)[0]
            first = (f"column '{self.names[in_cols[j]]}' on {_day(self.dates[kept[i]])} = "
                     f"{float(self.values[in_cols[j]][kept[i]])!r}")
            count = int(rows.sum())
            if count > limit:
                raise DataError(f"{self.source}: {count} rows with {what}, more than ingest may drop "
                                f"(at most {limit} of {self.n} rows); first: {first}")
            bad_cols = [self.names[in_cols[k]] for k in np.flatnonzero(cells.any(axis=0))]
            self.drops[rule] = count
            self.warns.append(f"{self.source}: dropped {_rows(count)} with {what} in column(s) "
                              f"{', '.join(bad_cols)} ({_dates_text(self.dates[kept[rows]])}); first: {first}")
            bad_any |= rows
        return kept[~bad_any]

    def drop_inconsistent_ohlc(self, kept: np.ndarray) -> np.ndarray:
        opens, highs, lows, closes = (self.values[k][kept] for k in ("open", "high", "low", "close"))
        names, dates = self.names, self.dates
        high_below_low = highs < lows
        if high_below_low.any():
            self.drops["high_below_low"] = int(high_below_low.sum())
            self.warns.append(f"{self.source}: dropped {_rows(self.drops['high_below_low'])} with "
                              f"'{names['high']}' < '{names['low']}' ({_dates_text(dates[kept[high_below_low]])})")
        top, bottom = highs * (1 + OHLC_TOLERANCE), lows * (1 - OHLC_TOLERANCE)
        outside = ~high_below_low & ((opens > top) | (opens < bottom) | (closes > top) | (closes < bottom))
        if outside.any():
            self.drops["ohlc_inconsistent"] = int(outside.sum())
            self.warns.append(f"{self.source}: dropped {_rows(self.drops['ohlc_inconsistent'])} with "
                              f"'{names['open']}' or '{names['close']}' outside ['{names['low']}', "
                              f"'{names['high']}'] ({_dates_text(dates[kept[outside]])})")
        return kept[~(high_below_low | outside)]

    def drop_placeholder_runs(self, kept: np.ndarray) -> np.ndarray:
        """Zero-volume runs, then stale-price runs among the rows left (a trading day next to a
        zero-volume run at the same price is not stale by itself)."""
        for rule, col, minimum, what in (("zero_volume", "volume", ZERO_VOLUME_RUN, "zero-volume"),
                                         ("stale_price", "close", STALE_RUN, "unchanged-close")):
            values = self.values[col][kept]
            if rule == "zero_volume":
                mask = _runs(values == 0, minimum)
            else:
                # only flat bars (open == high == low == close) can be placeholders: a real day with
                # a range breaks the run even when it closes at the same price
                opens, highs, lows = (self.values[k][kept] for k in ("open", "high", "low"))
                flat = (opens == highs) & (highs == lows) & (lows == values)
                mask = _runs_of_equal(np.where(flat, values, -1.0 - np.arange(len(values))), minimum)
            if mask.any():
                self.drops[rule] = int(mask.sum())
                self.warns.append(f"{self.source}: dropped {_rows(self.drops[rule])} in {what} runs of >= "
                                  f"{minimum} days in column '{self.names[col]}' "
                                  f"({_runs_text(self.dates[kept], mask)})")
                kept = kept[~mask]
        return kept

    def bars(self, kept: np.ndarray, *, adjusted: bool) -> pd.DataFrame:
        """The canonical bars; with an Adj Close, Open/High/Low/Close scaled by Adj Close / Close."""
        out = pd.DataFrame({"date": self.dates[kept],
                            **{k: self.values[k][kept] for k in ("open", "high", "low", "close", "volume")}})
        if adjusted:
            adj = self.values["adj_close"][kept]
            factor = adj / out["close"].to_numpy()
            for k in ("open", "high", "low"):
                out[k] = out[k].to_numpy() * factor
            out["close"] = adj
        return out

    def skip_reason(self, kept: int, min_history: int) -> str | None:
        if kept > 0 and kept >= min_history:
            return None
        lost = ", ".join(f"{rule} {count}" for rule, count in self.drops.items() if count)
        return (f"{kept} rows of clean history"
                + (f" < min_history {min_history}" if min_history else "")
                + (f" ({self.n} read; dropped {lost})" if lost else f" ({self.n} read)"))


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


def _runs(mask: np.ndarray, min_len: int) -> np.ndarray:
    """Mask of the True elements that lie in runs of at least ``min_len`` consecutive Trues."""
    if not mask.any():
        return mask
    return mask & (_run_lengths(mask) >= min_len)


def _runs_of_equal(values: np.ndarray, min_len: int) -> np.ndarray:
    """Mask of the elements in runs of at least ``min_len`` consecutive equal values."""
    if len(values) < min_len:
        return np.zeros(len(values), dtype=bool)
    return _run_lengths(values) >= min_len


def _run_lengths(values: np.ndarray) -> np.ndarray:
    """For each element, the length of the run of equal consecutive values it belongs to."""
    starts = np.r_[True, values[1:] != values[:-1]]
    ids = np.cumsum(starts) - 1
    return np.bincount(ids)[ids]


def _value(v: float) -> str:
    """A number as a file would write it: 1022 for a volume, 170.5 for a price."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _day(value) -> str:
    return pd.Timestamp(value).strftime("%Y-%m-%d")


def _rows(k: int) -> str:
    return f"{k} row{'s' if k != 1 else ''}"


def _dates_text(dates) -> str:
    return _more([_day(d) for d in np.asarray(dates)[:_LIST_MAX]], len(dates))


def _more(parts: list[str], total: int) -> str:
    return ", ".join(parts) + (f" and {total - len(parts)} more" if total > len(parts) else "")


def _runs_text(dates: np.ndarray, mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.r_[idx[0], idx[breaks + 1]]
    ends = np.r_[idx[breaks], idx[-1]]
    parts = [f"{_day(dates[a])}..{_day(dates[b])}" for a, b in zip(starts[:_LIST_MAX], ends[:_LIST_MAX])]
    more = len(starts) - len(parts)
    return ", ".join(parts) + (f" and {more} more runs" if more > 0 else "")


def _row_ref(source: str, label) -> str:
    """'line N' (header = line 1) for CSV sources, else 'row N' (1-based, header not counted)."""
    if re.search(r"\.csv\b", source, flags=re.IGNORECASE):
        return f"line {int(label) + 2}"
    return f"row {int(label) + 1}"


def _rows_text(source: str, labels) -> str:
    return _more([_row_ref(source, r) for r in list(labels)[:_LIST_MAX]], len(labels))
