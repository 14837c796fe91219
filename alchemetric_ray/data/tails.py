"""What an append resumes each ticker from (``OUT/tails/part-NNNNN.parquet``), so that it computes the new
rows from a few bars instead of re-reading and recomputing the history (:mod:`~alchemetric_ray.data.append`).

One row per ticker whose bars the folder keeps:

- ``date``, ``open``, ``high``, ``low``, ``close``, ``volume``: its last kept bars (lists, oldest first),
  :func:`tail_length` of them: the bars its next rows can look back on (the longest warm-up of the
  features, the label's 20-bar volatility) and the ``reach`` bars after its last row, which had no
  label yet;
- ``last_row``: the date of its last row with complete features and a label (before the per-date
  pass, which may drop a thin date's rows); null: none;
- ``checkpoint``: the date of the bar its EMAs' states were kept after (its last row, where that is
  ``reach`` bars before its last bar, as it is but where a last row was dropped as not finite); null:
  none, and the append then recomputes the ticker from the bars store (``bars/``);
- ``ema_<key>``: each EMA of the features (``features.Panel.ewm``'s ``key``) after the checkpoint bar:
  [running mean, weight of its past, valid values counted] (``features.EmaStates``).

A build writes one part (``tails/part-00000.parquet``); an append writes a new part with every ticker's
row (the ones it computed brought up to date), lists it in the manifest (``files["tails"]``) and removes
the parts it replaces once the manifest is written.  A folder without one (built before tails were kept)
is appended to from its bars store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from alchemetric_ray.data import features as feat
from alchemetric_ray.data.bars_store import PRICE_COLUMNS

TAILS_DIR = "tails"
LABEL_LOOKBACK = 21  # the label's trailing 20-bar volatility: 21 closes
_BAR_COLUMNS = ("date", *PRICE_COLUMNS)


def lookback(names: list[str]) -> int:
    """Bars a row's features and label are computed from, its own included."""
    return max(feat.warmup_bars(names) + 1, LABEL_LOOKBACK)


def tail_length(names: list[str], reach: int) -> int:
    """Kept bars per ticker: those after its last row (``reach``), and what the first new row looks back
    on, with one bar to spare."""
    return lookback(names) + reach + 1


def ema_keep_at(lengths: np.ndarray, reach: int) -> np.ndarray:
    """Per ticker, the bar whose EMA states to keep: its last bar with a label (``reach`` before its last)."""
    at = np.asarray(lengths, dtype=np.int64) - 1 - reach
    return np.where(at >= 0, at, -1)


def record(tickers: list[str], columns: dict[str, np.ndarray], lengths: np.ndarray, last_row: np.ndarray,
           emas: feat.EmaStates, keep: int) -> pa.Table:
    """The tails rows of ``tickers`` (their bars one below the other in ``columns``: date and prices,
    ``lengths`` each): the last ``keep`` bars of each, its last row (``last_row``: a bar number, -1: none)
    and the EMAs' states (``emas``: kept after each ticker's bar ``emas.at``, which must be its last row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    firsts = ends - np.minimum(lengths, keep)
    take = np.concatenate([np.arange(a, b) for a, b in zip(firsts.tolist(), ends.tolist())]) if len(lengths) \
        else np.zeros(0, dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(ends - firsts)]).astype(np.int32))
    starts = ends - lengths
    dates = columns["date"].astype("datetime64[ns]")
    has_row = last_row >= 0
    last_date = np.full(len(lengths), np.datetime64("NaT"), dtype="datetime64[ns]")
    last_date[has_row] = dates[starts[has_row] + last_row[has_row]]
    resumable = has_row & (last_row == emas.at)
    arrays: dict[str, pa.Array] = {
        "ticker": pa.array(tickers, type=pa.string()),
        "last_row": pa.array(last_date, type=pa.timestamp("ns"), mask=~has_row),
        "checkpoint": pa.array(last_date, type=pa.timestamp("ns"), mask=~resumable),
        **{c: pa.ListArray.from_arrays(offsets, pa.array(dates[take] if c == "date" else
                                                         np.asarray(columns[c], dtype=np.float64)[take]))
           for c in _BAR_COLUMNS},
    }
    for key, states in sorted(emas.states.items()):
        flat = pa.array(np.asarray(states, dtype=np.float64).reshape(-1), from_pandas=False)
        arrays[f"ema_{key}"] = pa.FixedSizeListArray.from_arrays(flat, 3)
    return pa.table(arrays)


def write(folder: Path, index: int, tables: list[pa.Table]) -> str:
    """The tails rows of ``tables`` (one schema) as ``folder/tails/part-NNNNN.parquet``; its name
    relative to ``folder``."""
    target = folder / TAILS_DIR
    target.mkdir(exist_ok=True)
    name = f"part-{index:05d}.parquet"
    # no dictionary encoding: prices and dates gain nothing from it, and it costs an append a third of its writing
    pq.write_table(pa.concat_tables(tables).combine_chunks(), target / name, use_dictionary=False)
    return f"{TAILS_DIR}/{name}"


def listed(folder: Path, files: dict) -> list[Path]:
    """The folder's tails parts: those its manifest lists (``files["tails"]``), else those on disk."""
    names = files.get(TAILS_DIR)
    if names:
        return [folder / n for n in names]
    return sorted((folder / TAILS_DIR).glob("part-*.parquet"))


