"""What a training worker iterates: its train and val shards in batches, streamed or cached.

A worker's shards come from Ray Data (``get_dataset_shard``, or the local runtime's iterators).
Either every epoch streams them (``train.cache_data=false``: a seeded windowed shuffle), or they
are read once, before the first epoch, and every epoch draws a permutation from a generator seeded
by (seed, epoch): the batch order then does not depend on Ray Data's scheduling, and a resumed run
sees exactly the batches of an uninterrupted one.  With the IC loss a batch holds whole dates
(:func:`date_batches`), each numbered for the loss on the host.

Where cached batches live (host memory, pinned staging, the GPU) is ``hardware.staging``'s call;
the loop only iterates :class:`WorkerBatches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, cast

import torch

from alchemetric_ray.data.loaders import Batch, concat_batches
from alchemetric_ray.hardware.staging import BatchSource, DataPath, choose_data_path, nbytes

SHUFFLE_WINDOW = 16  # batches mixed together when the training split is streamed
STREAM_WINDOW = 16  # batches Ray Data hands over at once to a stream in its own order
VAL_BATCHES = 4  # a cached validation batch is this many training batches


@dataclass(frozen=True)
class Batching:
    """How a worker cuts its rows into batches."""

    batch_size: int
    seed: int
    by_date: bool = False  # batches of whole dates (the IC loss; cached shards only: the config says so)

    def epoch_seed(self, epoch: int) -> int:
        return self.seed * 7919 + epoch


# ---- reading a shard -----------------------------------------------------------------------------


def stream(shard, batch_size: int, collate) -> Iterator[Batch]:
    """The shard's batches in Ray Data's order, as host tensors ("auto" would pick Ray's GPU, or
    cuda:0 in local mode whatever our device): the loop moves each batch to its own device.

    Ray Data hands them over STREAM_WINDOW at a time, sliced here into the same batches: its iterator
    costs ~0.7 ms a batch whatever the batch's size, a slice almost nothing (1M rows in batches of 4,096:
    0.50 s against 0.33 s for its blocks alone, measured 2026-12-06; ``bench/ingest.py``)."""
    for window in shard.iter_torch_batches(batch_size=STREAM_WINDOW * batch_size, collate_fn=collate,
                                           prefetch_batches=2, device="cpu"):
        for i in range(0, len(window[1]), batch_size):
            yield tuple(t[i:i + batch_size] for t in window)  # type: ignore[misc]  # the four tensors of a Batch


def shuffled_stream(shard, batch_size: int, collate, seed: int) -> Iterator[Batch]:
    """Local shuffle: windows of SHUFFLE_WINDOW batches, each permuted with a seeded generator.

    The same mixing as Ray Data's ``local_shuffle_buffer_size`` at a few batches' reach, at a
    fraction of its cost: one gather per window instead of a buffer concatenated and sampled for
    every batch (bench/PROFILE.md, "Streamed loop")."""
    generator = torch.Generator().manual_seed(seed)
    for batch in shard.iter_torch_batches(batch_size=SHUFFLE_WINDOW * batch_size, collate_fn=collate,
                                          prefetch_batches=1, device="cpu"):
        order = torch.randperm(len(batch[1]), generator=generator)
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            yield tuple(t[idx] for t in batch)


def read_all(shard, batch_size: int, collate) -> Batch:
    """Every row of the shard as one (x, y, date, fwd) tuple of host tensors (read a block at a time:
    ``batch_size`` is not needed, the rows are concatenated)."""
    return concat_batches(list(shard.iter_torch_batches(batch_size=None, collate_fn=collate, prefetch_batches=2,
                                                        device="cpu")))


def fingerprint(columns: Batch) -> float:
    """The sum of the features: which rows a rank holds, compared across ranks by the tests."""
    return float(columns[0].double().sum())


# ---- batches of whole dates ------------------------------------------------------------------------


def date_batches(dates: torch.Tensor, batch_size: int, seed: int, *,
                 shuffle: bool = True) -> list[tuple[torch.Tensor, list[int]]]:
    """Row indices of one epoch's batches of whole dates, each with the rows of each of its dates in
    turn (the IC loss's date numbering, made here on the host): the dates in an order drawn from
    ``seed`` (in date order without ``shuffle``), packed in turn into batches of at most ``batch_size``
    rows (a date wider than that alone in its batch)."""
    _, code = torch.unique(dates, return_inverse=True)
    n_dates = int(code.max()) + 1 if len(code) else 0
    generator = torch.Generator().manual_seed(seed)
    place = torch.empty(n_dates, dtype=torch.long)
    place[torch.randperm(n_dates, generator=generator) if shuffle else torch.arange(n_dates)] = torch.arange(n_dates)
    rows = torch.argsort(place[code], stable=True)  # rows grouped by date, dates in the seeded order
    sizes = torch.bincount(code, minlength=n_dates)[torch.argsort(place)].tolist()
    batches: list[tuple[torch.Tensor, list[int]]]
    held: list[int]
    batches, start, size, held = [], 0, 0, []
    for n in sizes:
        if size and size + n > batch_size:
            batches.append((rows[start:start + size], held))
            start, size, held = start + size, 0, []
        size += n
        held.append(n)
    if size:
        batches.append((rows[start:start + size], held))
    return batches


# ---- the one object the loop iterates ------------------------------------------------------------


@dataclass
class WorkerBatches:
    """A worker's train and val batches, from cached rows (``train``/``val``) or streamed shards.

    ``fewest``: the smallest of a count over the ranks (a collective under DDP), so that every rank
    takes as many date batches as the rank with the fewest (a few dates sit out an epoch, different
    ones each epoch)."""

    batching: Batching
    path: DataPath
    train: BatchSource | None = None  # (x, y, date, fwd) of every row, when cached
    val: BatchSource | None = None
    dates: torch.Tensor | None = None  # the cached training rows' dates, in host memory
    val_dates: torch.Tensor | None = None  # the cached validation rows' dates, in host memory
    shards: tuple | None = None  # (train shard, val shard, collate) when streamed
    fewest: Callable[[int], int] = lambda n: n
    rows_seen: int = 0  # training rows this rank holds (streamed: read in the last epoch)
    val_rows: int = 0  # validation rows this rank scored in the last pass
    fingerprint: float = 0.0
    val_fingerprint: float = 0.0
    _made: dict = field(default_factory=dict)  # the last epoch's date batches, made once

    @classmethod
    def streamed(cls, shards: tuple, batching: Batching, device: torch.device, *, sharers: int = 1,
                 fewest: Callable[[int], int] = lambda n: n) -> WorkerBatches:
        """The shards streamed every epoch (``train.cache_data=false``); ``shards``: (the train split's
        shard, the val split's, the collate function that makes their batches)."""
        path = choose_data_path(device, cached=False, shard_bytes=0, fraction=0.0, sharers=sharers)
        return cls(batching, path, shards=shards, fewest=fewest)

    @classmethod
    def read(cls, splits: tuple[Batch, Batch], batching: Batching, device: torch.device, *, fraction: float = 0.0,
             sharers: int = 1, fewest: Callable[[int], int] = lambda n: n) -> WorkerBatches:
        """Every row of both splits (train, val), read once (``train.cache_data``), put where the staging says."""
        train, val = splits
        path = choose_data_path(device, cached=True, shard_bytes=nbytes(train) + nbytes(val), fraction=fraction,
                                sharers=sharers)
        return cls.cached(train, val, batching, device, path, fewest=fewest)

    @classmethod
    def cached(cls, train: Batch, val: Batch | None, batching: Batching, device: torch.device, path: DataPath, *,
               fewest: Callable[[int], int] = lambda n: n) -> WorkerBatches:
        """Rows already read, put where ``path`` says."""
        return cls(batching, path,
                   train=BatchSource(train, device, path, max_rows=batching.batch_size),
                   val=None if val is None else BatchSource(val, device, path,
                                                            max_rows=VAL_BATCHES * batching.batch_size),
                   dates=train[2], val_dates=None if val is None else val[2], fewest=fewest,
                   rows_seen=len(train[1]), fingerprint=fingerprint(train),
                   val_fingerprint=0.0 if val is None else fingerprint(val))

    def steps_per_epoch(self, rows_estimate: int) -> int:
        if self.batching.by_date:
            return max(1, len(self.date_batches(0)))
        rows = self.train.rows if self.train is not None else rows_estimate
        return max(1, math.ceil(rows / self.batching.batch_size))

    def date_batches(self, epoch: int) -> list[tuple[torch.Tensor, list[int]]]:
        """This epoch's batches of whole dates, as many on every rank (made once per epoch)."""
        if epoch not in self._made:
            dates = cast(torch.Tensor, self.dates)  # batches of whole dates come from cached rows
            made = date_batches(dates, self.batching.batch_size, self.batching.epoch_seed(epoch))
            self._made = {epoch: made[:self.fewest(len(made))]}
        return self._made[epoch]

    def train_steps(self, epoch: int) -> Iterator[tuple[Batch, list[int] | None]]:
        """This epoch's training batches, each with the rows of each of its dates in turn when the
        batches hold whole dates (the IC loss), else None."""
        if self.batching.by_date:
            train = cast(BatchSource, self.train)  # cached rows, as date_batches says
            for idx, date_rows in self.date_batches(epoch):
                yield cast(Batch, train.take(idx)), date_rows  # the four columns it was given
            return
        for batch in self._rows(epoch):
            yield batch, None

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        return (batch for batch, _ in self.train_steps(epoch))

    def _rows(self, epoch: int) -> Iterator[Batch]:
        seed, size = self.batching.epoch_seed(epoch), self.batching.batch_size
        if self.train is None:
            train_shard, _, collate = cast(tuple, self.shards)  # streamed: no cached rows, so the shards
            count = 0
            for batch in shuffled_stream(train_shard, size, collate, seed):
                count += len(batch[1])
                yield batch
            self.rows_seen = count
            return
        order = torch.randperm(self.train.rows, generator=torch.Generator().manual_seed(seed))
        for i in range(0, len(order), size):
            yield cast(Batch, self.train.take(order[i:i + size]))  # the four columns it was given

    def val_batches(self, *, whole_dates: bool = False) -> Iterator[Batch]:
        """This rank's validation rows in batches: spans of the cached rows (or the streamed shard);
        ``whole_dates``: batches of whole dates (a cross-sectional model's; cached rows only), in date order."""
        self.val_rows = 0
        batches: Iterator[Batch]
        if whole_dates:
            val, dates = cast(BatchSource, self.val), cast(torch.Tensor, self.val_dates)
            batches = (cast(Batch, val.take(idx)) for idx, _ in
                       date_batches(dates, VAL_BATCHES * self.batching.batch_size, seed=0, shuffle=False))
        elif self.val is None:
            _, val_shard, collate = cast(tuple, self.shards)  # streamed: no cached rows, so the shards
            batches = stream(val_shard, self.batching.batch_size, collate)
        else:
            step = VAL_BATCHES * self.batching.batch_size
            batches = (cast(Batch, self.val.span(i, i + step)) for i in range(0, self.val.rows, step))
        for batch in batches:
            self.val_rows += len(batch[1])
            yield batch
