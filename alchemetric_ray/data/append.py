"""``features --append``: the bars after a shard folder's last date, added without rebuilding it.

An append computes only the rows that change and leaves the folder as a fresh build of all the bars
would be, row for row, for every row that build labels (``tests/test_append.py``):

1. **Settings**: the shards' own (``manifest.built_with``; an override that conflicts is refused, as
   for training on shards).  The new bars are read through the same ingest as a build (one file of
   many tickers that ingest would keep as it is: whole, ``bars/columnar.py``).
2. **Revisions**: a new bar for a date the folder already keeps must equal the kept one (open, high,
   low, close, volume, to 1e-9 relative), checked against the tails (``data/tails.py``: each ticker's
   last bars), or the bars store (``OUT/bars/``, the build's input bars,
   :mod:`~alchemetric_ray.data.bars_store`) for an older one; otherwise the append is refused in one
   line naming the ticker, the date and both closes, and ``--rebuild`` rebuilds the folder from the
   kept bars merged with the new ones.
3. **Rows**: per ticker, the rows after its last row in the shards: its newest ``reach`` kept bars had
   no label at the last build (so they were not written) and have one now, then the new bars'.  They
   are computed from its tail (the bars its first new row looks back on) and the new bars, its EMAs
   resumed from their states after its last row (``features.Panel.ewm``), by
   :func:`_resumed_rows`.  A ticker without them (new to the folder, a folder built before tails were
   kept) is computed from the bars store: :func:`tail_bars` kept bars before its first row to write,
   enough for the longest warm-up and for the slowest EMA to forget where they start (to
   ``EMA_TOLERANCE``).
4. **Per-date pass** (a cross-sectional label or feature): a date's values depend on that date's rows
   only, so it runs over every row of the dates from the first new row on (``A0``); where another
   ticker already has rows on those dates (its bars ended later than the first new row's), its rows
   from ``A0`` are computed again with the rest, from the bars store.
5. **Split and normalization**: the manifest's split plan (its test segment now ends at the last new
   row) and its train-fitted normalizer, unchanged.  Rows must fall in the test segment: a row that
   would land in train or val (a ticker new to the folder with years of history) is refused, since
   the normalization fitted on train would change (``--rebuild``).  Rows without a label yet (the
   newest ``reach`` bars) are not written, as in a build: they join at the next append.
6. **Writing** (``data/append_write.py``): each test file's tickers' new rows as a continuation of it
   (``part-NNNNN.K.parquet``; a sequence model's windows are built a chain of files at a time, so a
   ticker's new windows reach back into its earlier rows), the new rows of a ticker outside every
   file's range as a new file; where rows of the test segment were computed again (4.), the segment
   is written again instead.  Then the new bars as a new ``bars/part-NNNNN.parquet``, the tails
   brought up to date as a new ``tails/part-NNNNN.parquet``, then the manifest (atomically), with
   ``files``, ``rows``, ``class_counts``, ``tickers``, the test segment's end and an ``appends`` entry.
   Only then are the files it no longer lists removed.  A failure or an interrupt before the manifest
   is written removes every file the append wrote: the folder is left as it was.

Local folders only (a shard folder on object storage is refused in one line).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from alchemetric_ray.data import bars_store
from alchemetric_ray.data import tails as tails_store
from alchemetric_ray.data.append_bars import (
    BAR_COLUMNS,
    KeptBars,
    bare,
    bars_parts,
    dates_of,
    day,
    digest,
    kept_dates,
    load_kept,
    read_new,
    revision_line,
)
from alchemetric_ray.data.append_bars import REVISION_RTOL as REVISION_RTOL  # re-exported: the check is there
from alchemetric_ray.data.append_bars import last_rows as shard_last_rows
from alchemetric_ray.data.append_bars import revisions as find_revisions
from alchemetric_ray.data.append_write import NewRows, write
from alchemetric_ray.data.features import warmup_bars
from alchemetric_ray.data.manifest import MANIFEST, Manifest, reconcile_features
from alchemetric_ray.data.splits import SPLITS
from alchemetric_ray.data.staging import min_history
from alchemetric_ray.data.tails import Tails
from alchemetric_ray.errors import CrossSectionError, ShardError
from alchemetric_ray.storage import Location, locate

# The EMAs of features.py and their smoothing factors: Wilder's RSI(14) and ATR(14) (alpha = 1/14),
# MACD's EMA12 and EMA26 (2/13, 2/27) and its signal line's EMA9 (2/10), all adjust=False.  An EMA
# started k bars before a row differs from one started at the first bar by (1 - alpha)^k of the
# difference of their starting values, so k bars of the slowest one make that < EMA_TOLERANCE.
EMA_ALPHAS = {"rsi_14/atr_14": 1 / 14, "macd EMA26": 2 / 27, "macd EMA12": 2 / 13, "macd_hist signal EMA9": 2 / 10}
EMA_TOLERANCE = 1e-12
EMA_BARS = math.ceil(math.log(EMA_TOLERANCE) / math.log(1 - min(EMA_ALPHAS.values())))  # 373 (alpha 1/14)
GROUP_TICKERS = 64  # tickers per compute_group call


def tail_bars(names: list[str]) -> int:
    """Kept bars a ticker's recomputation starts before its first row to write: the longest warm-up
    of ``names``, then EMA_BARS for the EMAs to converge."""
    return warmup_bars(names) + EMA_BARS


@dataclass
class AppendSummary:
    """What an append (or ``--rebuild``) did; ``appended`` False: nothing new, nothing written."""

    out: Location
    manifest: Manifest
    seconds: float
    line: str
    appended: bool = True


# ---- the entry point ---------------------------------------------------------------------------


@dataclass
class _Job:
    """One append: the folder, its manifest, tails (None: it keeps none) and bars store, the new bars."""

    cfg: Any
    where: Location
    manifest: Manifest
    parts: list[Path]  # the bars store's files
    new: Mapping[str, pd.DataFrame]  # ticker -> the bars read
    description: str  # where they were read from
    tails: Tails | None = None
    start: float = field(default_factory=time.monotonic)

    @property
    def folder(self) -> Path:
        return self.where.local

    @functools.cached_property
    def dates(self) -> dict[str, np.ndarray]:
        """ticker -> its kept bars' dates (the whole bars store read: only where the tails do not do)."""
        return kept_dates(self.parts)

    @functools.cached_property
    def kept_last(self) -> dict[str, np.datetime64]:
        if self.tails is not None:
            return self.tails.last_bar()
        return {t: d[-1] for t, d in self.dates.items() if len(d)}

    def nothing(self) -> AppendSummary:
        last = day(max(self.kept_last.values())) if self.kept_last else "-"
        line = (f"nothing to append: the {len(self.new)} ticker(s) read from {self.description} have no bar after "
                f"{self.where}'s last date {last}")
        return AppendSummary(self.where, self.manifest, time.monotonic() - self.start, line, appended=False)

    def summary(self, manifest: Manifest, line: str) -> AppendSummary:
        return AppendSummary(self.where, manifest, time.monotonic() - self.start, line)


