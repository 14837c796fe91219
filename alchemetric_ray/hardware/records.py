"""The doctor's findings kept per (model config, device kind, precision), so training can ask for them.

Seed rule: mixed precision on MPS (the kinds whose record says ``doctor_gated``) is used only when the user
asked for it AND the doctor's checks passed for that model there.  ``alchemetric-ray doctor``
writes one record per examined target under ``<storage.path>/doctor/`` (:func:`write_records`);
training and sweeps call :func:`require_doctor_checked_precision` before they start.  Both sides
import this module, so the gate sits below them (hardware) and never reaches up into the doctor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import DoctorRequired
from alchemetric_ray.hardware.kinds import KINDS
from alchemetric_ray.storage import Location, locate


def model_key(cfg: RunConfig) -> str:
    settings = dict(cfg.model.__dict__)
    if settings.get("module") is None:  # a packaged model keeps the key it had before model.module existed
        settings.pop("module", None)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def record_path(cfg: RunConfig, device_type: str, mode: str) -> Location:
    """Where the doctor's record for this model on one backend lives: under ``storage.path`` (a
    local folder or object storage), so that training anywhere on the cluster finds it."""
    return locate(cfg.storage.path) / "doctor" / f"{cfg.model.name}-{model_key(cfg)}-{device_type}-{mode}.json"


class Examined(Protocol):
    """What a record keeps of one target the doctor examined (``doctor.report.TargetResult``)."""

    device: str
    device_type: str
    mode: str
    passed: bool | None
    blockers: list[str]


@dataclass(frozen=True)
class DoctorRecord:
    """The doctor's finding for one model on one (device, precision): the file training reads."""

    model: dict[str, Any]  # the model's settings (cfg.model)
    device: str
    mode: str
    passed: bool
    blockers: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "mode": self.mode, "passed": self.passed,
                "blockers": self.blockers}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DoctorRecord:
        return cls(raw.get("model", {}), raw.get("device", ""), raw.get("mode", ""), bool(raw.get("passed")),
                   list(raw.get("blockers", [])))


def write_records(cfg: RunConfig, targets: Sequence[Examined]) -> None:
    """One record per examined target, under ``<storage.path>/doctor/`` (:func:`record_path`)."""
    for t in targets:
        record = DoctorRecord(cfg.model.__dict__, t.device, t.mode, bool(t.passed), t.blockers)
        record_path(cfg, t.device_type, t.mode).write_json(record.as_dict())


def require_doctor_checked_precision(cfg: RunConfig, accelerator_kind: str) -> None:
    """Refuse explicit mixed precision on a gated device kind (MPS) unless the doctor passed this model there."""
    kind = KINDS.get(accelerator_kind)
    if kind is None or not kind.doctor_gated or cfg.precision.mode in ("auto", "fp32"):
        return
    shown = kind.label
    path = record_path(cfg, accelerator_kind, cfg.precision.mode)
    module = f" model.module={cfg.model.module}" if cfg.model.module else ""
    hint = (f"run `alchemetric-ray doctor --device {accelerator_kind} model.name={cfg.model.name}{module}` "
            "(same model settings) first")
    if not path.is_file():
        raise DoctorRequired(f"precision '{cfg.precision.mode}' on {shown} needs a passing doctor check for this model"
                             f"; {hint}")
    record = DoctorRecord.from_dict(json.loads(path.read_text()))
    if not record.passed:
        raise DoctorRequired(f"precision '{cfg.precision.mode}' on {shown}: the doctor blocked this model there "
                             f"({'; '.join(record.blockers)[:300]}); use precision.mode=fp32")
