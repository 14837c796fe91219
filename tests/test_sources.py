"""Bar sources: the built-in real sample data and the seeded synthetic market."""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.bars.builtin import (
    BUILTIN_DESCRIPTION,
    BUILTIN_TICKERS,
    builtin_bars,
)
from alchemetric_ray.bars.synthetic import (
    SyntheticMarket,
    synthetic_bars,
    synthetic_ticker,
    synthetic_ticker_names,
)
from alchemetric_ray.errors import UserError

COLUMNS = ["date", "open", "high", "low", "close", "volume"]


def assert_canonical(bars: pd.DataFrame) -> None:
    assert list(bars.columns) == COLUMNS
    assert bars["date"].dtype == np.dtype("datetime64[ns]")
    for col in COLUMNS[1:]:
        assert bars[col].dtype == np.float64, col
    dates = bars["date"]
    assert dates.is_monotonic_increasing and dates.is_unique
    assert (dates == dates.dt.normalize()).all()
    o, h, lo, c, v = (bars[col].to_numpy() for col in COLUMNS[1:])
    assert np.isfinite(np.column_stack([o, h, lo, c, v])).all()
    assert (o > 0).all() and (lo > 0).all() and (c > 0).all() and (v > 0).all()
    assert (h >= np.maximum(o, c)).all()
    assert (lo <= np.minimum(o, c)).all()


def daily_rank_ic(closes: np.ndarray, window: int = 10) -> np.ndarray:
    """Per day: Spearman correlation, across tickers, of trailing `window`-day and next-day returns."""
    trailing = closes[window:-1] / closes[:-window - 1] - 1.0
    following = closes[window + 1 :] / closes[window:-1] - 1.0
    a = pd.DataFrame(trailing).rank(axis=1).to_numpy()
    b = pd.DataFrame(following).rank(axis=1).to_numpy()
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    return (a * b).sum(axis=1) / np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))


def closes_of(market: SyntheticMarket) -> np.ndarray:
    return np.column_stack([bars["close"].to_numpy() for _, bars in synthetic_bars(market)])


# --- built-in real data ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin():
    return list(builtin_bars())


def test_builtin_tickers_and_contract(builtin):
    assert BUILTIN_TICKERS == ("AAPL", "GOOG", "IBM", "MSFT")
    assert [t for t, _ in builtin] == list(BUILTIN_TICKERS)
    assert "\n" not in BUILTIN_DESCRIPTION and "public domain" in BUILTIN_DESCRIPTION.lower()
    for ticker, bars in builtin:
        assert_canonical(bars)
        assert len(bars) > 2000, ticker
        assert bars["date"].min() >= pd.Timestamp("2000-01-01")
        assert bars["date"].max() <= pd.Timestamp("2013-12-31")
    lengths = {t: len(b) for t, b in builtin}
    assert lengths["AAPL"] > 3000 and lengths["IBM"] > 3000 and lengths["MSFT"] > 3000


def test_builtin_prices_are_adjusted(builtin):
    from bokeh_sampledata import stocks

    bars = dict(builtin)["AAPL"]
    raw = pd.DataFrame(stocks.AAPL)
    # Close is the source's adjusted close, and the other prices move with it.
    np.testing.assert_allclose(bars["close"].to_numpy(), raw["adj_close"].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        bars["open"].to_numpy() / bars["close"].to_numpy(), raw["open"].to_numpy() / raw["close"].to_numpy(), rtol=1e-12
    )
    # AAPL split 2:1 effective 2005-02-28: the raw close halves, the adjusted one does not.
    around = bars.set_index("date")["close"].loc["2005-02-25":"2005-02-28"].to_numpy()
    raw_around = raw.set_index("date")["close"].loc["2005-02-25":"2005-02-28"].to_numpy()
    assert raw_around[1] / raw_around[0] < 0.6
    assert 0.9 < around[1] / around[0] < 1.1


def test_builtin_drops_inconsistent_rows(monkeypatch):
    from bokeh_sampledata import stocks

    from alchemetric_ray.bars import builtin as builtin_module

    raw = {key: list(values[:6]) for key, values in stocks.MSFT.items()}
    raw["low"][1] = raw["high"][1] + 1.0  # high < low
    raw["open"][3] = -1.0  # non-positive price
    bars = builtin_module._to_bars(raw)
    assert_canonical(bars)
    assert list(bars["date"].dt.strftime("%Y-%m-%d")) == [raw["date"][i] for i in (0, 2, 4, 5)]


def test_builtin_without_package_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "bokeh_sampledata", None)
    monkeypatch.setitem(sys.modules, "bokeh_sampledata.stocks", None)
    with pytest.raises(UserError, match="bokeh-sampledata") as info:
        builtin_bars()
    assert "\n" not in str(info.value)


# --- synthetic market -----------------------------------------------------------------------


def test_ticker_names_sort_as_they_count():
    assert synthetic_ticker_names(3) == ["SYN0000", "SYN0001", "SYN0002"]
    names = synthetic_ticker_names(12001)
    assert names == sorted(names) and len(set(names)) == 12001 and names[-1] == "SYN12000"


