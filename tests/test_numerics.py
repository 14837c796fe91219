"""Training numerics: a NaN/inf loss under a GradScaler, without one, and a run that never recovers.

The issue's three promises, each proved with real optimizer steps on a real model:

* under a GradScaler a non-finite step is skipped (weights untouched), counted, the scale drops
  and the run goes on while the scale recovers -- for ``OptimizerStep`` itself and through the
  real training loop (skips land in the reported history, the epoch's train loss stays finite);
* without a scaler a NaN loss stops the run with a one-line error naming the epoch and step --
  for ``OptimizerStep`` (loss and gradient checks) and for a real Ray Train run from the CLI whose
  learning rate is so large that the weights blow up;
* a run whose every step is non-finite stops with ``TooManySkippedSteps`` after
  ``train.max_skipped_steps`` steps instead of spinning through its epochs.

The only GradScaler recipe the policy picks is fp16 on a CUDA GPU without native bf16; on this CPU
machine the tests run that exact recipe (fp16 autocast + a real ``torch.amp.GradScaler("cpu")``)
on the CPU.  Unit-level basics (one injected inf halves the scale, three NaN steps in a row stop,
the fp32 NaN message) are in tests/test_precision.py and are not repeated here.
"""

import math

import pytest
import torch
from torch import nn

from alchemetric_ray.config import load_config
from alchemetric_ray.data.loaders import read_split
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.shards import build_shards
from alchemetric_ray.errors import NonFiniteLossError, TooManySkippedSteps, UserError
from alchemetric_ray.hardware.optimizer import OptimizerStep
from alchemetric_ray.hardware.precision import Precision, resolve_precision
from alchemetric_ray.placement.plan import plan_resources
from alchemetric_ray.training import loop
from alchemetric_ray.training.trainer import Execution, build_trainer

CPU = torch.device("cpu")
# The CUDA fp16 recipe (autocast fp16 + GradScaler) on the CPU: a real GradScaler("cpu").
FP16_SCALED = Precision("fp16", "cpu", torch.float16, True, False, "test: the CUDA fp16 + GradScaler recipe on the CPU")


def _problem(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(512, 16)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)), x, y


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a, b))


# ---- (a) under a GradScaler: skipped, counted, the scale drops, training goes on ------------------


def test_scaler_skips_poisoned_steps_counts_them_and_training_recovers():
    model, x, y = _problem()
    # growth_interval=4 (default 2000) so that the scale's recovery fits in a short run
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=4)
    stepper = OptimizerStep(torch.optim.AdamW(model.parameters(), lr=1e-2), FP16_SCALED, scaler=scaler,
                            max_skipped_steps=5)
    poisoned = {5, 6}  # two non-finite steps in a row
    skipped, scales, losses = [], [], []
    for step in range(24):
        with FP16_SCALED.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        losses.append(float(loss.detach()))
        if step in poisoned:
            loss = loss * float("inf")  # an overflowing forward pass: the loss and every gradient are inf/NaN
        before, scale_before = _params(model), scaler.get_scale()
        out = stepper(loss, epoch=0, step=step)
        if out.skipped:
            skipped.append(step)
            assert _same(before, _params(model)), f"step {step} was skipped but the weights moved"
            assert scaler.get_scale() == scale_before / 2
        else:
            assert not _same(before, _params(model)), f"step {step} was taken but the weights did not move"
            assert math.isfinite(out.grad_norm)
        scales.append(scaler.get_scale())
        if step == 6:
            assert (stepper.skipped_total, stepper.skipped_in_row) == (2, 2)
    assert skipped == sorted(poisoned)  # exactly the poisoned steps, nothing else
    assert (stepper.skipped_total, stepper.skipped_in_row) == (2, 0)  # counted; the run of skips is over
    lowest = scales[6]
    assert lowest == max(scales[:5]) / 4  # halved twice
    assert scales[-1] > max(scales[:5]) > lowest  # then it recovers past where it was
    clean = [v for s, v in enumerate(losses) if s not in poisoned]
    assert all(math.isfinite(v) for v in losses)  # the unscaled losses were finite all along
    assert clean[-1] < 0.6 * clean[0]  # and training went on learning