def append_bars(cfg, out: str | Path | Location, *, rebuild: bool = False, progress: bool = False) -> AppendSummary:
    """Append the bars of ``cfg.data`` to the shard folder ``out`` (see the module's docstring);
    ``rebuild``: rebuild ``out`` from its kept bars merged with the new ones (the new win) instead."""
    job = _open(cfg, out)
    if rebuild:
        return _rebuild(job, progress)
    # the new bars in one set of columns where they allow it (else frames without the ingest's source
    # names, which only a rebuild's build uses)
    if not isinstance(job.new, KeptBars):
        job.new = KeptBars.from_frames(dict(job.new)) or {t: bare(f) for t, f in job.new.items()}
    kept_last = job.kept_last
    added: Mapping[str, pd.DataFrame]
    if isinstance(job.new, KeptBars):
        after = job.new.per_row(kept_last, np.iinfo(np.int64).min)  # a ticker the folder lacks: all its bars
        added = job.new.rows_where(job.new.cols["date"].view(np.int64) > after)
    else:
        added = {t: f[f["date"].to_numpy() > kept_last[t]] if t in kept_last else f for t, f in job.new.items()}
        added = {t: f.reset_index(drop=True) for t, f in added.items() if len(f)}
    if job.tails is not None:
        return _resumed(job, added)
    last_rows = shard_last_rows(job.folder, job.manifest)
    kept = load_kept(job.parts, _kept_since(job, added, last_rows))
    revisions = find_revisions(job.new, kept, kept_last)
    if revisions:
        raise ShardError(revision_line(revisions, str(out), job.new, kept))
    if not added:
        return job.nothing()
    rows, a0, cs_record, count = _new_rows(job, kept, added, last_rows)
    return write(job, NewRows(rows, a0, cs_record, computed={"from_tails": 0, "from_bars": count}), added)


