"""Where a worker's run goes: the wall time and the memory of each phase, recorded in the worker.

The loop marks the end of each phase: ``read`` (the shard read into memory, or the streaming
iterators ready), then per epoch ``train``, ``validate`` and ``checkpoint`` (the checkpoint written
and reported).  The first record, ``start``, is the moment the loop function was entered: what lies
before it (from ``fit()``) is Ray's start-up of the controller and the worker group.

Each record holds the phase's seconds and, on Linux, the worker's memory (``/proc/self/status``):
``private_mib`` is RssAnon at the phase's end, the process's own heap (tensors, batches, the model,
Python); ``shared_mib`` is RssShmem, mostly the object-store pages it mapped to read Ray Data
blocks, which are Ray's shared memory, not the worker's; ``rss_mib`` is the whole resident set at
the end (those two, and the mapped files: libraries); ``peak_mib`` is the highest resident set
*during* the phase (VmHWM, whose high-water mark is reset at each phase's start through
``/proc/self/clear_refs``; it counts shared pages too).  Recording at the phase's end in the worker
misses no spike the way an outside sampler does.  Elsewhere (macOS) the memory fields are None.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_FIELDS = {"RssAnon": "private_mib", "RssShmem": "shared_mib", "VmRSS": "rss_mib", "VmHWM": "peak_mib"}


def _memory() -> dict[str, float | None]:
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return {name: None for name in _FIELDS.values()}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in _FIELDS:
            found[_FIELDS[key]] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    return {name: found.get(name) for name in _FIELDS.values()}


def _reset_peak() -> None:
    try:
        _CLEAR_REFS.write_text("5")  # "5": reset the peak resident set size (VmHWM) to the current one
    except OSError:
        pass


@dataclass(frozen=True)
class PhaseRecord:
    """One phase's end: which phase, of which epoch (from 1; None for ``start`` and ``read``), its
    seconds, when it ended (Unix seconds), and the worker's memory then (MiB; None off Linux)."""

    phase: str
    epoch: int | None
    seconds: float
    at: float
    private_mib: float | None
    shared_mib: float | None
    rss_mib: float | None
    peak_mib: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def now(cls, phase: str, epoch: int | None, seconds: float, at: float) -> PhaseRecord:
        """The record of a phase ending at ``at``, with the worker's memory read now."""
        return cls(phase, epoch, seconds, at, **_memory())


class PhaseLog:
    """The records of one worker's phases, in order (``records``)."""

    def __init__(self) -> None:
        self._last = time.time()
        self.records: list[PhaseRecord] = [PhaseRecord.now("start", None, 0.0, self._last)]
        _reset_peak()

    def mark(self, phase: str, epoch: int | None = None) -> None:
        now = time.time()
        self.records.append(PhaseRecord.now(phase, epoch, round(now - self._last, 4), now))
        self._last = now
        _reset_peak()


def seconds_by_phase(records: list[PhaseRecord]) -> dict[str, float]:
    """Seconds per kind of phase in a run's records (``PhaseLog.records``), summed over the epochs."""
    out: dict[str, float] = {}
    for record in records[1:]:
        out[record.phase] = round(out.get(record.phase, 0.0) + record.seconds, 4)
    return out
