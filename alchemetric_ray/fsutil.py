"""Small file-system helpers: atomic writes and names that cannot escape their folder."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
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
    """The nearest existing ancestor of ``folder`` (itself included) if we cannot create folders
    there (no write permission, or not a folder at all: even root cannot), else None."""
    probe = Path(folder) if str(folder) else Path(".")
    while not probe.exists():
        probe = probe.parent
    return None if probe.is_dir() and os.access(probe, os.W_OK) else probe


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


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    global _RENAMEAT2
    if _RENAMEAT2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _RENAMEAT2 = libc.renameat2 if sys.platform.startswith("linux") else False
        except (OSError, AttributeError):
            _RENAMEAT2 = False
    if not _RENAMEAT2:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if _RENAMEAT2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


_RENAMEAT2: Any = None


def _backups(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime)


def recover_dir(target: str | Path) -> None:
    """Undo a :func:`replace_dir` killed between its two renames: put the old folder back.

    Only needed where the atomic exchange is unavailable; readers call it before they look."""
    target = Path(target)
    if not target.exists():
        backups = _backups(target) if target.parent.is_dir() else []
        if backups:
            os.replace(backups[-1], target)


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished folder ``tmp`` to ``target``, replacing any old one; never half a folder.

    Linux swaps the two in one atomic step, so a reader sees the old folder or the new one, never
    neither.  Elsewhere it is two renames (old aside, new in); a crash between them leaves the
    old folder beside the target, and :func:`recover_dir` (which readers call) puts it back.
    """
    recover_dir(target)
    if target.exists() and _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old folder
        return
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
