"""Known answers with power for the rank-IC confidence interval (issue 32, item 2a).

Honest rank ICs on US large caps are small (0.01-0.03) and noisy from day to day (sd of the daily
IC ~0.14: common factors move the whole cross-section).  These tests check that the interval the
evaluation reports -- :func:`ic_stats` with ``rank=True`` and ``lag = horizon - 1 = 0``, as
``evaluate`` calls it for 1-day labels: the t interval -- tells such an IC apart from none when,
and only when, there are enough days.  Each property is a rate over many
fixed seeds with a computed margin, so none of them is a coin flip.

The synthetic cross-section (per seed, per day d, names i = 1..88)::

    score[d, i]   = s[d, i]                                          s ~ N(0, 1)
    fwd_ret[d, i] = m[d] + VOL * ((B + g[d]) * s[d, i] + e[d, i])    e ~ N(0, 1)

``m[d]`` is the market's move (common to every name: ranks ignore it) and ``g[d] ~ N(0, TAU^2)`` is
that day's return on the style factor the score is exposed to; it makes the daily IC swing beyond
its sampling noise, as real common factors do.  ``B`` is the planted edge (``B = 0``: the null).

Calibration (n = 88 names; targets: mean daily rank IC 0.017, daily sd 0.145):

* The day's population Pearson correlation is rho = (B + g) / sqrt(1 + (B + g)^2).  For normal
  data the expected sample Spearman correlation is 6 / (pi (n + 1)) * [asin(rho) + (n - 2)
  asin(rho / 2)] ~= 3n / (pi (n + 1)) * rho = 0.944 rho.
* Variance: sampling noise 1 / (n - 1) = 0.01149 (sd 0.107: what a pure-noise score gives) plus the
  factor's 0.944^2 TAU^2.  For sd 0.145: TAU^2 = (0.145^2 - 0.01149) / 0.891 = 0.01069, TAU = 0.1034.
* Mean: E[rho] ~= B (1 - 1.5 TAU^2) = 0.984 B, so B = 0.017 / 0.944 / 0.984 = 0.0183.

What a correct 95 % interval must then do (mu = 0.017, sigma = 0.145, mu / sigma = 0.117):

* 1000 days (4 years): SE = 0.145 / sqrt(1000) = 0.00459, z = 3.71, power = Phi(3.71 - 1.96) = 0.96;
  over 200 seeds the rate's binomial sd is 1.4 %, so ">= 90 %" has a 4-sd margin.  At 750 days
  the power would be Phi(3.21 - 1.96) = 0.89: a coin flip around 90 %, hence 1000 (the issue asks
  for >= 750).  Real data's 0.02 / 0.137 = 0.146 would give 0.98 at 750 days, but then the 180-day
  half-width below equals the planted IC on average and half the seeds would break property 2:
  both properties together need mu / sigma a little under 1.96 / sqrt(180) = 0.146.
* 180 days: half-width = 1.96 * 0.145 / sqrt(180) = 0.0212.  The estimated sd varies from seed to
  seed by ~1 / sqrt(2 * 179) = 5.3 %, so the narrowest of 200 seeds (~2.8 sd below) is ~0.0180 (a t
  interval on these seeds: 0.0176), still above the planted 0.017 (realised 0.0166): a 180-day
  segment cannot resolve such an IC in any seed.
* Null (B = 0): the interval excludes 0 with probability 5 %.  The count over k trials must lie in
  the central 99.8 % of Binomial(k, 0.05) (computed with scipy): [8, 35] of 400 pooled panels
  (2 % - 8.75 %), [71, 131] of 2000 disjoint 180-day windows (3.55 % - 6.55 %).  2000 windows, not
  200, so that the check has power: a true rate of 7.8 % passes [71, 131] with probability 0.02,
  whereas over 200 it would pass the [2, 21] region with probability 0.93.

Second-order terms (the var of rho is ~(1 - 3 TAU^2) TAU^2, and the sampling variance shrinks a
little for rho != 0) put the realised sd ~1 % under the target (0.143): inside the 2 % tolerance.

The product's interval before this one (a moving-block bootstrap with 10-day blocks, percentile
interval) failed two of these properties on the same seeds: with only 18 blocks in 180 days its
half-width varied 15 % from seed to seed (the t interval's: 5 %) and was 5 % narrower on average,
so it was narrower than the planted IC in 31 of 200 seeds, and it excluded 0 in 144 of 2000 null
180-day windows (7.2 %).

The realised mean and sd of the daily IC are measured across all seeds (with an independent numpy
Spearman, which must also equal the product's daily series) so the calibration is checked, not
assumed.  Seeds: numpy ``default_rng([32, kind, i])``, kind 1 planted (i in 0..199) and 0 null
(i in 0..399).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from alchemetric_ray.signals.metrics import ic_stats, mean_interval

N_NAMES = 88
VOL = 0.02  # idiosyncratic daily return scale (ranks ignore it; it keeps fwd_ret realistic)
TARGET_IC = 0.017
TARGET_SD = 0.145
_SPEARMAN_SLOPE = 3 * N_NAMES / (math.pi * (N_NAMES + 1))  # E[sample Spearman] / rho, 0.944
TAU = math.sqrt((TARGET_SD**2 - 1 / (N_NAMES - 1)) / _SPEARMAN_SLOPE**2)  # 0.1034
B = TARGET_IC / _SPEARMAN_SLOPE / (1 - 1.5 * TAU**2)  # 0.0183
N_SEEDS = 200  # planted panels
N_NULL_SEEDS = 400  # null panels: 400 pooled intervals, 2000 disjoint 180-day windows
LONG_DAYS = 1000
SHORT_DAYS = 180
CONFIDENCE = 0.95
NULL_RATE = 1 - CONFIDENCE
TAIL = 0.001  # each tail of the binomial acceptance region for a false-positive count
LAG = 0  # what `evaluate` passes to ic_stats for 1-day forward returns (horizon - 1)
DATES = pd.bdate_range("2015-01-02", periods=LONG_DAYS)
TICKERS = np.array([f"N{i:02d}" for i in range(N_NAMES)])


def _panel(rng: np.random.Generator, b: float) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """One seed's (date, ticker, score, fwd_ret) frame, plus score and fwd_ret as (day, name) arrays."""
    s = rng.standard_normal((LONG_DAYS, N_NAMES))
    g = rng.normal(0.0, TAU, (LONG_DAYS, 1))
    m = rng.normal(0.0, 0.01, (LONG_DAYS, 1))
    e = rng.standard_normal((LONG_DAYS, N_NAMES))
    r = m + VOL * ((b + g) * s + e)
    frame = pd.DataFrame({"date": np.repeat(DATES, N_NAMES), "ticker": np.tile(TICKERS, LONG_DAYS),
                          "score": s.ravel(), "fwd_ret": r.ravel()})
    return frame, s, r


