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

Features come in sets (``features.set``): ``basic`` (``FEATURES``, the default 16 and the
market-relative returns), ``alpha158`` and ``alpha360`` (the families Qlib publishes under those
names, from their published definitions; docs/pipeline.md has every formula).  ``REGISTRY`` holds
every feature of every set; the windowed primitives the Alpha158 set needs (rolling max/min and
their positions, quantiles, rank, correlation, a least-squares line against time) are the panel's too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, cast

import numpy as np
import pandas as pd

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
        # the EMAs' states (EmaStates): kept after each ticker's bar ``keep_emas_at`` (its bar number, -1: none),
        # and resumed after ``resume``'s
        self.keep_emas_at: np.ndarray | None = None
        self.kept_emas: dict[str, np.ndarray] = {}
        self.resume: EmaStates | None = None

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
            span: float | None = None, key: str | None = None) -> np.ndarray:
        """pandas' ``ewm(alpha= | span=, adjust=False, min_periods=).mean()``, per ticker (at alpha = 0.5,
        after a missing value, pandas 3.1 gives other values than its recurrence; no feature uses 0.5).

        ``key`` names this EMA among the panel's (a feature's EMAs each have their own): where
        ``keep_emas_at`` is set, its state after each ticker's row there is kept in ``kept_emas[key]``;
        where ``resume`` is set, each ticker's EMA continues from ``resume``'s state after its row
        ``resume.at`` (the rows up to it are NaN)."""
        if (span is None) == (alpha is None):
            raise ValueError("ewm: give alpha or span")
        com = (span - 1) / 2 if span is not None else 1 / alpha - 1  # type: ignore[operator]  # as pandas does
        a = 1 / (1 + com)
        x = np.where(np.isfinite(x), x, np.nan)
        if self.resume is not None:
            if key is None or key not in self.resume.states:
                raise ValueError(f"ewm: no state to resume the EMA {key!r} from")
            return self._ewm_resumed(x, a, min_periods, key)
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
        keep = self.keep_emas_at is not None and key is not None
        states = np.full((len(self.lengths), 3), np.nan)  # weighted, old, nobs (EmaStates)
        smooth = started & ~gaps[self.tid]
        if smooth.any():
            out[smooth] = _ema_smooth(x[smooth], self.tid[smooth], since[smooth], a)
            if keep:  # no missing value: pandas' weight is 1 after each bar, and every bar since the first counts
                at = cast(np.ndarray, self.keep_emas_at)
                here = np.flatnonzero((at >= 0) & ~gaps)
                row = self.starts[here] + at[here]
                begun = since[row] >= 0
                states[here] = np.column_stack([np.where(begun, out[row], np.nan), np.ones(len(here)),
                                                np.where(begun, since[row] + 1.0, 0.0)])
            out[smooth & (since < min_periods - 1)] = np.nan
        if gaps.any():
            exact = gaps[self.tid]
            kept_rows = None
            if keep:
                kept_rows = cast(np.ndarray, self.keep_emas_at)[gaps]
            out[exact], got = _ema_exact(x[exact], self.tid[exact], self.pos[exact], a, min_periods, kept_rows)
            if keep:
                states[gaps] = got
        if keep:
            self.kept_emas[cast(str, key)] = states
        return out

    def _ewm_resumed(self, x: np.ndarray, a: float, min_periods: int, key: str) -> np.ndarray:
        """:meth:`ewm` continued from ``resume``: pandas' recurrence a bar at a time after each ticker's row
        ``resume.at``, every ticker at once, from its state there; the state after ``keep_emas_at`` kept."""
        resume = cast(EmaStates, self.resume)
        weighted, old, nobs = (resume.states[key][:, j].copy() for j in range(3))
        first = self.starts + resume.at + 1  # each ticker's first row after its state
        count = self.lengths - resume.at - 1
        out = np.full(self.n, np.nan)
        keep_at = self.keep_emas_at
        states = np.full((len(self.lengths), 3), np.nan)
        for k in range(int(count.max(initial=0))):
            on = np.flatnonzero(count > k)
            rows = first[on] + k
            w, o, n = _ema_step(weighted[on], old[on], nobs[on], x[rows], a)
            weighted[on], old[on], nobs[on] = w, o, n
            out[rows] = np.where(n >= min_periods, w, np.nan)
            if keep_at is not None:
                here = keep_at[on] == resume.at[on] + 1 + k
                states[on[here]] = np.column_stack([w[here], o[here], n[here]])
        if keep_at is not None:
            self.kept_emas[key] = states
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
    """y[0] = x[0], y[t] = a x[t] + (1 - a) y[t-1] over tickers without a missing value after their
    start: the recurrence a bar at a time over a [bar, ticker] matrix, every ticker at once (the same
    products and sums as a first-order IIR filter, without importing scipy.signal's 0.5 s)."""
    col = _columns(tid)
    m = np.zeros((int(since.max()) + 1, int(col.max()) + 1))
    m[since, col] = x
    y = np.empty_like(m)
    y[0] = m[0]
    keep = 1.0 - a
    for t in range(1, len(m)):
        np.multiply(m[t], a, out=y[t])
        y[t] += keep * y[t - 1]
    return y[since, col]


