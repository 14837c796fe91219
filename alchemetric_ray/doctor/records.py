"""The doctor's findings kept per (model config, device, precision), so training can ask for them.

Seed rule: mixed precision on MPS is used only when the user asked for it AND the doctor's
checks passed for that model there.  ``run_doctor`` writes one record per examined target under
``<storage.path>/doctor/``; ``require_checked_mps_autocast`` is what the trainer calls.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import atomic_write_json


class DoctorRequired(UserError, RuntimeError):
    pass


def model_key(cfg: RunConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.model.__dict__, sort_keys=True).encode()).hexdigest()[:16]


def record_path(cfg: RunConfig, device_type: str, mode: str) -> Path:
    return Path(cfg.storage.path) / "doctor" / f"{cfg.model.name}-{model_key(cfg)}-{device_type}-{mode}.json"


def write_records(cfg: RunConfig, targets: list[dict]) -> None:
    if "://" in cfg.storage.path:
        return
    for t in targets:
        path = record_path(cfg, t["device_type"], t["mode"])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"model": cfg.model.__dict__, "device": t["device"], "mode": t["mode"],
                                 "passed": bool(t.get("passed")), "blockers": t.get("blockers", [])})


def require_checked_mps_autocast(cfg: RunConfig, accelerator_kind: str) -> None:
    """Refuse explicit mixed precision on MPS unless the doctor passed this model there."""
    if accelerator_kind != "mps" or cfg.precision.mode in ("auto", "fp32"):
        return
    path = record_path(cfg, "mps", cfg.precision.mode)
    hint = f"run `alchemetric-ray doctor --device mps model.name={cfg.model.name}` (same model settings) first"
    if not path.is_file():
        raise DoctorRequired(f"precision '{cfg.precision.mode}' on MPS needs a passing doctor check for this model; {hint}")
    record = json.loads(path.read_text())
    if not record.get("passed"):
        raise DoctorRequired(f"precision '{cfg.precision.mode}' on MPS: the doctor blocked this model there "
                             f"({'; '.join(record.get('blockers', []))[:300]}); use precision.mode=fp32")
