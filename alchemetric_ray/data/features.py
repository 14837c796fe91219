"""A registry of named features, each computed only from past and current bars.

Most are per ticker.  A *market-relative* feature (``cross_sectional``) is a per-ticker value
minus that date's mean over the stocks in the data: its function gives the per-ticker value, and
the per-date pass (``data/cross_section.py``) subtracts the mean once every ticker is computed.

Adding a feature is one decorated function ``(bars) -> Series`` with its warm-up (the bars it
needs before it is defined).  Ratios whose denominator can be zero (a flat window) fall back to
a neutral value instead of inf/NaN, and ``compute_features`` refuses to pass any non-finite
value on: rows inside the longest warm-up are dropped, anything else non-finite is dropped and
counted.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from alchemetric_ray.errors import FeatureError


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


def resolve_feature_names(names: list[str] | None) -> list[str]:
    names = list(DEFAULT_FEATURES) if not names else list(names)
    for name in names:
        if name not in FEATURES:
            close = difflib.get_close_matches(name, list(FEATURES), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise FeatureError(f"unknown feature '{name}' in features.names{hint} (known: {', '.join(FEATURES)})")
    if len(set(names)) != len(names):
        raise FeatureError(f"features.names lists a feature twice: {names}")
    return names


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
