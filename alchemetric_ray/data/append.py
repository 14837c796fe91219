"""``features --append``: the bars after a shard folder's last date, added without rebuilding it.

An append computes only the rows that change and leaves the folder as a fresh build of all the bars
would be, row for row, for every row that build labels (``tests/test_append.py``):

1. **Settings**: the shards' own (``manifest.built_with``; an override that conflicts is refused, as
   for training on shards).  The new bars are read through the same ingest as a build.
2. **Revisions**: a new bar for a date the folder already keeps (``OUT/bars/``, the build's input
   bars, :mod:`~alchemetric_ray.data.bars_store`) must equal the kept one (open, high, low, close,
   volume, to 1e-9 relative); otherwise the append is refused in one line naming the ticker, the date
   and both closes, and ``--rebuild`` rebuilds the folder from the kept bars merged with the new ones.
3. **Rows**: per ticker, the rows after its last row in the shards: its newest ``reach`` kept bars
   had no label at the last build (so they were not written) and have one now, then the new bars'.
   They are computed by :func:`~alchemetric_ray.data.panel.compute_group` over a tail of the kept
   bars plus the new ones: :func:`tail_bars` bars before the first row to write, enough for the
   longest warm-up and for the slowest EMA to forget where the tail starts (to ``EMA_TOLERANCE``).
4. **Per-date pass** (a cross-sectional label or feature): a date's values depend on that date's rows
   only, so it runs over every row of the dates from the first new row on (``A0``); where another
   ticker already has rows on those dates (its bars ended earlier), they are recomputed with the rest.
5. **Split and normalization**: the manifest's split plan (its test segment now ends at the last new
   row) and its train-fitted normalizer, unchanged.  Rows must fall in the test segment: a row that
   would land in train or val (a ticker new to the folder with years of history) is refused, since
   the normalization fitted on train would change (``--rebuild``).  Rows without a label yet (the
   newest ``reach`` bars) are not written, as in a build: they join at the next append.
6. **Writing**: the test segment is written again as new part files (new names) holding its rows and
   the new ones, a ticker in one file, as a build writes them: a sequence model's windows are built a
   file at a time, so a ticker's new rows in a file of their own would cut its windows.  Then the new
   bars as a new ``bars/part-NNNNN.parquet``, then the manifest (atomically), with ``files``,
   ``rows``, ``class_counts``, ``tickers``, the test segment's end and an ``appends`` entry.  Only then
   are the test files it no longer lists removed.  A failure or an interrupt before the manifest is
   written removes every file the append wrote: the folder is left as it was.

Local folders only (a shard folder on object storage is refused in one line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from alchemetric_ray.data import bars_store
from alchemetric_ray.data.features import warmup_bars
from alchemetric_ray.data.manifest import MANIFEST, Manifest, reconcile_features
from alchemetric_ray.data.normalize import Normalizer
from alchemetric_ray.data.splits import SPLITS, SplitPlan
from alchemetric_ray.data.staging import min_history
from alchemetric_ray.errors import CrossSectionError, ShardError, UserError
from alchemetric_ray.storage import Location, locate

# The EMAs of features.py and their smoothing factors: Wilder's RSI(14) and ATR(14) (alpha = 1/14),
# MACD's EMA12 and EMA26 (2/13, 2/27) and its signal line's EMA9 (2/10), all adjust=False.  An EMA
# started k bars before a row differs from one started at the first bar by (1 - alpha)^k of the
# difference of their starting values, so k bars of the slowest one make that < EMA_TOLERANCE.
EMA_ALPHAS = {"rsi_14/atr_14": 1 / 14, "macd EMA26": 2 / 27, "macd EMA12": 2 / 13, "macd_hist signal EMA9": 2 / 10}
EMA_TOLERANCE = 1e-12
EMA_BARS = math.ceil(math.log(EMA_TOLERANCE) / math.log(1 - min(EMA_ALPHAS.values())))  # 373 (alpha 1/14)
REVISION_RTOL = 1e-9  # a kept bar and a new one for the same date are the same bar within this
GROUP_TICKERS = 64  # tickers per compute_group call
_PART = re.compile(r"part-(\d+)\.parquet$")
_BAR_COLUMNS = ["date", *bars_store.PRICE_COLUMNS]


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


# ---- the folder's bars, rows and new bars ------------------------------------------------------


def bars_parts(folder: Path, manifest: Manifest) -> list[Path]:
    """The bars store's files: those the manifest lists (``files["bars"]``), else every part on disk."""
    listed = manifest.files.get(bars_store.BARS_DIR)
    if listed:
        return [folder / name for name in listed]
    return sorted((folder / bars_store.BARS_DIR).glob("part-*.parquet"))


_NEVER = np.datetime64(np.iinfo(np.int64).max, "ns")  # later than any bar: a ticker not to load