def _resumed(job: _Job, added: Mapping[str, pd.DataFrame]) -> AppendSummary:
    """The append of a folder that keeps tails: each ticker's new rows computed from its tail and its EMAs'
    states (:func:`_resumed_rows`); from the bars store only a ticker without them, or one whose rows of
    dates before its new ones must be computed again (the per-date pass, where tickers' bars end on
    different dates); the tails brought up to date."""
    tails = cast(Tails, job.tails)
    kept = KeptBars(tails.tickers, tails.lengths, tails.cols)
    last_rows = {t: d for t, d in zip(tails.tickers, tails.last_row) if not np.isnat(d)}
    _check_revisions(job, kept)
    if not added:
        return job.nothing()
    names, spec = list(job.manifest.features), job.manifest.label_spec
    index = tails.index
    fast = sorted(t for t in added if t in index and not np.isnat(tails.checkpoint[index[t]]))
    rows, computed = _resumed_rows(fast, tails, added, names, spec)
    slow = sorted(set(added) - set(fast))
    if slow:  # a ticker new to the folder (its bars are all in ``added``), or one without its EMAs' states
        more, more_tails = _from_store(job, slow, added, {t: _next(last_rows.get(t)) for t in slow}, last_rows)
        rows, computed = pd.concat([rows, more], ignore_index=True), [*computed, more_tails]
    a0: Any = None
    cs_record: dict = {}
    again: list[str] = []
    if job.manifest.cross_section and not rows.empty:
        a0 = rows["date"].min().to_datetime64()
        # every row of the dates from the first new one on (a date's values depend on all its rows): the
        # tickers whose rows reach that date already are computed again from it, from the bars store
        again = sorted(t for t, d in last_rows.items() if d >= a0)
        if again:
            more, more_tails = _from_store(job, again, added, {t: a0 for t in again}, {t: a0 for t in again})
            rows = pd.concat([rows[~rows["ticker"].isin(again)], more], ignore_index=True)
            computed.append(more_tails)
        rows, cs_record = _cross_section(rows, names, spec, job.cfg, job.description)
    from_bars = set(slow) | set(again)
    how = {"from_tails": len(set(fast) - from_bars), "from_bars": len(from_bars)}
    return write(job, NewRows(rows, a0, cs_record, _merged(tails, computed), how, rewrite=bool(again)), added)


def _check_revisions(job: _Job, tails_bars: KeptBars) -> None:
    """A new bar for a date the folder keeps must be the kept bar: checked against the tails, or the bars
    store for a new bar older than its ticker's tail."""
    kept_last = job.kept_last
    deep: dict[str, np.datetime64] = {}
    for t in job.new:
        if t in kept_last and t in tails_bars:
            first = dates_of(job.new, t).min()
            if first <= kept_last[t] and first < dates_of(tails_bars, t)[0]:
                deep[t] = first
    shallow = {t: d for t, d in kept_last.items() if t not in deep}
    kept: Mapping[str, pd.DataFrame] = tails_bars
    found = find_revisions(job.new, tails_bars, shallow)
    if deep:
        kept = load_kept(job.parts, deep)
        found = sorted([*found, *find_revisions(job.new, kept, {t: kept_last[t] for t in deep})],
                       key=lambda r: (r.ticker, r.date))
        kept = {t: (kept if t in deep else tails_bars)[t] for t in {r.ticker for r in found}}
    if found:
        raise ShardError(revision_line(found, str(job.where), job.new, kept))


