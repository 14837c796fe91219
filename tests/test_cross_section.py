"""The per-date pass: ranks, z-scores and market-relative values across the stocks of each date."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from alchemetric_ray.data.cross_section import (
    CrossSectionError,
    Op,
    apply_cross_section,
    demean_by_date,
    rank_by_date,
    zscore_by_date,
)


def _frame(n_dates=30, n_names=12, seed=0):
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2021-01-04", periods=n_dates)
    rows = [(d, f"T{i:02d}") for d in dates for i in range(n_names) if rng.random() > 0.2]  # ragged dates
    frame = pd.DataFrame(rows, columns=["date", "ticker"])
    frame["x"] = rng.normal(size=len(frame)).round(1)  # rounded: ties on the same date
    return frame


def test_transforms_equal_pandas_groupby_per_date():
    frame = _frame()
    code = frame["date"].factorize()[0]
    n = int(code.max()) + 1
    by_date = frame.groupby("date")["x"]
    pct = (by_date.rank(method="average") - 1) / (by_date.transform("count") - 1) - 0.5
    np.testing.assert_allclose(rank_by_date(frame["x"].to_numpy(), code, n), pct, atol=1e-12)
    z = (frame["x"] - by_date.transform("mean")) / by_date.transform(lambda v: v.std(ddof=0))
    np.testing.assert_allclose(zscore_by_date(frame["x"].to_numpy(), code, n), z, atol=1e-12)
    np.testing.assert_allclose(demean_by_date(frame["x"].to_numpy(), code, n), frame["x"] - by_date.transform("mean"),
                               atol=1e-12)
    ranked = rank_by_date(frame["x"].to_numpy(), code, n)
    assert ranked.min() == -0.5 and ranked.max() == 0.5  # centred on 0, one stock at each end of every date


def test_a_flat_date_and_a_single_stock_give_zero():
    code = np.array([0, 0, 0, 1])
    values = np.array([2.0, 2.0, 2.0, 5.0])
    np.testing.assert_array_equal(zscore_by_date(values, code, 2), [0, 0, 0, 0])
    np.testing.assert_array_equal(rank_by_date(values, code, 2), [0, 0, 0, 0])


def test_no_look_ahead_a_date_depends_on_its_own_rows_only():
    """Changing every value after date D leaves the values of D and before unchanged."""
    frame = _frame(seed=1)
    code = frame["date"].factorize()[0]
    n = int(code.max()) + 1
    later = frame["date"] > frame["date"].unique()[14]
    edited = frame["x"].to_numpy().copy()
    edited[later.to_numpy()] = np.random.default_rng(9).normal(size=int(later.sum())) * 100
    for fn in (rank_by_date, zscore_by_date, demean_by_date):
        before, after = fn(frame["x"].to_numpy(), code, n), fn(edited, code, n)
        np.testing.assert_array_equal(before[~later.to_numpy()], after[~later.to_numpy()])


def _write_tickers(frame, folder):
    files = []
    for ticker, part in frame.groupby("ticker"):
        path = folder / f"{ticker}.parquet"
        pq.write_table(pa.Table.from_pandas(part.reset_index(drop=True), preserve_index=False), path)
        files.append(path)
    return files


def test_apply_over_ticker_files_drops_thin_dates_and_matches_the_in_memory_answer(tmp_path):
    frame = _frame(n_dates=20, n_names=12, seed=2)
    thin = frame["date"].unique()[[3, 7]]
    frame = frame[~frame["date"].isin(thin) | (frame["ticker"] < "T03")]  # two dates with 3 stocks or fewer
    frame = frame.assign(fwd_ret=frame["x"] * 0.01, label=0.0).reset_index(drop=True)
    files = _write_tickers(frame, tmp_path)
    report = apply_cross_section(files, [Op("x", "x", "demean"), Op("x", "x", "zscore"),
                                         Op("label", "fwd_ret", "rank")], min_names=5, what="test data")
    assert report.dates_dropped == 2 and report.dates_kept == 18
    assert report.rows_dropped == frame["date"].isin(thin).sum() > 0
    out = pd.concat([pd.read_parquet(f) for f in files]).sort_values(["date", "ticker"]).reset_index(drop=True)
    assert not out["date"].isin(thin).any()
    kept = frame[~frame["date"].isin(thin)].sort_values(["date", "ticker"]).reset_index(drop=True)
    by_date = kept.groupby("date")
    z = (kept["x"] - by_date["x"].transform("mean")) / by_date["x"].transform(lambda v: v.std(ddof=0))
    np.testing.assert_allclose(out["x"], z, atol=1e-6)
    pct = (by_date["fwd_ret"].rank() - 1) / (by_date["fwd_ret"].transform("count") - 1) - 0.5
    np.testing.assert_allclose(out["label"], pct, atol=1e-12)
    assert list(out.columns) == list(frame.columns)  # columns rewritten in place, none added


def test_no_date_with_enough_stocks_is_one_line(tmp_path):
    files = _write_tickers(_frame(n_dates=5, n_names=4).assign(fwd_ret=0.0), tmp_path)
    with pytest.raises(CrossSectionError, match=r"^my data: no date has 10 or more stocks .*the most on any date: 4"):
        apply_cross_section(files, [Op("label", "fwd_ret", "rank")], min_names=10, what="my data")


def test_unknown_values_stay_unknown_and_do_not_count(tmp_path):
    frame = _frame(n_dates=6, n_names=12, seed=3).assign(fwd_ret=lambda f: f["x"])
    last = frame["date"] == frame["date"].max()
    frame.loc[last, "fwd_ret"] = np.nan  # the most recent bar: no forward return yet
    frame.loc[frame.index[0], "fwd_ret"] = np.nan
    files = _write_tickers(frame, tmp_path)
    apply_cross_section(files, [Op("label", "fwd_ret", "rank")], min_names=3, what="d")
    out = pd.concat([pd.read_parquet(f) for f in files])
    assert out.loc[out["date"] == frame["date"].max(), "label"].isna().all()
    first = out[out["date"] == frame["date"].min()]
    assert first["label"].isna().sum() == 1 and first["label"].min() == -0.5 and first["label"].max() == 0.5
