"""Small file-system helpers: atomic writes and names that cannot escape their folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from alchemetric_ray.errors import UserError

_SAFE = re.compile(r"[A-Za-z0-9_.^=-]+")


class UnsafeNameError(UserError, ValueError):
    pass


def safe_child(parent: str | Path, name: str, what: str = "name") -> Path:
    """``parent / name`` for a plain ``name`` (no separators, no '..', not absolute)."""
    if not name or not _SAFE.fullmatch(name) or name.startswith(".") or ".." in name:
        raise UnsafeNameError(f"{what} {name!r} is not a plain name (letters, digits, '.', '_', '-'; "
                              "no path separators or '..')")
    return Path(parent) / name


def unwritable_ancestor(folder: str | Path) -> Path | None:
    """The nearest existing ancestor of ``folder`` (itself included) if we cannot write there, else None."""
    probe = Path(folder) if str(folder) else Path(".")
    while not probe.exists():
        probe = probe.parent
    return None if os.access(probe, os.W_OK) else probe


def _tmp_beside(path: Path) -> Path:
    return path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    import torch

    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished folder ``tmp`` to ``target``, replacing any old one; never half a folder."""
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def staging_dir(target: Path) -> Path:
    """A fresh temporary folder beside ``target`` (same file system, so the final rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_beside(target)
    tmp.mkdir()
    return tmp
