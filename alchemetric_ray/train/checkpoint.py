"""Checkpoints: a tensors-only state file plus JSON metadata, each written atomically.

``state.pt`` holds only tensors and plain containers (model, optimizer, scaler, scheduler state)
and is always loaded with ``torch.load(weights_only=True)``: a crafted pickle cannot run code.
``meta.json`` holds everything else: the whole run config, epoch, metrics, device and precision
with their reasons, versions, machine, git commit and the feature manifest.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import atomic_torch_save, atomic_write_json

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
