"""The bars an append reads and checks (:mod:`~alchemetric_ray.data.append`): the shard folder's kept
bars (``OUT/bars/``, :mod:`~alchemetric_ray.data.bars_store`) and the last date of each ticker's rows,
the new bars through the build's ingest, and the check that a new bar for a kept date is the kept bar
(:func:`revisions`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from alchemetric_ray.data import bars_store
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.splits import SPLITS
from alchemetric_ray.errors import ShardError

REVISION_RTOL = 1e-9  # a kept bar and a new one for the same date are the same bar within this
BAR_COLUMNS = ["date", *bars_store.PRICE_COLUMNS]


def bars_parts(folder: Path, manifest: Manifest) -> list[Path]:
    """The bars store's files: those the manifest lists (``files["bars"]``), else every part on disk."""
    listed = manifest.files.get(bars_store.BARS_DIR)
    if listed:
        return [folder / name for name in listed]
    return sorted((folder / bars_store.BARS_DIR).glob("part-*.parquet"))


_NEVER = np.datetime64(np.iinfo(np.int64).max, "ns")  # later than any bar: a ticker not to load


class KeptBars(Mapping[str, pd.DataFrame]):
    """Kept bars of many tickers in one set of columns (date, open, high, low, close, volume), rows by
    ticker (sorted) then date; a mapping ticker -> its bars as a frame, made on demand."""

    def __init__(self, tickers: list[str], lengths: np.ndarray, cols: dict[str, np.ndarray]):
        self.tickers, self.cols = tickers, cols
        ends = np.cumsum(lengths)
        self.bounds = {t: (int(e - n), int(e)) for t, n, e in zip(tickers, lengths.tolist(), ends.tolist()) if n}

    @classmethod
    def from_frames(cls, frames: dict[str, pd.DataFrame]) -> KeptBars | None:
        """``frames``' bars in one set of columns; None unless every frame has rows and the bars' columns
        only, each of one plain numpy dtype across the frames (dates in ns) (the frames are used then)."""
        tickers = sorted(frames)
        if not tickers:
            return None
        cols: dict[str, list[np.ndarray]] = {c: [] for c in BAR_COLUMNS}
        for t in tickers:
            frame = bare(frames[t])
            if not len(frame) or list(frame.columns) != BAR_COLUMNS:
                return None
            for c in BAR_COLUMNS:
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

    def rows_where(self, keep: np.ndarray) -> KeptBars:
        """The rows where ``keep``; a ticker left with none is dropped."""
        code = np.repeat(np.arange(len(self.bounds), dtype=np.int64),
                         [hi - lo for lo, hi in self.bounds.values()])
        lengths = np.bincount(code[keep], minlength=len(self.bounds)).astype(np.int64)
        return KeptBars(list(self.bounds), lengths, {c: v[keep] for c, v in self.cols.items()})

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
        try:
            table = pq.read_table(part, columns=["ticker", *columns], read_dictionary=["ticker"])
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{part}: the shards' kept bars cannot be read ({str(exc).splitlines()[0]}); rebuild "
                             f"the folder from all the bars: alchemetric-ray features --data ALL_BARS --out "
                             f"{part.parent.parent}") from None
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


def dates_of(bars: Mapping[str, pd.DataFrame], ticker: str) -> np.ndarray:
    """The dates of ``ticker``'s bars in ``bars``."""
    if isinstance(bars, KeptBars):
        return bars.arrays(ticker)["date"]
    return bars[ticker]["date"].to_numpy()


def kept_dates(parts: list[Path]) -> dict[str, np.ndarray]:
    """ticker -> its kept bars' dates, sorted (datetime64[ns])."""
    tickers, lengths, cols = _read_bars(parts, None, ["date"])
    ends = np.cumsum(lengths)
    return {t: cols["date"][e - n:e] for t, n, e in zip(tickers, lengths.tolist(), ends.tolist())}


def load_kept(parts: list[Path], since: dict[str, np.datetime64]) -> KeptBars:
    """ticker -> its kept bars from ``since[ticker]`` on (date, open, high, low, close, volume), one part
    read at a time; tickers not in ``since`` are not loaded."""
    columns = [c for c in bars_store.SCHEMA.names if c != "ticker"]
    return KeptBars(*_read_bars(parts, since, columns))


def last_rows(folder: Path, manifest: Manifest) -> dict[str, np.datetime64]:
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


