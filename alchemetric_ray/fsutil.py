"""Small file-system helpers: atomic writes and names that cannot escape their folder.

Two ways to write, one for a file and one for a folder, so that a reader never sees half of either:

* :func:`atomic_write` (and its bytes, text, JSON and torch forms): the file is written beside its
  final name and renamed over it.  The bytes, text, JSON and torch forms have the whole file in
  memory first, so they check the folder's free space before writing and turn a full disk
  (``ENOSPC``, a quota) into one :class:`DiskFullError` line, with no temporary file left.
* :func:`staged_dir`: ``with staged_dir(target) as stage: ...`` builds a folder in a stage and puts
  it in place of ``target`` when the block ends, or removes the stage when the block raises.  A
  local folder is swapped in atomically; a URI (``s3://...``) goes through ``pyarrow.fs``.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from alchemetric_ray.errors import DiskFullError, UnsafeNameError

_SAFE = re.compile(r"[A-Za-z0-9_.^=-]+")


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


# A stage's name says which process made it (``.NAME.tmp-HOST-PID-RANDOM``), so that a later run can
# remove the stages of a process that is gone (a kill -9, the OOM killer) and never a live one's.
_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


def stage_name(name: str) -> str:
    return f".{name}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _tmp_beside(path: Path) -> Path:
    return path.parent / stage_name(path.name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_stages(target: str | Path) -> list[Path]:
    """Remove the stages beside ``target`` left by processes of this machine that are no longer alive
    (killed between making a stage and putting it in place); a live process's stage, another
    machine's (a shared mount) and anything not named as a stage are left alone.  Returns the removed."""
    target = Path(target)
    removed: list[Path] = []
    try:
        siblings = list(target.parent.glob(f".{glob_escape(target.name)}.tmp-*"))
    except OSError:
        return removed
    for path in siblings:
        if not _stale_stage(path.name, target.name):
            continue
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _stale_stage(name: str, target: str) -> bool:
    """``name`` is a stage of ``target`` made on this machine by a process that is gone."""
    found = _STAGE.match(name)
    return bool(found and found.group(1) == target and found.group("host") == _HOST
                and not _pid_alive(int(found.group("pid"))))


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` a file beside ``path``, then rename it over ``path``; never half a file, no leftover."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# A file is refused unless the folder keeps this much free beyond it: the file system's own
# metadata (inode, directory entry, journal) needs a little, and a disk left at 0 bytes breaks
# every other writer on it (logs, Ray's spill files).
FREE_SPACE_MARGIN = 64 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_STAGE = re.compile(r"^\.(.+)\.tmp-(?P<host>[A-Za-z0-9]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}$")  # stage_name's names


@dataclass(frozen=True)
class WrittenFile:
    """What was written: its size and sha256, from the bytes in memory (no second read of the file)."""

    size: int
    sha256: str

    def as_dict(self) -> dict[str, int | str]:
        return {"size": self.size, "sha256": self.sha256}


def _size_text(n: int) -> str:
    if n < 1_000_000:
        return f"{n / 1e3:.1f} kB"
    return f"{n / 1e6:.1f} MB" if n < 1_000_000_000 else f"{n / 1e9:.2f} GB"


def _shown(path: Path) -> Path:
    """``path`` as the user will see it once in place: a staging folder (``.name.tmp-1234abcd``,
    :func:`staged_dir`) is named by the folder it becomes."""
    return Path(*[m.group(1) if (m := _STAGE.match(part)) else part for part in path.parts])


def _existing(folder: Path) -> Path:
    """``folder`` or its nearest ancestor that exists (the folder a file would be made in may not yet)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def free_bytes(folder: str | Path) -> int | None:
    """Free space for an ordinary user in ``folder`` (its nearest existing ancestor); None where
    the file system cannot say."""
    try:
        return shutil.disk_usage(_existing(Path(folder) if str(folder) else Path("."))).free
    except OSError:
        return None


def _disk_full(path: Path, need: int, free: int | None, what: str | None = None) -> DiskFullError:
    have = "unknown space" if free is None else _size_text(free)
    return DiskFullError(f"no space left for {what or _shown(path)}: {_size_text(need)} needed, {have} free in "
                         f"{_shown(_existing(path.parent).resolve())}")


def check_free_space(path: str | Path, need: int, *, what: str | None = None) -> None:
    """Refuse, before writing, a file of ``need`` bytes at ``path`` that its folder has no room for
    (plus :data:`FREE_SPACE_MARGIN`): a :class:`DiskFullError` naming the file (or ``what``) and both
    sizes.  A file system that reports no free space figures passes (the write itself is still
    checked)."""
    path = Path(path)
    free = free_bytes(path.parent)
    if free is not None and free < need + FREE_SPACE_MARGIN:
        raise _disk_full(path, need + FREE_SPACE_MARGIN, free, what)


def _write_all(fd: int, data: memoryview) -> None:
    """Write every byte (``os.write`` may write fewer than asked)."""
    while data:
        data = data[os.write(fd, data):]


def atomic_write_bytes(path: str | Path, data: bytes | bytearray | memoryview) -> WrittenFile:
    """Write ``data`` as the file ``path`` in one step: free space checked first, the bytes written
    by Python beside ``path`` and renamed over it.  A full disk, found before or during the write,
    is one :class:`DiskFullError` line; the temporary file is removed and an old ``path`` is left
    as it was.  Returns the size and sha256 of what was written."""
    path = Path(path)
    view = memoryview(data).cast("B")
    check_free_space(path, len(view))

    def write(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            _write_all(fd, view)
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        atomic_write(path, write)  # removes the temporary file however the write ends
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise _disk_full(path, len(view), free_bytes(path.parent)) from None
        raise
    return WrittenFile(len(view), hashlib.sha256(view).hexdigest())


def atomic_write_text(path: str | Path, text: str) -> WrittenFile:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    """How every JSON file here is written: indented, keys sorted, anything else as its ``str``."""
    return json.dumps(obj, indent=2, sort_keys=True, default=str).encode("utf-8")


def atomic_write_json(path: str | Path, obj: Any) -> WrittenFile:
    return atomic_write_bytes(path, json_bytes(obj))


def torch_bytes(obj: Any) -> memoryview:
    """``torch.save(obj)`` in memory: the size is known before any byte reaches the disk, and a full
    disk is Python's ``OSError`` when the bytes are written, not torch's ``RuntimeError`` (whose text
    depends on where in its zip writer the space ran out)."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer()


def atomic_torch_save(obj: Any, path: str | Path) -> WrittenFile:
    """``torch.save(obj, path)`` through :func:`atomic_write_bytes` (free space checked, never half a
    file); returns the size and sha256 of the file."""
    return atomic_write_bytes(path, torch_bytes(obj))


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
    """A fresh temporary folder beside ``target`` (same file system, so the final rename is atomic); the
    stages a killed process left beside it go first (not on every file write: a folder of shards or
    checkpoints is written file by file, and a stage is what a kill during an export leaves)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(target)
    tmp = _tmp_beside(target)
    tmp.mkdir()
    return tmp


def is_uri(location: str | Path) -> bool:
    return "://" in str(location)


@contextmanager
def staged_dir(target: str | Path, filesystem: Any = None, *, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """Build a folder and put it in place of ``target`` in one step; on an error, leave no trace.

    ``with staged_dir(target) as stage:`` yields an empty local folder.  When the block ends, the
    folder replaces ``target`` (any old one goes); when it raises, the stage is removed and
    ``target`` is untouched.  Readers of a local folder call :func:`recover_dir` first.

    Where ``target`` is on object storage (a URI such as ``s3://bucket/models/m``, or a path on a
    given ``pyarrow.fs.FileSystem``), the stage is a local temporary folder: it is uploaded to a
    hidden prefix beside ``target``, then the old ``target`` is deleted and the upload moved (copied,
    on object stores) into its place, and the hidden prefix deleted.  An error before the final move
    leaves the old ``target`` whole; during the move a reader can see no folder or part of the new
    one, which is weaker than the atomic swap of a local folder (object stores have no rename).
    The files named in ``last`` (a manifest that lists the others) are moved after all the others.
    """
    local = None if filesystem is not None else _local_path(target)
    if local is not None:
        stage = staging_dir(local)
        try:
            yield stage
            replace_dir(stage, local)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        return
    stage = Path(tempfile.mkdtemp(prefix="alchemetric-stage-"))
    try:
        yield stage
        _publish(stage, str(target), filesystem, last)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _local_path(target: str | Path) -> Path | None:
    """``target`` as a local path, or None where it lives on another file system."""
    if not is_uri(target):
        return Path(target)
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(str(target))
    return Path(path) if isinstance(filesystem, fs.LocalFileSystem) else None


def _publish(stage: Path, target: str, filesystem: Any = None, last: tuple[str, ...] = ()) -> None:
    """Upload the finished local folder ``stage`` to ``target`` on ``filesystem`` (or the URI's own)."""
    from pyarrow import fs

    if filesystem is None:
        filesystem, target = fs.FileSystem.from_uri(target)
    target = target.rstrip("/")
    parent, _, name = target.rpartition("/")
    upload = f"{parent}/{stage_name(name)}" if parent else stage_name(name)
    local = fs.LocalFileSystem()
    _remove_stale_uploads(filesystem, parent, name)
    try:
        filesystem.create_dir(upload, recursive=True)
        fs.copy_files(str(stage), upload, source_filesystem=local, destination_filesystem=filesystem)
        if filesystem.get_file_info(target).type != fs.FileType.NotFound:
            filesystem.delete_dir(target)
        try:
            filesystem.move(upload, target)
        except (OSError, NotImplementedError):  # object stores move files, not folders: copy file by file
            infos = filesystem.get_file_info(fs.FileSelector(upload, recursive=True))
            files = sorted((i.path for i in infos if i.type == fs.FileType.File),
                           key=lambda p: (p.rpartition("/")[2] in last, p))
            for path in files:
                dest = target + path[len(upload):]
                filesystem.create_dir(dest.rpartition("/")[0], recursive=True)  # a no-op on object stores
                filesystem.copy_file(path, dest)
    finally:
        if filesystem.get_file_info(upload).type != fs.FileType.NotFound:
            filesystem.delete_dir(upload)


def _remove_stale_uploads(filesystem: Any, parent: str, name: str) -> None:
    """:func:`remove_stale_stages` on another file system (object storage): uploads beside the target
    left by a process of this machine that is gone."""
    from pyarrow import fs

    try:
        infos = filesystem.get_file_info(fs.FileSelector(parent or "/", allow_not_found=True))
    except (OSError, NotImplementedError):
        return
    for info in infos:
        if _stale_stage(info.base_name, name):
            try:
                filesystem.delete_dir(info.path)
            except OSError:
                pass
