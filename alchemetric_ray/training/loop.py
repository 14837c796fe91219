"""The per-worker training loop run by Ray Train's TorchTrainer on every worker, and by a sweep's
one-worker trial in its own process.

What Ray gives the loop (rank and group size, dataset shards, prepare_model, report, the checkpoint
to resume from) comes from ``train/runtime.py``: a Train worker group or a Tune trial's process.
``run_loop`` reads top to bottom:

1. this worker's rank, device and precision (from the hardware package) and torch threads;
2. the model (DDP when world size > 1), moved to our device by us, and this worker's data shard;
3. AdamW with a cosine or one-cycle schedule; the loss (``train/losses.py``: cross-entropy, MSE or
   the per-date IC loss), computed in float32 outside autocast;
4. a restarted run resumes at the epoch after its latest checkpoint (``artifacts/checkpoint.py``);
5. each epoch: batches from this worker's Ray Data shard -> the shared optimizer step; with the IC
   loss, batches of whole dates (as many as ``train.batch_size`` rows hold) from the cached shard,
   each rank holding its own dates (``train/data_config.py``) and every rank taking as many steps.
   No step waits on the device: the step's verdicts (non-finite loss, skipped steps) and the
   epoch's loss stay there, read every ``train.check_every`` steps and at the epoch's end, before
   anything is validated, reported or checkpointed;
6. validation under no_grad: each rank scores its own part of the val split (disjoint parts that
   together hold every row once, ``train/data_config.py``); the outputs, labels, dates and forward
   returns are gathered to rank 0, which computes the target's metrics and the signal metrics (IC,
   rank IC per date); the early-stop decision is broadcast to every rank;
7. a report with the metrics and a checkpoint (rank 0 writes it).
"""

from __future__ import annotations

import functools
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from alchemetric_ray import console
from alchemetric_ray.artifacts.checkpoint import (
    CheckpointMeta,
    LoopState,
    Trainables,
    initial_weights,
    load_state,
    read_meta,
    save_checkpoint,
)
from alchemetric_ray.artifacts.run_folder import RunFolder
from alchemetric_ray.config import RunConfig, TrainConfig
from alchemetric_ray.data.batches import Batching, WorkerBatches
from alchemetric_ray.data.loaders import Batch, collate_for
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.hardware import (
    DeviceChoice,
    OptimizerStep,
    Precision,
    adamw,
    device_for_worker,
    resolve_precision,
)
from alchemetric_ray.hardware.device import on_reference
from alchemetric_ray.hardware.inventory import cpu_count
from alchemetric_ray.hardware.optimizer import fused_adamw_supported
from alchemetric_ray.hardware.staging import HOST, gpu_sharers
from alchemetric_ray.models import build_model, is_cross_sectional, model_spec
from alchemetric_ray.placement.plan import ResourcePlan
from alchemetric_ray.scoring.metrics import target_metrics
from alchemetric_ray.scoring.objective import is_better, loss_of, selection_metric, selection_mode
from alchemetric_ray.scoring.predictions import outputs_of
from alchemetric_ray.storage import locate
from alchemetric_ray.training.backend_check import BackendCheck, check_backend, forward
from alchemetric_ray.training.losses import DateGroups, Loss, make_loss
from alchemetric_ray.training.phases import PhaseLog
from alchemetric_ray.training.runtime import LocalRun, TrainGroup, TrialProcess
from alchemetric_ray.training.shadow import ShadowCheck, ShadowSettings, shadow_wanted
from alchemetric_ray.training.summary import LoopSummary


def train_loop_per_worker(config: dict[str, Any]) -> LoopSummary:
    """The ``TorchTrainer``'s loop: :func:`run_loop` as a Ray Train worker."""
    phases = PhaseLog()  # from here on, time and memory per phase (before this: Ray's start-up)
    folder = RunFolder(locate(config["run_dir"])) if config.get("run_dir") else None
    return run_loop(config, TrainGroup(folder, reader=config.get("reader")), phases)


