"""A seeded synthetic equity market with an optional, known, planted momentum effect.

Every number is a function of ``(seed, ticker index)`` only: a market-wide path (regime and
market factor) comes from the seed alone, and each ticker from its own RNG, so any ticker can
be regenerated alone (:func:`synthetic_ticker`) and equals the same ticker in the full market.
Tickers are simulated in blocks (vectorised across the block, a loop over days), each column
independent of the others, and yielded one at a time; memory is bounded by one block.

Model (daily log returns; t = day, i = ticker; every parameter below is a module constant):

* regime s_t in {bull, bear}: Markov chain, P(bull->bear) = 0.008, P(bear->bull) = 0.03,
  drift mu = +0.0005 / -0.0010, volatility multiplier k = 0.85 / 1.6.
* market factor m_t = mu(s_t) + k(s_t) * sqrt(H_t) * e_t, with GARCH(1,1)
  H_t = W + 0.08 * H_{t-1} e_{t-1}^2 + 0.90 * H_{t-1} (unconditional vol 1 %/day).
* ticker noise n_it = beta_i * m_t + k(s_t) * sqrt(h_it) * u_it, with GARCH(1,1)
  h_it = w_i + 0.06 * h_{i,t-1} u_{i,t-1}^2 + 0.92 * h_{i,t-1}, unconditional vol sigma_i
  (log-normal around 1.5 %/day), beta_i ~ U(0.5, 1.5); e, u are Student-t(5) scaled to unit
  variance.
* conditional vol sigma_it = k(s_t) * sqrt(beta_i^2 H_t + h_it), known the day before.
* return r_it = n_it + effect * 0.15 * sigma_it * tanh(z_it), where
  z_it = (r_{i,t-1} + ... + r_{i,t-W}) / sqrt(sigma_{i,t-1}^2 + ... + sigma_{i,t-W}^2) is the
  trailing W-day (``momentum_window``) return in units of its own volatility.  With effect = 0
  the term is absent (the null market); effect = 1 gives a weak but clearly detectable signal
  (mean daily cross-sectional Spearman IC of the trailing 10-day return against the next-day
  return about 0.1 with 50 tickers x 1000 days).
* bars: close = P0 * exp(cumsum r) with P0 log-uniform in [20, 200]; open = previous close *
  exp(g), g ~ N(0, (0.2 sigma)^2) (so the open-to-close body is r - g); high / low extend the
  body by 0.4 * sigma * |N(0,1)| each side; volume = V_i * exp(0.5 * (|r|/sigma - 0.8) +
  0.3 N(0,1)), V_i log-uniform in [2e5, 2e7].
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from alchemetric_ray.errors import UserError

# --- model constants ---------------------------------------------------------------------
_P_BULL_TO_BEAR = 0.008
_P_BEAR_TO_BULL = 0.03
_REGIME_DRIFT = np.array([0.0005, -0.0010])  # bull, bear
_REGIME_VOL = np.array([0.85, 1.6])

_MARKET_VOL = 0.01
_MARKET_ALPHA, _MARKET_BETA = 0.08, 0.90

_IDIO_VOL_MEDIAN, _IDIO_VOL_DISPERSION = 0.015, 0.3  # log-normal, clipped to the range below
_IDIO_VOL_RANGE = (0.006, 0.04)
_IDIO_ALPHA, _IDIO_BETA = 0.06, 0.92
_BETA_RANGE = (0.5, 1.5)
_T_DF = 5.0

_MOMENTUM_SCALE = 0.15  # effect = 1.0 -> expected return 0.15 * sigma * tanh(z)

_PRICE_RANGE = (20.0, 200.0)
_GAP_VOL = 0.2  # opening gap, in units of sigma
_RANGE_VOL = 0.4  # high/low extension beyond the body, in units of sigma
_VOLUME_RANGE = (2e5, 2e7)
_VOLUME_ABS_RET, _VOLUME_NOISE = 0.5, 0.3

# Block size: at most this many (day x ticker) cells per working array; about a dozen such
# arrays are alive at once, so a block costs ~12 x 8 x _BLOCK_CELLS bytes (~12 MiB).
_BLOCK_CELLS = 1 << 17
_MAX_BLOCK_TICKERS = 256

# Spawn keys: the market path and each ticker draw from disjoint streams of SeedSequence(seed).
_MARKET_STREAM, _TICKER_STREAM = 0, 1

_COLUMNS = ("date", "open", "high", "low", "close", "volume")


@dataclass(frozen=True)
class SyntheticMarket:
    """A seeded synthetic market; equal markets generate identical bars."""

    n_tickers: int = 50
    n_days: int = 1000
    effect: float = 0.0  # strength of the planted momentum effect; 0.0 = null market
    seed: int = 0
    start: str = "2010-01-04"  # business days from here
    momentum_window: int = 10  # next-day E[r] = effect * 0.15 * sigma * tanh(z of trailing window)
    effect_lag: int = 0  # the window ends this many days before t (0 = the last W days up to t-1):
    # a lagged effect is invisible to rules and features that look only at the recent window

    def __post_init__(self) -> None:
        for name in ("n_tickers", "n_days", "seed", "momentum_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise UserError(f"synthetic market: {name} must be an integer, got {value!r}")
        if self.n_tickers < 1:
            raise UserError(f"synthetic market: n_tickers must be >= 1, got {self.n_tickers}")
        if self.n_days < 2:
            raise UserError(f"synthetic market: n_days must be >= 2, got {self.n_days}")
        if self.seed < 0:
            raise UserError(f"synthetic market: seed must be >= 0, got {self.seed}")
        if not isinstance(self.effect_lag, (int, np.integer)) or self.effect_lag < 0:
            raise UserError(f"synthetic market: effect_lag must be an integer >= 0, got {self.effect_lag!r}")
        if self.momentum_window < 1:
            raise UserError(f"synthetic market: momentum_window must be >= 1, got {self.momentum_window}")
        if not (isinstance(self.effect, (int, float, np.floating)) and math.isfinite(self.effect) and self.effect >= 0):
            raise UserError(f"synthetic market: effect must be a finite number >= 0, got {self.effect!r}")
        try:
            pd.Timestamp(self.start)
        except (ValueError, TypeError):
            raise UserError(f"synthetic market: start must be a date like 2010-01-04, got {self.start!r}") from None
        _dates(self)  # the whole date range must be representable (datetime64[ns])


def synthetic_ticker_names(n: int) -> list[str]:
    """``["SYN0000", "SYN0001", ...]``: zero-padded (at least 4 digits) so they sort as they count."""
    width = max(4, len(str(max(n - 1, 0))))
    return [f"SYN{i:0{width}d}" for i in range(n)]


def synthetic_bars(market: SyntheticMarket) -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield (ticker, bars) one ticker at a time, in ticker order.

    Tickers are simulated a block at a time (at most ``_BLOCK_CELLS`` day x ticker cells per
    working array, about 12 MiB in all), so memory does not grow with ``n_tickers``; only the
    frames the caller keeps add to it.
    """
    names = synthetic_ticker_names(market.n_tickers)
    dates = _dates(market)
    path = _market_path(market)
    block = _block_size(market.n_days)
    for first in range(0, market.n_tickers, block):
        indices = range(first, min(first + block, market.n_tickers))
        for i, bars in zip(indices, _simulate_block(market, path, dates, indices)):
            yield names[i], bars


