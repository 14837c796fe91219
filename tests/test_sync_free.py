"""The sync-free training step: nothing in a step waits on the device; the verdicts are read at checks.

* the loop's own epoch (``training/loop.py``'s ``_train_epoch``, with its AdamW, ``OptimizerStep`` and
  losses, on a cached shard in host memory, in-process: no Ray) makes one host read per
  ``train.check_every`` steps plus one at the epoch's end, and nothing else, in fp32, bf16 and
  fp16 (GradScaler), and with the IC loss -- counted on the CPU by ``bench/syncs.py``'s rules (the
  operators that wait on a GPU, and host copies; optimizer step counters left out);
* the IC loss on the loop's host-numbered dates equals the old per-date correlation (``unique``,
  ``bincount``, boolean indexing), gradients included, and runs no sync;
* a NaN at a known step is reported, in one line, at the first check after it with its epoch and
  step, before any report: no checkpoint holds it (a real loop on the session's Ray, local mode);
* under a GradScaler, the max-skipped-steps rule is judged at checks, from device-side counts;
* under DDP (two gloo ranks) the verdict is a collective: a NaN on one rank stops both at one check.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from syncs import SyncCount  # bench/syncs.py: the counting rules the benchmark prints with

from alchemetric_ray.config import ModelConfig, TrainConfig, load_config
from alchemetric_ray.data.batches import Batching, WorkerBatches
from alchemetric_ray.errors import NonFiniteLossError, TooManySkippedSteps
from alchemetric_ray.hardware import DeviceChoice, adamw, resolve_precision
from alchemetric_ray.hardware.optimizer import OptimizerStep
from alchemetric_ray.hardware.precision import Precision
from alchemetric_ray.hardware.staging import HOST, DataPath
from alchemetric_ray.models import build_model
from alchemetric_ray.training import loop
from alchemetric_ray.training.losses import DateGroups, date_correlation, make_loss

CPU = torch.device("cpu")
PRECISIONS = {
    "fp32": resolve_precision("fp32", CPU),
    "bf16": Precision("bf16", "cpu", torch.bfloat16, False, False, "test: CPU bf16 autocast"),
    # the CUDA fp16 recipe (autocast + a real GradScaler("cpu")), which the policy refuses on a CPU
    "fp16": Precision("fp16", "cpu", torch.float16, True, False, "test: the CUDA fp16 + GradScaler recipe"),
}
FEATURES, DATES, STOCKS = 8, 40, 12  # 480 rows


def _data(batch_size: int, by_date: bool) -> WorkerBatches:
    """The loop's batches of a cached shard in host memory.  Numbering dates is host work on host
    tensors (on a GPU too), which a CPU count could not tell from device work: the batches make an
    epoch's date batches once, and the tests make them before counting."""
    generator = torch.Generator().manual_seed(0)
    n = DATES * STOCKS
    x = torch.randn(n, FEATURES, generator=generator)
    signal = x[:, 0] + 0.5 * torch.randn(n, generator=generator)
    label = signal if by_date else (signal > 0).long()
    date = torch.arange(n) // STOCKS
    return WorkerBatches.cached((x, label, date, torch.zeros(n)), None, Batching(batch_size, 0, by_date=by_date),
                                CPU, DataPath(HOST, "host memory"))


def _epoch_setup(precision: Precision, *, ic: bool, check_every: int, batch_size: int = 48):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=16), FEATURES, 1 if ic else 2)
    train_cfg = TrainConfig(batch_size=batch_size, check_every=check_every, lr=1e-2)
    worker = loop._Worker(0, 1, DeviceChoice(CPU, "test"), precision, 1)
    data = _data(batch_size, by_date=ic)
    trainables = loop._trainables(model, train_cfg, worker, data.steps_per_epoch(DATES * STOCKS))
    return model, trainables, make_loss("ic" if ic else "ce"), data, worker


@pytest.mark.parametrize("kind", ["fp32", "bf16", "fp16", "ic"])
@pytest.mark.parametrize("check_every", [4, 1000])
def test_an_epoch_of_the_loop_reads_the_device_once_per_check_and_at_its_end(kind, check_every):
    precision = PRECISIONS["fp32" if kind == "ic" else kind]
    model, trainables, loss_fn, data, worker = _epoch_setup(precision, ic=kind == "ic", check_every=check_every)
    assert trainables.optimizer.defaults["fused"]  # the loop's AdamW on a CPU: fused
    steps = data.steps_per_epoch(0)
    assert steps == 10
    data.date_batches(0)  # host work, before the count
    with SyncCount(trainables.optimizer) as count:
        train_loss, _, skipped = loop._train_epoch(loop.Training(model, trainables, loss_fn, data, worker, 0), 0)
    reads = steps // check_every + 1  # the checks after every check_every steps, and the epoch's end
    assert dict(count.by_op) == {"Tensor.tolist": reads}, count.events
    assert math.isfinite(train_loss) and skipped == 0


