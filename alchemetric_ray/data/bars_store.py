"""The bars a shard folder was built from, kept beside its shards so that it can be appended to.

``OUT/bars/part-NNNNN.parquet``: one file per group of tickers the build computed, the bars as
ingest gave them (ticker, date, open, high, low, close, volume), rows ordered by ticker then date.
``features --append`` re-reads the warm-up window from here and checks new bars against the ones
kept; ``--rebuild`` rebuilds from them merged with the new ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

BARS_DIR = "bars"
PRICE_COLUMNS = ("open", "high", "low", "close", "volume")
SCHEMA = pa.schema([("ticker", pa.string()), ("date", pa.timestamp("ns")),
                    *[(name, pa.float64()) for name in PRICE_COLUMNS]])


def bars_table(frames: list[tuple[str, pd.DataFrame]]) -> pa.Table:
    """One table of the bars of ``frames`` (ticker, frame), in their order."""
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    for ticker, frame in frames:
        columns["ticker"].append(np.full(len(frame), ticker, dtype=object))
        columns["date"].append(frame["date"].to_numpy().astype("datetime64[ns]"))
        for name in PRICE_COLUMNS:
            columns[name].append(frame[name].to_numpy(dtype=np.float64))
    arrays = [pa.array(np.concatenate(columns[f.name]) if columns[f.name] else [], type=f.type) for f in SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def write_part(folder: Path, index: int, frames: list[tuple[str, pd.DataFrame]]) -> str:
    """Write one group's bars under ``folder/bars``; the file's name relative to ``folder``."""
    return write_table_part(folder, index, bars_table(frames))


def write_table_part(folder: Path, index: int, table: pa.Table) -> str:
    """:func:`write_part` for a group's bars already in one table (:func:`bars_table`'s: a Ray task's)."""
    target = folder / BARS_DIR
    target.mkdir(exist_ok=True)  # never ``folder`` itself: a build's task must not remake a removed folder
    name = f"part-{index:05d}.parquet"
    # dictionary encoding for the ticker only: the prices' dictionaries cost time and gain nothing
    pq.write_table(table, target / name, use_dictionary=["ticker"])
    return f"{BARS_DIR}/{name}"