def _resumed_rows(tickers: list[str], tails: Tails, added: Mapping[str, pd.DataFrame], names: list[str],
                  spec) -> tuple[pd.DataFrame, list[pa.Table]]:
    """The rows after each ticker's checkpoint (its last row; raw features, before the per-date pass) from
    its tail and new bars, its EMAs resumed from their states there; and the tails rows brought up to date."""
    from alchemetric_ray.data.features import EmaStates, Panel
    from alchemetric_ray.data.panel import panel_columns

    if not tickers:
        return pd.DataFrame(), []
    index = tails.index
    which = np.array([index[t] for t in tickers], dtype=np.int64)
    starts, tail_lengths = tails.starts[which], tails.lengths[which]
    new = added if isinstance(added, KeptBars) else KeptBars.from_frames({t: added[t] for t in tickers})
    if new is None:  # frames of other columns or types: one set of columns of the bars' own
        new = KeptBars(tickers, np.array([len(added[t]) for t in tickers], dtype=np.int64),
                       {c: np.concatenate([_added_arrays(added, t)[c] for t in tickers]) for c in BAR_COLUMNS})
    new_starts, new_lengths = (np.array(v, dtype=np.int64) for v in zip(*[new.bounds[t] for t in tickers]))
    new_lengths = new_lengths - new_starts
    # each ticker's tail, then its new bars: gathered from both column sets by index arithmetic
    lengths = tail_lengths + new_lengths
    first = np.cumsum(lengths) - lengths
    pos = np.arange(int(lengths.sum())) - np.repeat(first, lengths)  # a row's bar number in its ticker
    in_tail = pos < np.repeat(tail_lengths, lengths)
    from_tail = (np.repeat(starts, lengths) + pos)[in_tail]
    from_new = (np.repeat(new_starts - tail_lengths, lengths) + pos)[~in_tail]
    columns = {}
    for c in BAR_COLUMNS:
        column = np.empty(len(pos), dtype=np.result_type(tails.cols[c].dtype, new.cols[c].dtype))
        column[in_tail], column[~in_tail] = tails.cols[c][from_tail], new.cols[c][from_new]
        columns[c] = column
    dates = columns["date"].astype("datetime64[ns]")
    resume_at = tail_lengths - 1 - spec.reach  # the checkpoint: the tail's bar `reach` before its last
    panel_starts = np.cumsum(lengths) - lengths
    if (resume_at < 0).any() or (dates[panel_starts + np.maximum(resume_at, 0)] != tails.checkpoint[which]).any():
        raise ShardError(f"{tails.tickers[0]}..: the folder's tails do not match its checkpoints; rebuild it: "
                         "--append --rebuild")
    panel = Panel({c: columns[c].astype(np.float64) for c in ("open", "high", "low", "close", "volume")}, lengths)
    panel.resume = EmaStates(resume_at, {k: v[which] for k, v in tails.emas.items()})
    panel.keep_emas_at = tails_store.ema_keep_at(lengths, spec.reach)
    cols, _ = panel_columns(panel, dates, names, spec)
    keep = cols["has_features"] & np.isfinite(cols["label"]) & (panel.pos > resume_at[panel.tid])
    last = resume_at.copy()  # no new row: the last one is still the checkpoint
    np.maximum.at(last, panel.tid[keep], panel.pos[keep])
    emas = EmaStates(panel.keep_emas_at, panel.kept_emas)
    updated = tails_store.record(tickers, {**columns, "date": dates}, lengths, last, emas,
                                 tails_store.tail_length(names, spec.reach))
    at = np.flatnonzero(keep)
    rows = pd.DataFrame({"date": dates[at], "ticker": np.asarray(tickers, dtype=object)[panel.tid[at]],
                         **{n: cols[n][at] for n in names}, "label": cols["label"][at], "fwd_ret": cols["fwd_ret"][at],
                         "label_end": cols["label_end"][at].astype("datetime64[ns]")})
    return rows, [updated]


def _added_arrays(added: Mapping[str, pd.DataFrame], ticker: str) -> dict[str, np.ndarray]:
    if isinstance(added, KeptBars):
        return added.arrays(ticker)
    frame = added[ticker]
    return {c: frame[c].to_numpy() for c in BAR_COLUMNS}


def _from_store(job: _Job, tickers: list[str], added: Mapping[str, pd.DataFrame], start_of: dict[str, Any],
                keep_from: dict[str, Any]) -> tuple[pd.DataFrame, pa.Table]:
    """The rows of ``tickers`` from ``keep_from[ticker]`` on (a datetime64; None: all), computed from the
    bars store's kept bars (:func:`tail_bars` before ``start_of[ticker]``) and the new ones; and their
    tails rows."""
    tail = tail_bars(list(job.manifest.features))
    since: dict[str, np.datetime64] = {}
    for t in tickers:
        d = job.dates.get(t)
        if d is None or not len(d):
            continue
        i = int(np.searchsorted(d, start_of[t], "left")) if start_of.get(t) is not None else 0
        since[t] = d[min(max(0, i - tail), len(d) - 1)]
    kept = load_kept(job.parts, since)
    names = list(job.manifest.features)
    windows = _windows(tickers, kept, added, start_of, tail)
    rows, records = _compute(windows, names, job.manifest.label_spec, min_history(job.cfg), keep_from, tails=True)
    return rows, pa.concat_tables(records)


