"""The in-run shadow check (``training/shadow.py``): real local-mode runs on the session's Ray, on the CPU.

* a planted fault (``tests/fault_model.py``: the first Linear's output 10 % off on the device after
  step k, as pytorch#193487 behaves) is caught at the first check after k, in one line naming the
  epoch, the step and the parameter, and the checkpoints before it stay;
* bf16 autocast on the CPU against its float32 shadow never trips in 10 epochs, with a check at
  every other step (the real clean test), and float32 against float32 shows exactly zero;
* the checks' figures reach the run summary, TensorBoard (local mode) and the model card;
* a check reads the device once; the adaptive interval spaces checks by their cost.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

from alchemetric_ray.config import load_config
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import UserError
from alchemetric_ray.hardware import resolve_precision
from alchemetric_ray.training import shadow as shadow_module
from alchemetric_ray.training.losses import make_loss
from alchemetric_ray.training.shadow import TOLERANCE, ShadowCheck, ShadowSettings, shadow_wanted
from alchemetric_ray.training.trainer import run_training

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from syncs import SyncCount  # bench/syncs.py: the counting rules of the sync-free step's tests

BATCH = 64


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    return stocknet_shards("AAPL,MSFT,XOM")


def _cfg(shards, tmp_path, *overrides):
    return load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}",
                              f"storage.models_dir={tmp_path / 'models'}", "model.hidden=16", "train.patience=0",
                              "device.name=cpu", f"train.batch_size={BATCH}", "train.shadow=true", *overrides])


def test_train_shadow_auto_checks_mps_only():
    assert shadow_wanted("auto", torch.device("mps")) and not shadow_wanted("auto", torch.device("cpu"))
    assert not shadow_wanted("auto", torch.device("cuda")) and shadow_wanted("true", torch.device("cpu"))
    assert not shadow_wanted("false", torch.device("mps"))


def test_a_planted_fault_is_caught_at_the_first_check_after_it_in_one_line(ray_session, shards, tmp_path,
                                                                           monkeypatch):
    fault = pytest.importorskip("fault_model")
    steps_per_epoch = math.ceil(Manifest.read(shards).rows["train"] / BATCH)
    after = steps_per_epoch + 2  # the fault starts in epoch 2
    monkeypatch.setattr(fault, "FAULT_AFTER", after)
    every = 4
    with pytest.raises(UserError) as caught:
        run_training(_cfg(shards, tmp_path, "model.module=fault_model", "model.name=faulty", "train.epochs=4",
                          f"train.shadow_every={every}", "storage.name=faulty"), export=False, progress=False)
    message = str(caught.value)
    first = (after // every + 1) * every  # the first checked step whose forward the fault reaches
    epoch, step = first // steps_per_epoch + 1, first % steps_per_epoch
    assert "\n" not in message
    assert message.startswith(f"shadow check failed at epoch {epoch} step {step}: the gradient on cpu fp32 is off by")
    # the largest error: the faulty layer, or the layer after it
    assert re.search(r"the largest is (first|rest\.1)\.(weight|bias).s \(", message), message
    assert "no entry of the known-bug table matches this run" in message and "remedy:" in message
    folders = sorted(p.name for p in (tmp_path / "results").glob("faulty-*/**/epoch-*") if p.is_dir())
    assert folders and folders[0].endswith("epoch-0000")  # epoch 1's checkpoint stays


@pytest.mark.slow
def test_bf16_on_the_cpu_never_trips_its_float32_shadow_and_float32_shows_zero(ray_session, shards, tmp_path):
    bf16 = run_training(_cfg(shards, tmp_path, "precision.mode=bf16", "train.epochs=10", "train.shadow_every=2",
                             "storage.name=bf16"), progress=False)
    stats = bf16.summary.shadow
    steps = 10 * math.ceil(Manifest.read(shards).rows["train"] / BATCH)
    assert stats["checks"] == math.ceil(steps / 2) and stats["every"] == 2
    assert 0 < stats["max_error"] < TOLERANCE["bf16"].gradient
    assert 0 < stats["max_parameter_error"] < TOLERANCE["bf16"].parameter
    # the figures in the history (TensorBoard's scalars come from its rows) and on the model card
    history = bf16.summary.history
    assert [row["shadow_checks"] for row in history][-1] == stats["checks"]
    assert max(row["shadow_max_error"] for row in history) == pytest.approx(stats["max_error"])
    card = (Path(bf16.model_dir.path) / "model_card.md").read_text()
    exported = next(row for row in history if row["epoch"] == bf16.best_metrics["epoch"])
    assert (f"shadow check against a float32 CPU copy: {exported['shadow_checks']} checks up to epoch "
            f"{exported['epoch']} (the exported one)") in card
    assert "known backend bugs: none of the table's entries matches this run on cpu" in card
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(bf16.run_path) / "tensorboard"))
    events.Reload()
    written = [e.value for e in events.Scalars("shadow_max_error")]
    assert len(written) == 10 and max(written) == pytest.approx(stats["max_error"], rel=1e-6)

    fp32 = run_training(_cfg(shards, tmp_path, "train.epochs=2", "train.shadow_every=3", "storage.name=fp32"),
                        export=False, progress=False)
    assert fp32.summary.shadow["checks"] > 0
    assert fp32.summary.shadow["max_error"] == 0.0 and fp32.summary.shadow["max_loss_error"] == 0.0


def _check(every: int = 0) -> tuple[ShadowCheck, tuple, tuple]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    cpu = torch.device("cpu")
    check = ShadowCheck(model, resolve_precision("fp32", cpu), (make_loss("ce"), make_loss("ce")), cpu,
                        ShadowSettings(every=every))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    return check, (x, y, None), (x, y, None)


def test_a_check_reads_the_device_once():
    check, batch, cpu_batch = _check(every=1)
    with SyncCount() as count:
        check(batch, cpu_batch, epoch=1, step=0)
    # one transfer of the device's loss, gradients and weights; the comparison then runs in numpy on
    # host memory: two numpy views of CPU tensors (the transfer's, the CPU copy's gradients), no read
    assert dict(count.by_op) == {"Tensor.cpu": 1, "Tensor.numpy": 2}, count.events
    assert check.stats.checks == 1 and check.stats.max_error == 0.0


def test_the_adaptive_interval_keeps_checks_under_five_percent_of_the_step_time():
    check, batch, cpu_batch = _check()
    assert check.due()  # the first step is checked
    check._schedule(cost=0.02, step_time=None)  # no step timed yet: the first gap
    assert check.stats.every == shadow_module.FIRST_GAP
    check._schedule(cost=0.02, step_time=0.004)  # a check as dear as 5 steps: 100 steps apart
    assert check.stats.every == math.ceil(0.02 / (shadow_module.BUDGET * 0.004)) == 100
    assert [check.due() for _ in range(100)] == [False] * 99 + [True]
    fixed, _, _ = _check(every=7)
    fixed._schedule(cost=1.0, step_time=0.001)
    assert fixed.stats.every == 7
