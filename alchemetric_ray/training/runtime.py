"""Where the per-worker loop takes its place, its data and its reports from.

The loop (``train/loop.py``) runs in one of three places, and asks the same five things of each:
its rank and group size, a dataset shard by name, the checkpoint to resume from, a report of an
epoch (with rank 0's checkpoint), and its model made ready for the group.

- :class:`TrainGroup`: a worker of a Ray Train ``TorchTrainer`` (``train``, and sweeps whose
  trials have several workers): Ray Train's context, shards, checkpoints and ``prepare_model``; a group of
  one worker that caches its shards reads them itself with pyarrow (no Ray Data to start).
- :class:`TrialProcess`: a sweep's one-worker trial runs the loop in the Tune trial's own process,
  which holds the worker's resources (CPU, GPU).  A ``TorchTrainer`` there would start six more
  processes per trial (controller, worker, dataset manager and Train's helpers) to run a single
  worker; each imports Ray and most import torch, which on a laptop is most of a short trial
  (``bench/PROFILE.md``, section 5).  Reports and checkpoints go to Tune itself (its
  ``report``/``get_checkpoint``: kept, ranked and restored by Tune's checkpoint config), and the
  shards are read whole with pyarrow where the trial caches them, else streamed through the same
  ``CompleteValidationConfig`` as a one-worker Train run.
- :class:`LocalRun`: a one-worker ``train`` on this machine runs the loop in the driver's own
  process (``TorchTrainer``'s local mode, ``ScalingConfig(num_workers=0)``): no controller, worker
  group or Train helper process to start.  Local mode keeps checkpoints in memory only, ignores the
  dataset config and runs no callbacks; this runtime supplies them: the shards (read whole with
  pyarrow where the run caches them, ``data/loaders.py:ShardReader``, so that no Ray needs to start;
  else configured as a one-worker Train run configures them), each report's checkpoint put in the
  run folder in Ray Train's layout (``artifacts/run_folder.py``: atomically, ranked and pruned by the
  selection metric), the TensorBoard scalars, and the checkpoint to resume from read from disk.

Each gives a split's rows read whole (``rows``, for a cached shard) or its shard to stream (``shard``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from alchemetric_ray import console
from alchemetric_ray.data.batches import read_all
from alchemetric_ray.interrupts import held_during

if TYPE_CHECKING:
    from alchemetric_ray.artifacts.run_folder import RunFolder
    from alchemetric_ray.data.loaders import Batch, ShardReader
    from alchemetric_ray.tracking.tensorboard import ScalarWriter


class _Runtime:
    reader: ShardReader | None = None  # a one-worker run's cached shards, read in its process with pyarrow

    def shard(self, name: str):
        raise NotImplementedError

    def rows(self, name: str, batch_size: int, collate) -> Batch:
        """Every row of the split ``name``, read once: with a ``reader`` (no Ray Data) here with pyarrow, in the
        files' order; else from this runtime's shard."""
        if self.reader is not None:
            return self.reader.rows(name)
        return read_all(self.shard(name), batch_size, collate)


class TrainGroup(_Runtime):
    """The loop as a Ray Train worker; ``folder``: the run's folder, where a checkpoint newer than
    the one Ray Train's snapshot names may lie (the snapshot is written behind the reports)."""

    def __init__(self, folder: RunFolder | None = None, reader: ShardReader | None = None) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.local_world = ctx.get_local_world_size()
        self.folder, self.reader = folder, reader

    def shard(self, name: str):
        import ray.train

        return ray.train.get_dataset_shard(name)

    def latest_checkpoint(self):
        """Ray Train's checkpoint to resume from, or a newer complete one in the run folder (after a
        Ctrl-C or a killed driver the snapshot can miss the last epochs' folders)."""
        import ray.train

        handed = ray.train.get_checkpoint()
        kept = self.folder.latest() if self.folder is not None and handed is not None else None
        if kept is not None and kept.location.name > handed.path.rstrip("/").rpartition("/")[2]:
            return kept.checkpoint()
        return handed

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


class _OneWorker(_Runtime):
    """Rank 0 of 1, in a process of ours: the datasets as a one-worker Train run reads them."""

    rank, world, local_world = 0, 1, 1

    def __init__(self, datasets: dict[str, Any] | None, data_config, *, reader: ShardReader | None = None) -> None:
        # the one-worker branch of the DataConfig a TorchTrainer would use: each dataset whole,
        # through its own iterator, with the run's execution options
        self._shards = {} if datasets is None else \
            data_config.configure(datasets, world_size=1, worker_handles=None, worker_node_ids=None)[0]
        self.reader = reader

    def shard(self, name: str):
        return self._shards[name]

    def prepare_model(self, model, device):
        return model.to(device)


class TrialProcess(_OneWorker):
    """The loop in a one-worker Tune trial's own process."""

    def __init__(self, datasets: dict[str, Any] | None, data_config, *, reader: ShardReader | None = None) -> None:
        if not console.verbose():  # Tune's storage says "Checkpoint successfully created at ..." every epoch
            logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
        super().__init__(datasets, data_config, reader=reader)

    def latest_checkpoint(self):
        import ray.tune

        return ray.tune.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        """Tune copies the checkpoint to the trial's storage before this returns (its own folder names)."""
        import ray.tune

        checkpoint = ray.tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.tune.report(metrics, checkpoint=checkpoint)


class LocalRun(_OneWorker):
    """The loop in the driver's process: its checkpoints in ``folder``, its scalars in ``scalars``."""

    def __init__(self, datasets: dict[str, Any] | None, data_config, folder: RunFolder, scalars: ScalarWriter | None,
                 *, reader: ShardReader | None = None) -> None:
        super().__init__(datasets, data_config, reader=reader)
        self.folder, self.scalars = folder, scalars

    def latest_checkpoint(self):
        """The newest complete checkpoint in the run folder (as Ray Train, a run whose folder holds
        checkpoints continues from them; a fresh run's timestamped folder holds none)."""
        kept = self.folder.latest()
        return kept.checkpoint() if kept else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        """The checkpoint into the run folder (before this returns: the loop deletes its folder), then
        the scalars.  A Ctrl-C meanwhile waits until the checkpoint is in place, then ends the run:
        an epoch whose report began is kept whole."""
        with held_during():
            if checkpoint_dir:
                self.folder.save(checkpoint_dir, int(metrics["epoch"]) - 1)  # folders by index: epoch-0000 is epoch 1
            if self.scalars is not None:
                self.scalars.write(metrics)
