"""What the product may replace: only a folder or file it made itself, of the same kind.

Every folder a command writes whole (feature shards, an exported model, an evaluation report, a
sweep report) carries a small mark, :data:`MARK` (``{"kind": "model"}``), written into its stage
(:func:`staged_output`).  Before any work, a command :func:`claim` s each place it will
write: a place that does not exist, an empty folder, or a folder whose mark names the same kind
(or, made before the mark existed, that holds that kind's own files) may be replaced; anything
else (a user's notes, a model where a report was asked for, a file where a folder goes) is
refused in one :class:`OutputError` line naming the path, and nothing is touched.  A signals file
carries its kind in its Parquet schema's metadata (:func:`signals_metadata`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alchemetric_ray.errors import OutputError
from alchemetric_ray.fsutil import is_uri, unwritable_ancestor
from alchemetric_ray.storage import Location, locate

MARK = ".alchemetric-ray.json"
SIGNALS_KEY = b"alchemetric_ray.kind"

# kind -> (what a person calls it, the files that made one before the mark existed, files it never holds)
KINDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "shards": ("feature-shard folder", ("manifest.json",), ("weights.pt",)),
    "model": ("model folder", ("weights.pt", "meta.json"), ()),
    "evaluation": ("evaluation report folder", ("evaluation.json", "report.md"), ()),
    "sweep-report": ("sweep report folder", (), ()),
    "refit-scratch": ("refit's scratch folder", (), ()),
}
_SIGNAL_COLUMNS = {"ticker", "date", "score", "position", "model_id"}


def mark_bytes(kind: str) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    return json.dumps({"kind": kind, "made_by": "alchemetric-ray"}).encode()


def kind_of(location) -> str | None:
    """The kind of product output at ``location`` (a folder), or None where it is not one."""
    mark = location / MARK
    if mark.is_file():
        try:
            return json.loads(mark.read_bytes()).get("kind")
        except (ValueError, AttributeError, OSError):
            return None
    names = set(location.listing(folders=False))
    for kind, (_, legacy, never) in KINDS.items():
        if legacy and names.issuperset(legacy) and not names.intersection(never):
            return kind
    return None


def check_writable(where, what: str, *, inside: bool = False) -> None:
    """Refuse a local folder (or file) this process cannot create or replace (beside it: its stage;
    ``inside``: write into it): a read-only file system, no permission, or a file where a folder
    must be.  Object storage is checked by ``storage.preflight``."""
    if is_uri(where):
        return
    path = Path(where).absolute()
    blocked = unwritable_ancestor(path if inside else path.parent)
    if blocked is not None:
        why = "not a folder" if blocked.exists() and not blocked.is_dir() else "not writable (a read-only file " \
            "system, or no permission)"
        raise OutputError(f"{what} {where}: {blocked} is {why}; choose a place this user can write")


def claim(where, kind: str, *, what: str | None = None) -> None:
    """Refuse, in one line, to replace ``where`` unless it is absent, an empty folder, or this
    product's own ``kind`` of output, in a place this process can write.  Call it before any work;
    ``what`` names the option."""
    location = locate(where)
    label = f"{what} {location}" if what else str(location)
    if location.is_local:
        check_writable(location.local, what or "output")
    name = KINDS[kind][0]
    if location.is_file():
        raise OutputError(f"{label} is a file, not a folder; refusing to replace it with {_a(name)} "
                          "(choose a new or empty folder)")
    if not location.is_dir():
        return
    held = [name for name in location.listing(folders=True) + location.listing(folders=False) if name != MARK]
    if not held:
        return
    found = kind_of(location)
    if found == kind:
        return
    holds = ", ".join(sorted(held)[:3]) + (", ..." if len(held) > 3 else "")
    made = f"it is {_a(KINDS[found][0])}" if found in KINDS else "it was not made by alchemetric-ray"
    raise OutputError(f"{label} exists and {made} (it holds {holds}); refusing to replace it with {_a(name)}: "
                      "choose a new or empty folder, or remove it yourself")


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def signals_metadata(metadata: dict | None) -> dict:
    """A signals table's schema metadata with the signals kind added."""
    return {**(metadata or {}), SIGNALS_KEY: b"signals"}


def claim_signals_file(where, *, what: str | None = None) -> None:
    """:func:`claim` for a signals Parquet file: a folder there, or a file that is not a signals file
    this product wrote, is refused."""
    location = locate(where)
    label = f"{what} {location}" if what else str(location)
    if location.is_local:
        check_writable(location.local, what or "output")
    if location.is_dir():
        raise OutputError(f"{label} is a folder; the signals output is one Parquet file "
                          f"(e.g. {str(location).rstrip('/')}/signals.parquet)")
    if not location.is_file():
        return
    if not _is_signals_file(location):
        raise OutputError(f"{label} exists and is not a signals file made by alchemetric-ray; refusing to "
                          "replace it: choose a new file name, or remove it yourself")


def _is_signals_file(location) -> bool:
    import pyarrow.parquet as pq

    try:
        with location.filesystem.open_input_file(location.path) as f:
            schema = pq.read_schema(f)
    except Exception:  # not Parquet at all (any error pyarrow raises for a foreign file)
        return False
    metadata = schema.metadata or {}
    return metadata.get(SIGNALS_KEY) == b"signals" or _SIGNAL_COLUMNS.issubset(schema.names)


@contextmanager
def staged_output(where: str | Path | Location, kind: str, *, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """``with staged_output(out, "model") as stage:`` build an output folder of ``kind`` that then
    replaces ``out`` whole (``Location.staged``), marked as ours; ``out`` is claimed first
    (:func:`claim`: anything else there is refused, untouched)."""
    location = locate(where)
    claim(location, kind)
    with location.staged(last=last) as stage:
        (stage / MARK).write_bytes(mark_bytes(kind))
        yield stage