def local_loop(config: dict[str, Any]) -> LoopSummary:
    """The ``TorchTrainer``'s loop in local mode: :func:`run_loop` in the driver, through its ``LocalRun``."""
    phases = PhaseLog()
    return run_loop(config, config["runtime"], phases)


def run_loop(config: dict[str, Any], runtime: TrainGroup | TrialProcess | LocalRun,
             phases: PhaseLog | None = None) -> LoopSummary:
    """The loop itself, wherever it runs (``runtime``); returns rank 0's summary of the run."""
    phases = phases or PhaseLog()
    console.quiet_worker()  # this worker's own Ray Data context and loggers: our lines only
    cfg = RunConfig.from_dict(config["run"])
    train_cfg, manifest = cfg.train, config["manifest"]
    worker = _place_worker(cfg, config["plan"], runtime)
    model, core, known = _model(cfg, manifest, worker, runtime)
    loss = loss_of(cfg)
    data = _batches(cfg, manifest, loss, worker, runtime, config["plan"])
    phases.mark("read")
    worker.say(f"worker {worker.rank}: data path {data.path}", detail=data.path.kind == HOST)
    trainables = _trainables(core, train_cfg, worker, data.steps_per_epoch(manifest.rows["train"] // worker.world))
    class_counts = manifest.class_counts.get("train") if train_cfg.class_weights else None
    loss_on = functools.partial(make_loss, loss, class_counts)  # the run's loss, on a device
    selection = Selection.of(cfg)
    metric = selection.metric
    shadow = _shadow(cfg, core, worker, trainables, known, loss_on)
    training = Training(model, trainables, loss_on(worker.device), data, worker, train_cfg.seed, known.micro_rows,
                        shadow, is_cross_sectional(core))

    state = _resume(trainables, worker, runtime, train_cfg.epochs)
    start_epoch = state.epoch + 1
    # The part of meta.json that stays the same every epoch (config, device, plan: what the tensors came from).
    meta = CheckpointMeta(config=cfg.to_dict(), manifest=manifest, device=worker.device_meta(),
                          precision=worker.precision.as_dict(), plan=config["plan"].as_dict(), world_size=worker.world,
                          known_bugs=known.as_dict())

    stopped_early = False
    for epoch in range(start_epoch, train_cfg.epochs):
        train_loss, samples_per_s, skipped = _train_epoch(training, epoch)
        phases.mark("train", epoch + 1)
        metrics, improved, stop = _validate_and_decide(core, data, state, worker, manifest, selection)
        phases.mark("validate", epoch + 1)
        state.epoch = epoch
        row = {"epoch": epoch + 1, "train_loss": train_loss, **_scalars(metrics), "samples_per_s": samples_per_s,
               "skipped_steps": skipped, "lr": trainables.scheduler.get_last_lr()[0], "improved": improved,
               **_shadow_row(shadow)}
        if worker.rank == 0:
            state.history.append(row)
        _report(row, trainables, meta.at(state, metrics), worker.rank, runtime)
        phases.mark("checkpoint", epoch + 1)
        # after the report: an epoch whose line was printed has its checkpoint (what a Ctrl-C keeps);
        # a sweep prints one line per finished trial instead (epoch_lines=False)
        worker.say(_epoch_line(row, train_cfg, metric, worker.device, worker.precision.mode),
                   detail=not config.get("epoch_lines", True))
        # Stop only after the report: the last epoch's checkpoint is what a resumed run continues from.
        ended, stopped_early = _ends_here(worker, train_cfg, epoch, start_epoch, stop, metric)
        if ended:
            break

    summary = _summary(worker, state, data, stopped_early, epochs_here=state.epoch + 1 - start_epoch, phases=phases)
    summary.known_bugs, summary.shadow = known.as_dict(), shadow.stats.as_dict() if shadow else None
    return summary


def _model(cfg: RunConfig, manifest, worker: _Worker, runtime: TrainGroup | TrialProcess | LocalRun):
    """The model on this worker's device (wrapped for DDP where the group has several), its plain
    module (whose keys checkpoints hold), and the known-bug table checked against this run (here:
    the driver in local mode, each worker otherwise), its findings said."""
    torch.manual_seed(cfg.train.seed)  # the same on every rank: DDP starts from identical weights
    model = build_model(cfg.model, len(manifest.features), manifest.outputs, window=cfg.features.window)
    if cfg.train.init_weights:  # a warm start (a resumed run's checkpoint, if any, replaces these weights)
        model.load_state_dict(initial_weights(cfg.train.init_weights, model, cfg.train.seed))
    model = runtime.prepare_model(model, worker.device)
    core = model.module if hasattr(model, "module") else model
    known = check_backend(cfg, len(manifest.features), manifest.outputs, worker.device, worker.precision,
                          world=worker.world, fused_optimizer=fused_adamw_supported(list(core.parameters())))
    for line in known.lines:
        worker.say(line)
    return model, core, known


def _batches(cfg: RunConfig, manifest, loss: str, worker: _Worker, runtime: TrainGroup | TrialProcess | LocalRun,
             plan: ResourcePlan) -> WorkerBatches:
    """This worker's shards of the train and val splits, batched (whole dates for the IC loss): read
    once (``train.cache_data``) or streamed every epoch."""
    train_cfg = cfg.train
    batching = Batching(train_cfg.batch_size, train_cfg.seed, by_date=loss == "ic")
    collate = collate_for(model_spec(cfg.model).inputs, manifest.features)
    sharers, fewest = gpu_sharers(plan.gpus_per_worker), lambda n: min(_gather_list(n, worker.world))
    if not train_cfg.cache_data:
        return WorkerBatches.streamed((runtime.shard("train"), runtime.shard("val"), collate), batching, worker.device,
                                      sharers=sharers, fewest=fewest)
    splits = cast(tuple[Batch, Batch], tuple(runtime.rows(split, batching.batch_size, collate)
                                             for split in ("train", "val")))  # (train, val)
    return WorkerBatches.read(splits, batching, worker.device, fraction=train_cfg.device_cache_fraction,
                              sharers=sharers, fewest=fewest)


def _ends_here(worker: _Worker, train_cfg: TrainConfig, epoch: int, start_epoch: int, stop: bool,
               metric: str) -> tuple[bool, bool]:
    """Whether the run ends after ``epoch`` (0-based), and whether that is an early stop; says why.
    ``train.stop_after`` ends this session after so many epochs; ``stop`` (patience ran out) ends the
    run, early unless this was the last epoch anyway."""
    if train_cfg.stop_after and epoch + 1 - start_epoch >= train_cfg.stop_after and epoch + 1 < train_cfg.epochs:
        worker.say(f"stopping after {train_cfg.stop_after} epoch(s) this session (train.stop_after); "
                   f"resume with the same storage.run to continue at epoch {epoch + 2}")
        return True, False
    if not stop:
        return False, False
    early = epoch + 1 < train_cfg.epochs
    if early:
        worker.say(f"early stop after epoch {epoch + 1}: no {metric} improvement for {train_cfg.patience} epoch(s)")
    return True, early


# ---- this worker --------------------------------------------------------------------------------


@dataclass
class _Worker:
    """This worker's place in the group and what it computes with."""

    rank: int
    world: int
    device_choice: DeviceChoice
    precision: Precision
    threads: int

    @property
    def device(self) -> torch.device:
        return self.device_choice.device

    def device_meta(self) -> dict[str, str]:
        return {"device": str(self.device), "reason": self.device_choice.reason}

    def say(self, message: str, *, detail: bool = False) -> None:
        """Rank 0's lines (forwarded to the driver by Ray); ``detail`` lines only with --verbose."""
        if self.rank == 0 and (not detail or console.verbose()):
            console.say(message)


@dataclass(frozen=True)
class Selection:
    """How the loop picks its best epoch and when patience runs out: the selection metric, its
    direction, the early-stop patience, and the long-short book's quantile the metrics use."""

    metric: str
    mode: str
    patience: int
    quantile: float

    @classmethod
    def of(cls, cfg: RunConfig) -> Selection:
        return cls(selection_metric(cfg), selection_mode(cfg), cfg.train.patience, cfg.signals.quantile)


@dataclass
class Training:
    """What an epoch trains with on this worker: the model (DDP-wrapped where the group has several
    workers), its optimizer and schedule, the loss, the batches, the worker, the run's seed, the
    known-bug micro-batch size (0: whole batches) and the shadow check (None: off)."""

    model: nn.Module
    trainables: Trainables
    loss_fn: Loss
    data: WorkerBatches
    worker: _Worker
    seed: int
    micro_rows: int = 0
    shadow: ShadowCheck | None = None
    cross_sectional: bool = False  # the model scores a date's stocks together: it gets each row's date code


def _place_worker(cfg: RunConfig, plan: ResourcePlan, runtime: TrainGroup | TrialProcess | LocalRun) -> _Worker:
    """Rank, device, precision and torch threads of this worker, announced with their reasons."""
    # The driver's plan chose the kind of device for the whole group; each worker takes its own one of that kind.
    device_choice = device_for_worker(plan.worker_device, source=f"the resource plan: {plan.reasons.accelerator}")
    precision = resolve_precision(cfg.precision.mode, device_choice.device, model=model_spec(cfg.model),
                                  tf32=cfg.precision.tf32)
    precision.apply_tf32_settings()
    # Workers on one node share its cores: left alone, each one's torch would start a thread per core.
    threads = cfg.scaling.threads_per_worker or max(1, cpu_count() // max(1, runtime.local_world))
    torch.set_num_threads(threads)
    worker = _Worker(runtime.rank, runtime.world, device_choice, precision, threads)
    worker.say(f"worker {worker.rank}/{worker.world}: device {device_choice}; precision {precision}; "
               f"torch threads {threads}", detail=True)
    return worker


# ---- data ---------------------------------------------------------------------------------------


# ---- one epoch ----------------------------------------------------------------------------------


def _trainables(core: nn.Module, train_cfg: TrainConfig, worker: _Worker, steps_per_epoch: int) -> Trainables:
    """AdamW (fused where the device has it: ``hardware.adamw``), its learning-rate schedule (stepped
    every batch) and the precision's optimizer step, which reads its verdicts every ``train.check_every`` steps."""
    optimizer = adamw(core.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    schedule = _schedule(train_cfg.schedule, train_cfg.epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    step_fn = OptimizerStep(optimizer, worker.precision, grad_clip=train_cfg.grad_clip,
                            max_skipped_steps=train_cfg.max_skipped_steps, check_every=train_cfg.check_every)
    return Trainables(core, optimizer, scheduler, step_fn)


def _shadow(cfg: RunConfig, core: nn.Module, worker: _Worker, trainables: Trainables, known: BackendCheck,
            loss_on: Callable[[torch.device], Loss]) -> ShadowCheck | None:
    """The in-run shadow check (``train/shadow.py``) where ``train.shadow`` wants it on this device;
    ``loss_on``: the run's loss on a given device (the worker's, and the CPU copy's)."""
    if not shadow_wanted(cfg.train.shadow, worker.device):
        return None
    every = cfg.train.shadow_every
    worker.say(f"shadow check on: {worker.device} {worker.precision.mode} against a float32 CPU copy, "
               + (f"every {every} steps" if every else "adaptive (at most 5% of the step time)"))
    return ShadowCheck(core, worker.precision, (loss_on(worker.device), loss_on(torch.device("cpu"))), worker.device,
                       ShadowSettings(every, known.micro_rows, known.hint(), worker.world, worker.rank),
                       scaler=trainables.step.scaler)


def _shadow_row(shadow: ShadowCheck | None) -> dict[str, Any]:
    """The epoch's shadow figures for its report row (and TensorBoard): checks so far, the epoch's largest error."""
    if shadow is None:
        return {}
    row = {"shadow_checks": shadow.stats.checks, "shadow_max_error": shadow.stats.epoch_max_error}
    shadow.stats.epoch_max_error = 0.0
    return row


def _train_epoch(training: Training, epoch: int) -> tuple[float, float, int]:
    """One pass over this rank's training batches: the mean loss over the ranks, samples per second,
    and the steps a GradScaler skipped so far (this rank's).  ``training.micro_rows``: each batch
    forwarded in micro-batches (``train/backend_check.py``); ``training.shadow``: the shadow check, run
    before the steps it picks.

    Nothing in the pass reads the device: the loss of the steps taken is summed there, and read
    with the step's verdicts in the epoch's last check, which raises (on every rank alike) if a
    step went non-finite, before anything is validated, reported or checkpointed."""
    model, trainables, loss_fn, data, worker, shadow = (training.model, training.trainables, training.loss_fn,
                                                        training.data, training.worker, training.shadow)
    model.train()
    # Dropout draws from (seed, epoch, rank): a resumed run draws what an uninterrupted one would have.
    torch.manual_seed(training.seed * 1_000_003 + epoch * 1009 + worker.rank)
    loss_sum = torch.zeros((), device=worker.device)
    taken = torch.zeros((), device=worker.device)
    seen, started = 0, time.perf_counter()
    if shadow is not None:
        shadow.epoch_started()
    for step, ((host_x, host_y, date, _), date_rows) in enumerate(data.train_steps(epoch)):
        x, y = host_x.to(worker.device, non_blocking=True), host_y.to(worker.device, non_blocking=True)
        dates = (DateGroups.from_sizes(date_rows, worker.device) if date_rows is not None
                 else date.to(worker.device, non_blocking=True))
        if shadow is not None and shadow.due():
            cpu_dates = DateGroups.from_sizes(date_rows) if date_rows is not None else on_reference(date)
            shadow((x, y, dates), (on_reference(host_x), on_reference(host_y), cpu_dates), epoch=epoch + 1, step=step)
        code = dates.code if training.cross_sectional and isinstance(dates, DateGroups) else None
        with worker.precision.autocast():
            out = forward(model, x, training.micro_rows, code)
        loss = loss_fn(out, y, dates)  # float32, outside autocast
        outcome = trainables.step(loss, epoch=epoch + 1, step=step)  # epochs from 1 in its messages
        trainables.scheduler.step()
        kept = ~outcome.skipped  # a skipped step's loss is inf/NaN: not part of the epoch's mean
        loss_sum += torch.where(kept, loss.detach().float(), 0.0)
        taken += kept
        seen += len(y)
    skipped_so_far = trainables.step.skipped_steps()
    total, count, skipped = trainables.step.check(
        loss_sum, taken, skipped_so_far if skipped_so_far is not None else torch.zeros((), device=worker.device))
    train_seconds = time.perf_counter() - started  # after the check's read: every step has run on the device
    train_loss = total / count if count else float("nan")
    samples_per_s = _sum_over_ranks(seen, worker.world) / max(train_seconds, 1e-9)
    return _sum_over_ranks(train_loss, worker.world) / worker.world, samples_per_s, int(skipped)


def _validate_and_decide(core: nn.Module, data: WorkerBatches, state: LoopState, worker: _Worker, manifest: Manifest,
                         selection: Selection) -> tuple[dict[str, Any], bool, bool]:
    """Validate, and decide together: (metrics, improved, stop); the metrics on rank 0 only.

    Each rank scores its own part of the validation split (the parts are disjoint and together
    complete, so their sizes may differ) with the plain module, not DDP, whose forward could wait
    on collectives a rank with fewer batches never joins.  Rank 0 scores the gathered predictions
    and updates ``state.best`` and ``state.bad_epochs``; its decision is broadcast, so that every
    rank stops at the same epoch.
    """
    cross = is_cross_sectional(core)  # a date's stocks scored together: batches of whole dates
    outputs, labels, dates, fwd = _gather(_predict(core, data.val_batches(whole_dates=cross), worker.device,
                                                   worker.precision, manifest.regression, manifest.rows["val"]),
                                          worker.world)
    metrics: dict[str, Any] = {}
    decision = [False, False, state.best]
    if worker.rank == 0:
        metrics = target_metrics(outputs, labels, fwd, dates, manifest.classes, prefix="val_",
                                 quantile=selection.quantile)
        value = metrics[selection.metric]
        improved = is_better(value, state.best, selection.mode)
        state.best = value if improved else state.best
        state.bad_epochs = 0 if improved else state.bad_epochs + 1
        decision = [bool(selection.patience) and state.bad_epochs >= selection.patience, improved, state.best]
    stop, improved, state.best = _broadcast(decision, worker.world)
    return metrics, bool(improved), stop


def _resume(trainables: Trainables, worker: _Worker, runtime: TrainGroup | TrialProcess | LocalRun,
            epochs: int) -> LoopState:
    """The latest checkpoint's tensors and loop state, which Ray Train (or Tune) hands back after a
    failure or when storage.run names an earlier run; a fresh state when there is none."""
    checkpoint = runtime.latest_checkpoint()
    if checkpoint is None:
        return LoopState()
    with checkpoint.as_directory() as ckpt_dir:
        trainables.load_state_dict(load_state(ckpt_dir))
        state = CheckpointMeta.from_dict(read_meta(ckpt_dir)).loop_state()
    folder = str(checkpoint.path).rstrip("/").rpartition("/")[2]  # epoch-NNNN, or Tune's checkpoint_NNNNNN
    rest = f"continuing at epoch {state.epoch + 2} of {epochs}" if state.epoch + 1 < epochs else \
        f"all {epochs} epoch(s) done, none trained again"
    worker.say(f"resumed from the checkpoint of epoch {state.epoch + 1} ({folder}): {rest}")
    return state


def _report(row: dict[str, Any], trainables: Trainables, meta: CheckpointMeta, rank: int,
            runtime: TrainGroup | TrialProcess | LocalRun) -> None:
    """Every rank reports the epoch (Ray Train waits for them all); rank 0 alone attaches the checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:
            save_checkpoint(tmp, trainables.state_dict(meta.epoch), meta.to_dict())
        runtime.report(row, tmp if rank == 0 else None, f"epoch-{meta.epoch:04d}")


def _summary(worker: _Worker, state: LoopState, data: WorkerBatches, stopped_early: bool, *,
             epochs_here: int, phases: PhaseLog) -> LoopSummary:
    """What ``fit()`` returns (rank 0's): the run's history and, per rank, what it ran and read."""
    return LoopSummary(
        history=state.history,
        best=state.best,
        stopped_early=stopped_early,
        epochs_run=len(state.history),
        device=str(worker.device),
        device_reason=worker.device_choice.reason,
        precision=worker.precision.as_dict(),
        threads=worker.threads,
        world_size=worker.world,
        epochs_per_rank=_gather_list(epochs_here, worker.world),
        node_ids=_gather_list(_node_id(), worker.world),
        rows=_gather_list(data.rows_seen, worker.world),
        fingerprint=_gather_list(data.fingerprint, worker.world),
        val_rows=_gather_list(data.val_rows, worker.world),  # validation rows each rank scored (last epoch)
        val_fingerprint=_gather_list(data.val_fingerprint, worker.world),
        data_path=_gather_list(str(data.path), worker.world),  # where each rank's batches came from
        phases=phases.records,  # rank 0's time and memory per phase (train/phases.py)
    )


# ---- helpers ------------------------------------------------------------------------------------


@torch.no_grad()
def _predict(model, batches, device, precision, regression: bool, capacity: int) -> tuple[np.ndarray, ...]:
    """(outputs, labels, dates, forward returns) of this rank's validation rows, written batch by batch
    into arrays made once for ``capacity`` rows (the split's: pages never written are never resident),
    not gathered in lists and concatenated, which held everything twice at the end."""
    model.eval()
    held: list[np.ndarray] = []
    rows = 0
    cross = is_cross_sectional(model)
    for x, y, date, fwd in batches:
        with precision.autocast():
            x = x.to(device, non_blocking=True)
            raw = model(x, date.to(device, non_blocking=True)) if cross else model(x)
        # .cpu(): the device path's batches live on the GPU
        values = [t.cpu().numpy() for t in (outputs_of(raw, regression), y, date, fwd)]
        n = len(values[1])
        if not held:
            held = [np.empty((max(capacity, n), *v.shape[1:]), v.dtype) for v in values]
        elif rows + n > len(held[1]):  # more rows than the split was said to hold: grow, twice the rows
            held = [np.concatenate([h[:rows], np.empty((rows + 2 * n, *h.shape[1:]), h.dtype)]) for h in held]
        for h, v in zip(held, values):
            h[rows:rows + n] = v
        rows += n
    if not rows:
        return (np.zeros((0, 0), np.float32), np.zeros(0, np.float32 if regression else np.int64),
                np.zeros(0, np.int64), np.zeros(0, np.float32))
    return tuple(h[:rows] for h in held)


def _gather(arrays: tuple[np.ndarray, ...], world: int) -> tuple[np.ndarray, ...]:
    """Every rank's arrays, concatenated on rank 0 in rank order (ranks with no rows left out)."""
    if world == 1:
        return arrays
    parts: list = [None] * world
    torch.distributed.all_gather_object(parts, arrays)
    parts = [p for p in parts if len(p[1])]
    return tuple(np.concatenate(column) for column in zip(*parts))


def _gather_list(value, world: int) -> list:
    if world == 1:
        return [value]
    parts: list = [None] * world
    torch.distributed.all_gather_object(parts, value)
    return parts


def _broadcast(values: list, world: int) -> list:
    if world > 1:
        torch.distributed.broadcast_object_list(values, src=0)
    return values


def _sum_over_ranks(value: float, world: int) -> float:
    return float(sum(_gather_list(value, world))) if world > 1 else float(value)


def _schedule(kind: str, total_steps: int):
    total = max(1, total_steps)

    def cosine(step: int) -> float:
        return 0.5 * (1 + math.cos(math.pi * min(step, total) / total))

    def onecycle(step: int) -> float:
        warm = max(1, int(0.3 * total))
        if step < warm:
            return 0.1 + 0.9 * step / warm
        return 0.5 * (1 + math.cos(math.pi * min(step - warm, total - warm) / max(1, total - warm))) + 1e-3

    return {"cosine": cosine, "onecycle": onecycle, "constant": lambda step: 1.0}[kind]


def _epoch_line(row: dict, train_cfg: TrainConfig, metric: str, device, precision_mode: str) -> str:
    shown = {k: row[k] for k in ("val_accuracy", "val_balanced_accuracy", "val_log_loss", "val_mse", "val_rank_ic")
             if k in row}
    if metric in row and metric not in shown:
        shown[metric] = row[metric]
    vals = "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
    mark = " *" if row.get("improved") else ""
    return (f"epoch {row['epoch']}/{train_cfg.epochs}  train_loss {row['train_loss']:.4f}  {vals}  "
            f"{row['samples_per_s']:,.0f} samples/s  {device} {precision_mode}{mark}")


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics a report row takes: numbers only (the confusion matrix stays in the checkpoint's meta.json)."""
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}


def _node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
