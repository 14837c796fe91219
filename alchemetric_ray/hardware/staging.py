"""How a worker's cached batches reach its device: kept on the device, pinned staging, or plain host.

With ``train.cache_data`` a worker holds its shard in memory and draws every batch from it by
index.  On a CUDA device that can go three ways, chosen once per worker by :func:`choose_data_path`:

* **device** -- the whole cached shard (train and val) is copied to the GPU once, when it needs at
  most ``train.device_cache_fraction`` of the device's free memory, divided by the workers that
  share the GPU (fractional ``scaling.gpus_per_worker``).  Batches are then gathered on the GPU and
  nothing crosses the bus while training.
* **pinned** -- otherwise the shard stays in host memory and each batch is gathered with
  ``torch.index_select(..., out=...)`` into one of two page-locked staging buffers, taken in turn,
  then copied with ``non_blocking=True``.  Indexing a pinned tensor (``x_pinned[idx]``) returns
  ordinary pageable memory, whose copy cannot overlap anything: the gather must write into the pinned
  buffer itself.  A buffer is reused only after the copy out of it has finished (a CUDA event per
  buffer), so the CPU gathers batch k+1 while the GPU still trains on batch k.
* **host** -- every other case (CPU, MPS, a streamed shard): the batch is indexed from host memory
  and moved as it always was.

The driver's plan states the rule (:func:`planned_data_path`); each worker states what it chose and
why, with the figures (``DataPath.reason``).  Free memory is read by :func:`device_free_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from alchemetric_ray.hardware.kinds import kind_of_device

Columns = tuple[torch.Tensor, ...]
DEVICE, PINNED, HOST = "device", "pinned", "host"


@dataclass(frozen=True)
class DataPath:
    kind: str  # DEVICE | PINNED | HOST
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.reason})"


def device_free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` where torch can say (CUDA), else None."""
    return kind_of_device(device).free_memory(device)


def gpu_sharers(gpus_per_worker: float) -> int:
    """Workers that share one GPU: 1 for a whole GPU or more per worker, else 1 // the fraction."""
    return max(1, int(1 // gpus_per_worker)) if 0 < gpus_per_worker < 1 else 1


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def planned_data_path(worker_device: str, *, cached: bool, fraction: float, sharers: int) -> str:
    """The rule the workers of a plan will follow, in words (the plan's ``data path`` line)."""
    if not cached:
        return "streamed from Ray Data (train.cache_data=false): each batch is moved to the device as it comes"
    if not kind_of_device(worker_device).device_cache:
        return "the cached shard stays in host memory; batches are indexed there"
    if fraction <= 0:
        return "pinned staging: train.device_cache_fraction=0 keeps the cached shard in host memory"
    return (f"the cached shard on the GPU when it needs at most {fraction:g} x the GPU's free memory / "
            f"{sharers} worker(s) per GPU, else pinned staging (decided on each worker, which says which)")


def choose_data_path(device: torch.device, *, cached: bool, shard_bytes: int, fraction: float, sharers: int,
                     free_memory: Callable[[torch.device], int | None] = device_free_memory) -> DataPath:
    """Where this worker's cached shard lives and how its batches reach ``device``."""
    if not cached:
        return DataPath(HOST, "streamed from Ray Data")
    if not kind_of_device(device).device_cache:
        return DataPath(HOST, f"{device.type} trains from host memory")
    if fraction <= 0:
        return DataPath(PINNED, "train.device_cache_fraction=0")
    free = free_memory(device)
    if free is None:
        return DataPath(PINNED, "the device's free memory is unknown")
    budget = fraction * free / sharers
    figures = f"{_mib(shard_bytes)} vs {fraction:g} x {_mib(free)} free / {sharers} worker(s) = {_mib(budget)}"
    if shard_bytes <= budget:
        return DataPath(DEVICE, f"the cached shard fits: {figures}")
    return DataPath(PINNED, f"the cached shard does not fit on the device: {figures}")


def nbytes(columns: Sequence[torch.Tensor]) -> int:
    return sum(t.element_size() * t.nelement() for t in columns)


def _pin(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory()


class BatchSource:
    """Batches of a cached shard on ``device`` along ``path``: ``take(idx)`` for a batch of rows by
    index (training), ``span(start, stop)`` for a contiguous run (validation).

    ``pin`` turns a host tensor into a page-locked one (``Tensor.pin_memory``; a test passes its own,
    since pinning raises where there is no accelerator).  Batches of the pinned path alias the two
    staging buffers: a batch stays valid until the second ``take``/``span`` after it, which is why a
    consumer must be done with a batch before asking for the one after the next (the loop is).
    """

    def __init__(self, columns: Columns, device: torch.device, path: DataPath, *, max_rows: int,
                 pin: Callable[[torch.Tensor], torch.Tensor] = _pin):
        self.device, self.path = device, path
        self.rows = len(columns[0]) if columns else 0
        if path.kind == DEVICE:
            self.columns = tuple(t.to(device) for t in columns)
        else:
            self.columns = columns
        self._buffers: list[Columns] = []
        self._copied: list = [None, None]  # per buffer: the event recorded after the copy out of it
        self._turn = 0
        if path.kind == PINNED:
            rows = min(max_rows, self.rows)
            self._buffers = [tuple(pin(torch.empty((rows, *t.shape[1:]), dtype=t.dtype)) for t in columns)
                             for _ in range(2)]

    def take(self, idx: torch.Tensor) -> Columns:
        if self.path.kind == DEVICE:
            idx = idx.to(self.device, non_blocking=True)
            return tuple(t.index_select(0, idx) for t in self.columns)
        if self.path.kind == HOST:
            return tuple(t[idx] for t in self.columns)
        return self._stage(len(idx), lambda src, out: torch.index_select(src, 0, idx, out=out))

    def span(self, start: int, stop: int) -> Columns:
        if self.path.kind != PINNED:
            return tuple(t[start:stop] for t in self.columns)
        return self._stage(min(stop, self.rows) - start, lambda src, out: out.copy_(src[start:stop]))

    def _stage(self, n: int, fill: Callable[[torch.Tensor, torch.Tensor], object]) -> Columns:
        capacity = len(self._buffers[0][0])
        if n > capacity:
            raise ValueError(f"a batch of {n} rows is larger than the staging buffers ({capacity} rows)")
        turn, self._turn = self._turn, 1 - self._turn
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()  # the GPU has read this buffer's last batch
        batch = []
        for src, buffer in zip(self.columns, self._buffers[turn]):
            staged = buffer[:n]
            fill(src, staged)
            batch.append(staged.to(self.device, non_blocking=True))
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._copied[turn] = event
        return tuple(batch)
