"""What a run's loop returns (rank 0's, through ``fit()``): its per-epoch history and best value, and
per rank where it ran and what it read.  The history's rows stay dicts: they are free-form metrics
(the selection metric, the validation figures, the shadow check's), keyed by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alchemetric_ray.training.phases import PhaseRecord


@dataclass
class LoopSummary:
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per epoch, epochs from 1
    best: float | None = None  # the selection metric's best value
    stopped_early: bool = False
    epochs_run: int = 0
    device: str | None = None  # rank 0's device, and why
    device_reason: str | None = None
    precision: dict[str, Any] | None = None  # hardware.Precision.as_dict()
    threads: int | None = None  # torch's intra-op threads on rank 0
    world_size: int = 1
    # per rank, in rank order:
    epochs_per_rank: list[int] = field(default_factory=list)  # epochs trained in this session
    node_ids: list[str] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # training rows read
    fingerprint: list[float] = field(default_factory=list)  # a checksum of those rows
    val_rows: list[int] = field(default_factory=list)  # validation rows scored in the last epoch
    val_fingerprint: list[float] = field(default_factory=list)
    data_path: list[str] = field(default_factory=list)  # where the batches came from
    phases: list[PhaseRecord] = field(default_factory=list)  # rank 0's time and memory per phase
    known_bugs: dict[str, Any] | None = None  # train/backend_check.BackendCheck.as_dict()
    shadow: dict[str, Any] | None = None  # the shadow check's statistics, where it ran

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