def _spearman_by_day(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Daily Spearman correlation of the rows of two (day, name) arrays without ties, computed here
    independently of the product: 1 - 6 sum d^2 / (n (n^2 - 1)) on within-day ranks."""
    rx = x.argsort(axis=1).argsort(axis=1)
    ry = y.argsort(axis=1).argsort(axis=1)
    n = x.shape[1]
    return 1.0 - 6.0 * ((rx - ry) ** 2).sum(axis=1) / (n * (n * n - 1))


def _stats(frame: pd.DataFrame, first_day: int, n_days: int):
    """The product's rank-IC summary on days [first_day, first_day + n_days) of a panel."""
    rows = slice(first_day * N_NAMES, (first_day + n_days) * N_NAMES)
    return ic_stats(frame.iloc[rows], rank=True, lag=LAG, confidence=CONFIDENCE)


@dataclass
class _Runs:
    daily: np.ndarray  # (seeds, LONG_DAYS) independent Spearman of every day
    product_daily: np.ndarray  # (seeds, LONG_DAYS) ic_stats(...).daily of the long panel
    long_ci: np.ndarray  # (seeds, 2) interval over LONG_DAYS
    short_ci: np.ndarray  # (windows, 2) intervals over SHORT_DAYS windows
    short_sd: np.ndarray  # (windows,) daily-IC sd of each window


def _run(kind: int, b: float, n_seeds: int, short_windows: int) -> _Runs:
    daily, product, long_ci, short_ci, short_sd = [], [], [], [], []
    for i in range(n_seeds):
        frame, s, r = _panel(np.random.default_rng([32, kind, i]), b)
        daily.append(_spearman_by_day(s, r))
        st = _stats(frame, 0, LONG_DAYS)
        product.append(st.daily.to_numpy())
        long_ci.append((st.ci_low, st.ci_high))
        assert st.n_days == LONG_DAYS  # every day kept: a window's daily ICs are a slice of these
        first = _stats(frame, 0, SHORT_DAYS)  # the product's summary of the first window, from its rows
        for w in range(short_windows):
            # the product's interval on the window's daily ICs (ic_stats' own steps, without ranking the
            # window's rows again); the first window is checked against ic_stats on its rows
            v = st.daily.to_numpy()[w * SHORT_DAYS:(w + 1) * SHORT_DAYS]
            _, low, high = mean_interval(v, lag=LAG, confidence=CONFIDENCE)
            if w == 0:
                assert first.n_days == SHORT_DAYS
                np.testing.assert_allclose([low, high, v.std(ddof=1)], [first.ci_low, first.ci_high, first.std],
                                           rtol=0, atol=1e-12)
            short_ci.append((low, high))
            short_sd.append(v.std(ddof=1))
    return _Runs(np.array(daily), np.array(product), np.array(long_ci), np.array(short_ci), np.array(short_sd))


@pytest.fixture(scope="module")
def planted() -> _Runs:
    """200 seeds with the planted edge; the 180-day segment is each panel's first 180 days."""
    return _run(1, B, N_SEEDS, 1)


@pytest.fixture(scope="module")
def null() -> _Runs:
    """400 seeds without edge (same factor noise); five disjoint 180-day windows of each panel."""
    return _run(0, 0.0, N_NULL_SEEDS, LONG_DAYS // SHORT_DAYS)


def _excludes_zero(ci: np.ndarray) -> np.ndarray:
    return (ci[:, 0] > 0) | (ci[:, 1] < 0)


def _acceptance(k: int) -> tuple[int, int]:
    """Central region of Binomial(k, NULL_RATE) holding all but ~TAIL of the mass in each tail."""
    return int(binom.ppf(TAIL, k, NULL_RATE)), int(binom.isf(TAIL, k, NULL_RATE))


@pytest.mark.slow
def test_calibration_matches_real_data(planted, null):
    """The planted IC and the day-to-day sd are what the docstring's arithmetic says, measured over
    200 x 1000 planted and 400 x 1000 null days (mean within 4 standard errors; sd within 2 %, the
    analytic approximations' slack), and the product's daily rank IC is that same Spearman correlation."""
    for runs in (planted, null):
        np.testing.assert_allclose(runs.product_daily, runs.daily, rtol=0, atol=1e-9)
    for runs, target in ((planted, TARGET_IC), (null, 0.0)):
        v = runs.daily.ravel()
        se = v.std(ddof=1) / math.sqrt(v.size)
        assert abs(v.mean() - target) < 4 * se, (v.mean(), target, se)
        assert v.std(ddof=1) == pytest.approx(TARGET_SD, rel=0.02)
    # the per-window sd's seed-to-seed spread the 180-day margin relies on (~1 / sqrt(2 * 179) = 5.3 %)
    spread = planted.short_sd.std(ddof=1) / planted.short_sd.mean()
    assert spread < 1.3 / math.sqrt(2 * (SHORT_DAYS - 1)), spread


@pytest.mark.slow
def test_pooled_interval_detects_the_planted_ic(planted):
    """Over 1000 days a 0.017 rank IC is found: the interval lies above 0 in >= 90 % of the seeds
    (a correct interval: 96 %)."""
    above = planted.long_ci[:, 0] > 0
    assert above.mean() >= 0.90, above.mean()


@pytest.mark.slow
def test_180_day_interval_cannot_resolve_the_planted_ic(planted):
    """On a 180-day segment the interval's half-width is at least the planted IC in every seed: the
    segment is too short to tell 0.017 from 0, whatever the seed."""
    half = (planted.short_ci[:, 1] - planted.short_ci[:, 0]) / 2
    realised = planted.daily.mean()
    assert (half >= realised).all(), (half.min(), realised, int((half < realised).sum()))


@pytest.mark.slow
def test_null_false_positive_rate_pooled(null):
    """No edge, 1000 days: the interval excludes 0 in ~5 % of 400 seeds (count within [8, 35])."""
    hits = int(_excludes_zero(null.long_ci).sum())
    lo, hi = _acceptance(len(null.long_ci))
    assert lo <= hits <= hi, (hits, lo, hi)


@pytest.mark.slow
def test_null_false_positive_rate_180_days(null):
    """No edge, 180 days (the test segment evaluate reports): ~5 % of 2000 disjoint windows
    exclude 0 (count within [71, 131])."""
    hits = int(_excludes_zero(null.short_ci).sum())
    lo, hi = _acceptance(len(null.short_ci))
    assert lo <= hits <= hi, (hits, lo, hi)