class _KeptBars(Mapping[str, pd.DataFrame]):
    """Kept bars of many tickers in one set of columns (date, open, high, low, close, volume), rows by
    ticker (sorted) then date; a mapping ticker -> its bars as a frame, made on demand."""

    def __init__(self, tickers: list[str], lengths: np.ndarray, cols: dict[str, np.ndarray]):
        self.tickers, self.cols = tickers, cols
        ends = np.cumsum(lengths)
        self.bounds = {t: (int(e - n), int(e)) for t, n, e in zip(tickers, lengths.tolist(), ends.tolist()) if n}

    @classmethod
    def from_frames(cls, frames: dict[str, pd.DataFrame]) -> _KeptBars | None:
        """``frames``' bars in one set of columns; None unless every frame has rows and the bars' columns
        only, each of one plain numpy dtype across the frames (dates in ns) (the frames are used then)."""
        tickers = sorted(frames)
        if not tickers:
            return None
        cols: dict[str, list[np.ndarray]] = {c: [] for c in _BAR_COLUMNS}
        for t in tickers:
            frame = _bare(frames[t])
            if not len(frame) or list(frame.columns) != _BAR_COLUMNS:
                return None
            for c in _BAR_COLUMNS:
                column = frame[c]
                if not isinstance(column.dtype, np.dtype) or column.dtype.kind not in "fiuM":
                    return None
                cols[c].append(column.to_numpy())
        for c, arrays in cols.items():
            if len({a.dtype for a in arrays}) > 1:
                return None
        if cols["date"][0].dtype != np.dtype("datetime64[ns]"):
            return None
        lengths = np.array([len(a) for a in cols["date"]], dtype=np.int64)
        return cls(tickers, lengths, {c: np.concatenate(v) for c, v in cols.items()})

    def rows_where(self, keep: np.ndarray) -> _KeptBars:
        """The rows where ``keep``; a ticker left with none is dropped."""
        code = np.repeat(np.arange(len(self.bounds), dtype=np.int64),
                         [hi - lo for lo, hi in self.bounds.values()])
        lengths = np.bincount(code[keep], minlength=len(self.bounds)).astype(np.int64)
        return _KeptBars(list(self.bounds), lengths, {c: v[keep] for c, v in self.cols.items()})

    def per_row(self, values: dict[str, np.datetime64], missing: int) -> np.ndarray:
        """``values[ticker]`` for each row (int64 ns; ``missing`` where its ticker has none)."""
        each = np.array([values[t].astype("datetime64[ns]").astype(np.int64) if t in values else missing
                         for t in self.bounds], dtype=np.int64)
        return np.repeat(each, [hi - lo for lo, hi in self.bounds.values()])

    def arrays(self, ticker: str) -> dict[str, np.ndarray]:
        lo, hi = self.bounds[ticker]
        return {c: v[lo:hi] for c, v in self.cols.items()}

    def __getitem__(self, ticker: str) -> pd.DataFrame:
        return pd.DataFrame(self.arrays(ticker))

    def __iter__(self):
        return iter(self.bounds)

    def __len__(self) -> int:
        return len(self.bounds)

    def __contains__(self, ticker) -> bool:
        return ticker in self.bounds


