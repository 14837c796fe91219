"""The per-worker training loop run by Ray Train's TorchTrainer on every worker.

The only module that calls Ray Train's per-worker API (context, dataset shards, prepare_model,
report, checkpoints).  It reads top to bottom:

1. device and precision from the hardware package; torch threads from the resource plan;
2. the model (DDP when world size > 1), moved to our device by us;
3. AdamW with a cosine or one-cycle schedule, optional class weights;
4. each epoch: batches from this worker's Ray Data shard -> the shared optimizer step;
5. validation under no_grad with scikit-learn metrics: each rank scores its own part of the val
   split (disjoint parts that together hold every row once, ``train/data_config.py``), predictions
   gathered to rank 0, the early-stop decision broadcast to every rank;
6. ``ray.train.report`` with the metrics and a checkpoint (rank 0 writes it);
7. a restarted run resumes at the epoch after its latest checkpoint.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from alchemetric_ray import console
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.loaders import collate_for
from alchemetric_ray.hardware import OptimizerStep, device_for_worker, resolve_precision
from alchemetric_ray.hardware.inventory import cpu_count
from alchemetric_ray.models import build_model, model_spec
from alchemetric_ray.train.checkpoint import environment_meta, load_state, read_meta, save_checkpoint
from alchemetric_ray.train.metrics import classification_metrics, is_better, selection_mode


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train
    import ray.train.torch

    console.quiet_worker()  # this worker's own Ray Data context and loggers: our lines only
    cfg = RunConfig.from_dict(config["run"])
    manifest, plan = config["manifest"], config["plan"]
    ctx = ray.train.get_context()
    rank, world, local_world = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_world_size()
    t = cfg.train

    # 1. device, precision, threads ------------------------------------------------------------
    device_choice = device_for_worker(plan["worker_device"],
                                      source=f"the resource plan: {plan['reasons']['accelerator']}")
    device = device_choice.device
    precision = resolve_precision(cfg.precision.mode, device, model=model_spec(cfg.model), tf32=cfg.precision.tf32)
    precision.apply_matmul_settings()
    threads = cfg.scaling.threads_per_worker or max(1, cpu_count() // max(1, local_world))
    torch.set_num_threads(threads)
    _say(rank, f"worker {rank}/{world}: device {device_choice}; precision {precision}; torch threads {threads}",
         detail=True)

    # 2. model ---------------------------------------------------------------------------------
    features, classes = manifest["features"], manifest["label"]["classes"]
    mode = model_spec(cfg.model.name).inputs
    torch.manual_seed(t.seed)  # identical initial weights on every rank
    model = build_model(cfg.model, len(features), len(classes), window=cfg.features.window)
    model = ray.train.torch.prepare_model(model, move_to_device=device, parallel_strategy="ddp" if world > 1 else None)
    core = model.module if hasattr(model, "module") else model

    # 3. optimizer, schedule, loss -------------------------------------------------------------
    data = _ShardData(ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("val"),
                      collate_for(mode, features), t.batch_size, t.cache_data, t.deterministic, t.seed, rank)
    steps_per_epoch = data.steps_per_epoch(manifest["rows"]["train"] // world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(t.schedule, t.epochs * steps_per_epoch))
    step_fn = OptimizerStep(optimizer, precision, grad_clip=t.grad_clip, max_skipped_steps=t.max_skipped_steps)
    weights = _class_weights(manifest["class_counts"]["train"]) if t.class_weights else None
    loss_fn = nn.CrossEntropyLoss(weight=weights.to(device) if weights is not None else None)

    # 7. resume --------------------------------------------------------------------------------
    start_epoch, best, bad_epochs, history = 0, None, 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            state, meta = load_state(ckpt_dir), read_meta(ckpt_dir)
        core.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step_fn.scaler.load_state_dict(state["scaler"])
        start_epoch = meta["epoch"] + 1
        best, bad_epochs, history = meta["loop"]["best"], meta["loop"]["bad_epochs"], meta["loop"]["history"]
        _say(rank, f"resumed from the checkpoint of epoch {meta['epoch']}: continuing at epoch {start_epoch}")

    stopped_early, epochs_here, val_rows = False, 0, 0
    for epoch in range(start_epoch, t.epochs):
        epochs_here += 1
        # 4. train one epoch -------------------------------------------------------------------
        model.train()
        torch.manual_seed(t.seed * 1_000_003 + epoch * 1009 + rank)  # dropout: same stream after a resume
        losses, seen, started = [], 0, time.perf_counter()
        for step, (x, y) in enumerate(data.train_batches(epoch)):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with precision.autocast():
                loss = loss_fn(model(x), y)
            outcome = step_fn(loss, epoch=epoch, step=step)
            scheduler.step()
            if not outcome.skipped:  # a skipped step's loss is inf/NaN: not part of the epoch's mean
                losses.append(loss.detach())
            seen += len(y)
        train_seconds = time.perf_counter() - started
        train_loss = float(torch.stack(losses).float().mean()) if losses else float("nan")

        # 5. validate, gather to rank 0, decide together ----------------------------------------
        # Each rank scores its own part of the validation split (the parts are disjoint and together
        # complete, so their sizes may differ): the plain module, not DDP, whose forward could wait
        # on collectives a rank with fewer batches never joins.
        y_val, p_val = _predict(core, data.val_batches(), device, precision)
        val_rows = len(y_val)
        y_val, p_val = _gather(y_val, p_val, world)
        metrics: dict[str, Any] = {}
        decision = [False, False, best]
        if rank == 0:
            metrics = classification_metrics(y_val, p_val, prefix="val_")
            value = metrics[t.metric]
            improved = is_better(value, best, selection_mode(t))
            best = value if improved else best
            bad_epochs = 0 if improved else bad_epochs + 1
            stop = bool(t.patience) and bad_epochs >= t.patience
            decision = [stop, improved, best]
        decision = _broadcast(decision, world)
        stop, improved, best = decision

        # 6. report with a checkpoint ----------------------------------------------------------
        samples_per_s = _sum_over_ranks(seen, world) / max(train_seconds, 1e-9)
        scalars = {k: v for k, v in metrics.items() if not isinstance(v, list)}
        row = {"epoch": epoch, "train_loss": _sum_over_ranks(train_loss, world) / world, **scalars,
               "samples_per_s": samples_per_s, "skipped_steps": step_fn.skipped_total,
               "lr": scheduler.get_last_lr()[0], "improved": bool(improved)}
        if rank == 0:
            history.append(row)
            # a sweep prints one line per finished trial instead (epoch_lines=False)
            _say(rank, _epoch_line(row, t, device_choice.device, precision.mode, cfg.train.metric),
                 detail=not config.get("epoch_lines", True))
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                state = {"model": core.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "scaler": step_fn.scaler.state_dict(),
                         "epoch": torch.tensor(epoch)}
                meta = _meta(cfg, manifest, epoch, metrics, device_choice, precision, plan,
                             {"best": best, "bad_epochs": bad_epochs, "history": history}, world)
                save_checkpoint(tmp, state, meta)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(row, checkpoint=ckpt, checkpoint_dir_name=f"epoch-{epoch:04d}")
        if t.stop_after and epoch + 1 - start_epoch >= t.stop_after and epoch + 1 < t.epochs:
            _say(rank, f"stopping after {t.stop_after} epoch(s) this session (train.stop_after); "
                       f"resume with the same storage.run to continue at epoch {epoch + 2}")
            break
        if stop:
            stopped_early = epoch + 1 < t.epochs
            _say(rank, f"early stop after epoch {epoch}: no {t.metric} improvement for {t.patience} epoch(s)")
            break

    return {
        "history": history,
        "best": best,
        "stopped_early": stopped_early,
        "epochs_run": len(history),
        "device": str(device_choice.device),
        "device_reason": device_choice.reason,
        "precision": precision.as_dict(),
        "threads": threads,
        "world_size": world,
        "epochs_per_rank": _gather_list(epochs_here, world),
        "node_ids": _gather_list(_node_id(), world),
        "rows": _gather_list(data.rows_seen, world),
        "fingerprint": _gather_list(data.fingerprint, world),
        "val_rows": _gather_list(val_rows, world),  # validation rows each rank scored (last epoch)
        "val_fingerprint": _gather_list(data.val_fingerprint, world),
    }


# ---- data ---------------------------------------------------------------------------------------


SHUFFLE_WINDOW = 16  # batches mixed together when the training split is streamed


class _ShardData:
    """This worker's train/val batches: streamed from Ray Data, or cached in memory after one read.

    With the cache, the shard is read once (before the first epoch) and every epoch draws a
    permutation from a generator seeded by (seed, epoch), so the batch order does not depend on
    Ray Data's scheduling and a resumed run sees exactly the batches of an uninterrupted one.
    """

    def __init__(self, train_shard, val_shard, collate, batch_size: int, cache: bool, deterministic: bool,
                 seed: int, rank: int):
        self.train_shard, self.val_shard, self.collate = train_shard, val_shard, collate
        self.batch_size, self.cache, self.deterministic, self.seed, self.rank = batch_size, cache, deterministic, seed, rank
        self._train: tuple[torch.Tensor, torch.Tensor] | None = None
        self._val: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rows_seen = 0
        self.fingerprint = self.val_fingerprint = 0.0  # sums of the cached features: which rows a rank holds
        if cache:
            self._train = self._read_all(self.train_shard)
            self._val = self._read_all(self.val_shard)
            self.rows_seen = len(self._train[1])
            self.fingerprint = float(self._train[0].double().sum())
            self.val_fingerprint = float(self._val[0].double().sum())

    def _stream(self, shard, shuffle_seed: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if shuffle_seed is None:
            # Host tensors ("auto" would pick Ray's GPU, or cuda:0 in local mode whatever our device):
            # the loop moves each batch to the device it resolved.
            return shard.iter_torch_batches(batch_size=self.batch_size, collate_fn=self.collate, prefetch_batches=2,
                                            device="cpu")
        return self._shuffled_stream(shard, shuffle_seed)

    def _shuffled_stream(self, shard, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Local shuffle: windows of SHUFFLE_WINDOW batches, each permuted with a seeded generator.

        The same mixing as Ray Data's ``local_shuffle_buffer_size`` at a few batches' reach, at a
        fraction of its cost: one gather per window instead of a buffer concatenated and sampled
        for every batch (bench/PROFILE.md, "Streamed loop")."""
        generator = torch.Generator().manual_seed(seed)
        window = SHUFFLE_WINDOW * self.batch_size
        for x, y in shard.iter_torch_batches(batch_size=window, collate_fn=self.collate, prefetch_batches=1,
                                             device="cpu"):
            order = torch.randperm(len(y), generator=generator)
            for i in range(0, len(order), self.batch_size):
                idx = order[i:i + self.batch_size]
                yield x[idx], y[idx]

    def _read_all(self, shard) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for x, y in self._stream(shard, None):
            xs.append(x.contiguous())
            ys.append(y)
        if not ys:
            return torch.zeros(0), torch.zeros(0, dtype=torch.long)
        return torch.cat(xs), torch.cat(ys)

    def steps_per_epoch(self, rows_estimate: int) -> int:
        rows = len(self._train[1]) if self._train is not None else rows_estimate
        return max(1, math.ceil(rows / self.batch_size))

    def train_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        seed = self.seed * 7919 + epoch
        if self._train is None:
            count = 0
            for x, y in self._stream(self.train_shard, seed):
                count += len(y)
                yield x, y
            self.rows_seen = count
            return
        x_all, y_all = self._train
        order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(seed))
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            yield x_all[idx], y_all[idx]

    def val_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._val is None:
            yield from self._stream(self.val_shard, None)
            return
        x_all, y_all = self._val
        step = 4 * self.batch_size
        for i in range(0, len(y_all), step):
            yield x_all[i:i + step], y_all[i:i + step]