def _merged(tails: Tails, computed: list[pa.Table]) -> pa.Table:
    """The folder's tails with the rows of ``computed`` in place of their tickers' (new tickers added), by
    ticker."""
    new = pa.concat_tables([t for t in computed if t.num_rows]) if any(t.num_rows for t in computed) else None
    old = tails.table()
    if new is None:
        return old
    # a ticker computed twice (from its tail, then again from the bars store): the last
    last = {t: i for i, t in enumerate(new.column("ticker").to_pylist())}
    new = new.take(pa.array(sorted(last.values()), type=pa.int64()))
    keep = np.array([t not in last for t in tails.tickers], dtype=bool)
    both = pa.concat_tables([old.filter(pa.array(keep)), new.select(old.column_names)])
    return both.sort_by("ticker")


def _open(cfg, out: str | Path | Location) -> _Job:
    """The shard folder to append to, checked; its settings over ``cfg``; the new bars read."""
    from alchemetric_ray.outputs import claim

    start = time.monotonic()
    where = locate(out)
    if not where.is_local:
        raise ShardError(f"--out {out}: --append works on a local shard folder only for now (build the shards "
                         "whole on object storage, or append to a local copy and upload it)")
    folder = where.local
    if not (folder / MANIFEST).is_file():
        raise ShardError(f"--append: {out} holds no feature shards (no {MANIFEST}); build them first with "
                         f"alchemetric-ray features --data DIR --out {out}")
    claim(where, "shards", what="--out")
    manifest = Manifest.read(folder)
    parts = bars_parts(folder, manifest)
    missing = [p for p in parts if not p.is_file()]
    if not parts or not manifest.built_with or missing:
        why = f"its bars store lacks {missing[0].relative_to(folder)}" if missing else \
            f"it keeps no bars ({bars_store.BARS_DIR}/): it was built before builds kept their input bars"
        raise ShardError(f"--append: {out} cannot be appended to ({why}); rebuild it from all the bars: "
                         f"alchemetric-ray features --data ALL_BARS --out {out}")
    cfg = reconcile_features(cfg, manifest, str(where), appending=True)
    new, description = read_new(cfg)
    return _Job(cfg, where, manifest, parts, new, description, tails_store.read(folder, manifest.files), start)


def _kept_since(job: _Job, added: Mapping[str, pd.DataFrame],
                last_rows: dict[str, np.datetime64]) -> dict[str, np.datetime64]:
    """ticker -> the first kept bar to read: the overlap with the new bars (to check) and the tail that
    its rows to write are computed from (with a per-date pass: of every ticker trading from the first
    possible new row on)."""
    tail = tail_bars(list(job.manifest.features))
    cross = bool(job.manifest.cross_section)
    firsts = [_first_after(job.dates.get(t), dates_of(added, t), last_rows.get(t)) for t in added]
    bound = min((d for d in firsts if d is not None), default=None)  # no new row is earlier
    since: dict[str, np.datetime64] = {}
    for t, d in job.dates.items():
        if not len(d):
            continue
        points = []
        if t in job.new:
            points.append(int(np.searchsorted(d, dates_of(job.new, t).min(), "left")))
        again = cross and bound is not None and d[-1] >= bound
        if t in added or again:
            after = int(np.searchsorted(d, last_rows[t], "right")) if t in last_rows else 0
            if again and bound is not None:
                after = min(after, int(np.searchsorted(d, bound, "left")))
            points.append(max(0, after - tail))
        if points:
            since[t] = d[min(min(points), len(d) - 1)]
    return since


def _first_after(dates: np.ndarray | None, added: np.ndarray | None, last_row) -> np.datetime64 | None:
    """The date of a ticker's first bar after its last row in the shards (kept or new)."""
    if dates is not None and len(dates):
        i = int(np.searchsorted(dates, last_row, "right")) if last_row is not None else 0
        if i < len(dates):
            return dates[i]
    if added is not None and len(added):
        return added[0]
    return None