def _read_bars(parts: list[Path], since: dict[str, np.datetime64] | None,
               columns: list[str]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """The bars of ``parts`` (``columns`` of them), of each ticker from ``since[ticker]`` on (None: all;
    a ticker not in ``since``: none), in one set of columns by ticker (sorted) then date (stable: a
    date twice keeps the parts' order); the tickers and their row counts."""
    pieces = []
    for part in parts:
        table = pq.read_table(part, columns=["ticker", *columns], read_dictionary=["ticker"])
        if not table.num_rows:
            continue
        ticker = table.column("ticker").combine_chunks()
        names = [str(n) for n in ticker.dictionary.to_pylist()]
        codes = ticker.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        dates = table.column("date").to_numpy().astype("datetime64[ns]")
        if since is not None:
            bound = np.array([since.get(n, _NEVER) for n in names], dtype="datetime64[ns]")
            keep = dates >= bound[codes]
            if not keep.any():
                continue
            rows = np.flatnonzero(keep)
            codes, dates = codes[rows], dates[rows]
            cols = {c: table.column(c).to_numpy()[rows] for c in columns if c != "date"}
        else:
            cols = {c: table.column(c).to_numpy() for c in columns if c != "date"}
        cols["date"] = dates
        pieces.append((names, codes, cols))
    tickers = sorted({n for names, codes, _ in pieces for n in np.asarray(names, dtype=object)[np.unique(codes)]})
    where = {t: i for i, t in enumerate(tickers)}
    if not pieces:
        return [], np.zeros(0, dtype=np.int64), {c: np.empty(0, dtype="datetime64[ns]" if c == "date" else float)
                                                 for c in columns}
    code = np.concatenate([np.array([where.get(n, -1) for n in names], dtype=np.int64)[codes]
                           for names, codes, _ in pieces])
    cols = {c: np.concatenate([p[2][c] for p in pieces]) for c in columns}
    order = np.lexsort((cols["date"].view(np.int64), code))
    cols = {c: v[order] for c, v in cols.items()}
    return tickers, np.bincount(code, minlength=len(tickers)).astype(np.int64), cols


def _dates_of(bars: Mapping[str, pd.DataFrame], ticker: str) -> np.ndarray:
    """The dates of ``ticker``'s bars in ``bars``."""
    if isinstance(bars, _KeptBars):
        return bars.arrays(ticker)["date"]
    return bars[ticker]["date"].to_numpy()


def _kept_dates(parts: list[Path]) -> dict[str, np.ndarray]:
    """ticker -> its kept bars' dates, sorted (datetime64[ns])."""
    tickers, lengths, cols = _read_bars(parts, None, ["date"])
    ends = np.cumsum(lengths)
    return {t: cols["date"][e - n:e] for t, n, e in zip(tickers, lengths.tolist(), ends.tolist())}


def _load_kept(parts: list[Path], since: dict[str, np.datetime64]) -> _KeptBars:
    """ticker -> its kept bars from ``since[ticker]`` on (date, open, high, low, close, volume), one part
    read at a time; tickers not in ``since`` are not loaded."""
    columns = [c for c in bars_store.SCHEMA.names if c != "ticker"]
    return _KeptBars(*_read_bars(parts, since, columns))


def _last_rows(folder: Path, manifest: Manifest) -> dict[str, np.datetime64]:
    """ticker -> the date of its last row in the shards (any split)."""
    from alchemetric_ray.data.shards import split_files

    last: dict[str, np.datetime64] = {}
    for split in SPLITS:
        for file in split_files(folder, split, manifest):
            table = pq.read_table(file.local, columns=["ticker", "date"]).to_pandas()
            for ticker, date in table.groupby("ticker", sort=False)["date"].max().items():
                d = np.datetime64(date, "ns")
                if str(ticker) not in last or d > last[str(ticker)]:
                    last[str(ticker)] = d
    return last


def _read_new(cfg) -> tuple[dict[str, pd.DataFrame], str]:
    """The new bars, through the same ingest as a build (``cfg.data``): ticker -> bars; and where from."""
    from alchemetric_ray.bars.sources import open_source

    source = open_source(cfg.data, min_history=0)
    new = {ticker: _canonical(frame) for ticker, frame in source.bars}
    return new, source.description


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s date and price columns with a fresh index (the ingest's own frame where it is that)."""
    index = frame.index
    if list(frame.columns) == _BAR_COLUMNS and isinstance(index, pd.RangeIndex) and index.start == 0 \
            and index.step == 1:
        return frame
    return frame[_BAR_COLUMNS].reset_index(drop=True)


@dataclass(frozen=True)
class Revision:
    ticker: str
    date: str
    column: str  # the first column that differs ("close" where it does), or "" for a bar the kept ones lack
    new_close: float
    kept_close: float | None


def _revisions(new: Mapping[str, pd.DataFrame], kept: Mapping[str, pd.DataFrame],
               kept_last: dict[str, np.datetime64]) -> list[Revision]:
    """Every new bar for a date up to its ticker's last kept bar that is not the kept bar of that date
    (by ticker, then date)."""
    if isinstance(new, _KeptBars):
        last = new.per_row(kept_last, np.iinfo(np.int64).min)  # no kept bar: none of its bars
        old = _stack(new.rows_where(new.cols["date"].view(np.int64) <= last))
    else:
        old = _stack({t: f[f["date"].to_numpy() <= kept_last[t]] for t, f in new.items() if t in kept_last})
    if old.empty:
        return []
    both = _matched(old, kept)
    if both is None:
        both = old.merge(_stack(kept), on=["ticker", "date"], how="left", suffixes=("", "_kept"))
    lacking = both["close_kept"].isna().to_numpy()
    same = {c: np.isclose(both[c].to_numpy(dtype=float), both[f"{c}_kept"].to_numpy(dtype=float),
                          rtol=REVISION_RTOL, atol=0.0) for c in bars_store.PRICE_COLUMNS}
    differs = np.flatnonzero(lacking | ~np.logical_and.reduce(list(same.values())))
    found = []
    for i in differs[np.lexsort((both["date"].to_numpy()[differs], both["ticker"].to_numpy()[differs]))]:
        row = both.iloc[i]
        if lacking[i]:
            found.append(Revision(row["ticker"], _day(row["date"]), "", float(row["close"]), None))
            continue
        columns = [c for c in bars_store.PRICE_COLUMNS if not same[c][i]]
        found.append(Revision(row["ticker"], _day(row["date"]), "close" if "close" in columns else columns[0],
                              float(row["close"]), float(row["close_kept"])))
    return found


def _matched(old: pd.DataFrame, kept: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """``old`` with the kept bar of its ticker and date beside each row (columns ``PRICE_kept``, NaN where
    none): what a left merge on ticker and date gives where the kept bars have one bar a date, found by
    one sorted search over both; None where that does not hold (the merge then)."""
    if not isinstance(kept, _KeptBars) or old["date"].dtype != np.dtype("datetime64[ns]"):
        return None
    kept_dates = kept.cols["date"]
    where = {t: i for i, t in enumerate(kept.bounds)}
    lengths = np.array([hi - lo for lo, hi in kept.bounds.values()], dtype=np.int64)
    kept_code = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    old_code = np.array([where.get(t, -1) for t in old["ticker"].to_numpy()], dtype=np.int64)
    old_dates = old["date"].to_numpy()
    calendar = np.unique(np.concatenate([kept_dates, old_dates]))
    span = len(calendar) + 1
    kept_key = kept_code * span + np.searchsorted(calendar, kept_dates)
    if len(kept_key) > 1 and not (np.diff(kept_key) > 0).all():  # not sorted, or a date twice
        return None
    old_key = old_code * span + np.searchsorted(calendar, old_dates)
    at = np.minimum(np.searchsorted(kept_key, old_key), max(len(kept_key) - 1, 0))
    found = (old_code >= 0) & (len(kept_key) > 0)
    if len(kept_key):
        found &= kept_key[at] == old_key
    both = old.copy()
    for c in bars_store.PRICE_COLUMNS:
        values = np.full(len(old), np.nan)
        values[found] = kept.cols[c][at[found]]
        both[f"{c}_kept"] = values
    return both


def _revision_line(revisions: list[Revision], out: str, new: Mapping[str, pd.DataFrame],
                   kept: Mapping[str, pd.DataFrame]) -> str:
    first = revisions[0]
    if first.kept_close is None:
        what = (f"the new bars have a bar (close {first.new_close:.10g}) on a date inside the kept history that "
                f"{out}'s bars lack")
    else:
        what = f"close {first.new_close:.10g} in the new bars, {first.kept_close:.10g} in {out}'s kept bars"
        if first.column != "close":
            date = np.datetime64(first.date, "ns")
            a = new[first.ticker].loc[new[first.ticker]["date"] == date, first.column].iloc[0]
            b = kept[first.ticker].loc[kept[first.ticker]["date"] == date, first.column].iloc[0]
            what += f"; {first.column} {a:.10g} new, {b:.10g} kept"
    more = f" ({len(revisions) - 1} more revised bar(s))" if len(revisions) > 1 else ""
    return (f"{first.ticker} {first.date}: the new bars revise a bar the shards were built from ({what}){more}; "
            f"an append only adds the dates after each ticker's last kept bar: rerun with --append --rebuild to "
            f"rebuild {out} from its kept bars merged with the new ones")


def _stack(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One frame of ticker, date, open, high, low, close, volume: ``frames``' bars, by ticker."""
    columns = ["date", *bars_store.PRICE_COLUMNS]
    if isinstance(frames, _KeptBars):  # already one set of columns, by ticker
        lengths = [hi - lo for lo, hi in frames.bounds.values()]
        if not lengths:
            return _stack({})
        data = {"ticker": np.repeat(np.array(list(frames.bounds), dtype=object), lengths)}
        return pd.DataFrame({**data, **{c: frames.cols[c] for c in columns}})
    tickers = sorted(t for t, f in frames.items() if len(f))
    if not tickers:
        return pd.DataFrame({"ticker": pd.Series([], dtype=object), "date": pd.Series([], dtype="datetime64[ns]"),
                             **{c: pd.Series([], dtype=float) for c in bars_store.PRICE_COLUMNS}})
    chosen = [frames[t] for t in tickers]
    dtypes = [chosen[0][c].dtype for c in columns]
    if all(isinstance(d, np.dtype) for d in dtypes) and \
            all(f[c].dtype == d for f in chosen[1:] for c, d in zip(columns, dtypes)):
        # one numpy concatenation a column: what pd.concat gives for frames of the same numpy dtypes
        stacked = pd.DataFrame({c: np.concatenate([f[c].to_numpy() for f in chosen]) for c in columns})
    else:
        stacked = pd.concat([f[columns] for f in chosen], ignore_index=True)
    stacked.insert(0, "ticker", np.repeat(np.array(tickers, dtype=object), [len(f) for f in chosen]))
    return stacked


def _digest(frames: dict[str, pd.DataFrame] | pd.DataFrame) -> str:
    """The input hash of bars: sha256 of their rows (ticker, date, prices, volume), by ticker then date
    (``frames`` or their :func:`_stack`)."""
    stacked = frames if isinstance(frames, pd.DataFrame) else _stack(frames)
    return hashlib.sha256(pd.util.hash_pandas_object(stacked, index=False).to_numpy().tobytes()).hexdigest()


def _bars_table(stacked: pd.DataFrame) -> pa.Table:
    """:func:`bars_store.bars_table` of the bars :func:`_stack` stacked (the same table)."""
    schema = bars_store.SCHEMA
    columns = {"ticker": stacked["ticker"].to_numpy(), "date": stacked["date"].to_numpy().astype("datetime64[ns]"),
               **{c: stacked[c].to_numpy(dtype=np.float64) for c in bars_store.PRICE_COLUMNS}}
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def _bare(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its ``attrs`` (a shallow copy): pandas deep-copies a frame's attrs into every
    column it hands out, which a few reads of each of thousands of tickers' frames would pay for."""
    if not frame.attrs:
        return frame
    bare = frame.copy(deep=False)
    bare.attrs = {}
    return bare


def _day(value) -> str:
    return str(np.datetime64(value, "D"))


# ---- the entry point ---------------------------------------------------------------------------


@dataclass
class _Job:
    """One append: the folder, its manifest and kept bars' dates, the new bars."""

    cfg: Any
    where: Location
    manifest: Manifest
    parts: list[Path]  # the bars store's files
    new: Mapping[str, pd.DataFrame]  # ticker -> the bars read
    description: str  # where they were read from
    dates: dict[str, np.ndarray]  # ticker -> its kept bars' dates
    start: float = field(default_factory=time.monotonic)

    @property
    def folder(self) -> Path:
        return self.where.local

    @property
    def kept_last(self) -> dict[str, np.datetime64]:
        return {t: d[-1] for t, d in self.dates.items() if len(d)}

    def nothing(self) -> AppendSummary:
        last = _day(max(self.kept_last.values())) if self.kept_last else "-"
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
    job.new = _KeptBars.from_frames(dict(job.new)) or {t: _bare(f) for t, f in job.new.items()}
    last_rows = _last_rows(job.folder, job.manifest)
    kept_last = job.kept_last
    added: Mapping[str, pd.DataFrame]
    if isinstance(job.new, _KeptBars):
        after = job.new.per_row(kept_last, np.iinfo(np.int64).min)  # a ticker the folder lacks: all its bars
        added = job.new.rows_where(job.new.cols["date"].view(np.int64) > after)
    else:
        added = {t: f[f["date"].to_numpy() > kept_last[t]] if t in kept_last else f for t, f in job.new.items()}
        added = {t: f.reset_index(drop=True) for t, f in added.items() if len(f)}
    kept = _load_kept(job.parts, _kept_since(job, added, last_rows))
    revisions = _revisions(job.new, kept, kept_last)
    if revisions:
        raise ShardError(_revision_line(revisions, str(out), job.new, kept))
    if not added:
        return job.nothing()
    rows, a0, cs_record = _new_rows(job, kept, added, last_rows)
    return _write(job, rows, added, a0, cs_record)


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
    new, description = _read_new(cfg)
    return _Job(cfg, where, manifest, parts, new, description, _kept_dates(parts), start)


def _kept_since(job: _Job, added: Mapping[str, pd.DataFrame],
                last_rows: dict[str, np.datetime64]) -> dict[str, np.datetime64]:
    """ticker -> the first kept bar to read: the overlap with the new bars (to check) and the tail that
    its rows to write are computed from (with a per-date pass: of every ticker trading from the first
    possible new row on)."""
    tail = tail_bars(list(job.manifest.features))
    cross = bool(job.manifest.cross_section)
    firsts = [_first_after(job.dates.get(t), _dates_of(added, t), last_rows.get(t)) for t in added]
    bound = min((d for d in firsts if d is not None), default=None)  # no new row is earlier
    since: dict[str, np.datetime64] = {}
    for t, d in job.dates.items():
        if not len(d):
            continue
        points = []
        if t in job.new:
            points.append(int(np.searchsorted(d, _dates_of(job.new, t).min(), "left")))
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
    if isinstance(kept, _KeptBars) and isinstance(added, _KeptBars) and \
            all(kept.cols[c].dtype == added.cols[c].dtype for c in _BAR_COLUMNS):
        return _gathered_windows(tickers, kept, added, start_of, tail)
    frames = []
    for t in tickers:
        first = start_of.get(t)
        frames_of = [f for f in (kept.get(t), added.get(t)) if f is not None and len(f)]
        bars = pd.concat(frames_of, ignore_index=True) if len(frames_of) > 1 else frames_of[0].reset_index(drop=True)
        i = int(np.searchsorted(bars["date"].to_numpy(), first, "left")) if first is not None else 0
        frames.append((t, bars.iloc[max(0, i - tail):].reset_index(drop=True)))
    return frames


def _gathered_windows(tickers: list[str], kept: _KeptBars, added: _KeptBars, start_of: dict[str, Any],
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
    big = pd.DataFrame({c: np.concatenate([kept.cols[c], added.cols[c]])[index] for c in _BAR_COLUMNS})
    return list(tickers), big, np.array(lengths, dtype=np.int64)


def _compute(frames: _Windows, names: list[str], spec, need: int, keep_from: dict[str, Any]) -> pd.DataFrame:
    """compute_group over ``frames`` (:func:`_windows`), a group at a time; each ticker's rows from
    ``keep_from[ticker]`` on (inclusive, a datetime64)."""
    from alchemetric_ray.data.panel import compute_group

    out = []
    count = len(frames[0]) if isinstance(frames, tuple) else len(frames)
    for i in range(0, count, GROUP_TICKERS):
        if isinstance(frames, tuple):
            table = _group_table(frames, i, i + GROUP_TICKERS, names, spec, need)
        else:
            table = compute_group(frames[i:i + GROUP_TICKERS], names, spec, need).table
        if not table.num_rows:
            continue
        rows = table.to_pandas()
        rows["date"] = rows["date"].astype("datetime64[ns]")
        rows["label_end"] = rows["label_end"].astype("datetime64[ns]")
        cut = rows["ticker"].map(keep_from)
        out.append(rows[cut.isna() | (rows["date"] >= cut)])
    if not out:
        return pd.DataFrame()
    return pd.concat(out, ignore_index=True)


def _group_table(gathered: _Gathered, lo: int, hi: int, names: list[str], spec, need: int) -> pa.Table:
    """``compute_group(...).table`` of the tickers ``lo:hi`` of ``gathered``, from its frame's rows of
    them (compute_group's own steps, without a frame per ticker or the bars' digests, unused here)."""
    from alchemetric_ray.data.features import Panel
    from alchemetric_ray.data.panel import _arrow, panel_columns

    tickers, bars, lengths = gathered
    tickers, lengths = tickers[lo:hi], lengths[lo:hi]
    start = int(_lengths_before(gathered, lo))
    together = bars.iloc[start:start + int(lengths.sum())].reset_index(drop=True)
    panel = Panel.from_table(together, lengths)
    dates = together["date"].to_numpy().astype("datetime64[ns]")
    cols, _ = panel_columns(panel, dates, names, spec)
    computed = lengths >= need  # the short ones: no row
    keep = cols["has_features"] & np.isfinite(cols["label"]) & computed[panel.tid]
    if not keep.any():
        return pa.table({})
    rows_kept = np.flatnonzero(keep)
    columns = {"date": dates[rows_kept], "ticker": tickers, **{n: cols[n][rows_kept] for n in names},
               "label": cols["label"][rows_kept], "fwd_ret": cols["fwd_ret"][rows_kept],
               "label_end": cols["label_end"][rows_kept]}
    return _arrow(columns, panel.tid[rows_kept])


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
              last_rows: dict[str, np.datetime64]) -> tuple[pd.DataFrame, Any, dict]:
    """The rows to write (raw features, before normalization), the first date written again whole (with
    a per-date pass; else None) and the per-date pass's counts."""
    names = list(job.manifest.features)
    spec = job.manifest.label_spec
    tail = tail_bars(names)
    need = min_history(job.cfg)
    windows = _windows(sorted(added), kept, added, {t: _next(last_rows.get(t)) for t in added}, tail)
    rows = _compute(windows, names, spec, need, _after_last_row(last_rows, added))
    if not job.manifest.cross_section or rows.empty:
        return rows, None, {}
    # every row of the dates from the first new one on: a date's values depend on all its rows
    a0 = rows["date"].min().to_datetime64()
    before = a0 - np.timedelta64(1, "ns")
    again = sorted(t for t, d in job.dates.items()
                   if len(d) and (t not in added or last_rows.get(t, before) >= a0)
                   and max(d[-1], _dates_of(added, t)[-1] if t in added else d[-1]) >= a0)
    if again:
        more = _compute(_windows(again, kept, added, {t: a0 for t in again}, tail), names, spec, need,
                        {t: a0 for t in again})
        rows = pd.concat([rows[~rows["ticker"].isin(again)], more], ignore_index=True)
    rows, record = _cross_section(rows, names, spec, job.cfg, job.description)
    return rows, a0, record


def _next(last_row) -> Any:
    return None if last_row is None else last_row + np.timedelta64(1, "ns")


def _schema(names: list[str], regression: bool) -> pa.Schema:
    """The shards' columns (data/shards.py writes the same)."""
    return pa.schema([("date", pa.timestamp("ns")), ("ticker", pa.string()),
                      *[(n, pa.float32()) for n in names],
                      ("label", pa.float32() if regression else pa.int64()), ("fwd_ret", pa.float32()),
                      ("label_end", pa.timestamp("ns"))])


def _next_index(folder: Path) -> int:
    """One past the highest part number in ``folder`` (listed or not): a new name never replaces a file."""
    numbers = [int(m.group(1)) for p in folder.glob("part-*.parquet") if (m := _PART.search(p.name))]
    return max(numbers, default=-1) + 1


def _write(job: _Job, rows: pd.DataFrame, added: Mapping[str, pd.DataFrame], a0, cs_record: dict) -> AppendSummary:
    """The test segment again with the new rows, the new bars, then the manifest; on any failure before
    the manifest is written, every file written here is removed."""
    manifest, folder = job.manifest, job.folder
    plan = SplitPlan(**manifest.splits)
    if not rows.empty:
        rows = rows.sort_values(["ticker", "date"], kind="stable").reset_index(drop=True)
        plan = dataclasses.replace(plan, test_end=max(plan.test_end, _day(rows["date"].max())))
        rows = rows[_in_test(plan, rows) == 2].reset_index(drop=True)
    writer = _TestWriter(folder / "split=test", _schema(list(manifest.features), manifest.regression),
                         len(manifest.classes))
    from alchemetric_ray.data.shards import split_files

    old_files = [f.local for f in split_files(folder, "test", manifest)]
    new_table = _new_table(rows, list(manifest.features), Normalizer.from_dict(manifest.normalization),
                           writer.schema, manifest.regression)
    try:
        writer.rewrite(old_files, new_table, a0)
        stacked = _stack(added)
        bars_name = bars_store.write_table_part(folder, _next_index(folder / bars_store.BARS_DIR),
                                                _bars_table(stacked))
        writer.written.append(folder / bars_name)
        entry = _entry(job, rows, stacked, bars_name, writer.rows - manifest.rows.get("test", 0), a0)
        tickers = list(manifest.tickers) + sorted(set(rows["ticker"]) - set(manifest.tickers)) if len(rows) \
            else list(manifest.tickers)
        updated = dataclasses.replace(
            manifest,
            splits=plan.as_dict(),
            rows={**manifest.rows, "test": writer.rows},
            class_counts={**manifest.class_counts, "test": writer.classes} if writer.classes else
            manifest.class_counts,
            tickers=tickers,
            skipped_tickers={t: why for t, why in manifest.skipped_tickers.items() if t not in set(tickers)},
            files={**manifest.files, "test": writer.names(),
                   bars_store.BARS_DIR: [str(p.relative_to(folder)) for p in job.parts] + [bars_name]},
            cross_section=_cross_record(manifest.cross_section, cs_record, folder, manifest, a0),
            appends=[*manifest.appends, entry],
        )
        updated.write(folder)
    except OSError as exc:
        if _committed(folder, len(manifest.appends) + 1):  # written; what failed came after (a folder's sync)
            raise ShardError(f"{folder}: the append was written, but then: {exc.strerror or exc}") from None
        writer.remove()
        if isinstance(exc, UserError):  # already one line (a full disk)
            raise
        where = exc.filename or folder
        raise ShardError(f"{where}: cannot write the append ({exc.strerror or exc}); {job.where} is as it was") \
            from None
    except BaseException:
        if not _committed(folder, len(manifest.appends) + 1):  # an interrupt just after the manifest's rename
            writer.remove()
        raise
    for path in old_files:  # no longer listed: their rows are in the new files
        if path not in writer.written:
            path.unlink(missing_ok=True)
    dates = f"dates {entry['first_date']}..{entry['last_date']}" if entry["first_date"] else \
        f"bars {entry['bars']['first_date']}..{entry['bars']['last_date']} kept, no label yet"
    line = (f"appended {entry['rows']['test']} rows for {entry['tickers']} tickers ({dates}) to {job.where}; "
            f"test segment now {writer.rows} rows")
    return job.summary(updated, line)


def _committed(folder: Path, appends: int) -> bool:
    """Whether the manifest in ``folder`` is the one that records this append (its ``appends`` count)."""
    try:
        return len(Manifest.read(folder).appends) == appends
    except (ShardError, OSError):
        return False


def _in_test(plan: SplitPlan, rows: pd.DataFrame) -> np.ndarray:
    """The split of each row (:meth:`SplitPlan.assign`); a row that would land in train or val is refused."""
    split = plan.assign(rows["date"].to_numpy(), rows["label_end"].to_numpy())
    early = np.flatnonzero((split == 0) | (split == 1))
    if len(early):
        row = rows.iloc[early[0]]
        raise ShardError(f"{row['ticker']} {_day(row['date'])}: the append would add a row before the test segment "
                         f"(from {plan.test_start}), which would change the train/val segments and the normalization "
                         f"fitted on train; rebuild instead: --append --rebuild")
    return split


def _entry(job: _Job, rows: pd.DataFrame, stacked: pd.DataFrame, bars_name: str, added_rows: int,
           a0) -> dict[str, Any]:
    """The manifest's record of this append (``appends``); ``stacked``: the new bars (:func:`_stack`)."""
    return {
        "kind": "append",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": job.description,
        "input_hash": _digest(stacked),
        "bars": {"file": bars_name, "tickers": int(stacked["ticker"].nunique()), "rows": len(stacked),
                 "first_date": _day(stacked["date"].min()), "last_date": _day(stacked["date"].max())},
        "first_date": _day(rows["date"].min()) if len(rows) else None,
        "last_date": _day(rows["date"].max()) if len(rows) else None,
        "rows": {"train": 0, "val": 0, "test": added_rows},
        "tickers": int(rows["ticker"].nunique()) if len(rows) else 0,
        "rewritten_from": _day(a0) if a0 is not None else None,
    }


class _TestWriter:
    """The test segment's new part files: each ticker's kept rows then its new ones, a ticker never in
    two files, up to ROWS_PER_FILE rows a file (as data/shards.py writes them), under names no file has."""

    def __init__(self, folder: Path, schema: pa.Schema, n_classes: int):
        self.folder, self.schema = folder, schema
        self.written: list[Path] = []
        self.rows = 0
        self.classes = [0] * n_classes
        self.index = 0

    def rewrite(self, old_files: list[Path], new_rows: pa.Table, a0) -> None:
        """Each old file's rows before ``a0`` (all: None), each ticker's followed by its rows of
        ``new_rows`` (by ticker then date), then the new rows of tickers no old file holds; a ticker's
        rows never split across files, a file closed before it would pass ROWS_PER_FILE."""
        from alchemetric_ray.data.shards import ROWS_PER_FILE

        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = _next_index(self.folder)
        new_runs = {t: (lo, hi) for t, lo, hi in _ticker_runs(new_rows)}
        pieces: list[pa.Table] = []
        sizes: list[int] = []  # rows of each ticker, in the order written
        for path in old_files:
            table = pq.read_table(path)
            if table.schema != self.schema:
                table = table.cast(self.schema)
            if a0 is not None:  # the dates from the first new row on are written again, whole
                table = table.filter(pc.less(table.column("date"), pa.scalar(a0, pa.timestamp("ns"))))
            runs = _ticker_runs(table)
            if not any(t in new_runs for t, _, _ in runs):
                pieces.append(table)
                sizes.extend(hi - lo for _, lo, hi in runs)
                continue
            both = pa.concat_tables([table, new_rows])
            take = []
            for ticker, lo, hi in runs:
                extra = new_runs.pop(ticker, None)
                take.append(np.arange(lo, hi))
                if extra is not None:
                    take.append(np.arange(table.num_rows + extra[0], table.num_rows + extra[1]))
                sizes.append(hi - lo + (extra[1] - extra[0] if extra is not None else 0))
            pieces.append(both.take(pa.array(np.concatenate(take), type=pa.int64())))
        for ticker in sorted(new_runs):
            lo, hi = new_runs[ticker]
            pieces.append(new_rows.slice(lo, hi - lo))
            sizes.append(hi - lo)
        rows = pa.concat_tables(pieces) if pieces else new_rows.slice(0, 0)
        if self.classes and rows.num_rows:
            labels, counts = np.unique(rows.column("label").to_numpy(), return_counts=True)
            for c, n in zip(labels, counts):
                self.classes[int(c)] += int(n)
        for start, length in _file_cuts(sizes, ROWS_PER_FILE):
            self.write(rows.slice(start, length))
        self.rows += rows.num_rows

    def write(self, table: pa.Table) -> None:
        from alchemetric_ray.data.shards import ROWS_PER_ROW_GROUP

        path = self.folder / f"part-{self.index:05d}.parquet"
        self.written.append(path)
        # dictionary encoding for the ticker only, as data/shards.py writes
        pq.write_table(table.combine_chunks(), path, row_group_size=ROWS_PER_ROW_GROUP, use_dictionary=["ticker"])
        self.index += 1

    def names(self) -> list[str]:
        return [f"{self.folder.name}/{p.name}" for p in self.written if p.parent == self.folder]

    def remove(self) -> None:
        for path in self.written:
            try:
                path.unlink(missing_ok=True)
            except OSError:  # never made (its folder refused it)
                pass


def _file_cuts(sizes: list[int], per_file: int) -> list[tuple[int, int]]:
    """(first row, rows) of each file for runs of ``sizes`` rows written in turn, a run never split, a
    file closed before a run would take it past ``per_file`` rows."""
    cuts = []
    start = pending = 0
    for n in sizes:
        if not n:
            continue
        if pending and pending + n > per_file:
            cuts.append((start, pending))
            start, pending = start + pending, 0
        pending += n
    if pending:
        cuts.append((start, pending))
    return cuts


def _cross_record(record: dict, new: dict, folder: Path, manifest: Manifest, a0) -> dict:
    """The manifest's record of the per-date pass, its counts brought up to date: the dates the append
    wrote again (from ``a0`` on) are counted as this pass counted them."""
    if not record or not new:
        return record
    before = 0
    if a0 is not None:
        from alchemetric_ray.data.shards import split_files

        seen = set()
        for file in split_files(folder, "test", manifest):
            d = pq.read_table(file.local, columns=["date"]).column("date").to_numpy()
            seen.update(d[d >= np.datetime64(a0, "ns")].tolist())
        before = len(seen)
    out = dict(record)
    out["dates_kept"] = int(record.get("dates_kept", 0)) - before + int(new.get("dates_kept", 0))
    out["dates_dropped"] = int(record.get("dates_dropped", 0)) + int(new.get("dates_dropped", 0))
    out["rows_dropped"] = int(record.get("rows_dropped", 0)) + int(new.get("rows_dropped", 0))
    out["max_names"] = max(int(record.get("max_names", 0)), int(new.get("max_names", 0)))
    return out


def _new_table(rows: pd.DataFrame, names: list[str], normalizer: Normalizer, schema: pa.Schema,
               regression: bool) -> pa.Table:
    """The new rows (by ticker then date) as the shards hold them: normalized float32 features, the
    label's type."""
    if rows.empty:
        return schema.empty_table()
    normed = normalizer.apply(rows[names].to_numpy())
    cols: dict[str, Any] = {"date": rows["date"].to_numpy(), "ticker": rows["ticker"].to_numpy()}
    cols.update({n: normed[:, j] for j, n in enumerate(names)})
    cols.update({"label": rows["label"].to_numpy().astype(np.float32 if regression else np.int64),
                 "fwd_ret": rows["fwd_ret"].to_numpy().astype(np.float32),
                 "label_end": rows["label_end"].to_numpy()})
    return pa.Table.from_pydict(cols, schema=schema)


def _ticker_runs(table: pa.Table) -> list[tuple[str, int, int]]:
    """(ticker, first row, end row) of each run of one ticker in ``table``."""
    if not table.num_rows:
        return []
    tickers = table.column("ticker").to_numpy(zero_copy_only=False)
    cuts = np.flatnonzero(tickers[1:] != tickers[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(tickers)]
    return [(str(tickers[lo]), lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]


# ---- --rebuild ---------------------------------------------------------------------------------


def _rebuild(job: _Job, progress: bool) -> AppendSummary:
    """The folder rebuilt from its kept bars merged with the new ones (a new bar replaces the kept one of
    its date), with the shards' own settings; the manifest keeps its appends and records this one."""
    from alchemetric_ray.data.shards import build_shards

    folder, manifest, kept_last = job.folder, job.manifest, job.kept_last
    kept = _load_kept(job.parts, {t: np.datetime64(0, "ns") for t in kept_last})
    revisions = _revisions(job.new, kept, kept_last)
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
        "input_hash": _digest(job.new),
        "revised": {"bars": len(revisions), "tickers": revised_tickers,
                    "dates": [f"{r.ticker} {r.date}" for r in revisions[:100]]},
        "first_date": _day(min(f["date"].min() for f in fresh.values())) if fresh else None,
        "last_date": _day(max(f["date"].max() for f in fresh.values())) if fresh else None,
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
