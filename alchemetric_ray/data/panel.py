"""Features and labels for a group of tickers at once: the unit of work of the feature build.

:func:`compute_group` takes the bars of several tickers (each a frame of date, open, high, low,
close, volume, sorted by date) and returns every labelled row with complete features, for all of
them together, ordered by ticker then date.  It is a pure function of its inputs: the build runs
it in the driver for a small input and as Ray tasks over groups of tickers otherwise
(``data/staging.py``).

Every feature and label is computed for all the tickers of the group at once, over one panel of
columnar arrays (``features.Panel``: rows by ticker then date; windows, EMAs and shifts start over
at each ticker's first bar); there is no per-ticker loop.  The values equal those of the per-ticker
pandas implementation it replaced (``tests/reference_features.py``; ``tests/test_panel.py``
compares them on the packaged data and on a synthetic market with edge cases).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from alchemetric_ray.data import features as feat
from alchemetric_ray.data.features import Panel
from alchemetric_ray.data.labels import LabelSpec, panel_labels


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


def panel_columns(panel: Panel, dates: np.ndarray, names: list[str],
                  spec: LabelSpec) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every row of ``panel`` with its raw features, label, forward return, label end, the date of the
    next bar (when a signal computed on this bar takes effect; NaT for a ticker's last) and whether
    every feature is defined; and, per ticker, the rows after the warm-up dropped as non-finite."""
    values, late_bad = feat.feature_matrix(panel, names)
    label, fwd = panel_labels(panel, spec)
    cols = {name: values[:, j] for j, name in enumerate(names)}
    cols.update(label=label, fwd_ret=fwd, label_end=_later_date(panel, dates, spec.reach),
                next_date=_later_date(panel, dates, 1), has_features=np.isfinite(values).all(axis=1))
    return cols, late_bad


def _later_date(panel: Panel, dates: np.ndarray, reach: int) -> np.ndarray:
    """For each row, the date of the bar ``reach`` bars later in its ticker (NaT past its end)."""
    out = np.full(panel.n, np.datetime64("NaT"), dtype="datetime64[ns]")
    if panel.n > reach:
        out[: panel.n - reach] = dates[reach:]
    out[panel.left < reach] = np.datetime64("NaT")
    return out


def _dates(frames: list[pd.DataFrame]) -> np.ndarray:
    parts = [f["date"].to_numpy().astype("datetime64[ns]") for f in frames]
    return np.concatenate(parts) if parts else np.empty(0, dtype="datetime64[ns]")


def feature_table(ticker: str, frame: pd.DataFrame, names: list[str], spec: LabelSpec) -> tuple[pd.DataFrame, int]:
    """Every bar of one ticker with its raw features, label, forward return, label end, the date of the
    next bar and ``has_features`` (:func:`panel_columns` of a one-ticker panel); and its count of rows
    after the warm-up dropped as non-finite."""
    panel = Panel.from_frames([frame])
    dates = _dates([frame])
    cols, late_bad = panel_columns(panel, dates, names, spec)
    table = pd.DataFrame({"date": dates, "ticker": ticker})
    table[names] = np.column_stack([cols[n] for n in names]) if names else np.empty((len(frame), 0))
    for name in ("label", "fwd_ret", "label_end", "next_date", "has_features"):
        table[name] = cols[name]
    return table, int(late_bad.sum())


def compute_group(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec,
                  need: int) -> GroupResult:
    """Features and labels of every ticker in ``frames``; a ticker with fewer than ``need`` bars, or
    no labelled row with complete features, is skipped with its reason."""
    rows = sum(len(frame) for _, frame in frames)
    digests = {ticker: bars_digest(frame) for ticker, frame in frames}
    short = {ticker: f"{len(frame)} bars, fewer than the {need} the features and labels need"
             for ticker, frame in frames if len(frame) < need}
    inside = [(ticker, frame) for ticker, frame in frames if ticker not in short and len(frame)]
    panel = Panel.from_frames([frame for _, frame in inside])
    dates = _dates([frame for _, frame in inside])
    cols, late_bad = panel_columns(panel, dates, names, spec)
    keep = cols["has_features"] & np.isfinite(cols["label"])
    kept_rows = np.bincount(panel.tid[keep], minlength=len(inside))
    labelled = {ticker for (ticker, _), n in zip(inside, kept_rows) if n}
    skipped = {ticker: short.get(ticker, "no row with complete features and a label")
               for ticker, _ in frames if ticker not in labelled}
    kept = [ticker for ticker, _ in frames if ticker in labelled]
    if not kept:
        return GroupResult(pa.table({}), kept, skipped, int(late_bad.sum()), rows, digests)
    ticker_of = np.array([ticker for ticker, _ in inside], dtype=object)
    table = pd.DataFrame({"date": dates[keep], "ticker": ticker_of[panel.tid[keep]]})
    for name in [*names, "label", "fwd_ret", "label_end"]:
        table[name] = cols[name][keep]
    return GroupResult(pa.Table.from_pandas(table, preserve_index=False), kept, skipped, int(late_bad.sum()), rows,
                       digests)
