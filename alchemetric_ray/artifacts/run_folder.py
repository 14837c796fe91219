"""A run's folder as the product keeps it: ``<storage.path>/<run>/epoch-NNNN/`` checkpoints.

Ray Train writes this layout for a worker group's reports; a local-mode run (``train/runtime.py``:
``LocalRun``) writes it itself, so both read the same way afterwards:

* a checkpoint is complete once its ``meta.json`` (written last) is there and its ``state.pt``
  passes :func:`~alchemetric_ray.artifacts.checkpoint.checkpoint_problem`; an incomplete one (a write
  cut short by Ctrl-C, a full disk or a killed process) is skipped with a one-line warning;
* ``storage.num_to_keep`` applies as Ray Train applies it: the best checkpoints by the selection
  metric are kept, and the latest one always;
* :meth:`RunFolder.latest` is what ``--resume`` continues from, also where Ray Train's own snapshot
  (``checkpoint_manager_snapshot.json``, written behind the reports) missed the newest folders.

Folder names count epochs from 0 (``epoch-0009`` holds the tenth epoch); messages for people count
from 1 and name the folder too (``epoch 10 (epoch-0009)``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from alchemetric_ray.artifacts.checkpoint import META, checkpoint_problem, latest_complete_checkpoint
from alchemetric_ray.storage import Location

PREFIX = "epoch-"
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it keeps


def folder_name(epoch: int) -> str:
    """The checkpoint folder of the 0-based ``epoch``."""
    return f"{PREFIX}{epoch:04d}"


def epoch_label(epoch: int) -> str:
    """How a message names the 0-based ``epoch``: ``epoch 10 (epoch-0009)``."""
    return f"epoch {epoch + 1} ({folder_name(epoch)})"


@dataclass(frozen=True)
class Kept:
    """One complete checkpoint in the folder: its epoch (0-based) and its report row (the loop's
    history row of that epoch with its validation metrics), as Ray Train ranks them."""

    location: Location
    epoch: int
    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)  # the report rows of every epoch up to this one

    @classmethod
    def read(cls, where: Location) -> Kept:
        """The complete checkpoint at ``where``, from its ``meta.json``: the epoch (the folder's number
        where the file has none), the history, and that epoch's row with the validation metrics over it.
        Keys a checkpoint written before them lacks read as empty: it still ranks and resumes."""
        data = json.loads((where / META).read_text())
        epoch = int(data.get("epoch", _epoch_of(where.name)))
        history = list((data.get("loop") or {}).get("history", []))
        row: dict[str, Any] = next((h for h in history if h.get("epoch") == epoch + 1), {})  # epochs from 1
        return cls(where, epoch, {**row, **(data.get("metrics") or {}), "epoch": epoch + 1}, history)

    def checkpoint(self):
        """As a ``ray.train.Checkpoint`` (what the loop restores from and the export reads)."""
        from ray.train import Checkpoint

        where = self.location
        return Checkpoint(where.path, filesystem=None if where.is_local else where.filesystem)


class RunFolder:
    """The epoch checkpoints under ``where``, ranked by ``metric`` (``mode``: max or min)."""

    def __init__(self, where: Location, *, keep: int = 0, metric: str | None = None, mode: str = "max"):
        self.where, self.keep, self.metric, self.mode = where, keep, metric, mode
        self._whole: set[str] = set()  # folders found complete (or written) here: not hashed again each epoch

    def checkpoints(self) -> list[Kept]:
        """The complete checkpoints, oldest first."""
        names = sorted(self.where.listing(f"{PREFIX}*", folders=True), key=_epoch_of)
        return [self._kept(self.where / name) for name in names if self._complete(name)]

    def _complete(self, name: str) -> bool:
        if name not in self._whole and checkpoint_problem(self.where / name) is None:
            self._whole.add(name)
        return name in self._whole

    def latest(self, *, warn: bool = True) -> Kept | None:
        """The newest complete checkpoint (what ``--resume`` continues from), or None; each newer
        incomplete one is skipped with a one-line warning naming it and the one used instead
        (:func:`~alchemetric_ray.artifacts.checkpoint.latest_complete_checkpoint`)."""
        if not warn:
            kept = self.checkpoints()
            return kept[-1] if kept else None
        found = latest_complete_checkpoint(self.where)
        return self._kept(self.where / Path(str(found[0])).name) if found else None

    def _kept(self, where: Location) -> Kept:
        return Kept.read(where)

    def best(self) -> Kept | None:
        """The best complete checkpoint by the metric (the latest where none has it)."""
        ranked = self._ranked(self.checkpoints())
        return ranked[0] if ranked else self.latest(warn=False)

    def save(self, checkpoint_dir: str | Path, epoch: int) -> Location:
        """Put the finished local checkpoint folder in place as ``epoch-NNNN`` (whole or not at all:
        a staged folder swapped in, ``meta.json`` uploaded last on object storage), then prune."""
        target = self.where / folder_name(epoch)
        with target.staged(last=(META,)) as stage:
            for item in Path(checkpoint_dir).iterdir():
                shutil.copy2(item, stage / item.name)
        self._whole.discard(target.name)  # a folder of that name from before (a resumed epoch) was replaced
        self.prune()
        return target

    def prune(self) -> list[str]:
        """Delete what ``storage.num_to_keep`` does not keep (the best by the metric, and the latest);
        incomplete folders older than the latest complete one go too.  A folder Ray Train's snapshot
        lists is Ray's to prune: its controller refuses to resume a run whose listed checkpoints are
        gone.  Returns the deleted names."""
        if self.keep <= 0:
            return []
        kept = self.checkpoints()
        if not kept:
            return []
        keep = {k.location.name for k in self._ranked(kept)[:self.keep]} | {kept[-1].location.name}
        keep |= self._listed_by_ray()
        newest = kept[-1].epoch
        doomed = [k.location for k in kept if k.location.name not in keep]
        doomed += [self.where / name for name in self.where.listing(f"{PREFIX}*", folders=True)
                   if _epoch_of(name) < newest and name not in keep and checkpoint_problem(self.where / name)]
        for where in doomed:
            where.filesystem.delete_dir(where.path)
            self._whole.discard(where.name)
        return [w.name for w in doomed]

    def _listed_by_ray(self) -> set[str]:
        """The checkpoint folders Ray Train's ``checkpoint_manager_snapshot.json`` names (none in a
        local-mode run's folder)."""
        snapshot = self.where / RAY_SNAPSHOT
        if not snapshot.is_file():
            return set()
        try:
            state = json.loads(snapshot.read_text())
        except (ValueError, OSError):
            return set()
        results = [*state.get("checkpoint_results", []), state.get("latest_checkpoint_result") or {}]
        return {r["checkpoint_dir_name"] for r in results if isinstance(r, dict) and r.get("checkpoint_dir_name")}

    def _ranked(self, kept: list[Kept]) -> list[Kept]:
        scored = [k for k in kept if self.metric and isinstance(k.metrics.get(self.metric), (int, float))]
        sign = -1 if self.mode == "max" else 1
        metric = cast(str, self.metric)  # cast: scored is empty unless a metric is set
        return sorted(scored, key=lambda k: (sign * k.metrics[metric], k.epoch))  # a tie: the first to reach it


def _epoch_of(name: str) -> int:
    try:
        return int(name[len(PREFIX):])
    except ValueError:
        return -1