# ---- computing the rows ------------------------------------------------------------------------


_Gathered = tuple[list[str], pd.DataFrame, np.ndarray]  # tickers, their bars one below the other, row counts
_Windows = list[tuple[str, pd.DataFrame]] | _Gathered


def _windows(tickers: list[str], kept: Mapping[str, pd.DataFrame], added: Mapping[str, pd.DataFrame],
             start_of: dict[str, Any], tail: int) -> _Windows:
    """Each ticker's bars from ``tail`` bars before its first bar at or after ``start_of[ticker]``
    (None: all of them): the kept tail, then the new bars; (ticker, frame) pairs, or where both are
    column sets, the tickers, one frame of all their windows and their row counts."""
    if isinstance(kept, KeptBars) and isinstance(added, KeptBars) and \
            all(kept.cols[c].dtype == added.cols[c].dtype for c in BAR_COLUMNS):
        return _gathered_windows(tickers, kept, added, start_of, tail)
    frames = []
    for t in tickers:
        first = start_of.get(t)
        frames_of = [f for f in (kept.get(t), added.get(t)) if f is not None and len(f)]
        bars = pd.concat(frames_of, ignore_index=True) if len(frames_of) > 1 else frames_of[0].reset_index(drop=True)
        i = int(np.searchsorted(bars["date"].to_numpy(), first, "left")) if first is not None else 0
        frames.append((t, bars.iloc[max(0, i - tail):].reset_index(drop=True)))
    return frames


def _gathered_windows(tickers: list[str], kept: KeptBars, added: KeptBars, start_of: dict[str, Any],
                      tail: int) -> _Gathered:
    """:func:`_windows` by index arithmetic: each window's rows of the two column sets (of the same
    dtypes) found by offsets, gathered at once into one frame."""
    offset = len(kept.cols["date"])  # the new bars' rows come after the kept ones in the gathered source
    take: list[np.ndarray] = []
    lengths = []
    for t in tickers:
        klo, khi = kept.bounds.get(t, (0, 0))
        alo, ahi = added.bounds.get(t, (0, 0))
        first = start_of.get(t)
        if first is not None:
            dates = np.concatenate([kept.cols["date"][klo:khi], added.cols["date"][alo:ahi]])
            i = int(np.searchsorted(dates, first, "left"))
        else:
            i = 0
        start = max(0, i - tail)
        nk = khi - klo
        rows = np.concatenate([np.arange(klo + min(start, nk), khi),
                               np.arange(offset + alo + max(0, start - nk), offset + ahi)])
        take.append(rows)
        lengths.append(len(rows))
    index = np.concatenate(take) if take else np.zeros(0, dtype=np.int64)
    big = pd.DataFrame({c: np.concatenate([kept.cols[c], added.cols[c]])[index] for c in BAR_COLUMNS})
    return list(tickers), big, np.array(lengths, dtype=np.int64)


def _compute(frames: _Windows, names: list[str], spec, need: int, keep_from: dict[str, Any], *,
             tails: bool = False) -> tuple[pd.DataFrame, list[pa.Table]]:
    """compute_group over ``frames`` (:func:`_windows`), a group at a time; each ticker's rows from
    ``keep_from[ticker]`` on (inclusive, a datetime64); with ``tails``, also the tickers' tails rows
    (``data/tails.py``) from their windows."""
    from alchemetric_ray.data.panel import compute_group

    out, records = [], []
    count = len(frames[0]) if isinstance(frames, tuple) else len(frames)
    for i in range(0, count, GROUP_TICKERS):
        if isinstance(frames, tuple):
            table, record = _group_table(frames, slice(i, i + GROUP_TICKERS), names, spec, need, tails)
        else:
            result = compute_group(frames[i:i + GROUP_TICKERS], names, spec, need, tails=tails)
            table, record = result.table, result.tails
        if record is not None:
            records.append(record)
        if not table.num_rows:
            continue
        rows = table.to_pandas()
        rows["date"] = rows["date"].astype("datetime64[ns]")
        rows["label_end"] = rows["label_end"].astype("datetime64[ns]")
        cut = rows["ticker"].map(keep_from)
        out.append(rows[cut.isna() | (rows["date"] >= cut)])
    if not out:
        return pd.DataFrame(), records
    return pd.concat(out, ignore_index=True), records


