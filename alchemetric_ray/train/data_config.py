"""How the datasets reach the Train workers: train split evenly, validation complete.

Ray Train's ``DataConfig`` splits every dataset with ``streaming_split(n, equal=True)``, which
drops rows so that every rank gets the same count.  Training needs that (DDP ranks must take the
same number of steps), validation does not: there every row must be scored exactly once, or a
split of 1001 rows is scored on 1000 and the metrics that pick the best epoch are off.  So the
train split keeps Ray's equal split and every other dataset is split with ``equal=False``: the
ranks get disjoint parts that together are the whole dataset (one rank may get fewer rows, or
none), which the loop gathers to rank 0.  A single worker needs no split at all: it reads every
dataset through its own iterator, which spares Ray one coordinator actor per dataset.
"""

from __future__ import annotations

import copy

from ray.train import DataConfig

EQUAL_SPLIT = ("train",)


class CompleteValidationConfig(DataConfig):
    """``DataConfig`` with ``train`` split equally and every other dataset split completely."""

    def __init__(self, execution_options=None):
        super().__init__(datasets_to_split="all", execution_options=execution_options)
        self._options = execution_options

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        if world_size == 1:
            return [{name: self._whole(name, ds) for name, ds in datasets.items()}]
        equal = {name: ds for name, ds in datasets.items() if name in EQUAL_SPLIT}
        output = super().configure(equal, world_size, worker_handles, worker_node_ids, **kwargs)
        for name, ds in datasets.items():
            if name in EQUAL_SPLIT:
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