def test_synthetic_bars_follow_the_contract():
    market = SyntheticMarket(n_tickers=20, n_days=300, effect=1.0, start="2015-03-02")
    out = list(synthetic_bars(market))
    assert [t for t, _ in out] == synthetic_ticker_names(20)
    expected_dates = pd.bdate_range("2015-03-02", periods=300)
    for _, bars in out:
        assert_canonical(bars)
        assert (bars["date"].to_numpy() == expected_dates.to_numpy().astype("datetime64[ns]")).all()
    first_opens = np.array([bars["open"].iloc[0] for _, bars in out])
    assert (first_opens > 20 * 0.8).all() and (first_opens < 200 * 1.25).all()


def test_synthetic_is_deterministic_and_seeded():
    market = SyntheticMarket(n_tickers=8, n_days=200, effect=0.5, seed=7)
    a = list(synthetic_bars(market))
    b = list(synthetic_bars(SyntheticMarket(n_tickers=8, n_days=200, effect=0.5, seed=7)))
    c = list(synthetic_bars(SyntheticMarket(n_tickers=8, n_days=200, effect=0.5, seed=8)))
    for (ta, fa), (tb, fb), (_, fc) in zip(a, b, c):
        assert ta == tb
        pd.testing.assert_frame_equal(fa, fb, check_exact=True)
        assert not np.allclose(fa["close"].to_numpy(), fc["close"].to_numpy())


def test_ticker_regenerated_alone_equals_it_in_the_full_market():
    # 600 tickers x 300 days spans several simulation blocks.
    market = SyntheticMarket(n_tickers=600, n_days=300, effect=1.0, seed=3)
    wanted = {0, 1, 437, 599}
    full = {name: bars for i, (name, bars) in enumerate(synthetic_bars(market)) if i in wanted}
    for index in wanted:
        name, bars = synthetic_ticker(market, index)
        pd.testing.assert_frame_equal(bars, full[name], check_exact=True)
    # A ticker does not depend on how many others the market has.
    _, alone_in_small = synthetic_ticker(SyntheticMarket(n_tickers=2, n_days=300, effect=1.0, seed=3), 1)
    pd.testing.assert_frame_equal(alone_in_small, full["SYN0001"], check_exact=True)
    with pytest.raises(UserError):
        synthetic_ticker(market, 600)


@pytest.mark.parametrize(
    "kwargs",
    [{"n_tickers": 0}, {"n_days": 1}, {"seed": -1}, {"effect": -0.5}, {"effect": float("nan")}, {"momentum_window": 0},
     {"start": "not a date"}, {"n_days": 200_000}],
)
def test_bad_market_is_a_user_error(kwargs):
    with pytest.raises(UserError):
        SyntheticMarket(**kwargs)


def test_planted_momentum_effect_is_the_known_answer():
    ic = daily_rank_ic(closes_of(SyntheticMarket(n_tickers=50, n_days=1000, effect=1.0, seed=0)))
    t_stat = ic.mean() / ic.std(ddof=1) * np.sqrt(len(ic))
    assert 0.05 < ic.mean() < 0.15
    assert t_stat > 3


@pytest.mark.parametrize("seed", [0, 1])
def test_null_market_has_no_momentum(seed):
    ic = daily_rank_ic(closes_of(SyntheticMarket(n_tickers=50, n_days=1000, effect=0.0, seed=seed)))
    assert abs(ic.mean()) < 0.02


def test_volatility_clusters_tails_are_fat_and_volume_follows_moves():
    acf, shuffled_acf, kurt, vol_corr = [], [], [], []
    rng = np.random.default_rng(0)
    for _, bars in synthetic_bars(SyntheticMarket(n_tickers=30, n_days=2000, seed=1)):
        r = np.diff(np.log(bars["close"].to_numpy()))
        for series, out in ((r, acf), (rng.permutation(r), shuffled_acf)):
            sq = series * series - (series * series).mean()
            out.append((sq[1:] * sq[:-1]).sum() / (sq * sq).sum())
        z = (r - r.mean()) / r.std()
        kurt.append((z**4).mean())
        vol_corr.append(pd.Series(np.abs(r)).corr(pd.Series(bars["volume"].to_numpy()[1:]), method="spearman"))
    assert np.mean(acf) > 0.05
    assert abs(np.mean(shuffled_acf)) < 0.02
    assert np.median(kurt) > 4.0  # a normal has 3
    assert np.mean(vol_corr) > 0.2


@pytest.mark.slow
def test_generation_memory_is_bounded_by_a_block():
    market = SyntheticMarket(n_tickers=400, n_days=2500, effect=1.0, seed=5)  # 1M rows
    rows = 0
    materialised = 0
    tracemalloc.start()
    try:
        for _, bars in synthetic_bars(market):
            rows += len(bars)
            materialised += int(bars.memory_usage(index=False, deep=True).sum())
            del bars
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == 1_000_000
    assert materialised >= 40e6  # 1M rows x 6 eight-byte columns
    assert peak < 0.3 * materialised, f"peak {peak / 1e6:.1f} MB vs {materialised / 1e6:.1f} MB materialised"