def _group_table(gathered: _Gathered, group: slice, names: list[str], spec, need: int,
                 tails: bool = False) -> tuple[pa.Table, pa.Table | None]:
    """``compute_group(...).table`` (and ``.tails`` where asked) of the tickers ``group`` of ``gathered``,
    from its frame's rows of them (compute_group's own steps, without a frame per ticker or the bars'
    digests, unused here)."""
    from alchemetric_ray.data.features import EmaStates, Panel
    from alchemetric_ray.data.panel import _arrow, panel_columns

    tickers, bars, lengths = gathered
    tickers, lengths = tickers[group], lengths[group]
    start = int(_lengths_before(gathered, group.start))
    together = bars.iloc[start:start + int(lengths.sum())].reset_index(drop=True)
    panel = Panel.from_table(together, lengths)
    if tails:
        panel.keep_emas_at = tails_store.ema_keep_at(lengths, spec.reach)
    dates = together["date"].to_numpy().astype("datetime64[ns]")
    cols, _ = panel_columns(panel, dates, names, spec)
    computed = lengths >= need  # the short ones: no row
    keep = cols["has_features"] & np.isfinite(cols["label"]) & computed[panel.tid]
    record = None
    if tails:
        last = np.full(len(lengths), -1, dtype=np.int64)
        np.maximum.at(last, panel.tid[keep], panel.pos[keep])
        record = tails_store.record(tickers, {"date": dates, **{c: together[c].to_numpy() for c in BAR_COLUMNS[1:]}},
                                    lengths, last, EmaStates(cast(np.ndarray, panel.keep_emas_at), panel.kept_emas),
                                    tails_store.tail_length(names, spec.reach))
    if not keep.any():
        return pa.table({}), record
    rows_kept = np.flatnonzero(keep)
    columns = {"date": dates[rows_kept], "ticker": tickers, **{n: cols[n][rows_kept] for n in names},
               "label": cols["label"][rows_kept], "fwd_ret": cols["fwd_ret"][rows_kept],
               "label_end": cols["label_end"][rows_kept]}
    return _arrow(columns, panel.tid[rows_kept]), record


def _lengths_before(gathered: _Gathered, lo: int) -> int:
    """Rows of ``gathered``'s frame before its ticker ``lo``."""
    return int(gathered[2][:lo].sum())


def _after_last_row(last_rows: dict[str, np.datetime64], tickers) -> dict[str, np.datetime64]:
    """ticker -> the first instant after its last row (rows from there on are new)."""
    return {t: last_rows[t] + np.timedelta64(1, "ns") for t in tickers if t in last_rows}


def _cross_section(rows: pd.DataFrame, names: list[str], spec, cfg, what: str) -> tuple[pd.DataFrame, dict]:
    """The per-date pass of the build over ``rows`` (whole dates): the same transforms, the same drop of
    dates with fewer than ``features.min_cross_section`` stocks."""
    from alchemetric_ray.data.cross_section import (
        STAGED_SUFFIX,
        apply_cross_section,
        plan_ops,
        read_staged,
        write_staged,
    )

    ops = plan_ops(names, spec, cfg.features.cs_normalize)
    if not ops or rows.empty:
        return rows, {}
    with tempfile.TemporaryDirectory(prefix="alchemetric-append-") as tmp:
        files = [Path(tmp) / f"rows{STAGED_SUFFIX}"]  # one staged file (as the build's), rows by ticker then date
        write_staged(pa.Table.from_pandas(rows.sort_values(["ticker", "date"], kind="stable"), preserve_index=False),
                     files[0])
        try:
            report = apply_cross_section(files, ops, min_names=cfg.features.min_cross_section, what=what)
        except CrossSectionError:  # no new date has enough stocks: all dropped, as a build drops them
            return rows.iloc[:0], {"dates_kept": 0, "dates_dropped": int(rows["date"].nunique()),
                                   "rows_dropped": len(rows), "max_names": int(rows.groupby("date").size().max())}
        done = pd.concat([read_staged(f).to_pandas() for f in files], ignore_index=True)
    return done, report.as_dict()


# ---- the append --------------------------------------------------------------------------------


