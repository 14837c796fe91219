"""Training on a real local Ray: models, DDP, resume, early stopping, the plan, export, CLI."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from device_probes import cpu_only_machine

from alchemetric_ray.artifacts.checkpoint import load_state, read_meta
from alchemetric_ray.artifacts.export import load_model
from alchemetric_ray.config import load_config
from alchemetric_ray.data.loaders import read_split, read_split_windows
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.shards import build_shards
from alchemetric_ray.errors import PlanError
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.models import MODELS, is_cross_sectional, model_spec
from alchemetric_ray.placement.plan import plan_resources
from alchemetric_ray.training.trainer import Execution, build_trainer, run_training

WINDOW = 8


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    return stocknet_shards("AAPL,MSFT,XOM", f"features.window={WINDOW}")


def _cfg(shards, tmp_path, *overrides):
    return load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}",
                              f"storage.models_dir={tmp_path / 'models'}", f"features.window={WINDOW}",
                              "model.hidden=16", "train.batch_size=256", "device.name=cpu", *overrides])


def _final_state(outcome):
    with outcome.latest_checkpoint.as_directory() as d:
        return load_state(d)["model"]


# ---- models: each one can memorise 256 rows (Train's local mode: the loop runs in-process) ------


# a cross-sectional model learns a date's ranking, not classes: tests/test_cs_attention.py trains it
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "mlp" else n
                                  for n in sorted(MODELS) if not is_cross_sectional(MODELS[n])])
def test_each_model_overfits_256_rows(ray_session, shards, tmp_path, name):
    cfg = _cfg(shards, tmp_path, f"model.name={name}", "model.hidden=128", "model.dropout=0.0", "train.epochs=80",
               "train.lr=0.003", "train.schedule=constant", "train.batch_size=64", "train.weight_decay=0",
               "train.patience=0", "train.metric=val_accuracy")
    manifest = Manifest.read(shards)
    columns = ["date", "ticker", *manifest.features, "label", "fwd_ret"]
    if model_spec(name).inputs == "sequence":
        ds = read_split_windows(shards, "train", WINDOW, columns=columns, manifest=manifest)
    else:
        ds = read_split(shards, "train", columns=columns, manifest=manifest)
    rows = ds.limit(256).materialize()  # the same 256 rows to train on and to score
    plan = plan_resources(cfg, ray_session.cluster_resources())
    trainer = build_trainer(cfg, {"train": rows, "val": rows}, manifest, plan, name=f"overfit-{name}",
                            execution=Execution(local_mode=True))
    result = trainer.fit()
    history = result.return_value.history
    assert result.return_value.rows == [256]
    assert max(h["val_accuracy"] for h in history[-5:]) >= 0.95, [round(h["val_accuracy"], 3) for h in history[::10]]


# ---- the resource plan ---------------------------------------------------------------------------


def test_worker_env_carries_fallback_and_token_location_not_the_token(monkeypatch):
    from alchemetric_ray.placement.session import worker_env

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/home/ray/.ray/auth_token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret-value")
    env = worker_env(load_config(None, ["device.mps_fallback=warn"]))
    assert env["PYTORCH_ENABLE_MPS_FALLBACK"] == "1" and env["RAY_AUTH_TOKEN_PATH"] == "/home/ray/.ray/auth_token"
    assert "secret-value" not in env.values()
    assert worker_env(load_config())["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"


def test_plan_laptop_cpu_defaults(monkeypatch):
    cpu_only_machine(monkeypatch)  # a laptop without CUDA or MPS, whatever the host has
    cfg = load_config()
    plan = plan_resources(cfg, {"CPU": 2.0})
    assert ((plan.num_workers, plan.use_gpu, plan.backend, plan.cpus_per_worker, plan.cpus_for_data)
            == (1, False, "gloo", 1.0, 1.0))
    assert plan.worker_device == "cpu" and "one CPU worker" in plan.reasons.workers
    assert "Ray Data" in plan.describe()


def test_plan_two_cpu_workers_share_what_data_leaves():
    plan = plan_resources(load_config(None, ["scaling.workers=2"]), {"CPU": 2.0})
    assert plan.num_workers == 2 and plan.cpus_per_worker == 0.5 and plan.cpus_for_data == 1.0


def test_plan_refuses_to_starve_ray_data():
    cfg = load_config(None, ["scaling.workers=2", "scaling.cpus_per_worker=1"])
    with pytest.raises(PlanError, match=r"2 worker\(s\) x 1 CPU on a cluster of 2 CPUs leave 0 CPU for Ray Data, "
                                         r"which would wait forever"):
        plan_resources(cfg, {"CPU": 2.0})


def test_plan_gpu_requested_that_no_node_has():
    with pytest.raises(dev.DeviceError, match="no node of the Ray cluster has a CUDA GPU"):
        plan_resources(load_config(None, ["device.name=cuda"]), {"CPU": 8.0})


def test_plan_cuda_cluster_one_worker_per_gpu(monkeypatch):
    # a CPU-only head node of a GPU cluster: no local CUDA or MPS, 4 GPUs in the cluster
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    plan = plan_resources(load_config(), {"CPU": 32.0, "GPU": 4.0})
    assert (plan.num_workers, plan.use_gpu, plan.backend, plan.gpus_per_worker) == (4, True, "nccl", 1.0)
    assert plan.worker_device == "cuda" and "one per GPU" in plan.reasons.workers
    with pytest.raises(PlanError, match="need 8 GPUs; the cluster has 4"):
        plan_resources(load_config(None, ["scaling.workers=8"]), {"CPU": 32.0, "GPU": 4.0})


def test_plan_mac_path_with_an_apple_gpu_that_ray_counts_as_a_gpu(monkeypatch):
    # Ray 2.60 advertises an Apple GPU as GPU: 1 (what ray.cluster_resources() holds on a Mac); with
    # the MPS probe patched (no Mac here) the plan must not ask Ray for GPUs: one worker, gloo, and
    # that worker picks MPS itself.
    from alchemetric_ray.hardware import device as dev

    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: True)
    mac = {"CPU": 4.0, "GPU": 1.0, "memory": 8e9}
    plan = plan_resources(load_config(), mac).as_dict()
    assert (plan["num_workers"], plan["use_gpu"], plan["backend"], plan["worker_device"]) == (1, False, "gloo", "mps")
    assert "mps" in plan["reasons"]["accelerator"] and "not CUDA" in plan["reasons"]["accelerator"]
    two = plan_resources(load_config(None, ["scaling.workers=2"]), mac).as_dict()
    assert (two["num_workers"], two["worker_device"], two["backend"]) == (2, "cpu", "gloo")


# ---- real multi-worker runs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def even_shards(stocknet_dir, tmp_path_factory):
    """Shards whose train split has an even row count: Ray splits it into two equal halves
    (``equal=True`` drops the odd row out), so both ranks together see every row."""
    for frac in (0.70, 0.69, 0.71, 0.68, 0.72):
        out = tmp_path_factory.mktemp("even") / "shards"
        cfg = load_config(None, [f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT,XOM,GE",
                                 f"features.train_frac={frac}", "features.val_frac=0.15"])
        built = build_shards(cfg, out)
        if built.manifest.rows["train"] % 2 == 0:
            return built.out
    pytest.fail("no train fraction gave an even train split")


@pytest.mark.slow
def test_ddp_two_workers_equal_one_process_on_the_same_global_batches(ray_session, even_shards, tmp_path, capsys):
    shards = even_shards
    # Full-batch steps: the global batch of 2 DDP ranks is the whole train split, exactly what the
    # single worker sees; gradients averaged over two equal halves equal the full mean.
    common = ["train.batch_size=100000", "model.dropout=0.0", "train.epochs=3", "train.deterministic=true",
              "train.patience=0", "train.lr=0.01", "train.schedule=constant"]
    two = run_training(_cfg(shards, tmp_path, *common, "scaling.workers=2", "storage.name=ddp2"), export=False)
    # two workers split the rows through Ray Data; one reads them itself with pyarrow (the same rows, below)
    said = capsys.readouterr().out
    assert "left for data    " in said and "with pyarrow" not in said, said
    one = run_training(_cfg(shards, tmp_path, *common, "scaling.workers=1", "storage.name=ddp1"), export=False)
    assert "with pyarrow" in capsys.readouterr().out
    total = Manifest.read(shards).rows["train"]
    rows, prints = two.summary.rows, two.summary.fingerprint
    assert two.summary.world_size == 2 and len(rows) == 2
    # the ranks read disjoint halves that together are the whole split
    assert rows[0] == rows[1] and sum(rows) == total == one.summary.rows[0]
    assert sum(prints) == pytest.approx(one.summary.fingerprint[0], rel=1e-9)
    # cached on the CPU: each rank indexes its batches in host memory (hardware/staging.py)
    assert two.summary.data_path == ["host (cpu trains from host memory)"] * 2
    # rank 0's time and memory per phase, recorded in the worker (training/phases.py)
    phases = two.summary.phases
    assert [(p.phase, p.epoch) for p in phases] == [("start", None), ("read", None)] + [
        (kind, epoch) for epoch in range(1, 4) for kind in ("train", "validate", "checkpoint")]  # epochs from 1
    assert all(p.seconds >= 0 for p in phases) and phases[-1].at > phases[0].at
    assert all(p.peak_mib is None or p.peak_mib >= p.private_mib > 0 for p in phases)
    a, b = _final_state(two), _final_state(one)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_resume_continues_at_next_epoch_bitwise_and_same_seed_is_reproducible(ray_session, s3, shards, tmp_path,
                                                                              capfd):
    """The interrupted run lives on object storage (the session's S3 server): `--resume` finds its
    latest run there and continues bit for bit, as from a local folder (test_staged_dir.py)."""
    common = ["train.epochs=4", "train.deterministic=true", "train.patience=0"]
    full = run_training(_cfg(shards, tmp_path, *common, "storage.name=full"), export=False)
    on_s3 = [f"storage.path={s3.bucket('ar-resume')}/runs", "storage.name=cut"]
    cut = run_training(_cfg(shards, tmp_path, *common, *on_s3, "train.stop_after=2"), export=False)
    assert cut.summary.epochs_run == 2 and cut.run_path.startswith("s3://ar-resume/runs/cut-")
    resumed = run_training(_cfg(shards, tmp_path, *common, *on_s3, "storage.resume=true"), export=False)
    captured = capfd.readouterr()
    # epochs count from 1 in messages; the folder keeps its 0-based name
    said = captured.out + captured.err
    assert "resumed from the checkpoint of epoch 2 (epoch-0001): continuing at epoch 3 of 4" in said
    assert resumed.run_path == cut.run_path  # the same run, found in the bucket
    assert resumed.summary.epochs_run == 4 and resumed.summary.epochs_per_rank == [2]  # epochs 3 and 4 only
    a, b = _final_state(full), _final_state(resumed)
    for key in a:
        assert torch.equal(a[key], b[key]), key  # resumed == uninterrupted, bit for bit
    losses = [h["train_loss"] for h in full.summary.history]
    assert losses == [h["train_loss"] for h in resumed.summary.history]
    # same seed twice: the cut run, a second run from scratch, matched the full run epoch for epoch
    val = [h["val_log_loss"] for h in full.summary.history]
    assert [h["train_loss"] for h in cut.summary.history] == losses[:2]
    assert [h["val_log_loss"] for h in cut.summary.history] == val[:2]


@pytest.mark.slow
def test_streamed_run_reads_every_row_each_epoch_and_repeats_exactly(ray_session, shards, tmp_path):
    """train.cache_data=false: every epoch streams the shard from Ray Data through the windowed shuffle."""
    common = ["train.cache_data=false", "train.epochs=2", "train.deterministic=true", "train.patience=0"]
    runs = [run_training(_cfg(shards, tmp_path, *common, f"storage.name=stream{i}"), export=False) for i in range(2)]
    s = runs[0].summary
    assert s.rows == [Manifest.read(shards).rows["train"]] and s.epochs_run == 2
    assert all(math.isfinite(h["train_loss"]) for h in s.history)
    a, b = _final_state(runs[0]), _final_state(runs[1])
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ---- the selection metric's direction, checkpoint retention, complete validation ----------------


@pytest.fixture(scope="module")
def odd_val_shards(tmp_path_factory):
    """Tiny synthetic shards (3 tickers x 300 days, about 2 s to build) whose val split has an odd
    row count: Ray's default ``streaming_split(2, equal=True)`` would drop one of its rows."""
    out = tmp_path_factory.mktemp("odd") / "shards"
    cfg = load_config(None, ["data.source=synthetic", "data.synthetic_tickers=3", "data.synthetic_days=300"])
    built = build_shards(cfg, out)
    assert built.manifest.rows["val"] % 2 == 1, built.manifest.rows
    return built.out


def test_every_reader_of_the_selection_takes_the_direction_from_the_metric(tmp_path):
    from alchemetric_ray.artifacts.checkpoint import save_checkpoint
    from alchemetric_ray.artifacts.run_folder import RunFolder
    from alchemetric_ray.scoring.objective import selection_metric, selection_mode
    from alchemetric_ray.storage import locate

    cfg = load_config(None, ["train.metric=val_log_loss", f"storage.path={tmp_path}"])  # train.mode left at auto
    trainer = build_trainer(cfg, {}, {}, plan_resources(cfg, {"CPU": 4.0}), name="direction")
    order = trainer.run_config.checkpoint_config
    assert (order.checkpoint_score_attribute, order.checkpoint_score_order) == ("val_log_loss", "min")
    acc = load_config(None, ["train.metric=val_accuracy", f"storage.path={tmp_path}"])
    for c, values, best in ((cfg, [0.9, 0.4, 0.7], 1), (acc, [0.4, 0.6, 0.5], 1)):  # the lowest loss, the top accuracy
        metric = selection_metric(c)
        run = tmp_path / metric
        for epoch, value in enumerate(values):
            save_checkpoint(run / f"epoch-{epoch:04d}", {"w": torch.zeros(1)},
                            {"epoch": epoch, "metrics": {metric: value}, "loop": {"history": []}})
        folder = RunFolder(locate(run), metric=metric, mode=selection_mode(c))
        assert folder.best().epoch == best  # what the export takes


def test_num_to_keep_leaves_the_k_best_checkpoints_by_a_min_metric_plus_the_latest(ray_session, odd_val_shards,
                                                                                   tmp_path):
    """Ray Train V2 keeps the ``storage.num_to_keep`` best checkpoints by ``train.metric``, plus the
    latest one.  val_log_loss improves downwards: ranked the other way (the old default
    ``train.mode=max`` whatever the metric), Ray kept the worst epochs and deleted the best, and the
    export picked the worst.  The expected folders come from the loop's own per-epoch history."""
    cfg = _cfg(odd_val_shards, tmp_path, "train.metric=val_log_loss", "train.epochs=5", "train.patience=0",
               "storage.num_to_keep=2", "storage.name=keep", "train.lr=0.003", "train.batch_size=64")
    out = run_training(cfg, export=False)
    loss = {h["epoch"]: h["val_log_loss"] for h in out.summary.history}
    assert sorted(loss) == [1, 2, 3, 4, 5] and len(set(loss.values())) == 5, loss  # epochs by number, from 1
    best_two = sorted(loss, key=loss.get)[:2]
    kept = {p.name for p in Path(out.run_path).glob("epoch-*") if p.is_dir()}
    assert kept == {f"epoch-{e - 1:04d}" for e in {*best_two, 5}}, (kept, loss)  # folders from 0
    # the loop's best and the checkpoint the run would export agree with the history
    assert out.summary.best == min(loss.values())
    assert out.best_metrics["epoch"] == best_two[0]


@pytest.mark.slow
def test_ddp_ranks_stop_at_the_same_epoch_and_score_every_val_row_exactly_once(ray_session, odd_val_shards,
                                                                              tmp_path):
    """Two workers, a 99-row val split: the ranks score disjoint parts that together are the whole
    split (Ray's default equal split dropped a row), and rank 0's metrics cover all 99 rows; and
    the early-stop decision, made on rank 0, stops every rank at the same epoch."""
    import pandas as pd

    from alchemetric_ray.data.shards import split_dir

    # lr 1e-9 moves the weights by ~1e-9: accuracy stays put, so epoch 2 is not better and the run stops.
    # (Not val_log_loss: such steps still lower it by ~1e-9, enough to count as an improvement.)
    cfg = _cfg(odd_val_shards, tmp_path, "scaling.workers=2", "train.epochs=6", "train.patience=1", "train.lr=1e-9",
               "train.metric=val_accuracy", "train.mode=max", "storage.name=ddpval")
    out = run_training(cfg, export=False)
    s = out.summary
    assert s.stopped_early and s.epochs_run < 6
    assert s.epochs_per_rank == [s.epochs_run] * 2
    features = Manifest.read(odd_val_shards).features
    val = pd.read_parquet(split_dir(odd_val_shards, "val"), columns=features).to_numpy(np.float64)
    assert s.world_size == 2 and len(val) == 99
    assert sum(s.val_rows) == len(val), s.val_rows
    # the same rows, not just as many: the parts' feature sums add up to the split's
    assert sum(s.val_fingerprint) == pytest.approx(float(val.sum()), rel=1e-9, abs=1e-6)
    with out.latest_checkpoint.as_directory() as d:
        confusion = np.asarray(read_meta(d)["metrics"]["val_confusion"])
    assert confusion.sum() == len(val)  # the metrics that pick the best epoch saw every row once


# ---- export and the CLI ------------------------------------------------------------------------


@pytest.mark.slow
def test_train_cli_exports_a_model_that_predicts_like_its_checkpoint(ray_session, shards, tmp_path, capsys):
    from alchemetric_ray.cli import main
    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.scoring.predictions import model_inputs, predict_proba, split_frame

    rc = main(["train", "--device", "cpu", "--data", str(shards), "--model", "gru",
               f"storage.path={tmp_path / 'results'}",
               f"storage.models_dir={tmp_path / 'models'}", "storage.name=cli-gru", f"features.window={WINDOW}",
               "train.epochs=3", "model.hidden=16", "train.patience=1", "train.lr=1e-9"])
    assert rc == 0
    out = capsys.readouterr().out
    model_dir = tmp_path / "models" / "cli-gru"
    card = (model_dir / "model_card.md").read_text()  # the console names it; the card holds the table
    assert f"saved model: {model_dir}" in out and "| hist_gradient_boosting |" in card and "Only 3 tickers" in card
    loaded = load_model(model_dir)
    meta = json.loads((model_dir / "meta.json").read_text())
    assert meta["device"]["device"] == "cpu" and "resource plan" in meta["device"]["reason"]
    assert meta["precision"]["mode"] == "fp32" and meta["precision"]["reason"]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert set(metrics["baselines"]) == {"majority", "logistic_regression", "hist_gradient_boosting", "lightgbm"}
    # the test segment stays sealed: not scored at export, no look recorded; the card says so
    assert "test" not in metrics and all(set(b) == {"val"} for b in metrics["baselines"].values())
    assert "sealed, not scored at export" in card and not (model_dir / "looks").exists()
    assert json.loads((model_dir / "trials.json").read_text())["entries"][0]["trials"] == 1
    # The best epoch from the run's own history, not from what the export says about itself: the
    # latest checkpoint's meta holds every epoch's reported validation metrics.  At lr 1e-9 epoch 1
    # scores what epoch 0 scored, which is no improvement: the run stops early (patience 1), so its
    # best epoch (the first to reach the best score) is not its latest, and exporting the latest
    # checkpoint instead of the best fails here.
    (run_dir,) = (tmp_path / "results").glob("cli-gru-*")
    latest = max(int(p.name.removeprefix("epoch-")) for p in run_dir.glob("epoch-*"))
    history = read_meta(run_dir / f"epoch-{latest:04d}")["loop"]["history"]
    assert [h["epoch"] for h in history] == list(range(1, latest + 2))  # numbers from 1, folders from 0
    scores = [h["val_balanced_accuracy"] for h in history]  # train.metric's default; larger is better
    best_epoch = scores.index(max(scores))
    assert metrics["best_epoch"] == best_epoch + 1, (metrics["best_epoch"], scores)
    assert metrics["val"]["balanced_accuracy"] == scores[best_epoch]
    # the export predicts exactly what that epoch's checkpoint predicts
    reference = load_model(model_dir).model
    reference.load_state_dict(load_state(run_dir / f"epoch-{best_epoch:04d}")["model"])
    frame = split_frame(shards, "test", loaded.manifest.features)
    x, _ = model_inputs(frame, loaded.manifest.features, loaded.mode, WINDOW)
    p = resolve_precision("fp32", torch.device("cpu"))
    np.testing.assert_array_equal(predict_proba(loaded.model, x, torch.device("cpu"), p),
                                  predict_proba(reference, x, torch.device("cpu"), p))
    assert loaded.config.model.name == "gru"


def test_train_cli_bad_input_is_one_line(tmp_path, capsys):
    from alchemetric_ray.cli import main

    assert main(["train", "--model", "resnet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("alchemetric-ray train: error: unknown model 'resnet' "
                   "(known: cs_attention, gru, lstm, mlp, tcn, transformer)")
    assert main(["train", "train.lr=0"]) == 2
    assert (capsys.readouterr().err.strip()
            == "alchemetric-ray train: error: config 'train.lr': 0.0 is invalid, expected > 0")
