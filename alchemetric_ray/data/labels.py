"""Labels from the forward return, aligned to when a signal can actually trade.

A signal computed at the close of bar t is acted on at the open of bar t+1, so the label of
bar t is about the return from the open of t+1 to the open of t+1+h (``fwd_ret``).  Its *reach*,
the last bar it looks at, is t+1+h (t+1+barrier_bars for triple-barrier labels); splits keep
at least that many bars between segments.

Schemes (class ids are stable; the manifest names them):
  * three_class: 0 down / 1 flat / 2 up, with a flat band of ``threshold`` (fixed) or
    ``vol_multiple * vol_20 * sqrt(h)`` (vol; the trailing 20-bar volatility at t);
  * binary: 0 down / 1 up (fwd_ret > 0);
  * triple_barrier: entry at the open of t+1; up/down barriers at +-barrier * vol_20 in log
    price; first touch within ``barrier_bars`` bars decides up (2) or down (0), else flat (1).
    A bar whose high and low touch both barriers counts as down (conservative).

Labels are computed for all the tickers of a panel at once (``features.Panel``: the forward
return, the trailing volatility and the barriers never look past the ticker's own last bar).

Cross-sectional targets (regression; no classes): the same forward return, compared with the other
stocks of the same date: ``cs_rank`` its percentile rank centred on 0, ``cs_zscore`` its z-score.
Per ticker they are the forward return itself; the per-date pass (``data/cross_section.py``) turns
it into the target once every ticker is computed.  Execution lag, horizon, reach, embargo and purge
are those of the forward return, as for the classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from alchemetric_ray.config import REGRESSION_LABELS as REGRESSION_SCHEMES  # the config validates them
from alchemetric_ray.data.features import Panel, rolling_vol

CROSS_SECTION_KIND = {"cs_rank": "rank", "cs_zscore": "zscore"}  # data/cross_section.py's transform


@dataclass(frozen=True)
class LabelSpec:
    scheme: str = "three_class"
    horizon: int = 1
    threshold: float = 0.0
    threshold_mode: str = "vol"
    vol_multiple: float = 0.25
    barrier_up: float = 2.0
    barrier_down: float = 2.0
    barrier_bars: int = 10

    @classmethod
    def from_config(cls, f) -> "LabelSpec":
        return cls(f.label, f.horizon, f.threshold, f.threshold_mode, f.vol_multiple,
                   f.barrier_up, f.barrier_down, f.barrier_bars)

    @classmethod
    def from_manifest(cls, manifest) -> "LabelSpec":
        """The spec a feature manifest (``data.manifest.Manifest``) records: its label's own fields."""
        return cls(**{f.name: manifest.label[f.name] for f in dataclasses.fields(cls)})

    @property
    def regression(self) -> bool:
        """A cross-sectional target: a real number per row, scored by regression, not classes."""
        return self.scheme in REGRESSION_SCHEMES

    @property
    def classes(self) -> list[str]:
        if self.regression:
            return []
        return ["down", "up"] if self.scheme == "binary" else ["down", "flat", "up"]

    @property
    def reach(self) -> int:
        """Bars after t that the label of t depends on."""
        return 1 + (self.barrier_bars if self.scheme == "triple_barrier" else self.horizon)


def forward_return_panel(panel: Panel, horizon: int) -> np.ndarray:
    """log(open[t+1+h] / open[t+1]) for every row of ``panel``; NaN where the ticker's future is not there yet."""
    log_open = panel.cached("log_open", lambda: np.log(panel.open))
    out = panel.shift(log_open, -(1 + horizon)) - panel.shift(log_open, -1)
    out[panel.left < 1 + horizon] = np.nan
    return out


def panel_labels(panel: Panel, spec: LabelSpec) -> tuple[np.ndarray, np.ndarray]:
    """(label as float with NaN where undefined, forward return) for every row of ``panel``.  For a
    cross-sectional target the label is the forward return until the per-date pass replaces it."""
    fwd = forward_return_panel(panel, spec.horizon)
    if spec.regression:
        label = fwd.copy()
    elif spec.scheme == "binary":
        label = np.where(fwd > 0, 1.0, 0.0)
    elif spec.scheme == "three_class":
        if spec.threshold_mode == "fixed":
            band = np.full(panel.n, spec.threshold)
        else:
            band = spec.vol_multiple * rolling_vol(panel, 20) * np.sqrt(spec.horizon)
        label = np.where(fwd > band, 2.0, np.where(fwd < -band, 0.0, 1.0))
        label[np.isnan(band)] = np.nan
    else:
        label = _triple_barrier(panel, spec)
    label[np.isnan(fwd)] = np.nan
    # the label is undefined where its reach runs past the ticker's data
    if spec.reach > 0:
        label[panel.left < spec.reach] = np.nan
    return label, fwd


def _triple_barrier(panel: Panel, spec: LabelSpec) -> np.ndarray:
    vol = rolling_vol(panel, 20)
    log_high, log_low = np.log(panel.high), np.log(panel.low)
    label = np.full(panel.n, np.nan)
    undecided = np.ones(panel.n, dtype=bool)
    entry = panel.shift(np.log(panel.open), -1)
    up = entry + spec.barrier_up * vol
    down = entry - spec.barrier_down * vol
    for k in range(1, spec.barrier_bars + 1):  # bar t+k, for every t of every ticker at once
        hi, lo = panel.shift(log_high, -k), panel.shift(log_low, -k)
        hit_down = undecided & (lo <= down)
        hit_up = undecided & ~hit_down & (hi >= up)
        label[hit_down] = 0.0
        label[hit_up] = 2.0
        undecided &= ~(hit_down | hit_up)
    label[undecided] = 1.0
    label[np.isnan(vol)] = np.nan
    return label


def forward_return(bars: pd.DataFrame, horizon: int) -> np.ndarray:
    """One ticker's :func:`forward_return_panel`."""
    return forward_return_panel(Panel.from_frames([bars]), horizon)


def make_labels(bars: pd.DataFrame, spec: LabelSpec) -> tuple[np.ndarray, np.ndarray]:
    """One ticker's :func:`panel_labels`."""
    return panel_labels(Panel.from_frames([bars]), spec)
