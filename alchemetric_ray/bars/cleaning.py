"""One ticker's raw table -> canonical bars (:func:`validate_bars`), by the cleaning rules.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from alchemetric_ray.bars.columns import _Columns, _required_columns, _Rows, _to_dates, _to_float
from alchemetric_ray.bars.messages import _LIST_MAX, _dates_text, _day, _more, _row_ref, _rows, _runs_text, _value
from alchemetric_ray.bars.report import ON_DUPLICATE_DEFAULT, RULES, IngestReport, _check_policy
from alchemetric_ray.errors import DataError

DROP_LIMIT_ROWS = 2  # bad-value rows ingest may always drop per ticker and rule ...
DROP_LIMIT_FRACTION = 0.01  # ... or this share of the ticker's rows, whichever is larger
OHLC_TOLERANCE = 1e-6  # relative slack for Open/Close against [Low, High]
ZERO_VOLUME_RUN = 2  # consecutive zero-volume days that are dropped (a single one is kept)
STALE_RUN = 5  # consecutive identical closes that are dropped


def validate_bars(raw: pd.DataFrame | _Rows | _Columns, *, ticker: str, source: str, report: IngestReport,
                  min_history: int = 0, on_duplicate: str = ON_DUPLICATE_DEFAULT) -> pd.DataFrame | None:
    """Turn one ticker's raw table into canonical bars, or None if the ticker is skipped.

    ``source`` names the file in messages (row references are file lines for CSV sources).  The
    report is updated only when this returns: a :class:`DataError` leaves it untouched.  ``raw`` may
    also be one ticker's rows of a long table (:class:`~alchemetric_ray.bars.columns._Rows`, from
    :mod:`~alchemetric_ray.bars.files`): the same as passing those rows as a frame, converted faster;
    or a Parquet file's columns converted from Arrow (:class:`~alchemetric_ray.bars.columns._Columns`).
    """
    _check_policy(on_duplicate)
    if isinstance(raw, _Columns):
        cols = raw.cols
        numeric: list[str] = [c for c in ("open", "high", "low", "close", "adj_close", "volume") if c in cols]
        table = _Table(source, raw.n, np.arange(raw.n), {c: str(cols[c]) for c in cols}, raw.values, raw.empty,
                       numeric)
    elif isinstance(raw, _Rows):
        frame, cols = _required_columns(raw.table.frame, source)
        if frame is raw.table.frame:
            table = _Table.parse_rows(raw, cols, source)
        else:  # a date index turned into a column: the rows' own frame, as before
            raw, cols = _required_columns(raw.frame(), source)
            table = _Table.parse(raw, cols, source)
    else:
        raw, cols = _required_columns(raw, source)
        table = _Table.parse(raw, cols, source)
    # Each pass drops what it must from the rows the previous one kept, counting and saying why.
    kept = table.drop_empty_cells()
    kept = table.resolve_duplicates(kept, on_duplicate)
    skipped_for_duplicates = bool(table.conflicts) and on_duplicate == "skip_ticker"
    skip_reason: str | None
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
    report.rows_kept += len(cast(pd.DataFrame, bars))  # not skipped: the bars were made
    return bars


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

    @classmethod
    def parse_rows(cls, part: _Rows, cols: dict, source: str) -> _Table:
        """:meth:`parse` of a long table's rows for one ticker: a column converted once for the
        whole table is indexed; one that takes the general path is converted for these rows, as
        :meth:`parse` would (the same values, the same errors)."""
        frame, rows = part.table.frame, part.rows
        n = len(rows)
        labels = frame.index.to_numpy()[rows] if pd.api.types.is_integer_dtype(frame.index) else np.arange(n)
        numeric = [c for c in ("open", "high", "low", "close", "adj_close", "volume") if c in cols]
        values: dict[str, np.ndarray] = {}
        empty: dict[str, np.ndarray] = {}
        for name in (*numeric, "date"):
            col = cols[name]
            whole = part.table.dates(col) if name == "date" else part.table.floats(col)
            if whole is not None:
                values[name], empty[name] = whole[0][rows], whole[1][rows]
            else:
                convert = _to_dates if name == "date" else _to_float
                values[name], empty[name] = convert(frame[col].iloc[rows], source, col, labels)
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
        dates = self.dates[kept].view("int64")  # no NaT here: empty dates are gone
        if (dates[1:] > dates[:-1]).all():  # strictly increasing: no date twice, nothing to resolve
            return kept
        shared = _shared(dates)  # only rows of a date that occurs more than once can be copies
        if not shared.any():
            return kept
        # exact copies among those rows: the same date and every value the same (NaN equals NaN and
        # -0.0 equals 0.0 here, as in pandas' duplicated); a row's first occurrence in file order stays
        candidates = np.flatnonzero(shared)
        key = np.column_stack([dates[candidates],
                               *(_equality_bits(self.values[c][kept[candidates]]) for c in self.numeric)])
        _, first = np.unique(key, axis=0, return_index=True)  # a stable sort: first occurrences
        copies = np.zeros(len(kept), dtype=bool)
        copies[candidates] = True
        copies[candidates[first]] = False
        if copies.any():
            self.drops["duplicate_row"] = int(copies.sum())
            self.warns.append(f"{self.source}: dropped {_rows(int(copies.sum()))} that repeat an earlier row "
                              f"exactly ({_dates_text(np.unique(self.dates[kept[copies]]))})")
            kept, dates = kept[~copies], dates[~copies]
        differing = _shared(dates)
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
        keep = np.zeros(len(kept), dtype=bool)
        if on_duplicate == "first":
            keep[np.unique(dates, return_index=True)[1]] = True
        else:  # last
            keep[len(dates) - 1 - np.unique(dates[::-1], return_index=True)[1]] = True
        self.drops["duplicate_date"] = int((~keep).sum())
        self.warns.append(f"{self.source}: kept the {on_duplicate} row of each of {self.conflicts} date(s) with "
                          f"differing rows, dropped {_rows(self.drops['duplicate_date'])} "
                          f"(data.on_duplicate={on_duplicate}); first: {self.conflict_text()}")
        return kept[keep]

    def conflict_text(self) -> str:
        """The earliest date with differing rows: both rows and the first column where they differ."""
        a, b = cast(tuple[int, int], self.first_conflict)  # called only where there are conflicts
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
        volume = self.values["volume"][kept]
        price = np.column_stack([self.values[c][kept] for c in prices])
        with np.errstate(invalid="ignore"):
            if np.all((price > 0) & (price < np.inf)) and np.all((volume >= 0) & (volume < np.inf)):
                return kept  # no row for any of these rules (NaN fails both tests)
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
        block = np.empty((len(_BAR_NUMBERS), len(kept)))  # one row per column, as the frame holds them
        for i, k in enumerate(_BAR_NUMBERS):
            np.take(self.values[k], kept, out=block[i])
        if adjusted:
            adj = self.values["adj_close"][kept]
            factor = adj / block[3]
            block[:3] *= factor  # open, high, low
            block[3] = adj
        return _bars_frame(self.dates[kept], block)

    def skip_reason(self, kept: int, min_history: int) -> str | None:
        if kept > 0 and kept >= min_history:
            return None
        lost = ", ".join(f"{rule} {count}" for rule, count in self.drops.items() if count)
        return (f"{kept} rows of clean history"
                + (f" < min_history {min_history}" if min_history else "")
                + (f" ({self.n} read; dropped {lost})" if lost else f" ({self.n} read)"))


_BAR_NUMBERS = ("open", "high", "low", "close", "volume")
_BAR_COLUMNS = pd.Index(["date", *_BAR_NUMBERS])


try:
    from pandas.api.internals import create_dataframe_from_blocks as _from_blocks
except ImportError:  # pandas < 3
    _from_blocks = None


def _bars_frame(dates: np.ndarray, block: np.ndarray) -> pd.DataFrame:
    """The bars frame of a date column and the (5, n) block of the number columns, without copying
    them (pandas' create_dataframe_from_blocks where it has it: a third of the dict constructor's time)."""
    if _from_blocks is None:
        return pd.DataFrame({"date": dates, **dict(zip(_BAR_NUMBERS, block))}, copy=False)
    return _from_blocks([(block, np.arange(1, 1 + len(_BAR_NUMBERS))), (dates[None, :], np.array([0]))],
                        index=pd.RangeIndex(len(dates)), columns=_BAR_COLUMNS.copy())


def _shared(values: np.ndarray) -> np.ndarray:
    """Mask of the elements whose value occurs more than once (pandas' ``duplicated(keep=False)``)."""
    order = np.argsort(values, kind="stable")
    same = values[order][1:] == values[order][:-1]
    out = np.zeros(len(values), dtype=bool)
    out[order[1:][same]] = True
    out[order[:-1][same]] = True
    return out


_NAN_BITS = np.array([np.nan]).view("int64")[0]


def _equality_bits(values: np.ndarray) -> np.ndarray:
    """float64 values as int64 keys that are equal exactly where pandas' duplicated finds the values
    equal: -0.0 as 0.0, every NaN as one NaN."""
    bits = (values + 0.0).view("int64")  # -0.0 + 0.0 is 0.0
    return np.where(np.isnan(values), _NAN_BITS, bits)


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
