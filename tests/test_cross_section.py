"""The per-date pass: ranks, z-scores and market-relative values across the stocks of each date."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from alchemetric_ray.data.cross_section import (
    STAGED_SUFFIX,
    Op,
    apply_cross_section,
    demean_by_date,
    rank_by_date,
    read_staged,
    write_staged,
    zscore_by_date,
)
from alchemetric_ray.errors import CrossSectionError


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
        path = folder / f"{ticker}{STAGED_SUFFIX}"  # staged as the build stages: Arrow IPC
        write_staged(pa.Table.from_pandas(part.reset_index(drop=True), preserve_index=False), path)
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
    out = pd.concat([read_staged(f).to_pandas() for f in files]).sort_values(["date", "ticker"]).reset_index(drop=True)
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
    out = pd.concat([read_staged(f).to_pandas() for f in files])
    assert out.loc[out["date"] == frame["date"].max(), "label"].isna().all()
    first = out[out["date"] == frame["date"].min()]
    assert first["label"].isna().sum() == 1 and first["label"].min() == -0.5 and first["label"].max() == 0.5


# ---- in the shards -----------------------------------------------------------------------------


def _cs_cfg(*overrides):
    from alchemetric_ray.config import load_config

    return load_config(None, ["data.source=synthetic", "data.synthetic_tickers=12", "data.synthetic_days=260",
                              "features.names=[ret_1,ret_5,ret_5_rel,vol_20]", *overrides])


def _all_rows(out) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(out.local / f"split={s}") for s in ("train", "val", "test")],
                     ignore_index=True)


def test_cs_rank_shards_hold_the_per_date_rank_of_the_forward_return(tmp_path):
    from alchemetric_ray.data.shards import build_shards

    built = build_shards(_cs_cfg("features.label=cs_rank"), tmp_path / "shards")
    manifest, rows = built.manifest, _all_rows(built.out)
    assert manifest.regression and manifest.classes == [] and manifest.outputs == 1
    assert rows["label"].dtype == np.float32 and rows["label"].between(-0.5, 0.5).all()
    by_date = rows.groupby("date")["fwd_ret"]
    expected = (by_date.rank() - 1) / (by_date.transform("count") - 1) - 0.5
    np.testing.assert_allclose(rows["label"], expected, atol=1e-6)
    assert manifest.cross_section["min_names"] == 10 and manifest.cross_section["dates_dropped"] == 0
    assert {"target": "label", "source": "fwd_ret", "kind": "rank"} in manifest.cross_section["ops"]
    assert "survivorship" in manifest.cross_section["universe"]
    # the market-relative feature: its raw value minus the date's mean, i.e. one constant per date after
    # the train-fitted normalization (an affine map): every date's mean is the same
    assert rows.groupby("date")["ret_5_rel"].mean().std() < 1e-5
    assert rows.groupby("date")["ret_5"].mean().std() > 0.1  # the plain return keeps the market's move


def test_cs_zscore_label_and_rank_normalized_features(tmp_path):
    from alchemetric_ray.data.shards import build_shards

    built = build_shards(_cs_cfg("features.label=cs_zscore", "features.cs_normalize=rank"), tmp_path / "shards")
    rows = _all_rows(built.out)
    by_date = rows.groupby("date")
    z = (rows["fwd_ret"] - by_date["fwd_ret"].transform("mean")) / by_date["fwd_ret"].transform(lambda v: v.std(ddof=0))
    np.testing.assert_allclose(rows["label"], z, atol=1e-4)  # fwd_ret is stored as float32
    for name in ("ret_1", "vol_20"):  # every feature ranked per date: the same 12 values on every full date
        per_date = by_date[name].agg(["min", "max"])
        assert per_date["min"].std() < 1e-5 and per_date["max"].std() < 1e-5, name


def test_the_per_date_pass_looks_at_no_later_date(tmp_path):
    """Bars after a date D in the test segment are rewritten; every row whose label ends before D
    is unchanged, features and label alike (nothing fitted across dates; the normalization is
    fitted on train rows, which end long before D)."""
    from alchemetric_ray.bars.sources import open_source
    from alchemetric_ray.data.shards import build_shards

    cfg = _cs_cfg("features.label=cs_rank", "features.cs_normalize=zscore")
    bars = list(open_source(cfg.data).bars)
    cut = bars[0][1]["date"].iloc[-30]
    rng = np.random.default_rng(5)

    def later_changed(frame):
        frame = frame.copy()
        late = frame["date"] >= cut
        scale = np.exp(np.cumsum(rng.normal(0, 0.05, int(late.sum()))))
        for col in ("open", "high", "low", "close"):
            frame.loc[late, col] = frame.loc[late, col] * scale
        return frame

    a = _all_rows(build_shards(cfg, tmp_path / "a", bars=bars).out)
    b = _all_rows(build_shards(cfg, tmp_path / "b", bars=[(t, later_changed(f)) for t, f in bars]).out)
    key = ["date", "ticker"]
    before_a = a[a["label_end"] < cut].sort_values(key).reset_index(drop=True)
    before_b = b[b["label_end"] < cut].sort_values(key).reset_index(drop=True)
    assert len(before_a) > 1000
    pd.testing.assert_frame_equal(before_a, before_b)
    after = a[a["date"] > cut].sort_values(key).reset_index(drop=True)
    assert not after["label"].equals(b[b["date"] > cut].sort_values(key).reset_index(drop=True)["label"])


# ---- a regression target through the service ----------------------------------------------------


@pytest.mark.slow
def test_a_cs_rank_model_trains_with_mse_reports_ic_and_predicts_scores(ray_session, tmp_path):
    """features.label=cs_rank end to end on a real local Ray: a one-output model trained on the MSE,
    picked by val_rank_ic (train.metric auto), IC / rank IC / their IRs every epoch, the export's test
    metrics and regression baselines, and `predict` (inside `evaluate`) writing the score with per-date
    quantile positions.  The market is the null one of seed 3 (no effect planted; test_signals.py
    checks seeds 4 and 5 the same way): the verdict is no signal and no edge."""
    import json

    import pandas as pd

    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.training.trainer import run_training

    cfg = _cs_cfg("data.synthetic_tickers=20", "data.synthetic_days=400", "data.synthetic_effect=0.0", "data.seed=3",
                  "features.label=cs_rank", f"storage.path={tmp_path / 'results'}",
                  f"storage.models_dir={tmp_path / 'models'}", "storage.name=cs", "train.epochs=2",
                  "model.hidden=16", "device.name=cpu", "signals.quantile=0.25", "train.score_test=true")
    outcome = run_training(cfg, progress=False)
    history = outcome.summary.history
    assert len(history) == 2 and all(np.isfinite(h["train_loss"]) for h in history)
    for key in ("val_mse", "val_ic", "val_rank_ic", "val_icir", "val_rank_icir"):
        assert all(np.isfinite(h[key]) for h in history), key
    assert "val_accuracy" not in history[0] and outcome.summary.best == max(h["val_rank_ic"] for h in history)
    metrics = json.loads((outcome.model_dir / "metrics.json").read_text())
    assert metrics["selection_metric"] == "val_rank_ic"
    assert {"mse", "ic", "rank_ic"} <= set(metrics["test"])
    assert set(metrics["baselines"]) == {"mean", "ridge_regression", "hist_gradient_boosting", "lightgbm"}
    card = (outcome.model_dir / "model_card.md").read_text()
    assert "| model | val rank IC | test rank IC | test IC | test MSE |" in card and "Survivorship" in card

    result = evaluate(outcome.model_dir, None, tmp_path / "report")
    names = [r.name for r in result.rows]
    assert names == ["deep model", "ridge regression", "hist gradient boosting", "lightgbm", "momentum 20d",
                     "buy and hold"]
    assert "Survivorship" in (tmp_path / "report" / "report.md").read_text()
    verdict = result.verdict
    assert not verdict.signal and not verdict.edge, verdict.line  # the null market

    signals = pd.read_parquet(tmp_path / "report" / "signals.parquet")  # what evaluate's predict() wrote
    assert not [c for c in signals.columns if c.startswith("p_")] and "pred_class" not in signals
    assert signals["score"].notna().all() and signals["score"].std() > 0
    legs = signals.groupby("date")["position"].agg(long=lambda p: (p == 1).sum(), short=lambda p: (p == -1).sum())
    assert (legs["long"] == 5).all() and (legs["short"] == 5).all()  # 20 stocks a date, quantile 0.25


# ---- the IC loss ---------------------------------------------------------------------------------


def test_ic_loss_is_minus_the_mean_daily_correlation_and_leaves_out_dates_without_one():
    import torch

    from alchemetric_ray.training.losses import date_correlation, make_loss

    rng = np.random.default_rng(0)
    date = np.repeat(np.arange(6), [5, 7, 1, 4, 6, 3])  # date 2 has one row
    label = rng.normal(size=len(date))
    score = label + rng.normal(size=len(date))
    score[date == 4] = 1.5  # no spread in the score on date 4
    frame = pd.DataFrame({"d": date, "s": score, "y": label})
    expected = np.mean([g["s"].corr(g["y"]) for d, g in frame.groupby("d") if d not in (2, 4)])
    s = torch.tensor(score, dtype=torch.float32, requires_grad=True)
    loss = make_loss("ic")(s[:, None], torch.tensor(label, dtype=torch.float32), torch.tensor(date))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-expected, abs=1e-5)
    loss.backward()
    assert torch.isfinite(s.grad).all() and (s.grad[torch.tensor(date) == 4] == 0).all()
    one_row_dates = date_correlation(s[:2], torch.zeros(2), torch.tensor([0, 1]))
    assert one_row_dates.item() == 0.0  # nothing to correlate: 0, not NaN


def test_date_batches_hold_whole_dates_every_date_once_in_a_seeded_order():
    import torch

    from alchemetric_ray.data.batches import Batching, WorkerBatches
    from alchemetric_ray.hardware.staging import HOST, DataPath

    date = torch.tensor(np.repeat(np.arange(40), 12))  # 40 dates x 12 stocks
    n = len(date)
    columns = (torch.arange(n)[:, None].float(), torch.zeros(n), date, torch.zeros(n))
    data = WorkerBatches.cached(columns, None, Batching(50, seed=3, by_date=True), torch.device("cpu"),
                                DataPath(HOST, "host memory"))
    epochs = [[b[2] for b in data.train_batches(e)] for e in (0, 0, 1)]
    for batches in epochs:
        assert all(len(b) == 48 for b in batches)  # 4 whole dates of 12 rows fit in 50
        seen = torch.cat(batches)
        assert sorted(seen.tolist()) == sorted(date.tolist())  # every row once
        assert all(len(torch.unique(b)) == 4 for b in batches)
    assert all(torch.equal(a, b) for a, b in zip(epochs[0], epochs[1]))  # same seed and epoch: same batches
    assert not all(torch.equal(a, b) for a, b in zip(epochs[0], epochs[2]))  # another epoch: another order
    assert data.steps_per_epoch(0) == 10


@pytest.mark.slow
def test_ic_loss_on_two_ddp_workers_splits_dates_not_rows(ray_session, tmp_path):
    """train.loss=ic with DDP: each rank holds whole dates (together every train row exactly once),
    both take the same number of steps, and the run learns a finite loss with IC metrics."""
    from alchemetric_ray.training.trainer import run_training

    cfg = _cs_cfg("features.label=cs_rank", "train.loss=ic", "scaling.workers=2", "train.batch_size=120",
                  f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                  "storage.name=ic", "train.epochs=2", "model.hidden=16", "device.name=cpu")
    outcome = run_training(cfg, progress=False, export=False)
    summary = outcome.summary
    assert summary.world_size == 2 and summary.epochs_per_rank == [2, 2]
    train_rows = _train_rows(outcome.shards)
    assert sum(summary.rows) == train_rows and min(summary.rows) > 0.3 * train_rows  # a split, not copies
    assert all(np.isfinite(h["train_loss"]) and -1 <= h["train_loss"] <= 1 for h in summary.history)
    assert all(np.isfinite(h["val_rank_ic"]) for h in summary.history)


def _train_rows(shards) -> int:
    from alchemetric_ray.data.manifest import Manifest

    return Manifest.read(shards).rows["train"]