# ---- helpers ------------------------------------------------------------------------------------


@torch.no_grad()
def _predict(model, batches, device, precision) -> tuple[np.ndarray, np.ndarray]:
    model.eval()
    ys, ps = [], []
    for x, y in batches:
        with precision.autocast():
            logits = model(x.to(device, non_blocking=True))
        ps.append(torch.softmax(logits.float(), dim=1).cpu().numpy())
        ys.append(y.cpu().numpy())
    if not ys:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(ys), np.concatenate(ps)


def _gather(y: np.ndarray, p: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray]:
    if world == 1:
        return y, p
    parts: list = [None] * world
    torch.distributed.all_gather_object(parts, (y, p))
    parts = [(py, pp) for py, pp in parts if len(py)]
    return np.concatenate([py for py, _ in parts]), np.concatenate([pp for _, pp in parts])


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


def _class_weights(counts: list[int]) -> torch.Tensor:
    c = torch.tensor(counts, dtype=torch.float32).clamp(min=1)
    return c.sum() / (len(c) * c)


def _meta(cfg, manifest, epoch, metrics, device_choice, precision, plan, loop_state, world) -> dict:
    return {
        "epoch": epoch,
        "config": cfg.to_dict(),
        "metrics": metrics,
        "device": {"device": str(device_choice.device), "reason": device_choice.reason},
        "precision": precision.as_dict(),
        "plan": plan,
        "world_size": world,
        "environment": environment_meta(),
        "manifest": manifest,
        "loop": loop_state,
    }


def _epoch_line(row: dict, t, device, precision_mode: str, metric: str) -> str:
    shown = {k: row[k] for k in ("val_accuracy", "val_balanced_accuracy", "val_log_loss") if k in row}
    if metric in row and metric not in shown:
        shown[metric] = row[metric]
    vals = "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
    mark = " *" if row.get("improved") else ""
    return (f"epoch {row['epoch'] + 1}/{t.epochs}  train_loss {row['train_loss']:.4f}  {vals}  "
            f"{row['samples_per_s']:,.0f} samples/s  {device} {precision_mode}{mark}")


def _node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _say(rank: int, message: str, *, detail: bool = False) -> None:
    """Rank 0's lines (forwarded to the driver by Ray); ``detail`` lines only with --verbose."""
    if rank == 0 and (not detail or console.verbose()):
        console.say(message)
