"""Where the per-worker loop takes its place, its data and its reports from.

The loop (``train/loop.py``) runs in one of two places, and asks the same five things of each:
its rank and group size, a dataset shard by name, the checkpoint to resume from, a report of an
epoch (with rank 0's checkpoint), and its model made ready for the group.

- :class:`TrainGroup`: a worker of a Ray Train ``TorchTrainer`` (``train``, and sweeps whose
  trials have several workers): Ray Train's context, shards, checkpoints and ``prepare_model``.
- :class:`TrialProcess`: a sweep's one-worker trial runs the loop in the Tune trial's own process,
  which holds the worker's resources (CPU, GPU).  A ``TorchTrainer`` there would start six more
  processes per trial (controller, worker, dataset manager and Train's helpers) to run a single
  worker; each imports Ray and most import torch, which on a laptop is most of a short trial
  (``bench/PROFILE.md``, section 5).  Reports and checkpoints go to Tune itself (its
  ``report``/``get_checkpoint``: kept, ranked and restored by Tune's checkpoint config), and the
  datasets are read through the same ``CompleteValidationConfig`` as a one-worker Train run.
"""

from __future__ import annotations

import logging
from typing import Any

from alchemetric_ray import console


class TrainGroup:
    """The loop as a Ray Train worker."""

    def __init__(self) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.local_world = ctx.get_local_world_size()

    def shard(self, name: str):
        import ray.train

        return ray.train.get_dataset_shard(name)

    def latest_checkpoint(self):
        import ray.train

        return ray.train.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        """Every rank reports (Ray Train waits for them all); ``checkpoint_dir`` from rank 0 alone."""
        import ray.train

        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)

    def prepare_model(self, model, device):
        import ray.train.torch

        # Our device, not Ray Train's pick: the resolver also knows MPS and a cuda:N asked for by name.
        return ray.train.torch.prepare_model(model, move_to_device=device,
                                             parallel_strategy="ddp" if self.world > 1 else None)


class TrialProcess:
    """The loop in a one-worker Tune trial's own process: rank 0 of 1."""

    rank, world, local_world = 0, 1, 1

    def __init__(self, datasets: dict[str, Any], data_config) -> None:
        if not console.verbose():  # Tune's storage says "Checkpoint successfully created at ..." every epoch
            logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
        # the one-worker branch of the DataConfig a TorchTrainer would use: each dataset whole,
        # through its own iterator, with the run's execution options
        self._shards = data_config.configure(datasets, world_size=1, worker_handles=None, worker_node_ids=None)[0]

    def shard(self, name: str):
        return self._shards[name]

    def latest_checkpoint(self):
        import ray.tune

        return ray.tune.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        """Tune copies the checkpoint to the trial's storage before this returns (its own folder names)."""
        import ray.tune

        checkpoint = ray.tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.tune.report(metrics, checkpoint=checkpoint)

    def prepare_model(self, model, device):
        return model.to(device)