def test_the_epoch_loss_is_the_mean_of_the_steps_taken():
    """The device-side sum gives what the old list of the steps' losses gave."""
    model, trainables, loss_fn, data, worker = _epoch_setup(PRECISIONS["fp32"], ic=False, check_every=3)
    seen = []

    def recording(out, y, date):
        value = loss_fn(out, y, date)
        seen.append(float(value.detach()))
        return value

    train_loss, _, _ = loop._train_epoch(loop.Training(model, trainables, recording, data, worker, 0), 0)
    assert len(seen) == 10 and train_loss == pytest.approx(float(np.mean(seen)), rel=1e-6)


def test_optimizer_step_alone_reads_nothing_between_checks_under_every_precision():
    for name, precision in PRECISIONS.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2))
        optimizer = adamw(model.parameters(), lr=1e-3)
        step_fn = OptimizerStep(optimizer, precision, check_every=25)
        x, y = torch.randn(64, FEATURES), torch.randint(0, 2, (64,))
        with SyncCount(optimizer) as count:
            for step in range(50):
                with precision.autocast():
                    out = model(x)
                step_fn(nn.functional.cross_entropy(out.float(), y), epoch=1, step=step)
        assert count.by_op == {"Tensor.tolist": 2}, (name, count.events)  # after steps 24 and 49


