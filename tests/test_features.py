"""Features and labels: no look-ahead, finite values, label alignment and schemes."""

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.bars.builtin import builtin_bars
from alchemetric_ray.data import features as feat
from alchemetric_ray.data.labels import LabelSpec, forward_return, make_labels


@pytest.fixture(scope="module")
def aapl() -> pd.DataFrame:
    return dict(builtin_bars())["AAPL"].iloc[:600].reset_index(drop=True)


def test_default_set_is_sixteen_named_features():
    names = feat.resolve_feature_names(None)
    assert len(names) == 16 and names == list(feat.DEFAULT_FEATURES)
    assert feat.warmup_bars(names) == 60


def test_unknown_feature_suggests():
    with pytest.raises(feat.FeatureError, match="unknown feature 'rsi_41' in features.names; did you mean 'rsi_14'"):
        feat.resolve_feature_names(["ret_1", "rsi_41"])


@pytest.mark.parametrize(("feature_set", "t"), [("basic", 80), ("basic", 200), ("basic", 450), ("alpha158", 70),
                                               ("alpha158", 250), ("alpha360", 70), ("alpha360", 250)])
def test_no_look_ahead_changing_the_future_changes_no_past_feature(aapl, feature_set, t):
    """Every feature set: changing the bars after t changes no feature value up to t."""
    names = feat.resolve_feature_names(None, feature_set)
    base, _ = feat.compute_features(aapl, names)
    future = aapl.copy()
    rng = np.random.default_rng(t)
    scale = rng.uniform(0.5, 2.0, size=len(future) - t - 1)
    for col in ("open", "high", "low", "close"):
        future.loc[t + 1:, col] = future.loc[t + 1:, col].to_numpy() * scale
    future.loc[t + 1:, "volume"] = future.loc[t + 1:, "volume"].to_numpy() * scale[::-1]
    changed, _ = feat.compute_features(future, names)
    pd.testing.assert_frame_equal(base.iloc[: t + 1], changed.iloc[: t + 1])
    assert not base.iloc[t + 1:].equals(changed.iloc[t + 1:])  # the future really changed


def test_features_finite_after_warmup_even_on_flat_prices(aapl):
    flat = aapl.copy()
    flat.loc[100:160, ["open", "high", "low", "close"]] = 50.0  # a dead stretch: std = 0, range = 0
    flat.loc[100:160, "volume"] = 1000.0
    names = feat.resolve_feature_names(None)
    values, bad = feat.compute_features(flat, names)
    after = values.iloc[feat.warmup_bars(names):].to_numpy()
    assert np.isfinite(after).all() and bad == 0
    assert values.loc[130, "bb_pctb_20"] == 0.5 and values.loc[130, "volume_z_20"] == 0.0


def test_known_values(aapl):
    values, _ = feat.compute_features(aapl, ["ret_5", "close_sma_10", "hl_range"])
    c = aapl["close"]
    assert values.loc[30, "ret_5"] == pytest.approx(np.log(c[30] / c[25]))
    assert values.loc[30, "close_sma_10"] == pytest.approx(c[30] / c[21:31].mean() - 1)
    assert values.loc[30, "hl_range"] == pytest.approx((aapl["high"][30] - aapl["low"][30]) / c[30])


def test_forward_return_is_aligned_to_the_next_open(aapl):
    fwd = forward_return(aapl, 3)
    o = aapl["open"].to_numpy()
    assert fwd[10] == pytest.approx(np.log(o[14] / o[11]))  # enter at open t+1, exit at open t+1+h
    assert np.isnan(fwd[-4:]).all() and np.isfinite(fwd[:-4]).all()


def test_three_class_binary_and_reach(aapl):
    fixed = LabelSpec("three_class", horizon=1, threshold=0.01, threshold_mode="fixed")
    label, fwd = make_labels(aapl, fixed)
    ok = ~np.isnan(label)
    assert set(np.unique(label[ok])) == {0.0, 1.0, 2.0}
    assert (label[ok & (fwd > 0.01)] == 2).all() and (label[ok & (fwd < -0.01)] == 0).all()
    assert (label[ok & (np.abs(fwd) <= 0.01)] == 1).all()
    assert np.isnan(label[-fixed.reach:]).all() and fixed.reach == 2
    binary, fwd = make_labels(aapl, LabelSpec("binary", horizon=5))
    ok = ~np.isnan(binary)
    assert ((binary[ok] == 1) == (fwd[ok] > 0)).all()
    assert LabelSpec("binary", horizon=5).classes == ["down", "up"]


def test_triple_barrier_first_touch(aapl):
    spec = LabelSpec("triple_barrier", barrier_up=1.0, barrier_down=1.0, barrier_bars=5)
    label, _ = make_labels(aapl, spec)
    assert spec.reach == 6
    vol = np.log(aapl["close"]).diff().rolling(20).std().to_numpy()
    lo, hi, op = (np.log(aapl[c].to_numpy()) for c in ("low", "high", "open"))
    for t in range(30, 500, 37):  # brute-force a few bars
        entry, expect = op[t + 1], 1.0
        for k in range(1, 6):
            if lo[t + k] <= entry - vol[t]:
                expect = 0.0
                break
            if hi[t + k] >= entry + vol[t]:
                expect = 2.0
                break
        assert label[t] == expect, t
    assert np.isnan(label[-6:]).all()
