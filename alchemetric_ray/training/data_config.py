"""How the datasets reach the Train workers: train split evenly, validation complete.

Ray Train's ``DataConfig`` splits every dataset with ``streaming_split(n, equal=True)``, which
drops rows so that every rank gets the same count.  Training needs that (DDP ranks must take the
same number of steps), validation does not: there every row must be scored exactly once, or a
split of 1001 rows is scored on 1000 and the metrics that pick the best epoch are off.  So the
train split keeps Ray's equal split and every other dataset is split with ``equal=False``: the
ranks get disjoint parts that together are the whole dataset (one rank may get fewer rows, or
none), which the loop gathers to rank 0.  A single worker needs no split at all: it reads every
dataset through its own iterator, which spares Ray one coordinator actor per dataset.

With the IC loss (``by_date``) the train split is split by *date*, not by row: a correlation
across a date's stocks needs all of them on one rank.  Each rank reads the split and keeps the
dates whose day number modulo the world size is its rank; the loop then evens out the step
counts.  A cross-sectional model (``val_by_date``) scores a date's stocks together, so the validation
split is split by date as well: the same disjoint, complete parts, each date whole on one rank.
"""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
from ray.train import DataConfig

EQUAL_SPLIT = ("train",)


class CompleteValidationConfig(DataConfig):
    """``DataConfig`` with ``train`` split equally and every other dataset split completely."""

    def __init__(self, execution_options=None, *, by_date: bool = False, val_by_date: bool = False):
        super().__init__(datasets_to_split="all", execution_options=execution_options)
        self._options, self._by_date, self._val_by_date = execution_options, by_date, val_by_date

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        if world_size == 1:
            return [{name: self._whole(name, ds) for name, ds in datasets.items()}]
        by_date = {name for name in datasets if (name in EQUAL_SPLIT and self._by_date)
                   or (name not in EQUAL_SPLIT and self._val_by_date)}
        equal = {name: ds for name, ds in datasets.items() if name in EQUAL_SPLIT and name not in by_date}
        output = super().configure(equal, world_size, worker_handles, worker_node_ids, **kwargs)
        output = output or [{} for _ in range(world_size)]
        for name in by_date:
            for rank in range(world_size):
                part = self._prepared(name, datasets[name]).map_batches(DatesOfRank(rank, world_size),
                                                                        batch_format="pyarrow")
                output[rank][name] = part.iterator()
        for name, ds in datasets.items():
            if name in EQUAL_SPLIT or name in by_date:
                continue
            ds = self._prepared(name, ds)
            for rank, part in enumerate(ds.streaming_split(world_size, equal=False, locality_hints=worker_node_ids)):
                output[rank][name] = part
        return output

    def _prepared(self, name, ds):
        if ds.name is None:
            ds.set_name(name)
        ds = ds.copy(ds)
        ds.context.execution_options = copy.deepcopy(self._options or self.default_ingest_options())
        return ds

    def _whole(self, name, ds):
        # One worker reads every row of every dataset: its own iterator, executed in the worker,
        # instead of a one-way split whose coordinator is one more Ray actor per dataset.
        return self._prepared(name, ds).iterator()


class DatesOfRank:
    """A Ray Data batch function: the rows of the dates that belong to ``rank`` (day number modulo
    the world size)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def __call__(self, table: pa.Table) -> pa.Table:
        days = table.column("date").to_numpy().astype("datetime64[D]").astype(np.int64)
        return table.filter(pa.array(days % self.world == self.rank))
