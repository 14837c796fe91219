"""Checkpoints: a tensors-only state file plus JSON metadata, each written atomically.

``state.pt`` holds only tensors and plain containers (model, optimizer, scaler, scheduler state)
and is always loaded with ``torch.load(weights_only=True)``: a crafted pickle cannot run code.
``meta.json`` holds everything else: the whole run config, epoch, metrics, device and precision
with their reasons, versions, machine, git commit and the feature manifest.

This module reads and writes a local folder and the objects a checkpoint restores:
``Trainables`` (what ``state.pt`` holds), ``LoopState`` (what the loop carries from epoch to
epoch) and ``CheckpointMeta`` (``meta.json``).  Fetching and reporting checkpoints through Ray
Train is ``train/loop.py``'s part.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import atomic_torch_save, atomic_write_json

if TYPE_CHECKING:
    from alchemetric_ray.hardware import OptimizerStep

STATE = "state.pt"
META = "meta.json"


class CheckpointError(UserError, RuntimeError):
    pass


def save_checkpoint(directory: str | Path, state: dict[str, Any], meta: dict[str, Any]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(state, directory / STATE)
    atomic_write_json(directory / META, meta)  # written last: a checkpoint with meta is complete


def load_state(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / STATE
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {STATE} (not a checkpoint, or an incomplete one)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError for crafted files, RuntimeError for truncated ones
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: refused to load ({type(exc).__name__}: {first[:200]})") from None


def read_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / META
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {META} (not a checkpoint, or an incomplete one)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: not valid JSON") from None


def checkpoint_problem(directory: str | Path) -> str | None:
    """Why the checkpoint in ``directory`` is incomplete (one phrase), or None when it is complete."""
    directory = Path(directory)
    if not (directory / META).is_file():
        return f"no {META}"
    if not (directory / STATE).is_file():
        return f"no {STATE}"
    try:
        read_meta(directory)
    except CheckpointError:
        return f"{META} is not valid JSON"
    return None


@lru_cache(maxsize=1)
def _environment() -> tuple:
    import ray

    from alchemetric_ray.hardware.inventory import cpu_model

    return (("torch", torch.__version__), ("ray", ray.__version__), ("python", platform.python_version()),
            ("os", platform.platform()), ("cpu", cpu_model()), ("host", platform.node()), ("git_commit", git_commit()))


def environment_meta() -> dict[str, Any]:
    """Versions, OS, CPU and git commit: where a checkpoint came from (read once per process)."""
    return dict(_environment())


def git_commit() -> str | None:
    here = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


# ---- what a training checkpoint restores ---------------------------------------------------------


@dataclass
class LoopState:
    """What the training loop carries from one epoch to the next besides tensors; a resumed run
    starts from the saved one, so early stopping and the history continue where they were."""

    epoch: int = -1  # the last finished epoch (-1: none yet)
    best: float | None = None  # the best value of train.metric so far
    bad_epochs: int = 0  # epochs since train.metric last improved (rank 0 counts them)
    history: list[dict[str, Any]] = field(default_factory=list)  # each epoch's report row (rank 0)


@dataclass
class Trainables:
    """The objects whose tensors ``state.pt`` holds: saved together, restored together."""

    model: torch.nn.Module  # the plain module, not DDP's wrapper: its keys load into an exported model
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: OptimizerStep  # its GradScaler: a resumed fp16 run continues at the loss scale it had reached

    def state_dict(self, epoch: int) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.step.scaler.state_dict(),
                "epoch": torch.tensor(epoch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from alchemetric_ray.hardware import load_optimizer_state

        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])  # fused or not as built here, whatever it was
        self.scheduler.load_state_dict(state["scheduler"])
        self.step.scaler.load_state_dict(state["scaler"])


@dataclass
class CheckpointMeta:
    """``meta.json``: where a checkpoint's tensors came from.  Its keys are the file's keys, which
    the export, a resumed run and the sweep read."""

    config: dict[str, Any]  # the whole run config
    manifest: Manifest  # the feature shards' manifest: the columns the model was trained on
    device: dict[str, Any]  # {"device": ..., "reason": ...}
    precision: dict[str, Any]  # Precision.as_dict(), reason included
    plan: dict[str, Any]  # ResourcePlan.as_dict()
    world_size: int
    epoch: int = -1
    metrics: dict[str, Any] = field(default_factory=dict)  # the epoch's validation metrics
    loop: dict[str, Any] = field(default_factory=dict)  # the LoopState less its epoch: best, bad_epochs, history
    environment: dict[str, Any] = field(default_factory=environment_meta)

    def at(self, state: LoopState, metrics: dict[str, Any]) -> CheckpointMeta:
        """This run's metadata for the epoch ``state`` has just finished."""
        loop = {"best": state.best, "bad_epochs": state.bad_epochs, "history": state.history}
        return replace(self, epoch=state.epoch, metrics=metrics, loop=loop)

    def loop_state(self) -> LoopState:
        return LoopState(self.epoch, self.loop["best"], self.loop["bad_epochs"], self.loop["history"])

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "manifest": self.manifest.to_dict()}

    @classmethod
    def from_dict(cls, meta: dict[str, Any]) -> CheckpointMeta:
        missing = [f.name for f in fields(cls) if f.name not in meta]
        if missing:
            raise CheckpointError(f"checkpoint metadata without {', '.join(missing)} (not written by a training run)")
        return cls(**{**{f.name: meta[f.name] for f in fields(cls)}, "manifest": Manifest.from_dict(meta["manifest"])})