def synthetic_ticker(market: SyntheticMarket, index: int) -> tuple[str, pd.DataFrame]:
    """Regenerate ticker ``index`` alone; equal to that ticker in :func:`synthetic_bars`."""
    if not 0 <= index < market.n_tickers:
        raise UserError(f"synthetic market: ticker index {index} outside 0..{market.n_tickers - 1}")
    (bars,) = _simulate_block(market, _market_path(market), _dates(market), [index])
    return synthetic_ticker_names(market.n_tickers)[index], bars


# --- internals -----------------------------------------------------------------------------


def _block_size(n_days: int) -> int:
    return max(1, min(_MAX_BLOCK_TICKERS, _BLOCK_CELLS // n_days))


def _dates(market: SyntheticMarket) -> np.ndarray:
    start = pd.Timestamp(market.start).normalize()
    try:
        return pd.bdate_range(start, periods=market.n_days).as_unit("ns").to_numpy()
    except (OverflowError, pd.errors.OutOfBoundsDatetime):
        raise UserError(
            f"synthetic market: {market.n_days} business days from {market.start} run past the last "
            f"representable date ({pd.Timestamp.max.date()})"
        ) from None


def _std_t(rng: np.random.Generator, size) -> np.ndarray:
    """Student-t innovations scaled to unit variance."""
    return rng.standard_t(_T_DF, size) * math.sqrt((_T_DF - 2.0) / _T_DF)


class _MarketPath:
    """The market-wide series shared by all tickers (seed only): regime and market factor."""

    def __init__(self, vol_mult: np.ndarray, factor: np.ndarray, factor_var: np.ndarray) -> None:
        self.vol_mult = vol_mult  # k(s_t)
        self.factor = factor  # m_t
        self.factor_var = factor_var  # H_t


def _market_path(market: SyntheticMarket) -> _MarketPath:
    rng = np.random.default_rng(np.random.SeedSequence(market.seed, spawn_key=(_MARKET_STREAM,)))
    n = market.n_days
    switch = rng.random(n).tolist()
    regime = np.empty(n, dtype=np.intp)
    state = 0  # start in the bull regime
    for t in range(n):
        if t:  # day 0 keeps the initial state
            if state == 0 and switch[t] < _P_BULL_TO_BEAR:
                state = 1
            elif state == 1 and switch[t] < _P_BEAR_TO_BULL:
                state = 0
        regime[t] = state
    eps = _std_t(rng, n)
    omega = _MARKET_VOL**2 * (1.0 - _MARKET_ALPHA - _MARKET_BETA)
    coef = (_MARKET_ALPHA * eps * eps + _MARKET_BETA).tolist()
    var = [0.0] * n
    h = _MARKET_VOL**2
    for t in range(n):
        if t:
            h = omega + coef[t - 1] * h
        var[t] = h
    factor_var = np.asarray(var)
    vol_mult = _REGIME_VOL[regime]
    factor = _REGIME_DRIFT[regime] + vol_mult * np.sqrt(factor_var) * eps
    return _MarketPath(vol_mult, factor, factor_var)


def _ticker_rng(market: SyntheticMarket, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(market.seed, spawn_key=(_TICKER_STREAM, index)))


def _simulate_block(
    market: SyntheticMarket, path: _MarketPath, dates: np.ndarray, indices: Sequence[int]
) -> Iterator[pd.DataFrame]:
    """Simulate the tickers in ``indices`` together (days x tickers arrays) and yield their bars.

    Every operation is elementwise per column (or a per-column scan), so a ticker's numbers do
    not depend on which other tickers share its block.
    """
    n, m = market.n_days, len(indices)
    rngs = [_ticker_rng(market, i) for i in indices]
    # Per-ticker constants, then innovations, each from the ticker's own stream in a fixed order.
    params = np.array(
        [
            [
                rng.uniform(math.log(_PRICE_RANGE[0]), math.log(_PRICE_RANGE[1])),
                rng.normal(math.log(_IDIO_VOL_MEDIAN), _IDIO_VOL_DISPERSION),
                rng.uniform(*_BETA_RANGE),
                rng.uniform(math.log(_VOLUME_RANGE[0]), math.log(_VOLUME_RANGE[1])),
            ]
            for rng in rngs
        ]
    )
    log_p0 = params[:, 0]
    idio_vol = np.clip(np.exp(params[:, 1]), *_IDIO_VOL_RANGE)
    beta = params[:, 2]
    log_v0 = params[:, 3]
    eps = np.empty((n, m))
    for j, rng in enumerate(rngs):
        eps[:, j] = _std_t(rng, n)

    # Idiosyncratic GARCH(1,1) variance: h_t = w + h_{t-1} * (a * u_{t-1}^2 + b).
    coef = _IDIO_ALPHA * eps * eps + _IDIO_BETA
    omega = idio_vol * idio_vol * (1.0 - _IDIO_ALPHA - _IDIO_BETA)
    h = np.empty((n, m))
    h[0] = idio_vol * idio_vol
    for t in range(1, n):
        np.multiply(coef[t - 1], h[t - 1], out=h[t])
        h[t] += omega
    del coef
    k = path.vol_mult[:, None]
    # Noise return n_t (into `ret`), conditional total volatility sigma_t.
    ret = np.sqrt(h)
    ret *= eps
    ret *= k
    ret += path.factor[:, None] * beta
    del eps
    sigma = h
    sigma += path.factor_var[:, None] * (beta * beta)
    np.sqrt(sigma, out=sigma)
    sigma *= k
    del h

    if market.effect > 0:
        _add_momentum(ret, sigma, market.effect * _MOMENTUM_SCALE, market.momentum_window, market.effect_lag)

    log_close = np.cumsum(ret, axis=0)
    log_close += log_p0
    for j, rng in enumerate(rngs):
        yield _bars(dates, log_close[:, j], ret[:, j], sigma[:, j], log_v0[j], rng)


def _add_momentum(ret: np.ndarray, sigma: np.ndarray, scale: float, window: int, lag: int = 0) -> None:
    """In place: r_t += scale * sigma_t * tanh(sum of last `window` r / sqrt(sum of their sigma^2)).

    With ``lag`` > 0 the window is r[t-lag-window .. t-lag-1] (its variance likewise).

    The trailing sums include the momentum terms already added (the effect feeds back), so
    this is a scan over days; at day t < window the window is what is there (day 0: z = 0).
    """
    n = ret.shape[0]
    var = sigma * sigma
    csum = np.cumsum(var, axis=0)
    trailing_var = np.empty_like(csum)
    trailing_var[0] = 1.0  # day 0: trailing return is 0, any positive denominator
    trailing_var[1:] = csum[:-1]  # day t: sum of sigma^2 over days max(0, t - window) .. t - 1
    trailing_var[window + 1 :] -= csum[: max(n - window - 1, 0)]
    # Guard the square root against a difference of cumulative sums rounding to <= 0.
    if lag:
        shifted = np.ones_like(trailing_var)  # before the lagged window exists: z = 0 (running is 0)
        shifted[lag:] = trailing_var[: n - lag] if n > lag else shifted[lag:]
        trailing_var = shifted
    np.maximum(trailing_var, np.finfo(np.float64).tiny, out=trailing_var)
    inv_scale = 1.0 / np.sqrt(trailing_var)
    del csum, var, trailing_var
    amp = sigma * scale
    running = np.zeros(ret.shape[1])
    z = np.empty(ret.shape[1])
    for t in range(n):
        np.multiply(running, inv_scale[t], out=z)
        np.tanh(z, out=z)
        z *= amp[t]
        ret[t] += z
        if t >= lag:  # r[t - lag] enters the window used from day t + 1 on
            running += ret[t - lag]
            if t - lag >= window:
                running -= ret[t - lag - window]


def _bars(
    dates: np.ndarray,
    log_close: np.ndarray,
    ret: np.ndarray,
    sigma: np.ndarray,
    log_v0: float,
    rng: np.random.Generator,
) -> pd.DataFrame:
    n = len(log_close)
    gap = rng.standard_normal(n) * (_GAP_VOL * sigma)
    up = np.abs(rng.standard_normal(n)) * (_RANGE_VOL * sigma)
    down = np.abs(rng.standard_normal(n)) * (_RANGE_VOL * sigma)
    noise = rng.standard_normal(n)
    close = np.exp(log_close)
    open_ = np.exp(log_close - ret + gap)  # previous close (P0 on day 0) times the gap
    # Multiplying by exp(x >= 0) >= 1 never rounds below the base, so the contract holds exactly.
    high = np.maximum(open_, close) * np.exp(up)
    low = np.minimum(open_, close) * np.exp(-down)
    volume = np.exp(log_v0 + _VOLUME_ABS_RET * (np.abs(ret) / sigma - 0.8) + _VOLUME_NOISE * noise)
    return pd.DataFrame(
        {"date": dates, "open": open_, "high": high, "low": low, "close": close, "volume": volume},
        columns=list(_COLUMNS),
    )
