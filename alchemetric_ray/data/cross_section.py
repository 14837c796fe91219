"""The per-date pass: labels and features taken across the stocks that trade on each date.

Features and labels are first computed by groups of tickers (one Arrow IPC file per group, in a
staging folder: ``data/staging.py``); what needs every stock of a date at once comes after, here:

* ``rank``: the value's percentile rank among that date's stocks, ties averaged, centred on 0
  (``(rank - 1) / (n - 1) - 0.5``, in [-0.5, 0.5]);
* ``zscore``: ``(value - date mean) / date std`` (0 where every stock has the same value);
* ``demean``: ``value - date mean`` (the market-relative features).

Nothing is fitted: a date's values depend on that date's rows only, so there is no look-ahead
across dates.  A value that is not known (NaN: the forward return of the last bars) stays NaN and
takes no part in its date's statistics.  Dates with fewer than ``min_names`` stocks are dropped
(and counted): a rank or a z-score over two stocks says little.

Memory: one column of every row at a time, independent of the number of features.  The pass holds
the date code of every row, one source column and its result, and a rank's sort orders and run
ids while it ranks: about 80 bytes a row at its peak (measured with ``bench/cross_section_memory.py``:
934k rows, 291 MiB against 220 MiB for the per-ticker build, 2026-12-01), so about 0.8 GB at
10M rows.  Each result waits in a memory-mapped file of raw float64 until the per-file rewrite at
the end, which holds one staged group (``features.group_rows``).  With Ray, each bucket of dates
is a task of its own: a task holds its dates' rows of one column.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

from alchemetric_ray.errors import CrossSectionError

KINDS = ("rank", "zscore", "demean")
STAGED_SUFFIX = ".arrow"  # a staged part: uncompressed Arrow IPC (Feather v2)


def write_staged(table: pa.Table, path: Path, *, like: Path | None = None) -> None:
    """A staged table as uncompressed Arrow IPC (Feather v2): no encoding or compression to pay on the way
    out or back in (630k rows x 20 columns, measured: Parquet 0.32 s to write, 0.48 s to read; this
    0.03 s and 0.12 s), and read back memory-mapped (:func:`read_staged`).  A ``.parquet`` path (the
    inputs ``signals/predict.py`` stages) stays Parquet; ``like``: the file whose format ``path`` takes."""
    if Path(like or path).suffix == ".parquet":
        pq.write_table(table, path)
    else:
        feather.write_feather(table, str(path), compression="uncompressed")


def read_staged(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A staged part (:func:`write_staged`), memory-mapped: the columns asked for are paged in as read."""
    if Path(path).suffix == ".parquet":
        return pq.read_table(path, columns=columns)
    return feather.read_table(str(path), columns=columns, memory_map=True)


@dataclass(frozen=True)
class Op:
    """``target = kind(source)`` per date (target may be source: in place)."""

    target: str
    source: str
    kind: str


@dataclass
class CrossSectionReport:
    dates_kept: int
    dates_dropped: int
    rows_dropped: int
    max_names: int  # the most stocks on any one date
    min_names: int  # the threshold applied
    kept_dates: np.ndarray | None = None  # the dates kept, sorted (not part of the manifest's record)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "kept_dates"}


# ---- the transforms on one column (code: the row's date as 0..n_dates-1) ----------------------


