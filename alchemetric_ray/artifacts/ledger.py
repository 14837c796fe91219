"""What a saved model's test segment has been through: its looks and the trials behind the model.

The test segment is evidence only while nobody chooses with it.  Two ledgers in the model folder
keep the count:

    <model>/looks/<when>-<id>.json   one file per look: a command that scored the test segment (its
                                     labels against a model's scores), with when, which command,
                                     and the dates it scored
    <model>/trials.json              every selection that produced a model of this name: a sweep's
                                     trials, or one plain training run, with their validation
                                     long-short Sharpe ratios (what the deflated Sharpe ratio counts)

A look is one file, written whole: two commands looking at once never lose each other's record.
Both ledgers outlive a re-export under the same name (a new model trained after a look is exactly
what they are for): :func:`carried` copies them into the new model's folder.  Only the looks and
trials of the same test segment count (:func:`looks_at`, :func:`trials_at`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from alchemetric_ray.errors import StorageError
from alchemetric_ray.fsutil import json_bytes
from alchemetric_ray.storage import Location, locate

LOOKS, TRIALS = "looks", "trials.json"


@dataclass(frozen=True)
class Look:
    """One look at the test segment: when, which command, the dates it scored, and what it scored.
    :meth:`as_dict` is its file in ``looks/``."""

    when: str  # %Y-%m-%dT%H:%M:%S%z
    command: str
    start: str
    end: str
    what: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def file_name(self) -> str:
        """Its file's name in ``looks/``: the time of the look, and a random part (two looks in one second)."""
        stamp = self.when.replace(":", "").replace("-", "")[:15]
        return f"{stamp}-{uuid.uuid4().hex[:8]}.json"


@dataclass(frozen=True)
class Trial:
    """One selection behind a model: ``trials`` compared (a sweep's, or one plain training run), the
    finite ones' per-period validation long-short Sharpe ratios, the moments of the one kept
    (``chosen``: sr, skew, kurt, days) and the test segment it was made for.  :meth:`as_dict` is its
    entry in ``trials.json``."""

    when: str
    command: str
    sweep: str | None
    trials: int
    val_ls_srs: list[float]
    chosen: dict | None
    test_start: str
    test_end: str

    def as_dict(self) -> dict:
        return asdict(self)


def look_entry(command: str, start: str, end: str, what: str) -> Look:
    return Look(when=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=command, start=str(start), end=str(end),
                what=what)


def write_look(folder: Path, look: Look) -> None:
    """A look into a model folder being written (the export's stage)."""
    from alchemetric_ray.fsutil import atomic_write_bytes

    (folder / LOOKS).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / LOOKS / look.file_name(), json_bytes(look.as_dict()))


def record_look(model_dir: str | Path | Location, command: str, start: str, end: str, what: str) -> bool:
    """Record a look in a saved model's folder; where it cannot be written (a read-only model), say
    so in one line and go on: the scores were computed either way.  True when it was recorded."""
    look = look_entry(command, start, end, what)
    where = locate(model_dir) / LOOKS
    try:
        (where / look.file_name()).write_bytes(json_bytes(look.as_dict()))
        return True
    except (OSError, StorageError) as exc:
        print(f"warning: this look at the test segment was not recorded in {where}: {exc}", file=sys.stderr)
        return False


def _look_files(model_dir: str | Path | Location) -> dict[str, bytes]:
    """Every look record of a model folder as its bytes, by file name (none where it cannot be read)."""
    where = locate(model_dir) / LOOKS
    try:
        names = where.listing("*.json", folders=False) if where.is_dir() else []
    except StorageError:
        return {}
    out = {}
    for name in names:
        try:
            out[name] = (where / name).read_bytes()
        except (OSError, StorageError):
            continue
    return out


def looks(model_dir: str | Path | Location) -> list[dict]:
    """Every look recorded in a model folder, oldest first (an unreadable record is skipped)."""
    out = []
    for raw in _look_files(model_dir).values():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return sorted(out, key=lambda e: e.get("when", ""))


def _overlaps(first: object, last: object, start: str, end: str) -> bool:
    """Whether a record's dates ``first``..``last`` overlap ``start``..``end`` (compared as text)."""
    return str(first) <= str(end) and str(last) >= str(start)


def looks_at(model_dir: str | Path | Location, start: str, end: str) -> list[dict]:
    """The recorded looks whose scored dates overlap ``start``..``end`` (the model's test segment)."""
    return [e for e in looks(model_dir) if _overlaps(e.get("start", ""), e.get("end", ""), start, end)]


def look_summary(entries: list[dict]) -> str:
    """``3 (2 evaluate, 1 tune --evaluate), the first 2026-12-02T10:00:00+0000``."""
    if not entries:
        return "0"
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.get("command", "?")] = counts.get(e.get("command", "?"), 0) + 1
    kinds = ", ".join(f"{n} {command}" for command, n in counts.items())
    return f"{len(entries)} ({kinds}), the first {entries[0].get('when', '?')}"


def trial_entry(command: str, splits: dict, *, sweep: str | None, srs: list, chosen: dict | None) -> Trial:
    """One selection: ``srs`` the per-period validation long-short Sharpe ratios of every trial it
    compared (one for a plain training run), ``chosen`` the moments of the one it kept."""
    finite = [float(v) for v in srs if v is not None and math.isfinite(float(v))]
    return Trial(when=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=command, sweep=sweep, trials=len(srs),
                 val_ls_srs=finite, chosen=chosen, test_start=splits["test_start"], test_end=splits["test_end"])


def read_trials(model_dir: str | Path | Location) -> list[dict]:
    path = locate(model_dir) / TRIALS
    try:
        return json.loads(path.read_text())["entries"] if path.is_file() else []
    except (OSError, StorageError, ValueError, KeyError, TypeError):
        return []


def trials_at(entries: list[dict], start: str, end: str) -> list[dict]:
    return [e for e in entries if _overlaps(e.get("test_start"), e.get("test_end"), start, end)]


def deflation_inputs(entries: list[dict]) -> dict | None:
    """What the deflated Sharpe ratio of the newest entry's chosen model needs, counting every trial
    of every entry: ``{"n_trials", "variance", "chosen"}``; None with fewer than 2 trials, no
    chosen moments or fewer than 2 finite Sharpe ratios to take a variance of."""
    if not entries:
        return None
    n = sum(int(e.get("trials", 0)) for e in entries)
    srs = [v for e in entries for v in e.get("val_ls_srs", [])]
    chosen = entries[-1].get("chosen")
    if n < 2 or not chosen or len(srs) < 2 or chosen.get("sr") is None:
        return None
    return {"n_trials": n, "variance": statistics.variance(srs), "chosen": chosen,
            "selections": len(entries)}


def carried(previous: str | Path | Location, new_entry: Trial) -> dict[str, bytes]:
    """The ledger files of a model about to replace ``previous`` (its folder, which may not exist):
    the previous looks as they are, and its trials (as they are) with ``new_entry`` appended, by
    relative path."""
    files: dict[str, bytes] = {}
    where = locate(previous)
    try:
        exists = where.is_dir()
    except StorageError:
        exists = False
    if exists:
        files.update({f"{LOOKS}/{name}": raw for name, raw in _look_files(where).items()})
    entries = read_trials(where) if exists else []
    files[TRIALS] = json_bytes({"entries": [*entries, new_entry.as_dict()]})
    return files
