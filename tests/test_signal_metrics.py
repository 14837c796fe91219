"""Known answers for the signal metrics: IC, its t interval, long-short and per-name P&L, PSR/DSR, verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from alchemetric_ray.signals.metrics import (
    ICStats,
    daily_ic,
    deflated_sharpe,
    edge_verdict,
    expected_max_sharpe,
    ic_stats,
    probabilistic_sharpe,
)
from alchemetric_ray.signals.portfolio import hit_rate, long_short, position_returns


def panel(n_days: int, n_names: int, *, seed: int = 0, noise: float | None = None, vol: float = 0.02) -> pd.DataFrame:
    """Synthetic (date, ticker) panel; score = fwd_ret + noise * N(0, vol) (pure noise when noise is None)."""
    rng = np.random.default_rng(seed)
    fwd = rng.normal(0.0, vol, (n_days, n_names))
    if noise is None:
        score = rng.normal(0.0, 1.0, (n_days, n_names))
    else:
        score = fwd + noise * rng.normal(0.0, vol, (n_days, n_names))
    dates = pd.bdate_range("2020-01-01", periods=n_days)
    return pd.DataFrame(
        {
            "date": np.repeat(dates, n_names),
            "ticker": np.tile([f"T{i:03d}" for i in range(n_names)], n_days),
            "score": score.ravel(),
            "fwd_ret": fwd.ravel(),
        }
    )


def tiny(rows: list[tuple[str, str, float, float]], **extra) -> pd.DataFrame:
    """(date, ticker, score, simple return) -> frame with fwd_ret = log(1 + simple return)."""
    df = pd.DataFrame(rows, columns=["date", "ticker", "score", "simple"])
    df["date"] = pd.to_datetime(df["date"])
    df["fwd_ret"] = np.log1p(df.pop("simple"))
    for k, v in extra.items():
        df[k] = v
    return df


# Two dates, five names.  Date 1: A best ... E worst; date 2 reversed.
TWO_DATES = tiny(
    [
        ("2024-01-02", "A", 5, 0.10),
        ("2024-01-02", "B", 4, 0.02),
        ("2024-01-02", "C", 3, 0.00),
        ("2024-01-02", "D", 2, -0.04),
        ("2024-01-02", "E", 1, -0.06),
        ("2024-01-03", "A", 1, -0.02),
        ("2024-01-03", "B", 2, 0.00),
        ("2024-01-03", "C", 3, 0.01),
        ("2024-01-03", "D", 4, 0.03),
        ("2024-01-03", "E", 5, 0.05),
    ]
)


# ------------------------------------------------------------------------------------------ IC


def test_perfect_and_inverted_score_give_ic_plus_minus_one():
    df = panel(50, 20, seed=1)
    df["score"] = df["fwd_ret"]
    for rank in (False, True):
        ic = daily_ic(df, rank=rank)
        assert len(ic) == 50
        np.testing.assert_allclose(ic.to_numpy(), 1.0, atol=1e-12)
        inv = daily_ic(df.assign(score=-df["fwd_ret"]), rank=rank)
        np.testing.assert_allclose(inv.to_numpy(), -1.0, atol=1e-12)
    # a monotone, non-linear transform: rank IC stays exactly 1, Pearson IC drops below 1
    mono = df.assign(score=np.exp(60 * df["fwd_ret"]))
    np.testing.assert_allclose(daily_ic(mono, rank=True).to_numpy(), 1.0, atol=1e-12)
    assert daily_ic(mono).mean() < 0.999
    st = ic_stats(df, rank=True)
    assert st.mean == pytest.approx(1.0) and st.ci_low == pytest.approx(1.0) and st.rank


def test_rank_ic_handles_ties_like_spearman():
    from scipy.stats import spearmanr

    scores, returns = [1, 1, 2, 3, 3, 3], [0.01, -0.02, 0.0, 0.03, 0.01, 0.02]
    df = tiny([("2024-01-02", t, s, r) for t, s, r in zip("ABCDEF", scores, returns)])
    expected = spearmanr(df["score"], df["fwd_ret"]).statistic
    assert daily_ic(df, rank=True).iloc[0] == pytest.approx(expected, abs=1e-12)


def test_daily_ic_drops_small_and_constant_dates():
    df = panel(4, 6, seed=2, noise=1.0)
    d = df["date"].unique()
    df = df[~((df["date"] == d[0]) & (df["ticker"] > "T001"))]  # date 0 keeps 2 names only
    df.loc[df["date"] == d[1], "score"] = 0.3  # constant score
    df.loc[df["date"] == d[2], "fwd_ret"] = -0.01  # constant return
    ic = daily_ic(df, min_names=3)
    assert list(ic.index) == [d[3]]
    assert list(daily_ic(df, rank=True).index) == [d[3]]


def test_pure_noise_ic_is_zero_with_ci_containing_zero():
    st = ic_stats(panel(600, 50, seed=3))
    assert st.n_days == 600
    assert abs(st.mean) < 0.015
    assert st.ci_low < 0.0 < st.ci_high
    assert abs(st.t_stat) < 3


def test_weak_planted_signal_ci_excludes_zero_and_stats_formulas():
    df = panel(1000, 50, seed=4, noise=30.0)  # true corr 1/sqrt(901) ~ 0.033 per day
    st = ic_stats(df, rank=True, annualization=252)
    assert 0.015 < st.mean < 0.06
    assert st.ci_low > 0.0 and st.ci_high > st.mean > st.ci_low
    v = st.daily.to_numpy()
    assert st.std == pytest.approx(v.std(ddof=1))
    assert st.icir == pytest.approx(v.mean() / v.std(ddof=1) * math.sqrt(252))
    assert st.t_stat == pytest.approx(v.mean() / v.std(ddof=1) * math.sqrt(len(v)))
    assert ic_stats(df, rank=True, annualization=52).icir == pytest.approx(st.icir * math.sqrt(52 / 252))


def test_the_interval_is_the_t_interval_at_lag_0_and_newey_west_widens_it_for_autocorrelated_ic():
    from scipy.stats import t as student_t

    df = panel(400, 30, seed=5, noise=10.0)
    a = ic_stats(df)
    assert (a.ci_low, a.ci_high) == (ic_stats(df).ci_low, ic_stats(df).ci_high)  # no random draws
    # lag 0 is the textbook t interval: mean +- t(n - 1) * std / sqrt(n), and t_stat = mean / (std / sqrt(n))
    half = student_t.ppf(0.975, a.n_days - 1) * a.std / math.sqrt(a.n_days)
    assert (a.ci_low, a.ci_high) == pytest.approx((a.mean - half, a.mean + half), rel=1e-12)
    assert a.t_stat == pytest.approx(a.mean / a.std * math.sqrt(a.n_days))
    # lag 1 by hand: long-run variance = (sum x^2 + 2 * 0.5 * sum x_t x_t+1) / (n - 1)
    v = a.daily.to_numpy()
    x = v - v.mean()
    se = math.sqrt((x @ x + x[:-1] @ x[1:]) / (len(v) - 1) / len(v))
    one = ic_stats(df, lag=1)
    assert one.ci_high - one.mean == pytest.approx(student_t.ppf(0.975, len(v) - 1) * se, rel=1e-12)
    assert one.t_stat == pytest.approx(v.mean() / se)

    # persistent signal strength (AR(1) in the planted weight) -> serially correlated daily IC
    rng = np.random.default_rng(9)
    n_days, n_names = 1000, 40
    w = np.zeros(n_days)
    for t in range(1, n_days):
        w[t] = 0.97 * w[t - 1] + rng.normal(0, 0.25)
    fwd = rng.normal(0, 1, (n_days, n_names))
    score = w[:, None] * fwd + rng.normal(0, 1, (n_days, n_names))
    dates = pd.bdate_range("2015-01-01", periods=n_days)
    ar = pd.DataFrame(
        {"date": np.repeat(dates, n_names), "ticker": np.tile(np.arange(n_names).astype(str), n_days),
         "score": score.ravel(), "fwd_ret": fwd.ravel() * 0.01}
    )
    narrow = ic_stats(ar)
    wide = ic_stats(ar, lag=50)
    assert (wide.ci_high - wide.ci_low) > 2 * (narrow.ci_high - narrow.ci_low)
    with pytest.raises(ValueError, match="lag"):
        ic_stats(ar, lag=-1)


def test_ic_stats_degenerate_inputs():
    st = ic_stats(panel(1, 10, seed=0))
    assert st.n_days == 1 and math.isnan(st.std) and math.isnan(st.ci_low) and math.isnan(st.icir)
    empty = ic_stats(panel(3, 10).assign(score=np.nan))
    assert empty.n_days == 0 and math.isnan(empty.mean) and empty.daily.empty
    with pytest.raises(ValueError):
        ic_stats(panel(3, 10), confidence=1.5)


# ----------------------------------------------------------------------------------- long-short


def test_long_short_tiny_example_exact_numbers():
    ls = long_short(TWO_DATES, quantile=0.4, cost_bps=10.0, min_names=5)  # k = 2 per leg, weights +-0.25
    d = ls.daily
    assert list(d.columns) == ["date", "gross", "cost", "net", "equity"]
    # date 1: long A, B; short D, E.  0.25*(0.10+0.02) - 0.25*(-0.04-0.06) = 0.055
    # date 2: long E, D; short A, B.  0.25*(0.05+0.03) - 0.25*(-0.02+0.00) = 0.025
    np.testing.assert_allclose(d["gross"], [0.055, 0.025], atol=1e-15)
    # turnover: 1.0 entering from flat, then every leg flips: 4 * |0.25 - (-0.25)| = 2.0
    np.testing.assert_allclose(d["cost"], [10e-4 * 1.0, 10e-4 * 2.0], atol=1e-15)
    np.testing.assert_allclose(d["net"], [0.054, 0.023], atol=1e-15)
    np.testing.assert_allclose(d["equity"], [1.054, 1.054 * 1.023], atol=1e-15)
    assert ls.turnover == pytest.approx(1.5)
    assert ls.n_days == 2 and ls.hit_rate == 1.0 and ls.max_drawdown == 0.0
    assert ls.annual_return == pytest.approx((0.054 + 0.023) / 2 * 252)
    assert ls.sharpe == pytest.approx(np.mean([0.054, 0.023]) / np.std([0.054, 0.023], ddof=1) * math.sqrt(252))

    k1 = long_short(TWO_DATES, quantile=0.2, cost_bps=0.0)  # k = 1: weights +-0.5
    np.testing.assert_allclose(k1.daily["gross"], [0.5 * 0.10 + 0.5 * 0.06, 0.5 * 0.05 + 0.5 * 0.02], atol=1e-15)


def test_costs_reduce_net_by_exactly_bps_times_turnover():
    free = long_short(TWO_DATES, quantile=0.4, cost_bps=0.0)
    paid = long_short(TWO_DATES, quantile=0.4, cost_bps=25.0)
    np.testing.assert_allclose(free.daily["gross"], paid.daily["gross"], atol=0)
    np.testing.assert_allclose(free.daily["net"] - paid.daily["net"], 25e-4 * np.array([1.0, 2.0]), atol=1e-15)
    assert free.turnover == paid.turnover == pytest.approx(1.5)

    big = panel(60, 30, seed=6, noise=2.0)
    f, p = long_short(big, cost_bps=0.0), long_short(big, cost_bps=5.0)
    assert (f.daily["net"] - p.daily["net"]).sum() == pytest.approx(5e-4 * f.turnover * f.n_days)


def test_perfect_score_long_short_is_profitable():
    ls = long_short(panel(250, 50, seed=7).pipe(lambda d: d.assign(score=d["fwd_ret"])))
    assert ls.sharpe > 5 and ls.annual_return > 0 and ls.hit_rate == 1.0
    assert (ls.daily["gross"] > 0).all()
    assert 0 < ls.turnover <= 2.0
    assert ls.max_drawdown < 0.01


def test_constant_score_makes_no_trades():
    df = panel(40, 20, seed=8).assign(score=0.7)
    ls = long_short(df)
    assert ls.n_days == 40
    assert ls.turnover == 0.0
    assert (ls.daily[["gross", "cost", "net"]].to_numpy() == 0).all()
    assert (ls.daily["equity"] == 1.0).all()
    assert ls.annual_return == 0.0 and ls.annual_vol == 0.0 and ls.sharpe == 0.0 and ls.max_drawdown == 0.0
    assert math.isnan(ls.hit_rate)  # never traded: neither a hit nor a miss
    # flat positions likewise trade nothing; hit_rate of rows without a position is undefined
    flat = position_returns(df.assign(position=0))
    assert flat.turnover == 0.0 and (flat.daily["net"] == 0).all() and math.isnan(flat.hit_rate)
    assert math.isnan(hit_rate(df.assign(position=0)))


def test_ties_straddling_the_cut_are_in_or_out_as_a_group():
    # k = 1; the top two names tie (average rank 4.5 < 5) -> no long leg -> flat that date
    df = tiny([("2024-01-02", t, s, 0.01) for t, s in zip("ABCDE", [3, 3, 2, 1, 0])])
    ls = long_short(df, quantile=0.2, cost_bps=0)
    assert ls.turnover == 0.0 and ls.daily["gross"].iloc[0] == 0.0
    # quantile 0.4 (k = 2): the tied pair is exactly the top two -> long both
    rets = [0.04, 0.02, 0.0, -0.01, -0.03]
    df = tiny([("2024-01-02", t, s, r) for t, s, r in zip("ABCDE", [3, 3, 2, 1, 0], rets)])
    g = long_short(df, quantile=0.4, cost_bps=0).daily["gross"].iloc[0]
    assert g == pytest.approx(0.25 * (0.04 + 0.02) - 0.25 * (-0.01 - 0.03))


def test_horizon_rebalances_without_double_counting():
    df = panel(12, 10, seed=10, noise=1.0)
    daily = long_short(df, cost_bps=0.0, horizon=1)
    h4 = long_short(df, cost_bps=0.0, horizon=4)
    assert h4.n_days == 3 and h4.periods_per_year == 252 / 4
    dates = np.sort(df["date"].unique())
    assert list(h4.daily["date"]) == list(dates[[0, 4, 8]])
    # the same books, only every 4th date: each 4-day forward return is earned exactly once
    np.testing.assert_allclose(h4.daily["gross"], daily.daily["gross"].to_numpy()[[0, 4, 8]])
    net = h4.daily["net"].to_numpy()
    assert h4.annual_return == pytest.approx(net.mean() * 63)
    assert h4.sharpe == pytest.approx(net.mean() / net.std(ddof=1) * math.sqrt(63))
    # a date with too few names is skipped outright; the grid runs over the kept dates
    thin = df[~((df["date"] == dates[4]) & (df["ticker"] > "T002"))]
    assert list(long_short(thin, horizon=4).daily["date"]) == list(dates[[0, 5, 9]])
    with pytest.raises(ValueError):
        long_short(df, horizon=0)


def test_min_names_and_validation():
    df = panel(5, 4, seed=11)
    assert long_short(df, min_names=5).n_days == 0
    assert long_short(df, min_names=4).n_days == 5
    with pytest.raises(ValueError):
        long_short(df, quantile=0.6)
    with pytest.raises(ValueError, match="duplicated"):
        long_short(pd.concat([df, df.iloc[:1]]))
    with pytest.raises(ValueError, match="missing"):
        daily_ic(df.drop(columns="fwd_ret"))


# -------------------------------------------------------------------------- per-name positions


def test_max_drawdown_of_a_known_equity_path():
    rets = [0.10, -0.20, 0.10, 0.30, -0.10]  # equity 1.1, 0.88, 0.968, 1.2584, 1.13256
    df = tiny([(f"2024-01-{i + 2:02d}", "X", 1.0, r) for i, r in enumerate(rets)], position=1)
    st = position_returns(df, cost_bps=0.0)
    np.testing.assert_allclose(st.daily["equity"], np.cumprod(1 + np.array(rets)))
    assert st.max_drawdown == pytest.approx(0.2)  # 1.1 -> 0.88
    first_loss = tiny([("2024-01-02", "X", 1.0, -0.1), ("2024-01-03", "X", 1.0, 0.05)], position=1)
    assert position_returns(first_loss, cost_bps=0).max_drawdown == pytest.approx(0.1)  # from the start at 1
    assert st.hit_rate == pytest.approx(3 / 5)


def test_position_returns_weights_and_turnover():
    pos = [1, 1, -1, 0, 1]
    df = tiny([(f"2024-01-{i + 2:02d}", "X", 0.0, 0.01) for i in range(5)], position=pos)
    st = position_returns(df, cost_bps=10.0)
    np.testing.assert_allclose(st.daily["cost"], 1e-3 * np.array([1, 0, 2, 1, 1]))
    np.testing.assert_allclose(st.daily["gross"], 0.01 * np.array(pos, dtype=float))
    assert st.turnover == pytest.approx(1.0)
    # two names: equal weight 1/2 each; B absent on day 2 -> its position is closed (turnover 0.5)
    two = tiny(
        [("2024-01-02", "A", 0, 0.02), ("2024-01-02", "B", 0, -0.04), ("2024-01-03", "A", 0, 0.01)],
        position=[1, -1, 1],
    )
    st2 = position_returns(two, cost_bps=0.0)
    np.testing.assert_allclose(st2.daily["gross"], [0.5 * 0.02 + 0.5 * 0.04, 0.01])
    np.testing.assert_allclose(st2.daily["cost"], [0, 0])
    assert st2.turnover == pytest.approx((1.0 + 0.5 + 0.5) / 2)  # day 2: A 0.5 -> 1 (0.5), B -0.5 -> 0 (0.5)
    # without a position column the position is sign(score)
    no_pos = two.drop(columns="position").assign(score=[0.3, -0.2, 0.1])
    np.testing.assert_allclose(position_returns(no_pos, cost_bps=0).daily["net"], st2.daily["net"])


def test_hit_rate_counts_only_rows_with_a_position():
    df = tiny(
        [(f"2024-01-0{i + 2}", "X", 0.0, r) for i, r in enumerate([0.01, -0.02, 0.03, -0.01, 0.0])],
        position=[1, 1, -1, 0, 1],
    )
    assert hit_rate(df) == pytest.approx(1 / 4)  # hit, miss, miss, (skipped), zero return = miss
    assert hit_rate(df.assign(position=[1, -1, 0, 0, 0])) == 1.0


# -------------------------------------------------------------------------------- NaN handling


def test_nan_rows_are_ignored_everywhere():
    clean = panel(30, 12, seed=12, noise=3.0)
    clean["position"] = np.sign(clean["score"])
    junk = clean.sample(40, random_state=1).copy()
    junk["ticker"] = junk["ticker"] + "_nan"
    junk.loc[junk.index[:20], "score"] = np.nan
    junk.loc[junk.index[20:], "fwd_ret"] = np.nan
    dirty = pd.concat([clean, junk]).sample(frac=1.0, random_state=2)  # also shuffles the rows
    pd.testing.assert_series_equal(daily_ic(clean), daily_ic(dirty))
    pd.testing.assert_series_equal(daily_ic(clean, rank=True), daily_ic(dirty, rank=True))
    a, b = ic_stats(clean), ic_stats(dirty)
    assert (a.mean, a.ci_low, a.ci_high) == pytest.approx((b.mean, b.ci_low, b.ci_high))
    pd.testing.assert_frame_equal(long_short(clean).daily, long_short(dirty).daily)
    assert long_short(dirty).n_days == 30
    pr_clean = position_returns(clean.drop(columns="position"))
    pr_dirty = position_returns(dirty.drop(columns="position"))
    pd.testing.assert_frame_equal(pr_clean.daily, pr_dirty.daily)
    assert hit_rate(clean.drop(columns="position")) == hit_rate(dirty.drop(columns="position"))
    # a NaN position drops its row from the position-based metrics (and only there)
    holed = clean.copy()
    holed.loc[holed.index[7], "position"] = np.nan
    without = clean.drop(index=clean.index[7])
    pd.testing.assert_frame_equal(position_returns(holed).daily, position_returns(without).daily)
    assert hit_rate(holed) == hit_rate(without)
    pd.testing.assert_frame_equal(long_short(holed).daily, long_short(clean).daily)


# ------------------------------------------------------------------------------------ PSR / DSR


def test_probabilistic_sharpe_known_values():
    rng = np.random.default_rng(13)
    r = rng.normal(0.001, 0.01, 2000)
    assert probabilistic_sharpe(r) > 0.5
    assert probabilistic_sharpe(-r) < 0.5
    zero = r - r.mean()
    assert probabilistic_sharpe(zero) == pytest.approx(0.5, abs=1e-12)
    # against its own SR -> 0.5; a higher benchmark -> lower probability
    sr = r.mean() / r.std(ddof=1)
    assert probabilistic_sharpe(r, benchmark_sr=sr) == pytest.approx(0.5, abs=1e-12)
    assert probabilistic_sharpe(r, benchmark_sr=sr / 2) > probabilistic_sharpe(r, benchmark_sr=sr)
    # hand formula with sample skewness and (Pearson) kurtosis
    d = r - r.mean()
    m2 = np.mean(d**2)
    skew, kurt = np.mean(d**3) / m2**1.5, np.mean(d**4) / m2**2
    z = sr * math.sqrt(len(r) - 1) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)
    assert probabilistic_sharpe(r) == pytest.approx(norm.cdf(z), rel=1e-12)
    assert math.isnan(probabilistic_sharpe(np.array([0.01]))) and math.isnan(probabilistic_sharpe(np.zeros(10)))


def test_deflated_sharpe_matches_the_worked_example_of_bailey_and_lopez_de_prado():
    # Bailey, D. H. and M. Lopez de Prado (2014), "The Deflated Sharpe Ratio: Correcting for
    # Selection Bias, Backtest Overfitting and Non-Normality", Journal of Portfolio Management
    # 40(5), pp. 94-107, numerical example: an annualized SR of 2.5 over 5 years of daily returns
    # (T = 1250), skewness -3, kurtosis 10, chosen among N = 100 trials whose annualized SRs have
    # variance 0.5.  The paper gets an expected maximum SR of ~0.1132 per period and DSR ~0.9004.
    # The formula works on per-period figures; with 250 periods a year:
    #   SR_daily = SR_annual / sqrt(250),   variance_daily = variance_annual / 250.
    periods = 250
    sr_daily = 2.5 / math.sqrt(periods)
    var_daily = 0.5 / periods
    assert expected_max_sharpe(100, var_daily) == pytest.approx(0.1132, abs=5e-5)  # the paper rounds to 4 decimals
    dsr = deflated_sharpe(sr_daily, skew=-3.0, kurtosis=10.0, n_obs=1250, n_trials=100, var_trials_sr=var_daily)
    assert dsr == pytest.approx(0.9004, abs=5e-5)
    # one trial selects nothing: no deflation, the PSR against 0
    assert expected_max_sharpe(1, var_daily) == 0.0
    assert deflated_sharpe(sr_daily, -3.0, 10.0, 1250, 1, var_daily) > dsr
    with pytest.raises(ValueError):
        deflated_sharpe(sr_daily, -3.0, 10.0, 1250, 0, var_daily)


# ------------------------------------------------------------------------------------- verdict


def _ic(mean: float, lo: float, hi: float, rank: bool = True, daily: pd.Series | None = None) -> ICStats:
    return ICStats(mean, 0.1, 1.0, 3.0, 500, lo, hi, pd.Series(dtype=float) if daily is None else daily, rank=rank)


def _daily(mean: float, seed: int, common: np.ndarray, n: int = 500) -> pd.Series:
    rng = np.random.default_rng(seed)
    return pd.Series(common + mean + rng.normal(0, 0.02, n), index=pd.bdate_range("2020-01-01", periods=n))


def test_edge_verdict_lines():
    common = np.random.default_rng(0).normal(0, 0.1, 500)  # market-wide noise both signals share
    strong, weak, same = _daily(0.041, 1, common), _daily(0.010, 2, common), _daily(0.040, 3, common)
    yes = edge_verdict(_ic(0.041, 0.012, 0.070, daily=strong), _ic(0.010, -0.01, 0.03, daily=weak), n_tickers=50,
                       baseline_name="momentum 20d")
    assert yes.edge is True and yes.signal is True and yes.cross_section_meaningful is True
    assert yes.line.startswith("edge over the best baseline: yes (mean rank IC 0.041, 95% CI [0.012, 0.070]; "
                               "momentum 20d 0.010; difference +0.03")
    assert yes.difference.ci_low > 0 and yes.difference.n_days == 500
    ci_spans_zero = edge_verdict(_ic(0.041, -0.002, 0.080, daily=strong), _ic(0.010, -0.01, 0.03, daily=weak),
                                 n_tickers=50)
    assert ci_spans_zero.edge is False and ci_spans_zero.signal is False
    assert ci_spans_zero.line.startswith("edge over the best baseline: no (mean rank IC 0.041")
    # a real signal that only ties the best baseline is no edge over it
    tie = edge_verdict(_ic(0.041, 0.012, 0.070, daily=strong), _ic(0.040, 0.01, 0.07, daily=same), n_tickers=50)
    assert tie.signal is True and tie.edge is False
    assert tie.difference.ci_low < 0 < tie.difference.ci_high
    alone = edge_verdict(_ic(0.03, 0.01, 0.05, rank=False), None, n_tickers=50)
    assert alone.edge is True and "mean IC 0.030" in alone.line
    few = edge_verdict(_ic(0.2, 0.1, 0.3), _ic(0.0, -0.1, 0.1), n_tickers=3)
    assert few.edge is False and few.cross_section_meaningful is False
    assert "not meaningful with 3 tickers" in few.line


def test_classification_metrics_equal_the_scikit_learn_functions_they_replace():
    """Label metrics from one confusion matrix, a lean log loss and a ROC-AUC from one sort per class:
    the same figures as scikit-learn's own functions, missing classes, one-class splits, tied
    scores and float32 probabilities included."""
    import warnings

    from sklearn import metrics as skm

    from alchemetric_ray.scoring.metrics import classification_metrics

    rng = np.random.default_rng(1)
    for trial in range(120):
        n, k = int(rng.integers(1, 300)), int(rng.choice([2, 3, 4]))
        y = rng.integers(0, k, n)
        if trial % 5 == 0:
            y[:] = 0  # one class only
        if trial % 7 == 0:
            y = np.where(y == 1, 0, y)  # class 1 absent from y_true
        p = rng.random((n, k)).astype(np.float32 if trial % 2 else np.float64)
        p /= p.sum(axis=1, keepdims=True)
        if trial % 3 == 0:
            p[rng.random(n) < 0.3] = np.eye(k)[0]  # hard 0/1 probabilities: the clip matters
        got = classification_metrics(y, p, prefix="")
        pred, labels = p.argmax(axis=1), list(range(k))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = {
                "accuracy": skm.accuracy_score(y, pred),
                "balanced_accuracy": skm.balanced_accuracy_score(y, pred),
                "macro_f1": skm.f1_score(y, pred, labels=labels, average="macro", zero_division=0),
                "log_loss": skm.log_loss(y, np.clip(p.astype(np.float64), 1e-7, 1), labels=labels),
                "mcc": skm.matthews_corrcoef(y, pred),
            }
            try:
                want["roc_auc"] = (skm.roc_auc_score(y, p[:, 1]) if k == 2 else
                                   skm.roc_auc_score(y, p.astype(np.float64), multi_class="ovr", labels=labels))
            except ValueError:  # a class with no positive (or no negative) row: reported as NaN
                want["roc_auc"] = float("nan")
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), (trial, key)
        assert got["confusion"] == skm.confusion_matrix(y, pred, labels=labels).tolist()
    p[0, 0] = np.nan  # a diverged model: no area, as scikit-learn refuses it
    assert np.isnan(classification_metrics(y, p, prefix="")["roc_auc"])


def test_equity_plot_draws_buy_and_hold_as_the_equal_weight_long_only_book():
    """On a cross-section the plot draws long-short curves; buy-and-hold (a constant score, which
    ranks nothing) is drawn as what it stands for: every name held, equal weights, net of the
    first day's cost."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.signals.contenders import BUY_AND_HOLD, contender_stats
    from alchemetric_ray.signals.report import equity_curves

    cfg = load_config(None)
    frame = panel(40, 12, seed=5, noise=1.0).assign(fwd_ret=lambda f: f["fwd_ret"] + 0.001)  # a rising market
    model = contender_stats("deep model", frame.assign(position=np.sign(frame["score"])), cfg)
    hold = contender_stats(BUY_AND_HOLD, frame.assign(score=1.0, position=1), cfg)
    curves = equity_curves(12, [model, hold])

    gross = frame.assign(g=np.expm1(frame["fwd_ret"])).groupby("date")["g"].mean().to_numpy()
    net = gross - np.r_[cfg.signals.cost_bps / 1e4, np.zeros(len(gross) - 1)]  # bought once, never traded again
    np.testing.assert_allclose(curves[BUY_AND_HOLD]["equity"], np.cumprod(1 + net), rtol=1e-12)
    assert curves[BUY_AND_HOLD]["equity"].iloc[-1] > 1.02  # not the flat 1.0 of its long-short book
    assert (hold.long_short_equity["equity"] == 1.0).all()
    pd.testing.assert_frame_equal(curves["deep model"], model.long_short_equity)  # the others: long-short
    few = equity_curves(3, [model, hold])  # too few names: positions for everyone
    pd.testing.assert_frame_equal(few["deep model"], model.positions_equity)


