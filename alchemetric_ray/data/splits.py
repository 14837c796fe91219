"""Time-based train/val/test splits with an embargo, and walk-forward folds.

Segments are ranges of the shared trading calendar (every date any ticker traded):
``train = [D0, D[i1 - e])``, ``val = [D[i1], D[i2 - e])``, ``test = [D[i2], end]`` where ``e`` is
the embargo in bars (at least the label's reach).  On top of the gap, a row is *purged* when its
own label window (``label_end``, the date of the last bar its label looks at, in its ticker's
own series) reaches the next segment, so no label ever crosses a boundary, whatever gaps a
single ticker's history has.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from alchemetric_ray.errors import SplitError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SplitPlan:
    train_start: str
    train_end: str  # last date in train (inclusive)
    val_start: str
    val_end: str
    test_start: str
    test_end: str
    embargo: int

    def as_dict(self) -> dict:
        return asdict(self)

    def assign(self, dates: np.ndarray, label_end: np.ndarray) -> np.ndarray:
        """Split index per row (0 train, 1 val, 2 test, -1 dropped: embargo gap or purged)."""
        d = dates.astype("datetime64[ns]")
        end = label_end.astype("datetime64[ns]")
        ts = {k: np.datetime64(v, "ns") for k, v in self.as_dict().items() if k != "embargo"}
        out = np.full(len(d), -1, dtype=np.int8)
        train = (d >= ts["train_start"]) & (d <= ts["train_end"]) & (end < ts["val_start"])
        val = (d >= ts["val_start"]) & (d <= ts["val_end"]) & (end < ts["test_start"])
        test = (d >= ts["test_start"]) & (d <= ts["test_end"])
        out[train] = 0
        out[val] = 1
        out[test] = 2
        return out


@dataclass(frozen=True)
class SplitSpec:
    """Where the segments fall: fractions of the calendar (``train_frac``, ``val_frac``), or explicit
    ends (``train_end`` and ``val_end``, both or neither); ``embargo`` dates dropped before each
    boundary; ``train_start`` drops the dates before it (a rolling window's start)."""

    train_frac: float
    val_frac: float
    embargo: int
    train_end: str | None = None
    val_end: str | None = None
    train_start: str | None = None


def plan_splits(calendar: np.ndarray, spec: SplitSpec) -> SplitPlan:
    """Segment boundaries on the shared calendar (sorted unique dates), as ``spec`` says."""
    train_frac, val_frac, embargo = spec.train_frac, spec.val_frac, spec.embargo
    train_end, val_end, train_start = spec.train_end, spec.val_end, spec.train_start
    dates = np.unique(np.asarray(calendar).astype("datetime64[D]"))
    if train_start:
        dates = dates[dates >= np.datetime64(train_start, "D")]
    n = len(dates)
    if train_end or val_end:
        if not (train_end and val_end):
            raise SplitError("explicit splits need both features.train_end and features.val_end")
        i1 = int(np.searchsorted(dates, np.datetime64(train_end, "D"), side="right"))
        i2 = int(np.searchsorted(dates, np.datetime64(val_end, "D"), side="right"))
    else:
        i1 = int(round(train_frac * n))
        i2 = int(round((train_frac + val_frac) * n))
    segments = {"train": (0, i1 - embargo), "val": (i1, i2 - embargo), "test": (i2, n)}
    for name, (lo, hi) in segments.items():
        if hi - lo < 1:
            span = f"{_d(dates[0])}..{_d(dates[-1])}" if n else "-..-"
            raise SplitError(
                f"split '{name}' is empty: {n} trading dates ({span}) "
                f"cannot hold train/val/test with an embargo of {embargo} bars; use more data or change the split")
    return SplitPlan(
        train_start=_d(dates[0]), train_end=_d(dates[i1 - embargo - 1]),
        val_start=_d(dates[i1]), val_end=_d(dates[i2 - embargo - 1]),
        test_start=_d(dates[i2]), test_end=_d(dates[-1]),
        embargo=embargo,
    )


def walk_forward_folds(calendar: np.ndarray, n_folds: int, *, embargo: int, min_train_frac: float = 0.4,
                       val_frac: float = 0.15) -> list[SplitPlan]:
    """Expanding-window folds: each fold trains on everything before its test block."""
    dates = np.unique(np.asarray(calendar).astype("datetime64[D]"))
    n = len(dates)
    first_test = int(round(min_train_frac * n))
    block = (n - first_test) // n_folds
    if n_folds < 1 or block < 2 * embargo + 2:
        raise SplitError(f"{n_folds} walk-forward folds do not fit in {n} trading dates with an embargo of {embargo}")
    folds = []
    for k in range(n_folds):
        test_lo = first_test + k * block
        test_hi = n if k == n_folds - 1 else test_lo + block
        train_n = test_lo - embargo
        val_lo = int(round(train_n * (1 - val_frac)))
        folds.append(SplitPlan(
            train_start=_d(dates[0]), train_end=_d(dates[val_lo - embargo - 1]),
            val_start=_d(dates[val_lo]), val_end=_d(dates[test_lo - embargo - 1]),
            test_start=_d(dates[test_lo]), test_end=_d(dates[test_hi - 1]),
            embargo=embargo,
        ))
    return folds


def refit_folds(calendar: np.ndarray, refit_every: int, *, embargo: int, train_window: int = 0,
                min_train_frac: float = 0.4, val_frac: float = 0.15) -> list[SplitPlan]:
    """Walk-forward refits every ``refit_every`` trading dates: the first test block starts after
    ``min_train_frac`` of the calendar, each block is ``refit_every`` dates (the last one whatever is
    left), and each fold trains on the dates before its block: all of them (``train_window=0``, an
    expanding window) or the last ``train_window`` (a rolling one), its last ``val_frac`` for
    validation, with ``embargo`` dates between train, val and test."""
    dates = np.unique(np.asarray(calendar).astype("datetime64[D]"))
    n = len(dates)
    first_test = int(round(min_train_frac * n))
    if refit_every < 2 * embargo + 2 or first_test + refit_every > n:
        raise SplitError(f"signals.refit_every={refit_every}: blocks of that many trading dates do not fit in the "
                         f"{n - first_test} dates after the first {min_train_frac:.0%} of {n} "
                         f"(embargo {embargo}); use a smaller value or more data")
    starts = list(range(first_test, n, refit_every))
    if n - starts[-1] < 2 * embargo + 2 and len(starts) > 1:  # a last block too short to score joins the one before
        starts.pop()
    folds = []
    if train_window and train_window < 2 * (2 * embargo + 2):
        raise SplitError(f"signals.train_window={train_window}: too few trading dates for a train and a validation "
                         f"segment with an embargo of {embargo}")
    for k, test_lo in enumerate(starts):
        test_hi = starts[k + 1] if k + 1 < len(starts) else n
        lo = max(0, test_lo - embargo - train_window) if train_window else 0
        train_n = test_lo - embargo - lo
        val_lo = lo + int(round(train_n * (1 - val_frac)))
        folds.append(SplitPlan(
            train_start=_d(dates[lo]), train_end=_d(dates[val_lo - embargo - 1]),
            val_start=_d(dates[val_lo]), val_end=_d(dates[test_lo - embargo - 1]),
            test_start=_d(dates[test_lo]), test_end=_d(dates[test_hi - 1]),
            embargo=embargo,
        ))
    return folds


def boundaries(calendar: np.ndarray, plan: SplitPlan) -> tuple[str, str]:
    """``features.train_end`` and ``features.val_end`` for which :func:`plan_splits` rebuilds ``plan``
    on ``calendar``: the last dates before its val and its test segments.  ``plan_splits`` takes the
    embargo off those boundaries itself, so passing ``plan.train_end``/``plan.val_end`` (which already
    lie an embargo before the next segment) would apply it twice."""
    dates = np.unique(np.asarray(calendar).astype("datetime64[D]"))
    i1 = int(np.searchsorted(dates, np.datetime64(plan.val_start, "D")))
    i2 = int(np.searchsorted(dates, np.datetime64(plan.test_start, "D")))
    return _d(dates[i1 - 1]), _d(dates[i2 - 1])


def label_end_dates(dates: pd.Series, reach: int) -> np.ndarray:
    """For each bar of one ticker, the date of the bar ``reach`` bars later (NaT past the end)."""
    d = dates.to_numpy().astype("datetime64[ns]")
    out = np.full(len(d), np.datetime64("NaT"), dtype="datetime64[ns]")
    if len(d) > reach:
        out[: len(d) - reach] = d[reach:]
    return out


def _d(value) -> str:
    return str(np.datetime64(value, "D"))