def test_the_step_counters_of_a_plain_adamw_are_not_counted_but_its_found_inf_read_is():
    """What the counting rule leaves out, and what it does not: a plain AdamW reads its CPU step
    counters (no device wait) and, under a GradScaler, GradScaler.step reads the found-inf flag."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = OptimizerStep(optimizer, PRECISIONS["fp16"], check_every=100)
    x, y = torch.randn(16, FEATURES), torch.randint(0, 2, (16,))
    with SyncCount(optimizer) as count:
        for step in range(5):
            with PRECISIONS["fp16"].autocast():
                out = model(x)
            step_fn(nn.functional.cross_entropy(out.float(), y), epoch=1, step=step)
    assert count.by_op == {"_local_scalar_dense": 5}  # the found-inf read, once a step; no step counter


# ---- the IC loss ---------------------------------------------------------------------------------


def _old_date_correlation(score, label, date):
    """The IC loss before the sync-free step (commit 87c6c2b), verbatim but for the names."""
    _, code = torch.unique(date, return_inverse=True)
    n_dates = int(code.max()) + 1 if len(code) else 0
    zeros = score.new_zeros(n_dates)
    count = torch.bincount(code, minlength=n_dates).to(score.dtype)
    safe = count.clamp(min=1)
    ds = score - (zeros.index_add(0, code, score) / safe)[code]
    dl = label - (zeros.index_add(0, code, label) / safe)[code]
    sxx = zeros.index_add(0, code, ds * ds)
    syy = zeros.index_add(0, code, dl * dl)
    sxy = zeros.index_add(0, code, ds * dl)
    valid = (count >= 2) & (sxx > 1e-12) & (syy > 1e-12)
    if not bool(valid.any()):
        return (score * 0).sum()
    return (sxy[valid] / torch.sqrt(sxx[valid] * syy[valid])).mean()


def _value_and_grad(fn, score, label, dates):
    s = score.clone().requires_grad_(True)
    value = fn(s, label, dates)
    value.backward()
    return value.detach(), s.grad


@pytest.mark.parametrize("sizes", [
    [5, 7, 1, 4, 6, 3],  # a date with one row
    [12] * 10,
    [2, 2, 2],
    [1, 1, 1, 1],  # no date with a correlation: 0, with a gradient of 0
    [30],
])
def test_ic_loss_on_host_numbered_dates_equals_the_old_one_gradient_included(sizes):
    rng = np.random.default_rng(len(sizes))
    n = sum(sizes)
    date = torch.tensor(np.repeat(np.arange(100, 100 + len(sizes)), sizes))  # raw date numbers, not 0..n-1
    label = torch.tensor(rng.normal(size=n), dtype=torch.float32)
    score = label + torch.tensor(rng.normal(size=n), dtype=torch.float32)
    if len(sizes) > 2:
        score[date == 101] = 1.5  # no spread in the score on one date
        label[date == 102] = -0.25  # none in the label on another
    old_value, old_grad = _value_and_grad(_old_date_correlation, score, label, date)
    for dates in (DateGroups.from_sizes(sizes, CPU), date):  # the loop's numbering, and raw dates
        value, grad = _value_and_grad(date_correlation, score, label, dates)
        assert value.item() == pytest.approx(old_value.item(), abs=1e-6)
        torch.testing.assert_close(grad, old_grad, rtol=1e-5, atol=1e-6)
        assert torch.isfinite(grad).all()
    if all(s == 1 for s in sizes):
        assert value.item() == 0.0 and (grad == 0).all()


def test_ic_loss_on_host_numbered_dates_runs_no_sync():
    sizes = [STOCKS] * 8
    score = torch.randn(sum(sizes), 1, requires_grad=True)
    label = torch.randn(sum(sizes))
    groups = DateGroups.from_sizes(sizes, CPU)
    with SyncCount() as count:
        loss = make_loss("ic")(score, label, groups)
        loss.backward()
    assert count.total == 0, count.events
    with SyncCount() as raw:  # raw dates are numbered where they are: unique, bincount, int(...)
        make_loss("ic")(score, label, torch.arange(sum(sizes)) // STOCKS)
    assert raw.by_op["_unique2"] == 1 and raw.by_op["bincount"] == 1


def test_date_batches_number_their_dates_for_the_loss():
    data = _data(50, by_date=True)
    for (x, y, date, _), date_rows in data.train_steps(0):
        assert sum(date_rows) == len(date) and all(n == STOCKS for n in date_rows)
        code = DateGroups.from_sizes(date_rows).code
        # rows come date by date: the codes run 0, 0, ..., 1, 1, ... along the batch's own dates
        assert torch.equal(torch.unique_consecutive(date, return_inverse=True)[1], code)


# ---- verdicts at checks --------------------------------------------------------------------------


def _problem(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(128, FEATURES)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2)), x, (x[:, 0] > 0).long()


@pytest.mark.parametrize("fused", [True, False])
def test_nan_without_scaler_is_masked_and_raised_at_the_next_check_naming_its_step(fused):
    model, x, y = _problem()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    step_fn = OptimizerStep(optimizer, PRECISIONS["fp32"], check_every=5)
    for step in range(7):
        loss = nn.functional.cross_entropy(model(x), y)
        if step == 6:
            loss = loss * float("nan")
        step_fn(loss, epoch=3, step=step)  # a check after step 4: nothing yet
    before = [p.detach().clone() for p in model.parameters()]
    for step in range(7, 9):  # finite again: the flag stays up until the check
        step_fn(nn.functional.cross_entropy(model(x), y), epoch=3, step=step)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the NaN step never reached the weights
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the later steps did
    with pytest.raises(NonFiniteLossError) as err:
        step_fn(nn.functional.cross_entropy(model(x), y), epoch=3, step=9)  # the check after step 9
    message = str(err.value)
    assert message == ("non-finite loss (nan) at epoch 3 step 6 under fp32 with no GradScaler to skip it "
                       "(seen at the check after step 9); lower train.lr or check the data")


def test_skipped_steps_rule_is_judged_at_checks_under_a_scaler():
    model, x, y = _problem()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    optimizer = adamw(model.parameters(), lr=1e-2)
    step_fn = OptimizerStep(optimizer, PRECISIONS["fp16"], scaler=scaler, max_skipped_steps=3, check_every=8)
    # two skips, a taken step, three skips: the rule trips at step 6 (scale 1024 / 2**5), seen after step 7
    poisoned = {1, 2, 3 + 1, 3 + 2, 3 + 3}
    skipped = []
    with SyncCount(optimizer) as count:
        with pytest.raises(TooManySkippedSteps) as err:
            for step in range(16):
                with PRECISIONS["fp16"].autocast():
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                out = step_fn(loss * float("inf") if step in poisoned else loss, epoch=2, step=step)
                skipped.append(out.skipped)
    assert count.by_op == {"Tensor.tolist": 1}  # the one check after step 7
    assert [bool(s) for s in skipped] == [s in poisoned for s in range(7)]  # the 8th step raised, at its check
    assert str(err.value) == ("3 optimizer steps in a row skipped for non-finite gradients (last at epoch 2 step 6, "
                              "scale 32; seen at the check after step 7); training is not recovering: lower train.lr "
                              "or use precision.mode=fp32")
    assert step_fn.skipped_total == 5


def test_skips_that_recover_before_the_check_are_counted_and_do_not_stop():
    model, x, y = _problem()
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-2), PRECISIONS["fp16"], max_skipped_steps=3,
                            scaler=torch.amp.GradScaler("cpu", init_scale=1024.0), check_every=10)
    for step in range(10):
        with PRECISIONS["fp16"].autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        step_fn(loss * float("nan") if step in (2, 3, 7) else loss, epoch=1, step=step)
    assert (step_fn.skipped_total, step_fn.skipped_in_row) == (3, 0)


# ---- a real loop on the session's Ray: no checkpoint holds the NaN --------------------------------


@pytest.fixture(scope="module")
def shards(stocknet_dir, tmp_path_factory):
    from alchemetric_ray.data.shards import build_shards

    out = tmp_path_factory.mktemp("syncfree") / "shards"
    cfg = load_config(None, [f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT"])
    return build_shards(cfg, out, progress=False).out


def test_a_nan_in_the_second_epoch_stops_the_run_before_its_report_and_no_checkpoint_holds_it(
        ray_session, shards, tmp_path, monkeypatch):
    from alchemetric_ray.data.loaders import read_split
    from alchemetric_ray.data.manifest import Manifest
    from alchemetric_ray.placement.plan import plan_resources
    from alchemetric_ray.training.trainer import Execution, build_trainer

    manifest = Manifest.read(shards)
    frame = read_split(shards, "train", columns=["date", "ticker", *manifest.features, "label", "fwd_ret"])
    rows = frame.limit(512).to_pandas()  # 8 batches of 64 an epoch
    real_make_loss = loop.make_loss
    calls = []

    def make_poisoned_loss(*args, **kwargs):  # the loop's loss, NaN at its 12th call: epoch 2, step 3
        real = real_make_loss(*args, **kwargs)

        def poisoned(out, y, date):
            calls.append(1)
            value = real(out, y, date)
            return value * float("nan") if len(calls) == 12 else value
        return poisoned

    monkeypatch.setattr(loop, "make_loss", make_poisoned_loss)
    saved = []  # every checkpoint the loop writes (Train's local mode: the loop runs in this process)
    real_save = loop.save_checkpoint

    def save_and_keep(directory, state, meta):
        saved.append((meta["epoch"], {k: v.clone() for k, v in state["model"].items()}))
        real_save(directory, state, meta)

    monkeypatch.setattr(loop, "save_checkpoint", save_and_keep)
    cfg = load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}", "model.name=mlp",
                             "model.hidden=16", "train.batch_size=64", "train.patience=0", "train.epochs=3",
                             "train.check_every=3", "device.name=cpu", "precision.mode=fp32"])
    plan = plan_resources(cfg, ray_session.cluster_resources())
    datasets = {"train": ray_session.data.from_pandas(rows), "val": ray_session.data.from_pandas(rows)}
    trainer = build_trainer(cfg, datasets, manifest, plan, name="nan-epoch-2",
                            execution=Execution(local_mode=True))
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit()
    message = str(err.value)
    assert message == ("non-finite loss (nan) at epoch 2 step 3 under fp32 with no GradScaler to skip it "
                       "(seen at the check after step 5); lower train.lr or check the data")
    assert len(calls) == 14  # stopped at the check after step 5: the epoch's last two steps never ran
    assert [epoch for epoch, _ in saved] == [0]  # the first epoch's checkpoint only: the second never reported
    assert all(torch.isfinite(t).all() for t in saved[0][1].values())


# ---- DDP: the verdict is a collective ------------------------------------------------------------


def _ddp_rank(rank: int, port: int, results) -> None:
    """One of two gloo ranks: DDP over a small model; rank 1's loss at step 2 is inf with finite
    gradients (a constant), so only rank 1's own flag goes up; both must stop at the check after step 3."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, 2)))
        step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), PRECISIONS["fp32"], check_every=4)
        x, y = torch.randn(32, FEATURES), torch.randint(0, 2, (32,))
        outcome = "no error"
        try:
            for step in range(8):
                loss = nn.functional.cross_entropy(model(x), y)
                if rank == 1 and step == 2:
                    loss = loss + torch.tensor(float("inf"))
                step_fn(loss, epoch=1, step=step)
        except NonFiniteLossError as exc:
            outcome = f"step {step}: {exc}"
        results.put((rank, outcome))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_under_ddp_a_nan_on_one_rank_stops_every_rank_at_the_same_check():
    from conftest import free_port

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_rank, args=(rank, port, results)) for rank in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got[1] == ("step 3: non-finite loss (inf) at epoch 1 step 2 under fp32 with no GradScaler to skip it "
                      "(seen at the check after step 3); lower train.lr or check the data")
    assert got[0] == ("step 3: non-finite loss or gradient on another rank under fp32 with no GradScaler to skip "
                      "it (seen at the check after epoch 1 step 3); lower train.lr or check the data")