def _ema_exact(x: np.ndarray, tid: np.ndarray, pos: np.ndarray, a: float, min_periods: int,
               keep_at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """pandas' own recurrence (adjust=False, ignore_na=False), a bar at a time for all the given
    tickers together: a missing value keeps the mean and decays its weight, min_periods counts
    valid values.  Only tickers with a missing value after their first one come here.  With
    ``keep_at`` (per ticker, a bar number or -1), also each ticker's state after that bar
    (weighted, old, nobs; NaN: none)."""
    col = _columns(tid)
    m = np.full((int(pos.max()) + 1, int(col.max()) + 1), np.nan)
    m[pos, col] = x
    out = np.full_like(m, np.nan)
    states = np.full((m.shape[1], 3), np.nan)
    weighted, old = m[0].copy(), np.ones(m.shape[1])
    nobs = ~np.isnan(weighted) * 1
    out[0] = np.where(nobs >= min_periods, weighted, np.nan)
    if keep_at is not None:
        here = keep_at == 0
        states[here] = np.column_stack([weighted[here], old[here], nobs[here]])
    for i in range(1, m.shape[0]):
        weighted, old, nobs = _ema_step(weighted, old, nobs, m[i], a)
        out[i] = np.where(nobs >= min_periods, weighted, np.nan)
        if keep_at is not None:
            here = keep_at == i
            states[here] = np.column_stack([weighted[here], old[here], nobs[here]])
    return out[pos, col], states


def _ema_step(weighted: np.ndarray, old: np.ndarray, nobs: np.ndarray, cur: np.ndarray,
              a: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One bar of pandas' recurrence for many tickers: the running mean, the weight of its past and the
    valid values counted after the values ``cur`` (NaN: missing, which keeps the mean and decays its
    weight)."""
    obs = ~np.isnan(cur)
    have = ~np.isnan(weighted)
    old = np.where(have, old * (1 - a), old)
    mix = (old * weighted + a * cur) / (old + a)
    weighted = np.where(have & obs & (weighted != cur), mix, weighted)
    old = np.where(have & obs, 1.0, old)
    weighted = np.where(~have & obs, cur, weighted)
    return weighted, old, nobs + obs


@dataclass(frozen=True)
class EmaStates:
    """Where a panel's EMAs resume: per ticker, the row (within the ticker, ``at``) after which each EMA
    continues from ``states[key][ticker]`` = (weighted, old, nobs): pandas' running mean, the weight of
    its past and the valid values counted (:meth:`Panel.ewm`)."""

    at: np.ndarray
    states: dict[str, np.ndarray]


@dataclass(frozen=True)
class Feature:
    name: str
    fn: Callable[[Panel], np.ndarray]
    warmup: int  # bars before the first defined value
    description: str
    cross_sectional: bool = False  # minus the date's mean over the stocks (the per-date pass)
    family: str = "basic"  # the feature set it belongs to (features.set)


REGISTRY: dict[str, Feature] = {}  # every feature, of every set
FEATURES: dict[str, Feature] = {}  # the `basic` set's registry (tests/reference_features.py mirrors it)


def feature(name: str, warmup: int, description: str, *, cross_sectional: bool = False, family: str = "basic"):
    def register(fn: Callable[[Panel], np.ndarray]):
        spec = Feature(name, fn, warmup, description, cross_sectional, family)
        REGISTRY[name] = spec
        if family == "basic":
            FEATURES[name] = spec
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
    gain = p.ewm(np.clip(delta, 0, None), alpha=1 / 14, min_periods=14, key="rsi_gain")
    loss = p.ewm(np.clip(-delta, 0, None), alpha=1 / 14, min_periods=14, key="rsi_loss")
    return safe_ratio(gain, gain + loss, 0.5) - 0.5  # no movement at all = neutral


def _macd_line(p: Panel) -> np.ndarray:
    def line() -> np.ndarray:
        fast = p.ewm(p.close, span=12, min_periods=12, key="macd_fast")
        slow = p.ewm(p.close, span=26, min_periods=26, key="macd_slow")
        return (fast - slow) / p.close

    return p.cached("macd_line", line)


@feature("macd", 26, "MACD line (EMA12 - EMA26) divided by close")
def _macd(p: Panel) -> np.ndarray:
    return _macd_line(p)


@feature("macd_hist", 34, "MACD line minus its 9-bar EMA signal, divided by close")
def _macd_hist(p: Panel) -> np.ndarray:
    line = _macd_line(p)
    return line - p.ewm(line, span=9, min_periods=9, key="macd_signal")


@feature("bb_pctb_20", 20, "Bollinger %B(20, 2 std), 0.5 when the window is flat")
def _bb(p: Panel) -> np.ndarray:
    mid, std = p.rolling_mean_std(p.close, 20, ddof=0)
    return safe_ratio(p.close - (mid - 2 * std), 4 * std, 0.5)


@feature("atr_14", 14, "Wilder ATR(14) divided by close")
def _atr(p: Panel) -> np.ndarray:
    prev = p.shift(p.close, 1)
    true_range = np.fmax(np.fmax(p.high - p.low, np.abs(p.high - prev)), np.abs(p.low - prev))  # NaN-skipping max
    true_range[np.isnan(prev)] = np.nan
    return p.ewm(true_range, alpha=1 / 14, min_periods=14, key="atr") / p.close


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


# ---- the research sets: Alpha158 and Alpha360 (docs/pipeline.md, "Feature sets", has every formula) --------
# The families Qlib publishes as Alpha158 / Alpha360, written here from their published definitions.
# The bars have no VWAP: its proxy is the typical price (high + low + close) / 3.  A ratio whose
# denominator is zero (a bar with high = low, a flat window, a zero volume) takes the neutral value
# named in its line instead of Qlib's "+ 1e-12"; prices are positive, so a division by the close or the
# open is plain (a zero price gives inf, which feature_matrix drops and counts).
ALPHA_WINDOWS = (5, 10, 20, 30, 60)
ALPHA360_BARS = 60


def vwap_proxy(p: Panel) -> np.ndarray:
    return p.cached("vwap_proxy", lambda: (p.high + p.low + p.close) / 3)


def _a158(name: str, warmup: int, description: str):
    return feature(f"alpha158_{name}", warmup, description, family="alpha158")


def _by_close(p: Panel, x: np.ndarray) -> np.ndarray:
    return x / p.close


def _body_top(p: Panel) -> np.ndarray:
    return p.cached("body_top", lambda: np.maximum(p.open, p.close))


def _body_bottom(p: Panel) -> np.ndarray:
    return p.cached("body_bottom", lambda: np.minimum(p.open, p.close))


def _range(p: Panel) -> np.ndarray:
    return p.cached("bar_range", lambda: p.high - p.low)


# k-line shape of the current bar
_a158("kmid", 0, "(close - open) / open")(lambda p: (p.close - p.open) / p.open)
_a158("klen", 0, "(high - low) / open")(lambda p: _range(p) / p.open)
_a158("kmid2", 0, "(close - open) / (high - low); 0 when high = low")(
    lambda p: safe_ratio(p.close - p.open, _range(p), 0.0))
_a158("kup", 0, "(high - max(open, close)) / open")(lambda p: (p.high - _body_top(p)) / p.open)
_a158("kup2", 0, "(high - max(open, close)) / (high - low); 0 when high = low")(
    lambda p: safe_ratio(p.high - _body_top(p), _range(p), 0.0))
_a158("klow", 0, "(min(open, close) - low) / open")(lambda p: (_body_bottom(p) - p.low) / p.open)
_a158("klow2", 0, "(min(open, close) - low) / (high - low); 0 when high = low")(
    lambda p: safe_ratio(_body_bottom(p) - p.low, _range(p), 0.0))
_a158("ksft", 0, "(2 close - high - low) / open")(lambda p: (2 * p.close - p.high - p.low) / p.open)
_a158("ksft2", 0, "(2 close - high - low) / (high - low); 0 when high = low")(
    lambda p: safe_ratio(2 * p.close - p.high - p.low, _range(p), 0.0))

# the current bar's prices over its close
_a158("open_0", 0, "open / close")(lambda p: _by_close(p, p.open))
_a158("high_0", 0, "high / close")(lambda p: _by_close(p, p.high))
_a158("low_0", 0, "low / close")(lambda p: _by_close(p, p.low))
_a158("vwap_0", 0, "VWAP proxy (high + low + close) / 3, over close")(lambda p: _by_close(p, vwap_proxy(p)))


def _close_change(p: Panel) -> np.ndarray:
    return p.cached("close_change", lambda: p.diff(p.close, 1))


def _volume_change(p: Panel) -> np.ndarray:
    return p.cached("volume_change", lambda: p.diff(p.volume, 1))


def _trend(p: Panel, w: int) -> np.ndarray:
    return p.cached(("trend", w), lambda: p.rolling_trend(p.close, w))


def _high_max(p: Panel, w: int) -> np.ndarray:
    return p.cached(("high_max", w), lambda: p.rolling_max(p.high, w))


def _low_min(p: Panel, w: int) -> np.ndarray:
    return p.cached(("low_min", w), lambda: p.rolling_min(p.low, w))


def _high_argmax(p: Panel, w: int) -> np.ndarray:
    return p.cached(("high_argmax", w), lambda: p.rolling_argmax(p.high, w))


def _low_argmin(p: Panel, w: int) -> np.ndarray:
    return p.cached(("low_argmin", w), lambda: p.rolling_argmin(p.low, w))


def _quantiles(p: Panel, w: int) -> np.ndarray:
    return p.cached(("close_quantiles", w), lambda: p.rolling_quantile(p.close, w, [0.2, 0.8]))


def _up_down(p: Panel, x: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the window: the sum of the rises of x, of its falls (as positive numbers), of its moves."""
    return (p.rolling_sum(np.clip(x, 0, None), w), p.rolling_sum(np.clip(-x, 0, None), w),
            p.rolling_sum(np.abs(x), w))


def _close_moves(p: Panel, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return p.cached(("close_moves", w), lambda: np.array(_up_down(p, _close_change(p), w)))  # type: ignore[return-value]


def _volume_moves(p: Panel, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return p.cached(("volume_moves", w), lambda: np.array(_up_down(p, _volume_change(p), w)))  # type: ignore[return-value]


def _counts(p: Panel, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The share of the window's bars whose close rose / fell from the bar before."""
    def make() -> np.ndarray:
        change = _close_change(p)
        up = np.where(np.isnan(change), np.nan, (change > 0) * 1.0)
        down = np.where(np.isnan(change), np.nan, (change < 0) * 1.0)
        return np.array([p.rolling_mean(up, w), p.rolling_mean(down, w)])

    return p.cached(("counts", w), make)  # type: ignore[return-value]


def _weighted_move(p: Panel) -> np.ndarray:
    return p.cached("weighted_move", lambda: np.abs(p.close / p.shift(p.close, 1) - 1) * p.volume)


def _cord_inputs(p: Panel) -> tuple[np.ndarray, np.ndarray]:
    def make() -> np.ndarray:
        prev_volume = p.shift(p.volume, 1)
        return np.array([p.close / p.shift(p.close, 1), np.log(safe_ratio(p.volume, prev_volume, 1.0) + 1)])

    return p.cached("cord_inputs", make)  # type: ignore[return-value]


def _wvma(p: Panel, w: int) -> np.ndarray:
    mean, std = p.rolling_mean_std(_weighted_move(p), w, 1)
    return safe_ratio(std, mean, 0.0)


for _w in ALPHA_WINDOWS:
    _a158(f"roc_{_w}", _w, f"close {_w} bars ago / close")(lambda p, w=_w: _by_close(p, p.shift(p.close, w)))
for _w in ALPHA_WINDOWS:
    _a158(f"ma_{_w}", _w - 1, f"mean of the close over {_w} bars / close")(
        lambda p, w=_w: _by_close(p, p.rolling_mean(p.close, w)))
for _w in ALPHA_WINDOWS:
    _a158(f"std_{_w}", _w - 1, f"std (ddof 1) of the close over {_w} bars / close")(
        lambda p, w=_w: _by_close(p, p.rolling_std(p.close, w)))
for _w in ALPHA_WINDOWS:
    _a158(f"beta_{_w}", _w - 1, f"slope of the least-squares line of the close against time over {_w} bars / close")(
        lambda p, w=_w: _by_close(p, _trend(p, w)[:, 0]))
for _w in ALPHA_WINDOWS:
    _a158(f"rsqr_{_w}", _w - 1, f"R^2 of that line over {_w} bars; 0 for a flat window")(
        lambda p, w=_w: _trend(p, w)[:, 1].copy())
for _w in ALPHA_WINDOWS:
    _a158(f"resi_{_w}", _w - 1, f"the current close minus that line's value over {_w} bars, / close")(
        lambda p, w=_w: _by_close(p, _trend(p, w)[:, 2]))
for _w in ALPHA_WINDOWS:
    _a158(f"max_{_w}", _w - 1, f"highest high over {_w} bars / close")(lambda p, w=_w: _by_close(p, _high_max(p, w)))
for _w in ALPHA_WINDOWS:
    _a158(f"min_{_w}", _w - 1, f"lowest low over {_w} bars / close")(lambda p, w=_w: _by_close(p, _low_min(p, w)))
for _w in ALPHA_WINDOWS:
    _a158(f"qtlu_{_w}", _w - 1, f"80% quantile of the close over {_w} bars / close")(
        lambda p, w=_w: _by_close(p, _quantiles(p, w)[:, 1]))
for _w in ALPHA_WINDOWS:
    _a158(f"qtld_{_w}", _w - 1, f"20% quantile of the close over {_w} bars / close")(
        lambda p, w=_w: _by_close(p, _quantiles(p, w)[:, 0]))
for _w in ALPHA_WINDOWS:
    _a158(f"rank_{_w}", _w - 1, f"the close's percentile rank among the last {_w} closes (ties: average rank)")(
        lambda p, w=_w: p.rolling_rank(p.close, w))
for _w in ALPHA_WINDOWS:
    _a158(f"rsv_{_w}", _w - 1, f"(close - lowest low) / (highest high - lowest low) over {_w} bars; 0.5 when flat")(
        lambda p, w=_w: safe_ratio(p.close - _low_min(p, w), _high_max(p, w) - _low_min(p, w), 0.5))
for _w in ALPHA_WINDOWS:
    _a158(f"imax_{_w}", _w - 1, f"position of the highest high in the last {_w} bars (1 = oldest) / {_w}")(
        lambda p, w=_w: _high_argmax(p, w) / w)
for _w in ALPHA_WINDOWS:
    _a158(f"imin_{_w}", _w - 1, f"position of the lowest low in the last {_w} bars (1 = oldest) / {_w}")(
        lambda p, w=_w: _low_argmin(p, w) / w)
for _w in ALPHA_WINDOWS:
    _a158(f"imxd_{_w}", _w - 1, f"(position of the highest high - of the lowest low) in the last {_w} bars / {_w}")(
        lambda p, w=_w: (_high_argmax(p, w) - _low_argmin(p, w)) / w)
for _w in ALPHA_WINDOWS:
    _a158(f"corr_{_w}", _w - 1, f"correlation of close and log(volume + 1) over {_w} bars; 0 when either is flat")(
        lambda p, w=_w: p.rolling_corr(p.close, np.log1p(p.volume), w))
for _w in ALPHA_WINDOWS:
    _a158(f"cord_{_w}", _w, f"correlation of close / previous close and log(volume / previous volume + 1) over "
                            f"{_w} bars (volume ratio 1 after a zero volume); 0 when either is flat")(
        lambda p, w=_w: p.rolling_corr(*_cord_inputs(p), w))
for _w in ALPHA_WINDOWS:
    _a158(f"cntp_{_w}", _w, f"share of the last {_w} bars whose close rose")(lambda p, w=_w: _counts(p, w)[0].copy())
for _w in ALPHA_WINDOWS:
    _a158(f"cntn_{_w}", _w, f"share of the last {_w} bars whose close fell")(lambda p, w=_w: _counts(p, w)[1].copy())
for _w in ALPHA_WINDOWS:
    _a158(f"cntd_{_w}", _w, f"cntp_{_w} - cntn_{_w}")(lambda p, w=_w: _counts(p, w)[0] - _counts(p, w)[1])
def _move_sums(prefix: str, moves: Callable, what: str) -> None:
    """``{prefix}p/n/d_{w}``: the rises, the falls and their difference over ``what``'s absolute moves."""
    for w in ALPHA_WINDOWS:
        _a158(f"{prefix}p_{w}", w, f"sum of {what}'s rises / sum of its absolute moves over {w} bars; 0.5 when flat")(
            lambda p, w=w: safe_ratio(moves(p, w)[0], moves(p, w)[2], 0.5))
    for w in ALPHA_WINDOWS:
        _a158(f"{prefix}n_{w}", w, f"sum of {what}'s falls / sum of its absolute moves over {w} bars; 0.5 when flat")(
            lambda p, w=w: safe_ratio(moves(p, w)[1], moves(p, w)[2], 0.5))
    for w in ALPHA_WINDOWS:
        _a158(f"{prefix}d_{w}", w, f"(rises - falls) / absolute moves of {what} over {w} bars; 0 when flat")(
            lambda p, w=w: safe_ratio(moves(p, w)[0] - moves(p, w)[1], moves(p, w)[2], 0.0))


_move_sums("sum", _close_moves, "the close")
for _w in ALPHA_WINDOWS:
    _a158(f"vma_{_w}", _w - 1, f"mean volume over {_w} bars / volume; 1 when the volume is 0")(
        lambda p, w=_w: safe_ratio(p.rolling_mean(p.volume, w), p.volume, 1.0))
for _w in ALPHA_WINDOWS:
    _a158(f"vstd_{_w}", _w - 1, f"std (ddof 1) of the volume over {_w} bars / volume; 0 when the volume is 0")(
        lambda p, w=_w: safe_ratio(p.rolling_std(p.volume, w), p.volume, 0.0))
for _w in ALPHA_WINDOWS:
    _a158(f"wvma_{_w}", _w, f"std / mean of |close / previous close - 1| x volume over {_w} bars; 0 when the "
                            "mean is 0")(lambda p, w=_w: _wvma(p, w))
_move_sums("vsum", _volume_moves, "the volume")


def _alpha360_field(p: Panel, name: str) -> np.ndarray:
    return vwap_proxy(p) if name == "vwap" else {"open": p.open, "high": p.high, "low": p.low, "close": p.close}[name]


for _field in ("close", "open", "high", "low", "vwap", "volume"):
    for _k in range(ALPHA360_BARS):
        _what = "the VWAP proxy (high + low + close) / 3" if _field == "vwap" else f"the {_field}"
        if _field == "volume":
            feature(f"alpha360_volume_{_k}", _k, f"the volume {_k} bars ago / the current volume; 1 when that is 0",
                    family="alpha360")(lambda p, k=_k: safe_ratio(p.shift(p.volume, k), p.volume, 1.0))
        else:
            feature(f"alpha360_{_field}_{_k}", _k, f"{_what} {_k} bars ago / the current close", family="alpha360")(
                lambda p, k=_k, f=_field: _by_close(p, p.shift(_alpha360_field(p, f), k)))


FEATURE_SETS: tuple[str, ...] = ("basic", "alpha158", "alpha360")


def set_features(feature_set: str) -> list[str]:
    """The features ``features.set`` computes when ``features.names`` is null, in column order."""
    if feature_set == "basic":
        return list(DEFAULT_FEATURES)
    if feature_set not in FEATURE_SETS:
        raise FeatureError(f"unknown feature set '{feature_set}' in features.set (known: {', '.join(FEATURE_SETS)})")
    return [name for name, spec in REGISTRY.items() if spec.family == feature_set]


def resolve_feature_names(names: list[str] | None, feature_set: str = "basic") -> list[str]:
    """The features a build computes: ``names`` when given (each from the registry of ``feature_set``:
    for `basic` any feature of FEATURES, for a research set a selection of its own), else the set's."""
    members = set_features(feature_set) if feature_set != "basic" else list(FEATURES)
    names = set_features(feature_set) if not names else list(names)
    for name in names:
        if name not in members:
            if name in REGISTRY:
                raise FeatureError(f"feature '{name}' in features.names belongs to features.set="
                                   f"{REGISTRY[name].family}, but features.set={feature_set}: set "
                                   f"features.set={REGISTRY[name].family} (names then select from that set)")
            close = difflib.get_close_matches(name, members, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            known = ", ".join(members) if feature_set == "basic" else \
                f"the {len(members)} features of set {feature_set}, {members[0]} .. {members[-1]}"
            raise FeatureError(f"unknown feature '{name}' in features.names{hint} (known: {known})")
    if len(set(names)) != len(names):
        raise FeatureError(f"features.names lists a feature twice: {names}")
    return names


def cross_sectional_names(names: list[str]) -> list[str]:
    """The market-relative features among ``names``: the per-date pass demeans them."""
    return [n for n in names if REGISTRY[n].cross_sectional]


def warmup_bars(names: list[str]) -> int:
    return max(REGISTRY[n].warmup for n in names)


def feature_matrix(panel: Panel, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The features of every row of ``panel`` (float64, one column per name, NaN where not defined)
    and, per ticker, the rows after the longest warm-up with a value that was not finite (set to
    NaN here; the caller drops those rows)."""
    values = np.empty((panel.n, len(names)), order="F")  # a column at a time
    kept = set(panel._cache)
    for j, name in enumerate(names):
        values[:, j] = REGISTRY[name].fn(panel)
    for key in set(panel._cache) - kept:  # the intermediates (Alpha158's: ~0.6 kB a bar) go with the pass
        del panel._cache[key]
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