@dataclass
class Tails:
    """A folder's tails, read: per ticker (in ``tickers``' order), its bars in one set of columns
    (``bounds[ticker]``: its rows there), last row and checkpoint (datetime64[ns], NaT: none), and each
    EMA's states (``emas[key]``: (tickers, 3))."""

    tickers: list[str]
    cols: dict[str, np.ndarray]
    lengths: np.ndarray
    last_row: np.ndarray
    checkpoint: np.ndarray
    emas: dict[str, np.ndarray]

    @property
    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tickers)}

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def last_bar(self) -> dict[str, np.datetime64]:
        ends = np.cumsum(self.lengths) - 1
        return {t: self.cols["date"][e] for t, e, n in zip(self.tickers, ends.tolist(), self.lengths.tolist()) if n}

    @classmethod
    def from_table(cls, table: pa.Table) -> Tails:
        table = table.combine_chunks()
        cols = {c: table.column(c).chunk(0).flatten().to_numpy(zero_copy_only=False) if table.num_rows else
                np.empty(0, dtype="datetime64[ns]" if c == "date" else np.float64) for c in _BAR_COLUMNS}
        cols["date"] = cols["date"].astype("datetime64[ns]")
        lengths = table.column("date").chunk(0).value_lengths().to_numpy(zero_copy_only=False).astype(np.int64) \
            if table.num_rows else np.zeros(0, dtype=np.int64)
        emas = {name[len("ema_"):]: table.column(name).chunk(0).flatten().to_numpy(zero_copy_only=False)
                .reshape(-1, 3) for name in table.column_names if name.startswith("ema_")}
        return cls([str(t) for t in table.column("ticker").to_pylist()], cols, lengths,
                   _dates(table.column("last_row")), _dates(table.column("checkpoint")), emas)

    def table(self) -> pa.Table:
        """These tails as the rows :func:`record` writes."""
        ends = np.cumsum(self.lengths)
        offsets = pa.array(np.concatenate([[0], ends]).astype(np.int32))
        arrays: dict[str, pa.Array] = {
            "ticker": pa.array(self.tickers, type=pa.string()),
            "last_row": pa.array(self.last_row, type=pa.timestamp("ns"), mask=np.isnat(self.last_row)),
            "checkpoint": pa.array(self.checkpoint, type=pa.timestamp("ns"), mask=np.isnat(self.checkpoint)),
            **{c: pa.ListArray.from_arrays(offsets, pa.array(self.cols[c])) for c in _BAR_COLUMNS},
        }
        for key, states in sorted(self.emas.items()):
            arrays[f"ema_{key}"] = pa.FixedSizeListArray.from_arrays(pa.array(states.reshape(-1)), 3)
        return pa.table(arrays)


def _dates(column: pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False).astype("datetime64[ns]")


def read(folder: Path, files: dict) -> Tails | None:
    """The folder's tails, or None where it keeps none (or an unreadable part)."""
    parts = listed(folder, files)
    if not parts or not all(p.is_file() for p in parts):
        return None
    try:
        table = pa.concat_tables([pq.read_table(p) for p in parts])
    except (OSError, pa.ArrowInvalid):
        return None
    return Tails.from_table(table)
