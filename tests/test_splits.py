"""Splits with an embargo, purging, walk-forward folds, and train-only normalization."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.data.normalize import RESERVOIR, NormalizerFit, run_moments, zscore_from_moments
from alchemetric_ray.data.splits import (
    SplitSpec,
    boundaries,
    label_end_dates,
    plan_splits,
    refit_folds,
    walk_forward_folds,
)
from alchemetric_ray.errors import SplitError

CAL = pd.bdate_range("2015-01-01", periods=1000).to_numpy()


def test_fraction_plan_has_embargo_gaps():
    plan = plan_splits(CAL, SplitSpec(train_frac=0.7, val_frac=0.15, embargo=5))
    d = pd.DatetimeIndex(CAL)
    i_train_end = d.get_loc(pd.Timestamp(plan.train_end))
    i_val_start = d.get_loc(pd.Timestamp(plan.val_start))
    i_val_end = d.get_loc(pd.Timestamp(plan.val_end))
    i_test_start = d.get_loc(pd.Timestamp(plan.test_start))
    assert i_val_start == 700 and i_test_start == 850
    assert i_val_start - i_train_end - 1 == 5 and i_test_start - i_val_end - 1 == 5
    assert plan.train_start == str(d[0].date()) and plan.test_end == str(d[-1].date())


def test_explicit_dates():
    plan = plan_splits(CAL, SplitSpec(train_frac=0.7, val_frac=0.15, embargo=2, train_end="2017-01-02",
                                      val_end="2017-06-30"))
    assert plan.val_start > "2017-01-02" and plan.train_end < "2017-01-02"
    assert plan.test_start > "2017-06-30"


def test_assign_purges_rows_whose_label_crosses_a_boundary():
    plan = plan_splits(CAL, SplitSpec(train_frac=0.7, val_frac=0.15, embargo=2))
    dates = CAL
    # a ticker with a 10-bar hole before each boundary (calendar dates 690-699 before val starts at
    # 700, and 840-849 before test starts at 850): its label windows (2 bars) reach further in
    # calendar time than the 2-bar embargo gap covers
    ticker_dates = pd.Series(np.delete(dates, np.r_[690:700, 840:850]))
    end = label_end_dates(ticker_dates, 2)
    split = plan.assign(ticker_dates.to_numpy(), end)
    val_start = np.datetime64(plan.val_start)
    test_start = np.datetime64(plan.test_start)
    assert (end[split == 0] < val_start).all()
    assert (end[split == 1] < test_start).all()
    # the last rows before each hole are purged, not just the calendar gap: by calendar date they
    # belong to train (688, 689) and val (838, 839), but their labels end at 700/701 and 850/851
    by_date = pd.Series(split, index=pd.DatetimeIndex(ticker_dates))

    def at(i):
        return int(by_date[pd.Timestamp(dates[i])])

    assert [at(i) for i in (687, 688, 689, 700)] == [0, -1, -1, 1]
    assert [at(i) for i in (837, 838, 839, 850)] == [1, -1, -1, 2]
    assert set(np.unique(split)) == {-1, 0, 1, 2}


def test_too_little_data_is_a_clear_error():
    with pytest.raises(SplitError, match="split 'val' is empty: 20 trading dates"):
        plan_splits(CAL[:20], SplitSpec(train_frac=0.7, val_frac=0.1, embargo=5))


def test_walk_forward_folds_expand_and_never_overlap():
    folds = walk_forward_folds(CAL, 4, embargo=3)
    assert len(folds) == 4
    for a, b in zip(folds, folds[1:]):
        assert a.test_end < b.test_start and a.train_start == b.train_start and a.train_end < b.train_end
    for f in folds:
        assert f.train_end < f.val_start < f.val_end < f.test_start
    assert folds[-1].test_end == str(pd.Timestamp(CAL[-1]).date())
    with pytest.raises(SplitError):
        walk_forward_folds(CAL[:50], 10, embargo=5)


def test_zscore_from_chunks_equals_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(1000.0, 3.0, size=(10_000, 3))
    chunks = np.array_split(x, 7)  # seven tickers' rows, each one run
    norm = zscore_from_moments(["a", "b", "c"], [run_moments([c[:, j] for j in range(3)], np.array([0]))
                                                  for c in chunks])
    np.testing.assert_allclose(norm.center, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(norm.scale, x.std(axis=0, ddof=1), rtol=1e-9)
    out = norm.apply(x)
    assert out.dtype == np.float32 and abs(out.mean()) < 1e-3


def test_zscore_from_per_ticker_moments_equals_numpy_however_the_tickers_are_grouped():
    """A build's zscore: each ticker's moments where its rows are (a group's task), merged in ticker order:
    numpy's mean and std, and the same bits whichever groups the tickers came in."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 400, size=60)
    x = rng.normal(500.0, 2.0, size=(int(lengths.sum()), 3)) * rng.uniform(0.5, 2.0, size=3)
    bounds = np.concatenate(([0], np.cumsum(lengths)))

    def fitted(cuts: list[int]) -> list[float]:  # groups of tickers, cut before the tickers in ``cuts``
        parts = []
        for lo, hi in zip([0, *cuts], [*cuts, len(lengths)]):
            rows = x[bounds[lo]:bounds[hi]]
            parts.append(run_moments([rows[:, j] for j in range(3)], bounds[lo:hi] - bounds[lo]))
        norm = zscore_from_moments(["a", "b", "c"], parts)
        return norm.center + norm.scale

    one = fitted([])
    np.testing.assert_allclose(one[:3], x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(one[3:], x.std(axis=0, ddof=1), rtol=1e-9)
    assert fitted([7, 30, 31]) == one and fitted(list(range(1, 60))) == one  # to the last bit
    with pytest.raises(ValueError, match="no train rows"):
        zscore_from_moments(["a"], [run_moments([np.empty(0)], np.zeros(0, dtype=np.int64))])


def test_robust_uses_bounded_reservoir():
    rng = np.random.default_rng(1)
    x = rng.standard_cauchy(size=(RESERVOIR * 2 + 123, 2))
    fit = NormalizerFit("robust", ["a", "b"], seed=3)
    for chunk in np.array_split(x, 11):
        fit.add(chunk)
    assert len(fit.sample) == RESERVOIR
    norm = fit.finish()
    np.testing.assert_allclose(norm.center, np.median(x, axis=0), atol=0.02)
    q75, q25 = np.percentile(x, [75, 25], axis=0)
    np.testing.assert_allclose(norm.scale, (q75 - q25) / 1.349, rtol=0.03)
    assert np.abs(norm.apply(x)).max() <= 10.0  # clipped


def test_constant_feature_gets_unit_scale():
    assert zscore_from_moments(["a"], [run_moments([np.ones(10)], np.array([0]))]).scale == [1.0]
    fit = NormalizerFit("robust", ["a"])
    fit.add(np.ones((10, 1)))
    assert fit.finish().scale == [1.0]


def test_a_walk_forward_fold_retrained_through_plan_splits_keeps_its_segments_with_one_embargo():
    """The fold's model is retrained on shards whose splits plan_splits makes from features.train_end
    and features.val_end: those must give back the fold's own segments, the embargo taken once."""
    for fold in walk_forward_folds(CAL, 4, embargo=3):
        train_end, val_end = boundaries(CAL, fold)
        rebuilt = plan_splits(CAL, SplitSpec(train_frac=0.7, val_frac=0.15, embargo=3, train_end=train_end,
                                             val_end=val_end))
        assert (rebuilt.train_end, rebuilt.val_start, rebuilt.val_end, rebuilt.test_start) == (
            fold.train_end, fold.val_start, fold.val_end, fold.test_start)
        dates = list(np.unique(CAL.astype("datetime64[D]")).astype(str))
        assert dates.index(fold.val_start) - dates.index(fold.train_end) == 3 + 1  # 3 dates between: one embargo


def _at(day: str) -> int:
    return pd.DatetimeIndex(CAL).get_loc(pd.Timestamp(day))


def test_refit_folds_tile_the_history_after_40_percent_in_blocks_with_one_embargo():
    folds = refit_folds(CAL, 150, embargo=5)
    assert [_at(f.test_start) for f in folds] == [400, 550, 700, 850]  # 1000 dates: 400 + 150 k
    assert [_at(f.test_end) for f in folds] == [549, 699, 849, 999]  # the last block: whatever is left
    for f in folds:
        assert f.train_start == str(pd.Timestamp(CAL[0]).date())  # expanding
        assert _at(f.test_start) - _at(f.val_end) - 1 == 5 and _at(f.val_start) - _at(f.train_end) - 1 == 5
    # a remainder too short to score joins the block before it
    assert [_at(f.test_end) for f in refit_folds(CAL, 199, embargo=5)][-1] == 999
    assert len(refit_folds(CAL, 199, embargo=5)) == 3  # 400, 599, 798 (the 4 dates after 997 join the last)
    with pytest.raises(SplitError, match="signals.refit_every=700"):
        refit_folds(CAL, 700, embargo=5)


def test_a_rolling_window_trains_on_the_last_train_window_dates_before_each_block():
    folds = refit_folds(CAL, 150, embargo=5, train_window=300)
    for f in folds:
        assert _at(f.test_start) - _at(f.train_start) == 300 + 5  # train + val + their embargo: 300 dates
        assert _at(f.test_start) - _at(f.val_end) - 1 == 5
    # plan_splits rebuilds each fold on the full calendar from its boundaries and its start
    f = folds[1]
    train_end, val_end = boundaries(CAL, f)
    rebuilt = plan_splits(CAL, SplitSpec(train_frac=0.7, val_frac=0.15, embargo=5, train_end=train_end, val_end=val_end,
                          train_start=f.train_start))
    assert rebuilt.test_end == str(pd.Timestamp(CAL[-1]).date())  # the run's test split: to the end, scored by block
    assert dataclasses.replace(rebuilt, test_end=f.test_end) == f
    with pytest.raises(SplitError, match="signals.train_window=10"):
        refit_folds(CAL, 150, embargo=5, train_window=10)


def test_train_start_is_a_config_date_before_train_end():
    from alchemetric_ray.config import load_config
    from alchemetric_ray.errors import ConfigError

    assert load_config(None, ["features.train_start=2014-01-02"]).features.train_start == "2014-01-02"
    with pytest.raises(ConfigError, match="features.train_start"):
        load_config(None, ["features.train_start=soon"])
    with pytest.raises(ConfigError, match=r"features.train_start.*before train_end"):
        load_config(None, ["features.train_start=2016-01-04", "features.train_end=2015-06-01",
                           "features.val_end=2016-06-01"])
    with pytest.raises(ConfigError, match="signals.train_window"):
        load_config(None, ["signals.train_window=-1"])


def test_shards_with_a_train_start_hold_no_row_before_it(stocknet_shards):
    """What a rolling-window refit builds: ``features.train_start`` drops the earlier dates from every
    split, so the normalization and the training see the window only."""
    from alchemetric_ray.data.manifest import Manifest
    from alchemetric_ray.data.shards import split_dir

    whole = Manifest.read(stocknet_shards("AAPL,MSFT,XOM"))
    out = stocknet_shards("AAPL,MSFT,XOM", "features.train_start=2014-01-02")
    rolled = Manifest.read(out)
    assert whole.splits["train_start"] < "2014-01-02" == rolled.splits["train_start"]
    train = pd.concat(pd.read_parquet(p) for p in split_dir(out, "train").glob("*.parquet"))
    assert pd.to_datetime(train["date"]).min() == pd.Timestamp("2014-01-02")
    assert rolled.rows["train"] < whole.rows["train"]