def demean_by_date(values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
    counts = np.bincount(code, minlength=n_dates)
    means = np.bincount(code, weights=values, minlength=n_dates) / np.maximum(counts, 1)
    return values - means[code]


def zscore_by_date(values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
    counts = np.maximum(np.bincount(code, minlength=n_dates), 1)
    centred = demean_by_date(values, code, n_dates)
    std = np.sqrt(np.bincount(code, weights=centred * centred, minlength=n_dates) / counts)
    scale = std[code]
    return np.divide(centred, scale, out=np.zeros_like(centred), where=scale > 1e-12)


def rank_by_date(values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
    """Percentile rank within the date, ties averaged, centred on 0; a date of one stock gives 0."""
    n = np.bincount(code, minlength=n_dates)[code].astype(np.float64)
    return np.divide(group_rank(values, code) - 1, n - 1, out=np.full(len(values), 0.5), where=n > 1) - 0.5


# ---- grouped primitives (also the evaluation's daily IC, signals/metrics.py) ----------------------

_REL_STD_TOL = 1e-10  # a date whose values spread less than this (relative to their size) is constant


def _group_sort_order(values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (codes, values): a value argsort, then a stable (radix, for
    codes < 2**16) argsort by group -- about twice as fast as ``np.lexsort`` at 1M rows."""
    o1 = np.argsort(values)
    g = codes[o1]
    if g.size and g.max() < 2**16:
        g = g.astype(np.uint16)
    return o1[np.argsort(g, kind="stable")]


def group_rank(values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """1-based average ranks (ties share the mean rank) of ``values`` within each group ``codes``."""
    n = values.size
    if n == 0:
        return np.empty(0)
    order = _group_sort_order(values, codes)
    v = values[order]
    g = codes[order]
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    new_group[1:] = g[1:] != g[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    pos = np.arange(n) - group_start + 1.0  # 1-based position inside the group
    new_run = new_group.copy()
    new_run[1:] |= v[1:] != v[:-1]
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], n) - 1
    avg = (pos[starts] + pos[ends]) / 2.0  # mean of consecutive positions
    ranks = np.empty(n)
    ranks[order] = avg[run_id]
    return ranks


def grouped_corr(x: np.ndarray, y: np.ndarray, codes: np.ndarray, n_groups: int):
    """Per-group Pearson correlation (two-pass, centred) and counts; NaN where a side is constant."""
    cnt = np.bincount(codes, minlength=n_groups).astype(np.float64)
    safe = np.where(cnt > 0, cnt, 1.0)
    mx = np.bincount(codes, x, n_groups) / safe
    my = np.bincount(codes, y, n_groups) / safe
    dx = x - mx[codes]
    dy = y - my[codes]
    sxx = np.bincount(codes, dx * dx, n_groups)
    syy = np.bincount(codes, dy * dy, n_groups)
    sxy = np.bincount(codes, dx * dy, n_groups)
    ax = np.bincount(codes, np.abs(x), n_groups) / safe
    ay = np.bincount(codes, np.abs(y), n_groups) / safe
    const_x = (sxx <= 0) | (sxx / safe <= (_REL_STD_TOL * ax) ** 2)
    const_y = (syy <= 0) | (syy / safe <= (_REL_STD_TOL * ay) ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = sxy / np.sqrt(sxx * syy)
    corr = np.clip(corr, -1.0, 1.0)
    corr[const_x | const_y] = np.nan
    return corr, cnt


_TRANSFORMS = {"rank": rank_by_date, "zscore": zscore_by_date, "demean": demean_by_date}


def transform_column(kind: str, values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
    """One op's transform of one column's known values (``code``: their dates as 0..n_dates-1)."""
    if kind not in _TRANSFORMS:
        raise ValueError(f"unknown cross-section kind {kind!r} (known: {', '.join(KINDS)})")
    return _TRANSFORMS[kind](values, code, n_dates)


def date_buckets(code: np.ndarray, n_dates: int, buckets: int) -> list[tuple[int, int]]:
    """At most ``buckets`` contiguous ranges of date codes ``[lo, hi)`` covering ``0..n_dates``, of about
    the same number of rows each (a date is never split: its rows are the unit of every transform)."""
    if n_dates <= 0:
        return []
    counts = np.cumsum(np.bincount(code, minlength=n_dates))
    total = int(counts[-1]) if len(counts) else 0
    cuts = {int(np.searchsorted(counts, total * k / buckets, side="left")) + 1 for k in range(1, buckets)}
    edges = sorted({0, n_dates, *(c for c in cuts if 0 < c < n_dates)})
    return list(zip(edges[:-1], edges[1:]))


# ---- over a folder of per-ticker files ------------------------------------------------------


Transform = Callable[[str, np.ndarray, np.ndarray, int], np.ndarray]


def apply_cross_section(files: list[Path], ops: list[Op], *, min_names: int, what: str,
                        transform: Transform | None = None) -> CrossSectionReport:
    """Apply ``ops`` in order to the staged ``files`` (:func:`write_staged`; rows ordered by ticker, then date;
    rewritten in place, each through a temporary file), dropping the rows of dates with fewer than ``min_names`` stocks.
    ``what`` names the data in the error raised when no date has enough stocks.  ``transform``: what
    computes one column (:func:`transform_column`'s arguments and result; the build's Ray tasks by
    buckets of dates), else :func:`transform_column` here."""
    keys = [read_staged(f, columns=["date"]).column("date").to_numpy() for f in files]
    sizes = [len(k) for k in keys]
    dates, code = np.unique(np.concatenate(keys) if keys else np.array([], "datetime64[ns]"), return_inverse=True)
    del keys
    per_date = np.bincount(code, minlength=len(dates))
    keep_date = per_date >= min_names
    if not keep_date.any():
        most = int(per_date.max()) if len(per_date) else 0
        raise CrossSectionError(f"{what}: no date has {min_names} or more stocks (features.min_cross_section; the "
                                f"most on any date: {most}), so there is no cross-section to rank or normalize")
    keep_row = keep_date[code]
    remap = np.cumsum(keep_date) - 1  # kept dates renumbered 0..kept-1
    kept_code = remap[code[keep_row]].astype(np.int64)
    n_kept = int(keep_date.sum())
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    with tempfile.TemporaryDirectory(prefix="alchemetric-cs-") as tmp:
        results: dict[str, Path] = {}
        for k, op in enumerate(ops):
            if op.kind not in _TRANSFORMS:
                raise ValueError(f"unknown cross-section kind {op.kind!r} (known: {', '.join(KINDS)})")
            if op.source in results:  # a column an earlier op has already rewritten
                column = np.fromfile(results[op.source], dtype=np.float64)
            else:
                column = _read_column(files, op.source)[keep_row]
            column = column.astype(np.float64)
            finite = np.isfinite(column)  # a value not known yet (the last bars' forward return) stays NaN
            out = np.full(len(column), np.nan)
            out[finite] = (transform or transform_column)(op.kind, column[finite], kept_code[finite], n_kept)
            results[op.target] = Path(tmp) / f"{k}.f64"  # raw float64: read back as plain numbers
            out.tofile(results[op.target])
            del column, out
        arrays = {name: np.memmap(path, dtype=np.float64, mode="r") for name, path in results.items()}
        kept_before = np.concatenate(([0], np.cumsum(keep_row)))  # kept rows before each global row
        for i, f in enumerate(files):
            lo, hi = offsets[i], offsets[i + 1]
            mask = keep_row[lo:hi]
            table = read_staged(f).filter(pa.array(mask))
            start = kept_before[lo]
            for name, values in arrays.items():
                column = np.asarray(values[start:start + table.num_rows])
                dtype = table.schema.field(name).type if name in table.column_names else pa.float64()
                array = pa.array(column).cast(dtype)
                table = (table.set_column(table.column_names.index(name), name, array)
                         if name in table.column_names else table.append_column(name, array))
            part = f.with_name(f.name + ".tmp")
            write_staged(table, part, like=f)
            del table  # the old file's mapping goes before the file is replaced
            part.replace(f)
    return CrossSectionReport(dates_kept=n_kept, dates_dropped=int((~keep_date).sum()),
                              rows_dropped=int((~keep_row).sum()), max_names=int(per_date.max()), min_names=min_names,
                              kept_dates=dates[keep_date])


def _read_column(files: list[Path], name: str) -> np.ndarray:
    parts = [read_staged(f, columns=[name]).column(name).to_numpy() for f in files]
    return np.concatenate(parts) if parts else np.zeros(0)


def plan_ops(names: list[str], spec, normalize: str) -> list[Op]:
    """The per-date operations a feature set and label need, in the order they apply: the
    market-relative features demeaned, then every feature normalized across the date's stocks
    (``features.cs_normalize``), then the cross-sectional label from the forward return."""
    from alchemetric_ray.data.features import cross_sectional_names
    from alchemetric_ray.data.labels import CROSS_SECTION_KIND

    ops = [Op(name, name, "demean") for name in cross_sectional_names(names)]
    if normalize != "none":
        ops += [Op(name, name, normalize) for name in names]
    if spec.scheme in CROSS_SECTION_KIND:
        ops.append(Op("label", "fwd_ret", CROSS_SECTION_KIND[spec.scheme]))
    return ops


def quantile_legs(score: np.ndarray, group: np.ndarray, n_groups: int,
                  quantile: float) -> tuple[np.ndarray, np.ndarray]:
    """(long, short) masks of the top and bottom ``quantile`` of each group's scores (a date, or a
    rebalance period): with n names, k = max(1, floor(quantile * n)); rank the scores (ties share
    their average rank r); long r >= n - k + 1, short r <= k."""
    n_names = np.bincount(group, minlength=n_groups).astype(np.float64)
    leg_size = np.maximum(1.0, np.floor(quantile * n_names + 1e-9))  # k
    rank = group_rank(score, group)  # r: 1-based, ties share their average rank
    return rank >= (n_names - leg_size + 1.0)[group], rank <= leg_size[group]


LONG_SHORT_MIN_NAMES = 5  # fewer stocks on a date (or in a period): no long-short book there


def long_short_weights(score: np.ndarray, group: np.ndarray, n_groups: int, quantile: float,
                       min_names: int = LONG_SHORT_MIN_NAMES) -> np.ndarray:
    """The one long-short book of the project, per row: the equal-weight, dollar-neutral
    top-minus-bottom ``quantile`` book of each group (a date, or a rebalance period), gross 1:
    each long weighs +0.5 / n_long, each short -0.5 / n_short (:func:`quantile_legs`).  A group with
    fewer than ``min_names`` stocks or an empty leg (a constant score ranks every name the same)
    holds nothing.  The period return is then ``sum(weight * simple_return)`` over the group's rows:
    what training's per-date validation book (``scoring.metrics``) and the evaluation's portfolio with
    costs (``signals.portfolio.long_short``) both take."""
    count = np.bincount(group, minlength=n_groups)
    is_long, is_short = quantile_legs(score, group, n_groups, quantile)
    n_long = np.bincount(group, is_long, n_groups)
    n_short = np.bincount(group, is_short, n_groups)
    trades = (count >= min_names) & (n_long > 0) & (n_short > 0)
    weight = np.zeros(len(score))
    weight[is_long] = np.where(trades, 0.5 / np.maximum(n_long, 1), 0.0)[group[is_long]]
    weight[is_short] = np.where(trades, -0.5 / np.maximum(n_short, 1), 0.0)[group[is_short]]
    return weight


def book_trades(weight: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: whether the book of :func:`long_short_weights` holds anything there."""
    return np.bincount(group, np.abs(weight), n_groups) > 0
