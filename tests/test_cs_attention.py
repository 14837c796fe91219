"""The cross-sectional model (issue 42 item 3, `model.name=cs_attention`): a date's stocks attend to each other.

* the model itself: a row's score depends on its own date's rows only, and not on their order; scoring
  (``scoring/predictions.py``) hands it whole dates, in batches of any size, and returns the rows' order;
* what it needs is said in one line: a regression target, the IC loss (``train.loss=auto`` picks it),
  and its batches whole (a micro-batch workaround of the known-bug table is refused for it);
* the known answer: shards in which the next return depends on where a stock's feature stands among
  the same date's peers (its distance from the date's centre), while the feature's level moves ten
  times more from date to date than across a date's stocks.  A per-stock MLP, trained with the same
  IC loss on the same whole-date batches, cannot place a stock among its peers and finds nothing;
  the cross-sectional model finds the effect at every seed, on the validation and the test segment,
  and under DDP with two workers (dates split across the ranks, each date scored whole on one rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from alchemetric_ray.config import load_config
from alchemetric_ray.errors import KnownBugError, TrainError

SEEDS = (0, 1, 2, 3, 4)


def _plant(shards: Path, seed: int = 0) -> None:
    """Rewrite every split's Parquet in place: feature 0 = the date's level (sd 10) + the stock's own
    draw e (sd 1), the others noise; the forward return = -|e - the date's mean e| (plus noise) and the
    label its cs_rank.  Only a stock's place among its date's peers says anything about its return."""
    from alchemetric_ray.data.cross_section import rank_by_date

    manifest = json.loads((shards / "manifest.json").read_text())
    for files in (manifest["files"][split] for split in ("train", "val", "test")):  # the shards (not bars, tails)
        for name in files:
            frame = pq.read_table(shards / name).to_pandas()
            days = frame["date"].to_numpy().astype("datetime64[D]").astype(np.int64)
            _, code = np.unique(days, return_inverse=True)
            n_dates = int(code.max()) + 1
            rng = np.random.default_rng([seed, int(days.min())])
            own = rng.normal(0.0, 1.0, len(frame))
            centre = np.bincount(code, own, n_dates)[code] / np.bincount(code, minlength=n_dates)[code]
            for column in manifest["features"]:
                frame[column] = rng.normal(0.0, 1.0, len(frame))
            frame[manifest["features"][0]] = rng.normal(0.0, 10.0, n_dates)[code] + own
            frame["fwd_ret"] = -np.abs(own - centre) * 0.01 + rng.normal(0.0, 0.003, len(frame))
            frame["label"] = rank_by_date(frame["fwd_ret"].to_numpy(), code, n_dates)
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), shards / name)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """40 synthetic tickers x 300 days of shards (cs_rank), their features and returns replaced by the plant."""
    from alchemetric_ray.data.shards import build_shards

    cfg = load_config(None, ["data.source=synthetic", "data.synthetic_tickers=40", "data.synthetic_days=300",
                             "data.seed=7", "features.label=cs_rank"])
    out = build_shards(cfg, tmp_path_factory.mktemp("planted") / "shards").out
    _plant(out)
    return out


def _run(shards: Path, tmp_path: Path, model: str, seed: int, *overrides: str):
    from alchemetric_ray.training.trainer import run_training

    cfg = load_config(None, [f"data.path={shards}", "features.label=cs_rank", f"model.name={model}",
                             "model.hidden=32", "model.dropout=0", "train.loss=ic", "train.epochs=10",
                             "train.patience=0", "train.lr=0.01", "train.batch_size=400", "device.name=cpu",
                             "scaling.threads_per_worker=1",  # a small model: one thread, never waiting on a busy core
                             f"train.seed={seed}", "train.score_test=true",
                             f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                             f"storage.name={model}-{seed}", *overrides])
    return run_training(cfg, progress=False)


def test_a_dates_scores_depend_on_its_own_rows_only_and_scoring_hands_it_whole_dates():
    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.models import MODELS, build_model, is_cross_sectional
    from alchemetric_ray.scoring.predictions import predict_proba

    cfg = load_config(None, ["model.name=cs_attention", "model.hidden=16", "model.dropout=0"])
    torch.manual_seed(0)
    model = build_model(cfg.model, 5, 1).eval()
    assert is_cross_sectional(model) and is_cross_sectional(MODELS["cs_attention"])
    assert not is_cross_sectional(MODELS["mlp"]) and not is_cross_sectional(build_model(load_config().model, 5, 1))
    x, date = torch.randn(10, 5), torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    with torch.no_grad():
        out = model(x, date)
        other = x.clone()
        other[7:] = torch.randn(3, 5)  # date 2's rows changed: dates 0 and 1 score as before, date 2 not
        changed = model(other, date)
        order = torch.randperm(10, generator=torch.Generator().manual_seed(1))
        shuffled = model(x[order], date[order])  # the rows in any order: each keeps its score
        alone = model(x[:3])  # no date codes: the batch is one date
    assert torch.allclose(out[:7], changed[:7], atol=1e-6) and not torch.allclose(out[7:], changed[7:])
    assert torch.allclose(shuffled, out[order], atol=1e-6) and torch.allclose(alone, out[:3], atol=1e-6)

    # scoring: 50 dates of 1 to 12 rows, shuffled, in batches of at most 20 rows (a wider date alone)
    rng = np.random.default_rng(0)
    dates = rng.permutation(np.repeat(np.arange(50), rng.integers(1, 13, 50)))
    xs = rng.normal(size=(len(dates), 5)).astype(np.float32)
    fp32 = resolve_precision("fp32", torch.device("cpu"))
    scored = predict_proba(model, xs, torch.device("cpu"), fp32, batch_size=20, regression=True, date=dates)
    with torch.no_grad():
        each = np.empty((len(dates), 1), np.float32)
        for d in np.unique(dates):
            rows = np.flatnonzero(dates == d)
            each[rows] = model(torch.from_numpy(xs[rows])).numpy()
    np.testing.assert_allclose(scored, each, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="scores whole dates: pass each row's date"):
        predict_proba(model, xs, torch.device("cpu"), fp32, regression=True)


def test_what_the_cross_sectional_model_needs_is_said_in_one_line(planted, tmp_path, monkeypatch):
    from device_probes import cpu_only_machine
    from test_known_bugs import CPU, FP32, M1_213

    from alchemetric_ray.scoring.objective import loss_of
    from alchemetric_ray.training.backend_check import check_backend

    assert loss_of(load_config(None, ["model.name=cs_attention", "features.label=cs_rank"])) == "ic"
    assert loss_of(load_config(None, ["model.name=mlp", "features.label=cs_rank"])) == "mse"
    with pytest.raises(TrainError) as caught:
        _run(planted, tmp_path, "cs_attention", 0, "train.loss=mse")
    assert str(caught.value) == ("config 'train.loss': cs_attention trains with the IC loss on whole dates, not mse; "
                                 "set train.loss=ic (or auto)")
    with pytest.raises(TrainError, match="^config 'train.cache_data': cs_attention needs whole dates in every batch"):
        _run(planted, tmp_path, "cs_attention", 0, "train.loss=auto", "train.cache_data=false")
    assert not (tmp_path / "models").exists()
    # a class target: the shards of the packaged-free synthetic market, labelled three_class
    from alchemetric_ray.data.shards import build_shards

    classes = build_shards(load_config(None, ["data.source=synthetic", "data.synthetic_tickers=4",
                                              "data.synthetic_days=200"]), tmp_path / "classes").out
    with pytest.raises(TrainError, match=r"^config 'model.name': cs_attention scores a date's stocks together .* "
                                         r"not features.label=three_class; use features.label=cs_rank or cs_zscore$"):
        _run(classes, tmp_path, "cs_attention", 0, "features.label=three_class", "train.loss=auto")

    # the MPS large-K matmul's workaround (micro-batches) would cut its dates apart: refused, in one line
    cpu_only_machine(monkeypatch)
    cfg = load_config(None, ["model.name=cs_attention", "features.label=cs_rank", "train.batch_size=40000"])
    with pytest.raises(KnownBugError, match=r"^known backend bug mps-matmul-large-k-2d .* \(the workaround, "
                                            r"micro-batches, would cut the dates of the cross-sectional model "
                                            r"'cs_attention' apart; lower train.batch_size\)$"):
        check_backend(cfg, 12, 1, CPU, FP32, backend=M1_213)


@pytest.mark.slow
def test_known_answer_the_cross_sectional_model_finds_a_peer_relative_effect_a_per_stock_mlp_cannot(planted, tmp_path):
    best: dict[str, list[float]] = {"cs_attention": [], "mlp": []}
    test: dict[str, list[float]] = {"cs_attention": [], "mlp": []}
    for model in best:
        for seed in SEEDS:
            outcome = _run(planted, tmp_path, model, seed)
            best[model].append(outcome.summary.best)
            test[model].append(json.loads((outcome.model_dir / "metrics.json").read_text())["test"]["rank_ic"])
    # the effect's rank IC is about 0.75 to find; the MLP's stays within noise of 0 (about 0.03 on 66 dates)
    assert min(best["cs_attention"]) > 0.3 and min(test["cs_attention"]) > 0.3, (best, test)
    assert max(best["mlp"]) < 0.12 and max(np.abs(test["mlp"])) < 0.12, (best, test)


@pytest.mark.slow
def test_cs_attention_under_ddp_splits_dates_across_two_workers_and_predicts_whole_dates(ray_session, planted,
                                                                                         tmp_path):
    import pandas as pd

    from alchemetric_ray.data.manifest import Manifest
    from alchemetric_ray.signals.predict import predict

    # each rank steps through half the dates: twice the epochs for as many steps as one worker's 10
    outcome = _run(planted, tmp_path, "cs_attention", 0, "scaling.workers=2", "train.epochs=20")
    s = outcome.summary
    manifest = Manifest.read(planted)
    assert s.world_size == 2 and s.epochs_per_rank == [20, 20]
    # validation by date: the two ranks' parts are disjoint and complete, each date whole on one rank
    assert sum(s.val_rows) == manifest.rows["val"] and min(s.val_rows) > 0, s.val_rows
    assert s.best > 0.3 and json.loads((outcome.model_dir / "metrics.json").read_text())["test"]["rank_ic"] > 0.3

    # predict: features computed again from the shards' own bars (not the plant), scored in whole dates
    signals = predict(outcome.model_dir, str(planted / "bars" / "part-00000.parquet"), tmp_path / "signals.parquet")
    assert len(signals) > 0 and np.isfinite(signals["score"]).all()
    written = pd.read_parquet(tmp_path / "signals.parquet")
    assert len(written) == len(signals) and written.groupby("date")["ticker"].nunique().max() == 40


@pytest.mark.slow
def test_cs_attention_takes_the_precision_rules_of_the_others_and_learns_under_cpu_bf16_autocast(monkeypatch):
    """Plan and precision as for every model: auto on a CUDA GPU (probes patched) is bf16 on Ampere and
    fp16 with a GradScaler on Volta, float32 off CUDA; and a real bf16-autocast step on the CPU (the IC
    loss in float32 outside autocast, as the loop computes it) lowers the loss of a date-relative task."""
    from alchemetric_ray.hardware import device as dev
    from alchemetric_ray.hardware import precision as prec
    from alchemetric_ray.hardware.optimizer import OptimizerStep
    from alchemetric_ray.hardware.precision import resolve_precision
    from alchemetric_ray.models import build_model, model_spec
    from alchemetric_ray.training.losses import DateGroups, make_loss

    spec = model_spec("cs_attention")
    for capability, bf16, expected in (((8, 0), True, ("bf16", False)), ((7, 0), False, ("fp16", True))):
        monkeypatch.setattr(dev, "cuda_capability", lambda i, c=capability: c)
        monkeypatch.setattr(prec, "cuda_bf16_native", lambda b=bf16: b)
        p = resolve_precision("auto", torch.device("cuda", 0), model=spec)
        assert (p.mode, p.use_scaler) == expected
    assert resolve_precision("auto", torch.device("cpu"), model=spec).mode == "fp32"

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    settings = load_config(None, ["model.name=cs_attention", "model.hidden=16", "model.dropout=0"]).model
    model = build_model(settings, 2, 1)
    x = torch.randn(400, 2)
    sizes = [40] * 10
    groups = DateGroups.from_sizes(sizes)
    own = x[:, 1]
    centre = torch.repeat_interleave(torch.stack([part.mean() for part in own.split(40)]), 40)
    y = -(own - centre).abs()
    x[:, 1] = own + torch.repeat_interleave(torch.randn(10) * 10, 40)  # the level moves from date to date
    precision = resolve_precision("bf16", cpu, model=spec)
    loss_fn = make_loss("ic")
    step = OptimizerStep(torch.optim.AdamW(model.parameters(), lr=3e-3), precision, grad_clip=1.0)
    losses = []
    for i in range(120):
        with precision.autocast():
            out = model(x, groups.code)
        loss = loss_fn(out, y, groups)
        losses.append(float(loss))
        assert not step(loss, epoch=0, step=i).skipped
    assert losses[-1] < losses[0] - 0.3, losses[::20]