def read_new(cfg) -> tuple[Mapping[str, pd.DataFrame], str]:
    """The new bars, through the same ingest as a build (``cfg.data``): ticker -> bars; and where from.
    One file of many tickers that ingest would keep as it is is read whole (``bars/columnar.py``)."""
    from alchemetric_ray.bars.columnar import clean_long_table
    from alchemetric_ray.bars.sources import open_source

    source = open_source(cfg.data, min_history=0)
    if source.kind == "files" and source.report is not None and not cfg.data.tickers:
        whole = clean_long_table(Path(cfg.data.path), source.report)
        if whole is not None:
            return KeptBars(*whole), source.description
    new = {ticker: _canonical(frame) for ticker, frame in source.bars}
    return new, source.description


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s date and price columns with a fresh index (the ingest's own frame where it is that)."""
    index = frame.index
    if list(frame.columns) == BAR_COLUMNS and isinstance(index, pd.RangeIndex) and index.start == 0 \
            and index.step == 1:
        return frame
    return frame[BAR_COLUMNS].reset_index(drop=True)


@dataclass(frozen=True)
class Revision:
    ticker: str
    date: str
    column: str  # the first column that differs ("close" where it does), or "" for a bar the kept ones lack
    new_close: float
    kept_close: float | None


def revisions(new: Mapping[str, pd.DataFrame], kept: Mapping[str, pd.DataFrame],
               kept_last: dict[str, np.datetime64]) -> list[Revision]:
    """Every new bar for a date up to its ticker's last kept bar that is not the kept bar of that date
    (by ticker, then date)."""
    if isinstance(new, KeptBars):
        last = new.per_row(kept_last, np.iinfo(np.int64).min)  # no kept bar: none of its bars
        old = stack(new.rows_where(new.cols["date"].view(np.int64) <= last))
    else:
        old = stack({t: f[f["date"].to_numpy() <= kept_last[t]] for t, f in new.items() if t in kept_last})
    if old.empty:
        return []
    both = _matched(old, kept)
    if both is None:
        both = old.merge(stack(kept), on=["ticker", "date"], how="left", suffixes=("", "_kept"))
    lacking = both["close_kept"].isna().to_numpy()
    same = {c: np.isclose(both[c].to_numpy(dtype=float), both[f"{c}_kept"].to_numpy(dtype=float),
                          rtol=REVISION_RTOL, atol=0.0) for c in bars_store.PRICE_COLUMNS}
    differs = np.flatnonzero(lacking | ~np.logical_and.reduce(list(same.values())))
    found = []
    for i in differs[np.lexsort((both["date"].to_numpy()[differs], both["ticker"].to_numpy()[differs]))]:
        row = both.iloc[i]
        if lacking[i]:
            found.append(Revision(row["ticker"], day(row["date"]), "", float(row["close"]), None))
            continue
        columns = [c for c in bars_store.PRICE_COLUMNS if not same[c][i]]
        found.append(Revision(row["ticker"], day(row["date"]), "close" if "close" in columns else columns[0],
                              float(row["close"]), float(row["close_kept"])))
    return found


def _matched(old: pd.DataFrame, kept: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """``old`` with the kept bar of its ticker and date beside each row (columns ``PRICE_kept``, NaN where
    none): what a left merge on ticker and date gives where the kept bars have one bar a date, found by
    one sorted search over both; None where that does not hold (the merge then)."""
    if not isinstance(kept, KeptBars) or old["date"].dtype != np.dtype("datetime64[ns]"):
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


def revision_line(revisions: list[Revision], out: str, new: Mapping[str, pd.DataFrame],
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


def stack(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One frame of ticker, date, open, high, low, close, volume: ``frames``' bars, by ticker."""
    columns = ["date", *bars_store.PRICE_COLUMNS]
    if isinstance(frames, KeptBars):  # already one set of columns, by ticker
        lengths = [hi - lo for lo, hi in frames.bounds.values()]
        if not lengths:
            return stack({})
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


def digest(frames: dict[str, pd.DataFrame] | pd.DataFrame) -> str:
    """The input hash of bars: sha256 of their rows (ticker, date, prices, volume), by ticker then date
    (``frames`` or their :func:`stack`)."""
    stacked = frames if isinstance(frames, pd.DataFrame) else stack(frames)
    return hashlib.sha256(pd.util.hash_pandas_object(stacked, index=False).to_numpy().tobytes()).hexdigest()


def bars_table(stacked: pd.DataFrame) -> pa.Table:
    """:func:`bars_store.bars_table` of the bars :func:`stack` stacked (the same table)."""
    schema = bars_store.SCHEMA
    columns = {"ticker": stacked["ticker"].to_numpy(), "date": stacked["date"].to_numpy().astype("datetime64[ns]"),
               **{c: stacked[c].to_numpy(dtype=np.float64) for c in bars_store.PRICE_COLUMNS}}
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def bare(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its ``attrs`` (a shallow copy): pandas deep-copies a frame's attrs into every
    column it hands out, which a few reads of each of thousands of tickers' frames would pay for."""
    if not frame.attrs:
        return frame
    bare = frame.copy(deep=False)
    bare.attrs = {}
    return bare


def day(value) -> str:
    return str(np.datetime64(value, "D"))
