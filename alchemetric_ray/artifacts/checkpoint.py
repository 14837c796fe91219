"""Checkpoints: a tensors-only state file plus JSON metadata, each written atomically.

``state.pt`` holds only tensors and plain containers (model, optimizer, scaler, scheduler state)
and is always loaded with ``torch.load(weights_only=True)``: a crafted pickle cannot run code.
``meta.json`` holds everything else: the whole run config, epoch, metrics, device and precision
with their reasons, versions, machine, git commit and the feature manifest, and the size and
sha256 of ``state.pt`` (``state_file``).  It is written last, so a folder with a ``meta.json``
whose record matches its ``state.pt`` is a whole checkpoint (:func:`checkpoint_problem`): a save
killed between the two files, a full disk or a copy cut short (Ray's upload of a checkpoint to
``storage.path``) leaves one that does not match, and :func:`latest_complete_checkpoint` skips it.

This module reads and writes a local folder and the objects a checkpoint restores:
``Trainables`` (what ``state.pt`` holds), ``LoopState`` (what the loop carries from epoch to
epoch) and ``CheckpointMeta`` (``meta.json``).  Fetching and reporting checkpoints through Ray
Train is ``train/loop.py``'s part.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import CheckpointError, StorageError
from alchemetric_ray.fsutil import WrittenFile, atomic_write_bytes, check_free_space, json_bytes, torch_bytes
from alchemetric_ray.storage import Location, locate

if TYPE_CHECKING:
    from alchemetric_ray.hardware import OptimizerStep

STATE = "state.pt"
META = "meta.json"
STATE_FILE = "state_file"  # meta.json's record of state.pt: {"size": bytes, "sha256": hex digest}
EPOCH_DIR = re.compile(r"epoch-(\d+)")  # a Train run's checkpoint folders (train/loop.py names them)
META_ROOM = 4096  # bytes beyond meta.json's size without its record: the record, and some slack


def save_checkpoint(directory: str | Path, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """``state.pt`` then ``meta.json`` (with ``state.pt``'s size and sha256), each atomically.

    Both are serialized first and the folder's free space checked for the two together, so a full
    disk is refused (one ``fsutil.DiskFullError`` line) before either file is touched; a disk that
    fills between the two leaves the old ``meta.json``, whose record no longer matches."""
    directory = Path(directory)
    data = torch_bytes(state)
    check_free_space(directory / STATE, len(data) + len(json_bytes(meta)) + META_ROOM)  # no empty folder left
    directory.mkdir(parents=True, exist_ok=True)
    written = atomic_write_bytes(directory / STATE, data)
    # written last: a checkpoint with meta is complete
    atomic_write_bytes(directory / META, json_bytes({**meta, STATE_FILE: written.as_dict()}))


def initial_weights(model_dir: str | Path, model: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """A warm start's tensors: the weights of the saved model in ``model_dir`` (``weights.pt``, loaded
    with ``weights_only=True``) that fit ``model``; a seed ensemble's member ``seed`` mod its size
    (each seed of a new ensemble starts from its own member).  Refused in one line where they do not fit."""
    path = Path(model_dir) / "weights.pt"
    if not path.is_file():
        raise CheckpointError(f"train.init_weights={model_dir}: not a saved model folder (no weights.pt)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    except Exception as exc:
        raise CheckpointError(f"{path}: refused to load ({type(exc).__name__})") from None
    members = sorted({int(k.split(".")[1]) for k in state if k.startswith("members.")})
    if members and not any(k.startswith("members.") for k in model.state_dict()):
        prefix = f"members.{members[seed % len(members)]}."
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    mine = model.state_dict()
    wrong = sorted(set(mine) ^ set(state)) or [k for k in mine if mine[k].shape != state[k].shape]
    if wrong:
        k = wrong[0]
        found = f"{tuple(state[k].shape)} there, {tuple(mine[k].shape)} here" if k in state and k in mine else \
            ("missing there" if k in mine else "not in this model")
        raise CheckpointError(f"train.init_weights={model_dir}: its weights do not fit this run's model (tensor "
                              f"{k}: {found}); a warm start needs the same model settings and features")
    return state


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


def checkpoint_problem(directory: str | Path | Location) -> str | None:
    """Why the checkpoint folder ``directory`` (local or on object storage) is not a whole checkpoint,
    in a few words for a one-line message; None where it is.

    Whole: ``meta.json`` parses, ``state.pt`` exists, and its size and sha256 are those that
    ``meta.json`` records.  A ``meta.json`` without the record (written before it existed) is taken
    on ``state.pt`` being there.  Reads ``state.pt`` once, in chunks, for its sha256."""
    where = locate(directory)
    try:
        return _problem(where)
    except (OSError, StorageError) as exc:  # unreadable (permissions, storage): not a checkpoint to resume from
        text = str(exc).strip()
        return f"unreadable: {text.splitlines()[0][:160] if text else type(exc).__name__}"


def _problem(where: Location) -> str | None:
    try:
        data = json.loads((where / META).read_bytes())
    except FileNotFoundError:
        return f"no {META}: its save did not finish"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{META} is not valid JSON"
    if not isinstance(data, dict):
        return f"{META} is not a JSON object"
    size = _file_size(where / STATE)
    if size is None:
        return f"no {STATE}"
    if data.get(STATE_FILE) is None:
        return None  # a checkpoint from before the record: its state.pt is there, and that is all we know
    record = state_file_record(data[STATE_FILE])
    if record is None:
        return f"{META}'s {STATE_FILE} record is not a size and a sha256"
    if size != record.size:
        return f"{STATE} is {size} bytes, {META} says {record.size}"
    digest = _sha256(where / STATE)
    if digest != record.sha256:
        return f"{STATE}'s sha256 is {digest[:12]}..., {META} says {record.sha256[:12]}..."
    return None


def state_file_record(data: Any) -> WrittenFile | None:
    """``meta.json``'s record of ``state.pt`` (``{"size": bytes, "sha256": hex digest}``, as
    :meth:`~alchemetric_ray.fsutil.WrittenFile.as_dict` wrote it) read back; None where it is not
    a size and a sha256."""
    if isinstance(data, dict) and isinstance(data.get("size"), int) and isinstance(data.get("sha256"), str):
        return WrittenFile(size=data["size"], sha256=data["sha256"])
    return None


def latest_complete_checkpoint(run_dir: str | Path | Location) -> tuple[Path | Location, int] | None:
    """The newest whole checkpoint of a Train run's folder and its epoch (0-based, as ``meta.json``
    has it); None where the run has none (or the folder is not there).

    Looks at the ``epoch-NNNN`` folders, newest first by their number (the epoch index the loop
    names them by); each one that :func:`checkpoint_problem` finds incomplete is skipped with a
    one-line warning on stderr naming it (people count epochs from 1: ``epoch-0011`` holds epoch
    12).  The folder comes back as a ``Path`` where ``run_dir`` is local, else as a ``Location``."""
    where = locate(run_dir)
    if not where.is_dir():
        return None
    numbered = sorted(((int(m.group(1)), name) for name in where.listing("epoch-*", folders=True)
                       if (m := EPOCH_DIR.fullmatch(name))), reverse=True)
    skipped: list[tuple[int, str, str]] = []
    for number, name in numbered:
        folder = where / name
        problem = checkpoint_problem(folder)
        if problem is not None:
            skipped.append((number, name, problem))
            continue
        epoch = json.loads((folder / META).read_bytes()).get("epoch", number)
        epoch = epoch if isinstance(epoch, int) else number
        _warn_skipped(skipped, f"using epoch {epoch + 1} ({name})")
        return (folder.local if where.is_local else folder), epoch
    _warn_skipped(skipped, f"no complete checkpoint is left in {where}")
    return None


def _warn_skipped(skipped: list[tuple[int, str, str]], instead: str) -> None:
    for number, name, problem in skipped:
        print(f"warning: checkpoint epoch {number + 1} ({name}) is incomplete ({problem}); {instead}",
              file=sys.stderr, flush=True)


def _file_size(where: Location) -> int | None:
    from pyarrow import fs

    info = where.filesystem.get_file_info(where.path)
    return info.size if info.type == fs.FileType.File else None


def _sha256(where: Location, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with where.filesystem.open_input_stream(where.path) as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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
    # the known-bug table against this run (train/backend_check.py): matches, their workaround, unknowns;
    # absent from checkpoints written before the table existed
    known_bugs: dict[str, Any] = field(default_factory=dict)

    def at(self, state: LoopState, metrics: dict[str, Any]) -> CheckpointMeta:
        """This run's metadata for the epoch ``state`` has just finished."""
        loop = {"best": state.best, "bad_epochs": state.bad_epochs, "history": state.history}
        return replace(self, epoch=state.epoch, metrics=metrics, loop=loop)

    def loop_state(self) -> LoopState:
        return LoopState(self.epoch, self.loop["best"], self.loop["bad_epochs"], self.loop["history"])

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "manifest": self.manifest.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMeta:
        """``meta.json`` as read (its ``state_file`` record is :func:`state_file_record`'s to read)."""
        optional = {"known_bugs"}
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in optional]
        if missing:
            raise CheckpointError(f"checkpoint metadata without {', '.join(missing)} (not written by a training run)")
        return cls(**{**{f.name: data[f.name] for f in fields(cls) if f.name in data},
                      "manifest": Manifest.from_dict(data["manifest"])})