@pytest.fixture(scope="module")
def shards(stocknet_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("numerics") / "shards"
    cfg = load_config(None, [f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT,XOM"])
    return build_shards(cfg, out, progress=False).out


@pytest.fixture(scope="module")
def rows(ray_session, shards):
    """The manifest and 512 real train rows, as a DataFrame to poison."""
    manifest = Manifest.read(shards)
    frame = read_split(shards, "train", columns=["date", "ticker", *manifest.features, "label", "fwd_ret"])
    return manifest, frame.limit(512).to_pandas()


def _local_run(ray, shards, tmp_path, train_frame, val_frame, manifest, *overrides):
    cfg = load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}", "model.name=mlp",
                             "model.hidden=16", "train.batch_size=64", "train.patience=0", *overrides])
    plan = plan_resources(cfg, ray.cluster_resources())
    datasets = {"train": ray.data.from_pandas(train_frame), "val": ray.data.from_pandas(val_frame)}
    # Train's local mode: the real loop, Ray Data shards and reports, in this process
    return build_trainer(cfg, datasets, manifest, plan, name=f"numerics-{tmp_path.name}",
                         execution=Execution(local_mode=True)).fit()


def test_loop_under_a_scaler_skips_an_overflowing_batch_each_epoch_and_goes_on(ray_session, shards, rows, tmp_path,
                                                                               monkeypatch):
    # One train row whose first feature (1e6) overflows float16: the batch holding it has an
    # inf/NaN loss in every epoch; every other batch is fine.
    monkeypatch.setattr(loop, "resolve_precision", lambda *a, **k: FP16_SCALED)
    manifest, clean = rows
    poisoned = clean.copy()
    poisoned.loc[100, manifest.features[0]] = 1e6
    result = _local_run(ray_session, shards, tmp_path, poisoned, clean, manifest, "train.epochs=3")
    out = result.return_value
    history = out.history
    assert out.precision["grad_scaler"] and out.precision["mode"] == "fp16"
    assert [h["epoch"] for h in history] == [1, 2, 3]  # the run went on to its last epoch
    assert [h["skipped_steps"] for h in history] == [1, 2, 3]  # one skip per epoch, counted
    assert all(math.isfinite(h["train_loss"]) for h in history)  # the skipped step's NaN is not averaged in
    assert all(math.isfinite(h["val_log_loss"]) for h in history)  # no NaN reached the weights


# ---- (b) no scaler: the run stops, naming epoch and step ------------------------------------------


def test_fp32_nonfinite_gradient_stops_before_the_weights_move():
    # A finite loss whose gradient is not (d sqrt(u)/du at u = 0): the second check of the step.
    model, x, _ = _problem()
    stepper = OptimizerStep(torch.optim.SGD(model.parameters(), lr=0.1), resolve_precision("fp32", CPU))
    before = _params(model)
    loss = torch.sqrt(model(x) * 0).sum()
    assert torch.isfinite(loss)
    with pytest.raises(NonFiniteLossError) as err:
        stepper(loss, epoch=4, step=9)
    message = str(err.value)
    assert "non-finite gradient norm" in message and "at epoch 4 step 9 under fp32" in message
    assert "\n" not in message and isinstance(err.value, UserError)
    assert _same(before, _params(model))


# A run that diverges under fp32 on a real Train worker (lr=1e30, no clipping: NaN at epoch 0, step 1)
# stops with one line naming the epoch, the step and what to change: tests/test_console.py, through
# the CLI into a pipe.


# ---- (c) a run that keeps skipping stops instead of spinning --------------------------------------


def test_loop_that_skips_every_step_stops_after_max_skipped_steps(ray_session, shards, rows, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "resolve_precision", lambda *a, **k: FP16_SCALED)
    manifest, clean = rows
    poisoned = clean.copy()
    poisoned[manifest.features[0]] = 1e6  # every batch overflows float16
    with pytest.raises(TooManySkippedSteps) as err:
        _local_run(ray_session, shards, tmp_path, poisoned, clean, manifest, "train.epochs=50",
                   "train.max_skipped_steps=3")
    message = str(err.value)
    # stopped at the third skip of the first epoch (8 batches), not after 50 epochs of skipped
    # steps; the scale dropped from GradScaler's 65536 once per skip
    assert message.startswith("3 optimizer steps in a row skipped for non-finite gradients")
    # (epochs counted from 1 in messages, as the epoch lines do; read at the epoch's closing check)
    assert "(last at epoch 1 step 2, scale 8192; seen at the check after step 7)" in message
    assert "lower train.lr" in message
    assert "\n" not in message and isinstance(err.value, UserError)