def _new_rows(job: _Job, kept: Mapping[str, pd.DataFrame], added: Mapping[str, pd.DataFrame],
              last_rows: dict[str, np.datetime64]) -> tuple[pd.DataFrame, Any, dict, int]:
    """The rows to write of a folder without tails (raw features, before normalization), the first date
    written again whole (with a per-date pass; else None), the per-date pass's counts and the tickers
    computed."""
    names = list(job.manifest.features)
    spec = job.manifest.label_spec
    tail = tail_bars(names)
    need = min_history(job.cfg)
    windows = _windows(sorted(added), kept, added, {t: _next(last_rows.get(t)) for t in added}, tail)
    rows, _ = _compute(windows, names, spec, need, _after_last_row(last_rows, added))
    if not job.manifest.cross_section or rows.empty:
        return rows, None, {}, len(added)
    # every row of the dates from the first new one on: a date's values depend on all its rows
    a0 = rows["date"].min().to_datetime64()
    before = a0 - np.timedelta64(1, "ns")
    again = sorted(t for t, d in job.dates.items()
                   if len(d) and (t not in added or last_rows.get(t, before) >= a0)
                   and max(d[-1], dates_of(added, t)[-1] if t in added else d[-1]) >= a0)
    if again:
        more, _ = _compute(_windows(again, kept, added, {t: a0 for t in again}, tail), names, spec, need,
                           {t: a0 for t in again})
        rows = pd.concat([rows[~rows["ticker"].isin(again)], more], ignore_index=True)
    rows, record = _cross_section(rows, names, spec, job.cfg, job.description)
    return rows, a0, record, len(set(added) | set(again))


def _next(last_row) -> Any:
    return None if last_row is None else last_row + np.timedelta64(1, "ns")


# ---- --rebuild ---------------------------------------------------------------------------------


def _rebuild(job: _Job, progress: bool) -> AppendSummary:
    """The folder rebuilt from its kept bars merged with the new ones (a new bar replaces the kept one of
    its date), with the shards' own settings; the manifest keeps its appends and records this one."""
    from alchemetric_ray.data.shards import build_shards

    folder, manifest, kept_last = job.folder, job.manifest, job.kept_last
    kept = load_kept(job.parts, {t: np.datetime64(0, "ns") for t in kept_last})
    revisions = find_revisions(job.new, kept, kept_last)
    fresh = {t: f[f["date"].to_numpy() > kept_last[t]] if t in kept_last else f for t, f in job.new.items()}
    fresh = {t: f for t, f in fresh.items() if len(f)}
    if not revisions and not fresh:
        return job.nothing()
    merged: dict[str, pd.DataFrame] = {}
    for ticker in sorted(set(kept) | set(job.new)):
        frames = [f for f in (kept.get(ticker), job.new.get(ticker)) if f is not None]
        both = pd.concat(frames, ignore_index=True).drop_duplicates("date", keep="last")
        merged[ticker] = both.sort_values("date", kind="stable").reset_index(drop=True)
    del kept
    summary = build_shards(job.cfg, job.where, bars=iter(merged.items()), source_description=manifest.source,
                           progress=progress)
    built = summary.manifest
    revised_tickers = sorted({r.ticker for r in revisions})
    entry: dict[str, Any] = {
        "kind": "rebuild",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": job.description,
        "input_hash": digest(job.new),
        "revised": {"bars": len(revisions), "tickers": revised_tickers,
                    "dates": [f"{r.ticker} {r.date}" for r in revisions[:100]]},
        "first_date": day(min(f["date"].min() for f in fresh.values())) if fresh else None,
        "last_date": day(max(f["date"].max() for f in fresh.values())) if fresh else None,
        "rows": {s: int(built.rows.get(s, 0)) - int(manifest.rows.get(s, 0)) for s in SPLITS},
        "tickers": len(fresh),
    }
    updated = dataclasses.replace(built, appends=[*manifest.appends, entry])
    updated.write(folder)
    revised = (f"{len(revisions)} revised bar(s) of {len(revised_tickers)} ticker(s), first "
               f"{revisions[0].ticker} {revisions[0].date}" if revisions else "no revised bar")
    dates = f"; new dates {entry['first_date']}..{entry['last_date']}" if fresh else ""
    line = (f"rebuilt {job.where} from its kept bars and the new ones ({revised}{dates}); rows train/val/test = "
            f"{built.rows.get('train')}/{built.rows.get('val')}/{built.rows.get('test')}")
    return job.summary(updated, line)
