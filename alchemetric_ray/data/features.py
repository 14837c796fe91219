"""A registry of named features, each computed only from past and current bars.

Every feature is computed for all the tickers of a :class:`Panel` at once: one set of columnar
arrays (rows ordered by ticker, then date) whose shifts, rolling windows and EMAs start over at
each ticker's first bar, so nothing crosses from one ticker into the next.  There is no loop over
the tickers (``data/panel.py`` says why numpy, with the figures).

Most are per ticker.  A *market-relative* feature (``cross_sectional``) is a per-ticker value
minus that date's mean over the stocks in the data: its function gives the per-ticker value, and
the per-date pass (``data/cross_section.py``) subtracts the mean once every ticker is computed.

Adding a feature is one decorated function ``(panel) -> array`` of the panel's primitives
(``panel.close``, ``panel.diff``, ``panel.rolling_mean``, ``panel.ewm``, ...) with its warm-up (the
bars it needs before it is defined).  The primitives keep pandas' semantics, which the features
were first written in (``tests/reference_features.py``, the reference the panel is tested against):
``ewm(adjust=False, min_periods=...)`` starts at a ticker's first valid value and counts valid
values; a rolling window is defined once it holds ``window`` valid values; inf counts as missing in
both.  Ratios whose denominator can be zero (a flat window) fall back to a neutral value instead of
inf/NaN, and :func:`feature_matrix` refuses to pass any non-finite value on: rows inside the longest
warm-up are dropped, anything else non-finite is dropped and counted.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from alchemetric_ray.errors import FeatureError


class Panel:
    """The bars of several tickers as one table of float64 columns, rows by ticker then date.

    ``lengths`` gives each ticker's number of bars (in order); ``pos`` is a row's bar number within
    its ticker and ``left`` the bars after it.  Every primitive respects the ticker boundaries.
    Intermediate results shared by several features (the log close, a MACD line) are kept in
    :meth:`cached` for the panel's lifetime.
    """

    def __init__(self, columns: dict[str, np.ndarray], lengths: np.ndarray):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.n = int(self.lengths.sum())
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.tid = np.repeat(np.arange(len(self.lengths)), self.lengths)
        self.pos = np.arange(self.n, dtype=np.int64) - self.starts[self.tid]
        self.left = self.lengths[self.tid] - 1 - self.pos
        self.open, self.high, self.low = columns["open"], columns["high"], columns["low"]
        self.close, self.volume = columns["close"], columns["volume"]
        self._cache: dict[object, np.ndarray] = {}

    @classmethod
    def from_frames(cls, frames: list[pd.DataFrame]) -> "Panel":
        """One panel of ``frames`` (each one ticker's bars, sorted by date), in their order."""
        return cls.from_table(stack(frames), np.array([len(f) for f in frames], dtype=np.int64))

    @classmethod
    def from_table(cls, table: pd.DataFrame, lengths: np.ndarray) -> "Panel":
        """A panel of one table of every ticker's bars, ``lengths[j]`` rows of ticker j after ticker j-1's."""
        return cls({c: table[c].to_numpy(dtype=np.float64) for c in ("open", "high", "low", "close", "volume")},
                   lengths)

    def cached(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ---- primitives, all per ticker ---------------------------------------------------------
    def shift(self, x: np.ndarray, k: int) -> np.ndarray:
        """The value k bars earlier (k > 0) or -k bars later (k < 0) in the same ticker; NaN where none."""
        out = np.full(self.n, np.nan)
        if abs(k) >= self.n:
            return out
        if k >= 0:
            out[k:] = x[: self.n - k]
            out[self.pos < k] = np.nan
        else:
            out[: self.n + k] = x[-k:]
            out[self.left < -k] = np.nan
        return out

    def diff(self, x: np.ndarray, k: int) -> np.ndarray:
        return x - self.shift(x, k)

    def rolling_mean(self, x: np.ndarray, window: int) -> np.ndarray:
        return self.rolling_mean_std(x, window, None)[0]

    def rolling_std(self, x: np.ndarray, window: int, ddof: int = 1) -> np.ndarray:
        return self.rolling_mean_std(x, window, ddof)[1]

    def rolling_mean_std(self, x: np.ndarray, w: int, ddof: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std (``ddof``; None: mean only) of the last ``w`` bars, defined where all ``w`` are
        valid.  Each window in two passes (its mean, then the squared deviations): as exact as
        pandas' running sums, including exactly 0 (and the value itself as the mean) for a flat
        window, which the neutral values of the ratios depend on."""
        if self.n == 0:
            return np.empty(0), np.empty(0)
        x = np.where(np.isfinite(x), x, np.nan)
        pad = np.concatenate([np.full(w - 1, np.nan), x])  # pad[k: k + n] is x k - w + 1 bars back
        total = x.copy()
        for k in range(w - 1):  # a window's bars, one lag at a time: contiguous adds, no n x w temporary
            total += pad[k: k + self.n]
        mean = total / w
        changes = np.concatenate([[0], np.cumsum(x[1:] != x[:-1])])
        flat = np.zeros(self.n, dtype=bool)
        flat[w - 1:] = changes[w - 1:] == changes[: self.n - w + 1]  # no change inside the window
        mean[flat] = x[flat]
        std = np.empty(0)
        if ddof is not None:
            sq, dev = np.zeros(self.n), np.empty(self.n)
            for k in range(w):
                np.subtract(pad[k: k + self.n], mean, out=dev)
                dev *= dev
                sq += dev
            sq[flat] = 0.0
            std = np.sqrt(sq / (w - ddof))
            std[self.pos < w - 1] = np.nan
        mean[self.pos < w - 1] = np.nan
        return mean, std

    def ewm(self, x: np.ndarray, *, min_periods: int, alpha: float | None = None,
            span: float | None = None) -> np.ndarray:
        """pandas' ``ewm(alpha= | span=, adjust=False, min_periods=).mean()``, per ticker (at alpha = 0.5,
        after a missing value, pandas 3.1 gives other values than its recurrence; no feature uses 0.5)."""
        if (span is None) == (alpha is None):
            raise ValueError("ewm: give alpha or span")
        com = (span - 1) / 2 if span is not None else 1 / alpha - 1  # type: ignore[operator]  # as pandas does
        a = 1 / (1 + com)
        x = np.where(np.isfinite(x), x, np.nan)
        valid = ~np.isnan(x)
        first = np.full(len(self.lengths), self.n)  # each ticker's first valid row (n: none)
        rows = np.flatnonzero(valid)
        head = np.concatenate([[True], self.tid[rows[1:]] != self.tid[rows[:-1]]]) if len(rows) else rows > 0
        first[self.tid[rows[head]]] = rows[head]
        since = np.arange(self.n) - first[self.tid]  # bars since the ticker's first valid value (<0: before)
        started = since >= 0
        gaps = np.zeros(len(self.lengths), dtype=bool)
        gaps[self.tid[started & ~valid]] = True  # a missing value after the start: the exact recurrence
        out = np.full(self.n, np.nan)
        smooth = started & ~gaps[self.tid]
        if smooth.any():
            out[smooth] = _ema_smooth(x[smooth], self.tid[smooth], since[smooth], a)
            out[smooth & (since < min_periods - 1)] = np.nan
        if gaps.any():
            exact = gaps[self.tid]
            out[exact] = _ema_exact(x[exact], self.tid[exact], self.pos[exact], a, min_periods)
        return out

    # ---- windowed primitives (the Alpha158 set) ----------------------------------------------
    def rolling_sum(self, x: np.ndarray, w: int) -> np.ndarray:
        """The sum of the last ``w`` bars, defined where all ``w`` are finite (a lag at a time: a window
        of zeros sums to exactly 0)."""
        if self.n == 0:
            return np.empty(0)
        x = np.where(np.isfinite(x), x, np.nan)
        pad = np.concatenate([np.full(w - 1, np.nan), x])
        total = x.copy()
        for k in range(w - 1):
            total += pad[k: k + self.n]
        total[self.pos < w - 1] = np.nan
        return total

    def windows(self, xs: list[np.ndarray], w: int, reduce: Callable[..., np.ndarray],
                width: int = 1) -> np.ndarray:
        """``reduce(*blocks)`` over every row's window of the last ``w`` bars of each of ``xs``: a block
        is a (rows, w) view, oldest bar first, the row's own bar last; ``reduce`` gives (rows,) or
        (rows, width).  NaN where the window starts before the ticker's first bar or holds a value
        that is not finite.  The windows are taken from one strided view of the whole column (no
        n x w copy) and reduced in blocks of about 2M values, which bounds the temporaries."""
        out = np.full((self.n, width), np.nan)
        if self.n < w:
            return out[:, 0] if width == 1 else out
        cols = [np.where(np.isfinite(x), x, np.nan) for x in xs]
        views = [np.lib.stride_tricks.sliding_window_view(x, w) for x in cols]  # views[.][i] = x[i: i + w]
        step = max(1, (1 << 21) // w)
        with np.errstate(invalid="ignore", divide="ignore"):
            for a in range(0, self.n - w + 1, step):
                got = reduce(*[v[a: a + step] for v in views])
                out[a + w - 1: a + w - 1 + len(got)] = got.reshape(len(got), width)
        missing = np.zeros(self.n + 1, dtype=np.int64)
        for x in cols:
            missing[1:] += np.cumsum(np.isnan(x))
        holes = np.zeros(self.n, dtype=bool)  # a value inside the window is missing
        holes[w - 1:] = missing[w:] > missing[: self.n - w + 1]
        out[holes | (self.pos < w - 1)] = np.nan
        return out[:, 0] if width == 1 else out

    def rolling_max(self, x: np.ndarray, w: int) -> np.ndarray:
        return self.windows([x], w, lambda b: b.max(axis=1))

    def rolling_min(self, x: np.ndarray, w: int) -> np.ndarray:
        return self.windows([x], w, lambda b: b.min(axis=1))

    def rolling_argmax(self, x: np.ndarray, w: int) -> np.ndarray:
        """Where in the window its maximum is: 1 = the oldest bar .. ``w`` = the current one (the first on a tie)."""
        return self.windows([x], w, lambda b: b.argmax(axis=1) + 1.0)

    def rolling_argmin(self, x: np.ndarray, w: int) -> np.ndarray:
        """Where in the window its minimum is: 1 = the oldest bar .. ``w`` = the current one (the first on a tie)."""
        return self.windows([x], w, lambda b: b.argmin(axis=1) + 1.0)

    def rolling_quantile(self, x: np.ndarray, w: int, qs: list[float]) -> np.ndarray:
        """The ``qs`` quantiles of the window (linear interpolation, as pandas' rolling quantile): (n, len(qs))."""
        return self.windows([x], w, lambda b: np.quantile(b, qs, axis=1).T, width=len(qs)).reshape(self.n, len(qs))

    def rolling_rank(self, x: np.ndarray, w: int) -> np.ndarray:
        """The current value's rank in its window over ``w`` (ties: the average rank), in (0, 1]: pandas'
        ``rolling(w).rank(pct=True)``."""
        def rank(b: np.ndarray) -> np.ndarray:
            last = b[:, -1:]
            return ((b < last).sum(axis=1) + ((b == last).sum(axis=1) + 1) / 2) / w

        return self.windows([x], w, rank)

    def rolling_corr(self, x: np.ndarray, y: np.ndarray, w: int, flat: float = 0.0) -> np.ndarray:
        """Pearson correlation of x and y over the window; ``flat`` where either is constant in it."""
        def corr(bx: np.ndarray, by: np.ndarray) -> np.ndarray:
            cx, cy = bx - bx.mean(axis=1, keepdims=True), by - by.mean(axis=1, keepdims=True)
            r = (cx * cy).sum(axis=1) / np.sqrt((cx * cx).sum(axis=1) * (cy * cy).sum(axis=1))
            constant = (bx.max(axis=1) == bx.min(axis=1)) | (by.max(axis=1) == by.min(axis=1))
            return np.where(constant, flat, np.clip(r, -1.0, 1.0))

        return self.windows([x, y], w, corr)

    def rolling_trend(self, x: np.ndarray, w: int, flat_rsquare: float = 0.0) -> np.ndarray:
        """The least-squares line of the window's values against time (1 .. ``w``): (n, 3) of its slope,
        its R^2 (``flat_rsquare`` for a constant window) and the residual of the current bar (its value
        minus the line's).  A constant window: slope 0, residual 0."""
        t = np.arange(1, w + 1, dtype=np.float64)
        tc = t - t.mean()
        stt = float(tc @ tc)

        def trend(b: np.ndarray) -> np.ndarray:
            mean = b.mean(axis=1)
            slope = (b @ tc) / stt
            dev = b - mean[:, None]
            syy = (dev * dev).sum(axis=1)
            constant = b.max(axis=1) == b.min(axis=1)
            slope[constant] = 0.0
            rsq = np.where(constant, flat_rsquare, np.clip(slope * slope * stt / syy, 0.0, 1.0))
            resid = np.where(constant, 0.0, b[:, -1] - (mean + slope * tc[-1]))
            return np.column_stack([slope, rsq, resid])

        return self.windows([x], w, trend, width=3)


def stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The frames one below the other (one concatenation: cheaper than gathering their columns one by one)."""
    if not frames:
        return pd.DataFrame({c: np.empty(0) for c in ("date", "open", "high", "low", "close", "volume")})
    return pd.concat(frames, ignore_index=True)


def _columns(tid: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... for the successive tickers of sorted ticker ids."""
    return np.concatenate([[0], np.cumsum(tid[1:] != tid[:-1])])


def _ema_smooth(x: np.ndarray, tid: np.ndarray, since: np.ndarray, a: float) -> np.ndarray:
    """y[0] = x[0], y[t] = (1 - a) y[t-1] + a x[t] over tickers without a missing value after their
    start: one IIR filter over a [ticker, bar] matrix."""
    col = _columns(tid)
    m = np.zeros((int(col.max()) + 1, int(since.max()) + 1))
    m[col, since] = x
    y = np.empty_like(m)
    y[:, 0] = m[:, 0]
    if m.shape[1] > 1:
        y[:, 1:] = lfilter([a], [1.0, -(1.0 - a)], m[:, 1:], axis=1, zi=(1.0 - a) * m[:, :1])[0]
    return y[col, since]


def _ema_exact(x: np.ndarray, tid: np.ndarray, pos: np.ndarray, a: float, min_periods: int) -> np.ndarray:
    """pandas' own recurrence (adjust=False, ignore_na=False), a bar at a time for all the given
    tickers together: a missing value keeps the mean and decays its weight, min_periods counts
    valid values.  Only tickers with a missing value after their first one come here."""
    col = _columns(tid)
    m = np.full((int(pos.max()) + 1, int(col.max()) + 1), np.nan)
    m[pos, col] = x
    out = np.full_like(m, np.nan)
    weighted, old = m[0].copy(), np.ones(m.shape[1])
    nobs = ~np.isnan(weighted) * 1
    out[0] = np.where(nobs >= min_periods, weighted, np.nan)
    for i in range(1, m.shape[0]):
        cur = m[i]
        obs = ~np.isnan(cur)
        nobs += obs
        have = ~np.isnan(weighted)
        old = np.where(have, old * (1 - a), old)
        mix = (old * weighted + a * cur) / (old + a)
        weighted = np.where(have & obs & (weighted != cur), mix, weighted)
        old = np.where(have & obs, 1.0, old)
        weighted = np.where(~have & obs, cur, weighted)
        out[i] = np.where(nobs >= min_periods, weighted, np.nan)
    return out[pos, col]


@dataclass(frozen=True)
class Feature:
    name: str
    fn: Callable[[Panel], np.ndarray]
    warmup: int  # bars before the first defined value
    description: str
    cross_sectional: bool = False  # minus the date's mean over the stocks (the per-date pass)


FEATURES: dict[str, Feature] = {}


def feature(name: str, warmup: int, description: str, *, cross_sectional: bool = False):
    def register(fn: Callable[[Panel], np.ndarray]):
        FEATURES[name] = Feature(name, fn, warmup, description, cross_sectional)
        return fn

    return register


def safe_ratio(num: np.ndarray, den: np.ndarray, neutral: float) -> np.ndarray:
    """num / den, with ``neutral`` where the denominator is zero or not finite."""
    den_ok = np.isfinite(den) & (np.abs(den) > 1e-12)
    out = np.full(len(num), neutral, dtype="float64")
    out[den_ok] = num[den_ok] / den[den_ok]
    out[np.isnan(num) | np.isnan(den)] = np.nan  # still warming up
    return out


def log_close(p: Panel) -> np.ndarray:
    return p.cached("log_close", lambda: np.log(p.close))


def log_ret(p: Panel) -> np.ndarray:
    return p.cached("log_ret", lambda: p.diff(log_close(p), 1))


def rolling_vol(p: Panel, window: int) -> np.ndarray:
    """The std (ddof 1) of the daily log returns over ``window`` bars (also the labels' vol_20)."""
    return p.cached(("vol", window), lambda: p.rolling_std(log_ret(p), window))


# ---- returns and volatility ----------------------------------------------------------------
for _k in (1, 5, 10, 20):
    feature(f"ret_{_k}", _k, f"log return over the last {_k} bar(s)")(
        lambda p, k=_k: p.diff(log_close(p), k))

for _k in (1, 5, 10, 20):
    feature(f"ret_{_k}_rel", _k, f"log return over the last {_k} bar(s) minus that date's mean over the stocks",
            cross_sectional=True)(lambda p, k=_k: p.diff(log_close(p), k))

for _w in (5, 20, 60):
    feature(f"vol_{_w}", _w, f"std of daily log returns over {_w} bars")(lambda p, w=_w: rolling_vol(p, w))


@feature("rsi_14", 14, "Wilder RSI(14), scaled to [-0.5, 0.5]")
def _rsi(p: Panel) -> np.ndarray:
    delta = p.diff(p.close, 1)
    gain = p.ewm(np.clip(delta, 0, None), alpha=1 / 14, min_periods=14)
    loss = p.ewm(np.clip(-delta, 0, None), alpha=1 / 14, min_periods=14)
    return safe_ratio(gain, gain + loss, 0.5) - 0.5  # no movement at all = neutral


def _macd_line(p: Panel) -> np.ndarray:
    def line() -> np.ndarray:
        fast = p.ewm(p.close, span=12, min_periods=12)
        slow = p.ewm(p.close, span=26, min_periods=26)
        return (fast - slow) / p.close

    return p.cached("macd_line", line)


@feature("macd", 26, "MACD line (EMA12 - EMA26) divided by close")
def _macd(p: Panel) -> np.ndarray:
    return _macd_line(p)


@feature("macd_hist", 34, "MACD line minus its 9-bar EMA signal, divided by close")
def _macd_hist(p: Panel) -> np.ndarray:
    line = _macd_line(p)
    return line - p.ewm(line, span=9, min_periods=9)


@feature("bb_pctb_20", 20, "Bollinger %B(20, 2 std), 0.5 when the window is flat")
def _bb(p: Panel) -> np.ndarray:
    mid, std = p.rolling_mean_std(p.close, 20, ddof=0)
    return safe_ratio(p.close - (mid - 2 * std), 4 * std, 0.5)


@feature("atr_14", 14, "Wilder ATR(14) divided by close")
def _atr(p: Panel) -> np.ndarray:
    prev = p.shift(p.close, 1)
    true_range = np.fmax(np.fmax(p.high - p.low, np.abs(p.high - prev)), np.abs(p.low - prev))  # NaN-skipping max
    true_range[np.isnan(prev)] = np.nan
    return p.ewm(true_range, alpha=1 / 14, min_periods=14) / p.close


@feature("volume_z_20", 20, "z-score of log volume over 20 bars, 0 when volume is constant")
def _volume_z(p: Panel) -> np.ndarray:
    logv = np.log1p(p.volume)
    mean, std = p.rolling_mean_std(logv, 20, ddof=1)
    return safe_ratio(logv - mean, std, 0.0)


@feature("hl_range", 0, "(high - low) / close of the bar")
def _hl(p: Panel) -> np.ndarray:
    return (p.high - p.low) / p.close


for _w in (10, 50):
    feature(f"close_sma_{_w}", _w - 1, f"close / SMA({_w}) - 1")(
        lambda p, w=_w: p.close / p.rolling_mean(p.close, w) - 1)


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


def feature_matrix(panel: Panel, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The features of every row of ``panel`` (float64, one column per name, NaN where not defined)
    and, per ticker, the rows after the longest warm-up with a value that was not finite (set to
    NaN here; the caller drops those rows)."""
    values = np.empty((panel.n, len(names)), order="F")  # a column at a time
    for j, name in enumerate(names):
        values[:, j] = FEATURES[name].fn(panel)
    bad = ~np.isfinite(values)
    late = bad.any(axis=1) & (panel.pos >= warmup_bars(names))
    late_bad = np.bincount(panel.tid[late], minlength=len(panel.lengths))
    values[bad] = np.nan
    return values, late_bad


def compute_features(bars: pd.DataFrame, names: list[str]) -> tuple[pd.DataFrame, int]:
    """One ticker's feature columns (float64) aligned with ``bars``; rows inside the warm-up are NaN.

    Returns (features, n_nonfinite): the count of values after the warm-up that were not
    finite and have been set to NaN (the caller drops those rows).
    """
    values, late_bad = feature_matrix(Panel.from_frames([bars]), names)
    return pd.DataFrame(values, index=bars.index, columns=names), int(late_bad.sum())