def test_a_contender_without_a_long_short_book_has_its_figures_undefined_not_zero():
    """Decided once, where the rows are built: a constant score never trades a long-short book, so
    its Sharpe, return, drawdown, turnover and PSR are None in evaluation.json and n/a in both
    tables; its positions book and its (undefined) rank IC keep their own figures."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.signals.contenders import BUY_AND_HOLD, Segment, contender_stats
    from alchemetric_ray.signals.metrics import Verdict
    from alchemetric_ray.signals.records import Evaluation
    from alchemetric_ray.signals.report import _contender_table, verdict_table

    cfg = load_config(None)
    frame = panel(40, 12, seed=5, noise=1.0)
    model = contender_stats("deep model", frame.assign(position=np.sign(frame["score"])), cfg)
    hold = contender_stats(BUY_AND_HOLD, frame.assign(score=1.0, position=1), cfg)
    assert model.trades and not hold.trades
    row = hold.as_dict()
    assert set(row["long_short"]) == set(model.as_dict()["long_short"])  # the same keys, readable as before
    assert all(row["long_short"][k] is None for k in ("sharpe", "annual_return", "max_drawdown", "turnover"))
    assert row["psr"] is None and row["long_short"]["n_days"] == model.long_short.n_days
    assert np.isfinite(row["positions"]["sharpe"])
    result = Evaluation(segment=Segment("2020-01-01", "2020-03-01"), tickers=12, rows=[model, hold],
                        best_baseline=None, verdict=Verdict(edge=False, signal=False, line="verdict",
                                                            cross_section_meaningful=True),
                        n_trials=1, selection=None, baselines_note=None)
    hold_line = next(line for line in verdict_table(result).splitlines() if line.startswith(BUY_AND_HOLD))
    assert hold_line.split()[-3:] == ["n/a", "n/a", "n/a"]  # L/S Sharpe, L/S return, bal. acc
    cells = [c.strip() for c in _contender_table(result.rows)[-1].strip("|").split("|")]
    assert cells[4:8] == ["n/a"] * 4 and cells[10] == "n/a" and cells[8] != "n/a"  # L/S and PSR; positions kept
    assert "0.00" not in hold_line


def test_validation_signal_metrics_are_the_daily_ic_of_the_evaluation():
    """The loop's val_ic / val_rank_ic (and IRs) are the mean (and mean/std) of the evaluation's
    daily IC series, with dates of one stock or a constant score left out."""
    from alchemetric_ray.scoring.metrics import signal_metrics

    frame = panel(60, 15, seed=4, noise=3.0)
    frame.loc[frame["date"] == frame["date"].iloc[0], "score"] = 0.5  # a date with a constant score
    frame = pd.concat([frame, pd.DataFrame({"date": [pd.Timestamp("2030-01-01")], "ticker": ["T000"],
                                            "score": [1.0], "fwd_ret": [0.01]})])  # a date of one stock
    got = signal_metrics(frame["score"].to_numpy(), frame["fwd_ret"].to_numpy(), frame["date"].to_numpy())
    for name, rank in (("ic", False), ("rank_ic", True)):
        daily = daily_ic(frame, rank=rank, min_names=2)
        assert len(daily) == 59
        assert got[f"val_{name}"] == pytest.approx(daily.mean(), abs=1e-12)
        assert got[f"val_{name}ir"] == pytest.approx(daily.mean() / daily.std(ddof=1), abs=1e-9)
    assert got["val_ic_days"] == 59 and got["val_rank_ic"] > 0.1


def test_validation_signal_metrics_are_the_same_to_the_bit_whatever_the_block_of_dates(monkeypatch):
    """signal_metrics takes whole dates a block at a time (its memory is a block's); a date's figures
    do not depend on the block it falls in: any block size, one date per block included, gives every
    figure bit for bit, with ties, non-finite rows, a one-stock date and dates out of order."""
    from alchemetric_ray.scoring import metrics

    rng = np.random.default_rng(11)
    n = 5_000
    date = rng.integers(0, 90, n) + 19_000  # shuffled: rows of a date are not together
    score = np.round(rng.standard_normal(n), 1).astype(np.float32)  # ties inside dates
    fwd = (0.01 * rng.standard_normal(n) + 0.002 * score).astype(np.float32)
    score[rng.random(n) < 0.02] = np.nan
    fwd[rng.random(n) < 0.01] = np.inf
    date[0], score[0], fwd[0] = 20_000, 1.0, 0.01  # a date of one stock
    results = []
    for block in (metrics.SIGNAL_BLOCK_ROWS, 1, 97, 1_000):
        monkeypatch.setattr(metrics, "SIGNAL_BLOCK_ROWS", block)
        results.append(metrics.signal_metrics(score, fwd, date, quantile=0.2))
    assert results[0]["val_ic_days"] == 90 and results[0]["val_rank_ic"] > 0.1
    for other in results[1:]:
        assert other == results[0]


def test_quantile_positions_take_the_top_and_bottom_of_each_date():
    from alchemetric_ray.signals.portfolio import quantile_positions

    dates = np.repeat(np.arange(3), [10, 5, 1])
    score = np.concatenate([np.arange(10.0), [3.0, 1.0, 2.0, 2.0, 9.0], [4.0]])
    pos = quantile_positions(score, dates, 0.2)
    assert pos[:10].tolist() == [-1, -1, 0, 0, 0, 0, 0, 0, 1, 1]  # k = 2 of 10
    assert pos[10:15].tolist() == [0, -1, 0, 0, 1]  # k = 1 of 5
    assert pos[15] == 0  # one stock: neither leg


def test_validation_long_short_moments_are_the_evaluations_gross_book():
    """The loop's val_ls_* come from the same top-minus-bottom book as the evaluation's long_short
    (gross of costs, every date a period), through the same per-period moments as the PSR/DSR."""
    from alchemetric_ray.scoring.metrics import signal_metrics, sr_moments

    frame = panel(120, 12, seed=8, noise=2.0)
    got = signal_metrics(frame["score"].to_numpy(), frame["fwd_ret"].to_numpy(), frame["date"].to_numpy(),
                         quantile=0.25)
    gross = long_short(frame, quantile=0.25, cost_bps=0.0).daily["gross"].to_numpy()
    sr, skew, kurt, n = sr_moments(gross)
    assert (got["val_ls_sr"], got["val_ls_skew"], got["val_ls_kurt"], got["val_ls_days"]) == pytest.approx(
        (sr, skew, kurt, n), rel=1e-9)
    assert n == 120 and sr > 0.2  # a score that carries the return: a positive book


def test_one_long_short_book_weighs_each_leg_half_and_holds_nothing_where_it_cannot_rank():
    """data.cross_section.long_short_weights is the one book (training's per-date validation book and
    the evaluation's portfolio both take it): +0.5 over the longs, -0.5 over the shorts, and nothing
    on a date with too few names or a constant score."""
    from alchemetric_ray.data.cross_section import LONG_SHORT_MIN_NAMES, book_trades, long_short_weights

    group = np.repeat(np.arange(3), [10, LONG_SHORT_MIN_NAMES - 1, 6])
    score = np.concatenate([np.arange(10.0), np.arange(LONG_SHORT_MIN_NAMES - 1.0), np.ones(6)])
    w = long_short_weights(score, group, 3, 0.2)
    assert w[:10].tolist() == [-0.25, -0.25, 0, 0, 0, 0, 0, 0, 0.25, 0.25]  # k = 2 of 10
    assert not w[10:].any() and book_trades(w, group, 3).tolist() == [True, False, False]


def test_the_chosen_trials_validation_sharpe_is_deflated_by_the_trials_variance():
    from alchemetric_ray.signals.selection import deflated_validation_sharpe
    from alchemetric_ray.sweeps.summary import trial_sr_variance

    trials = [{"val_long_short": {"sr": v, "skew": 0.0, "kurt": 3.0, "days": 250}} for v in (0.02, 0.05, 0.11, 0.08)]
    trials.append({"val_long_short": None})  # a trial that errored
    variance = trial_sr_variance(trials)
    assert variance == pytest.approx(np.var([0.02, 0.05, 0.11, 0.08], ddof=1))
    sweep = {"num_trials": 5, "trial_sr_variance": variance, "chosen_val_long_short": trials[2]["val_long_short"]}
    dsr = deflated_validation_sharpe(sweep)
    assert dsr == pytest.approx(deflated_sharpe(0.11, 0.0, 3.0, 250, 5, variance))
    # more trials tried with the same spread: a higher bar, a lower DSR; no sweep: no DSR
    assert deflated_validation_sharpe({**sweep, "num_trials": 50}) < dsr
    assert deflated_validation_sharpe(None) is None and deflated_validation_sharpe({"num_trials": 1}) is None


@pytest.mark.slow
def test_a_workers_validation_metrics_do_not_import_scikit_learn():
    """Every Train worker validates every epoch: importing scikit-learn there cost 0.8 s of every run
    (and trial).  The loop's metrics, classification and regression targets both, need numpy only."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "import alchemetric_ray.training.loop\n"
        "from alchemetric_ray.scoring.metrics import target_metrics\n"
        "rng = np.random.default_rng(0)\n"
        "date = np.repeat(np.arange(20), 10).astype('datetime64[D]')\n"
        "fwd = rng.normal(size=200)\n"
        "p = rng.random((200, 3)); p /= p.sum(axis=1, keepdims=True)\n"
        "a = target_metrics(p, rng.integers(0, 3, 200), fwd, date, ['down', 'flat', 'up'])\n"
        "b = target_metrics(rng.normal(size=(200, 1)), rng.normal(size=200), fwd, date, [])\n"
        "assert a['val_confusion'] and b['val_mse'] > 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_retired_key_is_read_from_a_saved_config_and_refused_as_input(tmp_path):
    """signals.n_boot (the bootstrap's resamples) is gone: a model saved with it still loads; a user
    who sets it is told in one line why."""
    from alchemetric_ray.config import RunConfig, load_config
    from alchemetric_ray.errors import ConfigError

    saved = RunConfig().to_dict()
    saved["signals"]["n_boot"] = 1000
    assert RunConfig.from_dict(saved) == RunConfig()
    with pytest.raises(ConfigError, match=r"^override: config key 'signals.n_boot' was retired: the rank-IC "
                                          r"intervals are t intervals"):
        load_config(None, ["signals.n_boot=100"])
    yaml = tmp_path / "run.yaml"
    yaml.write_text("signals:\n  n_boot: 100\n")
    with pytest.raises(ConfigError, match=rf"^{yaml}: config key 'signals.n_boot' was retired"):
        load_config(yaml)
