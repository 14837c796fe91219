"""The per-ticker pandas implementation of the features and labels, as it was before the
vectorized panel (``alchemetric_ray/data/panel.py``; moved here verbatim from features.py,
labels.py and shards.py at daf3096): the slow, direct reference that ``tests/test_panel.py``
compares the panel with.  Self-contained on purpose (numpy and pandas only): a change to the
product's features cannot change the reference along with it.  ``spec`` is any object with a
``LabelSpec``'s fields and properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from alchemetric_ray.data.labels import LabelSpec

@dataclass(frozen=True)
class Feature:
    name: str
    fn: Callable[[pd.DataFrame], pd.Series]
    warmup: int  # bars before the first defined value
    description: str
    cross_sectional: bool = False  # minus the date's mean over the stocks (the per-date pass)


FEATURES: dict[str, Feature] = {}


def feature(name: str, warmup: int, description: str, *, cross_sectional: bool = False):
    def register(fn: Callable[[pd.DataFrame], pd.Series]):
        FEATURES[name] = Feature(name, fn, warmup, description, cross_sectional)
        return fn

    return register


def _safe_ratio(num: pd.Series, den: pd.Series, neutral: float) -> pd.Series:
    """num / den, with ``neutral`` where the denominator is zero or not finite."""
    den_ok = den.notna() & np.isfinite(den) & (den.abs() > 1e-12)
    out = pd.Series(np.full(len(num), neutral, dtype="float64"), index=num.index)
    out[den_ok] = num[den_ok] / den[den_ok]
    out[num.isna() | den.isna()] = np.nan  # still warming up
    return out


def _log_ret(bars: pd.DataFrame) -> pd.Series:
    return np.log(bars["close"]).diff()


# ---- returns and volatility ----------------------------------------------------------------
for _k in (1, 5, 10, 20):
    feature(f"ret_{_k}", _k, f"log return over the last {_k} bar(s)")(
        lambda bars, k=_k: np.log(bars["close"]).diff(k))

for _k in (1, 5, 10, 20):
    feature(f"ret_{_k}_rel", _k, f"log return over the last {_k} bar(s) minus that date's mean over the stocks",
            cross_sectional=True)(lambda bars, k=_k: np.log(bars["close"]).diff(k))

for _w in (5, 20, 60):
    feature(f"vol_{_w}", _w, f"std of daily log returns over {_w} bars")(
        lambda bars, w=_w: _log_ret(bars).rolling(w, min_periods=w).std())


@feature("rsi_14", 14, "Wilder RSI(14), scaled to [-0.5, 0.5]")
def _rsi(bars: pd.DataFrame) -> pd.Series:
    delta = bars["close"].diff()
    gain = delta.clip(lower=0).ewm(alpha=1 / 14, adjust=False, min_periods=14).mean()
    loss = (-delta).clip(lower=0).ewm(alpha=1 / 14, adjust=False, min_periods=14).mean()
    total = gain + loss
    return _safe_ratio(gain, total, 0.5) - 0.5  # no movement at all = neutral


def _macd_line(bars: pd.DataFrame) -> pd.Series:
    close = bars["close"]
    fast = close.ewm(span=12, adjust=False, min_periods=12).mean()
    slow = close.ewm(span=26, adjust=False, min_periods=26).mean()
    return (fast - slow) / close


@feature("macd", 26, "MACD line (EMA12 - EMA26) divided by close")
def _macd(bars: pd.DataFrame) -> pd.Series:
    return _macd_line(bars)


@feature("macd_hist", 34, "MACD line minus its 9-bar EMA signal, divided by close")
def _macd_hist(bars: pd.DataFrame) -> pd.Series:
    line = _macd_line(bars)
    return line - line.ewm(span=9, adjust=False, min_periods=9).mean()


@feature("bb_pctb_20", 20, "Bollinger %B(20, 2 std), 0.5 when the window is flat")
def _bb(bars: pd.DataFrame) -> pd.Series:
    close = bars["close"]
    mid = close.rolling(20, min_periods=20).mean()
    std = close.rolling(20, min_periods=20).std(ddof=0)
    return _safe_ratio(close - (mid - 2 * std), 4 * std, 0.5)


@feature("atr_14", 14, "Wilder ATR(14) divided by close")
def _atr(bars: pd.DataFrame) -> pd.Series:
    prev = bars["close"].shift(1)
    true_range = pd.concat([bars["high"] - bars["low"], (bars["high"] - prev).abs(), (bars["low"] - prev).abs()],
                           axis=1).max(axis=1)
    true_range[prev.isna()] = np.nan
    return true_range.ewm(alpha=1 / 14, adjust=False, min_periods=14).mean() / bars["close"]


@feature("volume_z_20", 20, "z-score of log volume over 20 bars, 0 when volume is constant")
def _volume_z(bars: pd.DataFrame) -> pd.Series:
    logv = np.log1p(bars["volume"])
    mean = logv.rolling(20, min_periods=20).mean()
    std = logv.rolling(20, min_periods=20).std()
    return _safe_ratio(logv - mean, std, 0.0)


@feature("hl_range", 0, "(high - low) / close of the bar")
def _hl(bars: pd.DataFrame) -> pd.Series:
    return (bars["high"] - bars["low"]) / bars["close"]


for _w in (10, 50):
    feature(f"close_sma_{_w}", _w - 1, f"close / SMA({_w}) - 1")(
        lambda bars, w=_w: bars["close"] / bars["close"].rolling(w, min_periods=w).mean() - 1)


DEFAULT_FEATURES: tuple[str, ...] = (
    "ret_1", "ret_5", "ret_10", "ret_20", "vol_5", "vol_20", "vol_60", "rsi_14", "macd", "macd_hist",
    "bb_pctb_20", "atr_14", "volume_z_20", "hl_range", "close_sma_10", "close_sma_50",
)


def cross_sectional_names(names: list[str]) -> list[str]:
    """The market-relative features among ``names``: the per-date pass demeans them."""
    return [n for n in names if FEATURES[n].cross_sectional]


def warmup_bars(names: list[str]) -> int:
    return max(FEATURES[n].warmup for n in names)


def compute_features(bars: pd.DataFrame, names: list[str]) -> tuple[pd.DataFrame, int]:
    """Feature columns (float64) aligned with ``bars``; rows inside the warm-up are NaN.

    Returns (features, n_nonfinite): the count of values after the warm-up that were not
    finite and have been set to NaN (the caller drops those rows).
    """
    out = pd.DataFrame({name: FEATURES[name].fn(bars).astype("float64") for name in names}, index=bars.index)
    values = out.to_numpy(copy=True)
    bad = ~np.isfinite(values)
    warm = warmup_bars(names)
    late_bad = int(bad[warm:].any(axis=1).sum()) if len(values) > warm else 0
    if bad.any():
        values[bad] = np.nan
        out = pd.DataFrame(values, index=out.index, columns=out.columns)
    return out, late_bad


# ---- labels (labels.py) ----

def _trailing_vol(bars: pd.DataFrame) -> np.ndarray:
    return np.log(bars["close"]).diff().rolling(20, min_periods=20).std().to_numpy()


def forward_return(bars: pd.DataFrame, horizon: int) -> np.ndarray:
    """log(open[t+1+h] / open[t+1]); NaN where the future is not there yet."""
    log_open = np.log(bars["open"].to_numpy())
    out = np.full(len(bars), np.nan)
    if len(bars) > 1 + horizon:
        out[: len(bars) - 1 - horizon] = log_open[1 + horizon:] - log_open[1: len(bars) - horizon]
    return out


def make_labels(bars: pd.DataFrame, spec: LabelSpec) -> tuple[np.ndarray, np.ndarray]:
    """(label as float with NaN where undefined, forward return) for every bar.  For a
    cross-sectional target the label is the forward return until the per-date pass replaces it."""
    fwd = forward_return(bars, spec.horizon)
    n = len(bars)
    if spec.regression:
        label = fwd.copy()
    elif spec.scheme == "binary":
        label = np.where(fwd > 0, 1.0, 0.0)
    elif spec.scheme == "three_class":
        if spec.threshold_mode == "fixed":
            band = np.full(n, spec.threshold)
        else:
            band = spec.vol_multiple * _trailing_vol(bars) * np.sqrt(spec.horizon)
        label = np.where(fwd > band, 2.0, np.where(fwd < -band, 0.0, 1.0))
        label[np.isnan(band)] = np.nan
    else:
        label = _triple_barrier(bars, spec)
    label[np.isnan(fwd)] = np.nan
    # the label is undefined where its reach runs past the data
    if spec.reach > 0:
        label[max(0, n - spec.reach):] = np.nan
    return label, fwd


def _triple_barrier(bars: pd.DataFrame, spec: LabelSpec) -> np.ndarray:
    n = len(bars)
    vol = _trailing_vol(bars)
    log_open = np.log(bars["open"].to_numpy())
    log_high = np.log(bars["high"].to_numpy())
    log_low = np.log(bars["low"].to_numpy())
    label = np.full(n, np.nan)
    undecided = np.ones(n, dtype=bool)
    entry = np.full(n, np.nan)
    entry[: n - 1] = log_open[1:]
    up = entry + spec.barrier_up * vol
    down = entry - spec.barrier_down * vol
    for k in range(1, spec.barrier_bars + 1):  # bar t+k, for every t at once
        hi = np.full(n, np.nan)
        lo = np.full(n, np.nan)
        hi[: n - k] = log_high[k:]
        lo[: n - k] = log_low[k:]
        hit_down = undecided & (lo <= down)
        hit_up = undecided & ~hit_down & (hi >= up)
        label[hit_down] = 0.0
        label[hit_up] = 2.0
        undecided &= ~(hit_down | hit_up)
    label[undecided] = 1.0
    label[np.isnan(vol)] = np.nan
    return label


# ---- one ticker's table (shards.py, splits.py) ----

def label_end_dates(dates: pd.Series, reach: int) -> np.ndarray:
    """For each bar of one ticker, the date of the bar ``reach`` bars later (NaT past the end)."""
    d = dates.to_numpy().astype("datetime64[ns]")
    out = np.full(len(d), np.datetime64("NaT"), dtype="datetime64[ns]")
    if len(d) > reach:
        out[: len(d) - reach] = d[reach:]
    return out


def feature_table(ticker: str, frame: pd.DataFrame, names: list[str], spec: LabelSpec) -> tuple[pd.DataFrame, int]:
    """Every bar of one ticker with its raw features, label, forward return, label end and the
    date of the next bar (when a signal computed on this bar takes effect; NaT for the last)."""
    values, late_bad = compute_features(frame, names)
    label, fwd = make_labels(frame, spec)
    dates = frame["date"].to_numpy().astype("datetime64[ns]")
    table = pd.DataFrame({"date": dates, "ticker": ticker})
    table[names] = values.to_numpy()
    table["label"] = label
    table["fwd_ret"] = fwd
    table["label_end"] = label_end_dates(frame["date"], spec.reach)
    table["next_date"] = label_end_dates(frame["date"], 1)
    table["has_features"] = np.isfinite(table[names].to_numpy()).all(axis=1)
    return table, late_bad


def reference_group(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec,
                    need: int) -> tuple[pd.DataFrame, list[str], dict[str, str], int]:
    """``panel.compute_group`` as it was at daf3096 (a loop over the tickers): (the labelled rows with
    complete features of every ticker, in order; the tickers kept; the skipped ones and why; the
    non-finite rows after the warm-up)."""
    parts, kept, skipped, nonfinite = [], [], {}, 0
    for ticker, frame in frames:
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
        parts.append(table)
        kept.append(ticker)
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return rows, kept, skipped, nonfinite
