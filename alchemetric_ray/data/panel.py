"""Features and labels for a group of tickers at once: the unit of work of the feature build.

:func:`compute_group` takes the bars of several tickers (each a frame of date, open, high, low,
close, volume, sorted by date) and returns every labelled row with complete features, for all of
them together, ordered by ticker then date.  It is a pure function of its inputs: the build runs
it in the driver for a small input and as Ray tasks over groups of tickers otherwise
(``data/staging.py``).

(Interim implementation: per ticker, through ``shards.feature_table``; the vectorized one
replaces it behind the same signature.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from alchemetric_ray.data.labels import LabelSpec


@dataclass
class GroupResult:
    """What :func:`compute_group` gives back for one group of tickers."""

    table: pa.Table  # date (timestamp ns), ticker (string), one float64 column per feature, label (float64),
    #                  fwd_ret (float64), label_end (timestamp ns): the labelled rows with complete features
    tickers: list[str]  # the tickers with at least one such row, in input order
    skipped: dict[str, str] = field(default_factory=dict)  # ticker -> why it has no row
    nonfinite: int = 0  # rows after the warm-up dropped for a non-finite feature value
    rows_in: int = 0  # bars read
    digests: dict[str, str] = field(default_factory=dict)  # ticker -> sha256 of its bars (the input hash)


def bars_digest(frame: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()).hexdigest()


def compute_group(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec,
                  need: int) -> GroupResult:
    """Features and labels of every ticker in ``frames``; a ticker with fewer than ``need`` bars, or
    no labelled row with complete features, is skipped with its reason."""
    from alchemetric_ray.data.shards import feature_table

    parts, kept, skipped, nonfinite, rows = [], [], {}, 0, 0
    digests = {}
    for ticker, frame in frames:
        rows += len(frame)
        digests[ticker] = bars_digest(frame)
        if len(frame) < need:
            skipped[ticker] = f"{len(frame)} bars, fewer than the {need} the features and labels need"
            continue
        table, late_bad = feature_table(ticker, frame, names, spec)
        nonfinite += late_bad
        labelled = table["has_features"] & np.isfinite(table["label"].to_numpy())
        table = table[labelled].drop(columns=["has_features", "next_date"])
        if table.empty:
            skipped[ticker] = "no row with complete features and a label"
            continue
        parts.append(pa.Table.from_pandas(table, preserve_index=False))
        kept.append(ticker)
    table = pa.concat_tables(parts) if parts else pa.table({})
    return GroupResult(table, kept, skipped, nonfinite, rows, digests)
