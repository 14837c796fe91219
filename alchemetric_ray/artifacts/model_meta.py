"""A saved model's ``meta.json``: where its weights came from, as :class:`ModelMeta`.

The export writes it from the checkpoint's own record (``checkpoint.CheckpointMeta``): the device
and precision with their reasons, the resource plan, the world size, the environment (versions,
machine, git commit), the exported epoch (from 1), the known-bug table's findings for the run, and
when it was exported.  :meth:`ModelMeta.as_dict` is the file, key for key in that order;
:meth:`ModelMeta.from_dict` reads it back, a field the file lacks (a folder written before the
field existed) as None or empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class ModelMeta:
    """What an exported model folder's ``meta.json`` records."""

    device: dict[str, Any] | None = None  # {"device": ..., "reason": ...}: where it trained, and why
    precision: dict[str, Any] | None = None  # hardware.Precision.as_dict(), its reason included
    plan: dict[str, Any] | None = None  # placement.plan.ResourcePlan.as_dict()
    world_size: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)  # checkpoint.environment_meta()
    epoch: int | None = None  # the exported epoch, from 1 (its checkpoint folder epoch-NNNN counts from 0)
    known_bugs: dict[str, Any] = field(default_factory=dict)  # train/backend_check.py's findings, {} where none
    exported: str | None = None  # when, %Y-%m-%dT%H:%M:%S%z

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelMeta:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @property
    def device_name(self) -> str | None:
        """The device it trained on (``cuda:0``, ``cpu``), None where the file does not say."""
        return (self.device or {}).get("device")

    @property
    def precision_mode(self) -> str | None:
        """The precision it trained in (``bf16``, ``fp32``), None where the file does not say."""
        return (self.precision or {}).get("mode")
