"""`alchemetric-ray doctor`: verify a model on CUDA, MPS or CPU before trusting it, and recommend one.

For every available device and every precision the policy allows there (a refusal is itself a
finding), the doctor runs the checks (``coverage``, ``bug_probes``, ``parity``, ``amp``, ``speed``)
and, with ``--model``, the backend certificate.  Every check runs the run's own step
(``step.RunShape``: its model, features, outputs, window, loss and batch rows), and the known-bug
table is checked against a trace of that step, with a matmul probe at every shape it flags.
``verdict.decide`` turns the findings into a verdict: the recommended device and precision with
reasons, and the blocking conditions that say "do not adopt this backend yet".  The findings come
back as one :class:`~alchemetric_ray.checks.report.DoctorReport`.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from alchemetric_ray.checks.amp import amp_sanity
from alchemetric_ray.checks.bug_probes import known_bugs
from alchemetric_ray.checks.coverage import op_coverage
from alchemetric_ray.checks.parity import parity
from alchemetric_ray.checks.report import Checks, DoctorReport, TargetResult
from alchemetric_ray.checks.speed import speed, speed_ladder
from alchemetric_ray.checks.step import RunShape, first_line
from alchemetric_ray.checks.verdict import REFERENCE_MODE, decide, is_reference_target
from alchemetric_ray.config import DeviceName, RunConfig
from alchemetric_ray.errors import PrecisionError, UserError
from alchemetric_ray.hardware import resolve_device, resolve_precision
from alchemetric_ray.hardware.device import (
    is_reference,
    kinds_to_check,
    reference_device,
)
from alchemetric_ray.hardware.precision import EXPLICIT_MODES
from alchemetric_ray.hardware.records import write_records
from alchemetric_ray.hardware.report import environment_report
from alchemetric_ray.models import model_spec


def targets(cfg: RunConfig, requested: str | None) -> list[tuple[torch.device, str]]:
    """(device, mode) pairs to examine: the requested device (plus the reference) or every kind here."""
    if requested and requested != DeviceName.AUTO:
        dev = resolve_device(requested, source="--device").device
        devices = [dev] + ([] if is_reference(dev.type) else [reference_device()])
    else:
        devices = [resolve_device(kind, source="the doctor").device for kind in kinds_to_check()]
    return [(d, m) for d in devices for m in EXPLICIT_MODES]


def run_mode(cfg: RunConfig, device: torch.device) -> str | None:
    """The precision the run itself would train in on ``device`` (``precision.mode``, "auto" resolved),
    or None where the policy refuses it there."""
    try:
        return resolve_precision(cfg.precision.mode, device, model=model_spec(cfg.model), tf32=cfg.precision.tf32).mode
    except PrecisionError:
        return None


def _guarded(check, *args, **kwargs) -> dict[str, Any]:
    """A check's result, or its failure as a finding: one check that raises (an operator that fails at
    a shape, a kernel error) must not cost the report of every other target.  Bad input still stops."""
    try:
        return check(*args, **kwargs)
    except UserError:
        raise
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {first_line(exc)}", "passed": False,
                "best_samples_per_s": None, "best_batch": None, "ladder": []}


def examine(cfg: RunConfig, device: torch.device, mode: str, *, quick: bool = False,
            shape: RunShape | None = None) -> TargetResult:
    """Every check of one (device, precision) on the run's own shapes (``shape``: from a saved model's
    manifest; by default from ``cfg``).  Where the step needs operators the device lacks, the numeric
    checks are skipped: their numbers would be the CPU's, computed by the prober's fallback."""
    shape = shape or RunShape.of(cfg)
    target = TargetResult(str(device), device.type, mode, run_precision=run_mode(cfg, device) == mode)
    try:
        precision = resolve_precision(mode, device, model=model_spec(cfg.model), tf32=cfg.precision.tf32)
    except PrecisionError as exc:
        target.refused = str(exc)
        target.blockers = [f"refused by the precision policy: {exc}"]
        return target
    coverage = op_coverage(shape, device, precision)
    bugs = known_bugs(cfg, shape, device, precision)
    if not coverage["passed"]:
        why = "skipped: the step needs operators this device cannot run (see op_coverage)"
        target.checks = Checks(precision.as_dict(), coverage, bugs, {"skipped": why}, {"skipped": why},
                               {"skipped": why, "ladder": [], "best_samples_per_s": None, "best_batch": None})
        return target
    par = _guarded(parity, shape, device, precision)
    if precision.autocast_dtype is None:
        amp: dict[str, Any] = {"skipped": "float32 has no mixed precision", "passed": True}
    else:
        amp = _guarded(amp_sanity, shape, device, precision, steps=30 if quick else 60,
                       batch=min(shape.batch, 256) if quick else shape.batch)
    spd = _guarded(speed, shape, device, precision, ladder=speed_ladder(shape.batch, quick), repeats=3 if quick else 5)
    target.checks = Checks(precision.as_dict(), coverage, bugs, par, amp, spd)
    return target


def run_doctor(cfg: RunConfig, *, device: str | None = None, model_dir: str | None = None,
               quick: bool = False) -> DoctorReport:
    """Examine every target, certify a saved model (``model_dir``) on each usable one, decide, and
    write the records that gate MPS mixed precision (``hardware.records``)."""
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.checks.certificate import certify, write_certificate

    loaded = load_model(model_dir) if model_dir else None
    model_cfg = loaded.config if loaded else cfg
    spec = model_spec(model_cfg.model)
    shape = RunShape.of(model_cfg, loaded.manifest if loaded else None)
    inventory = environment_report(cfg.device.name, "auto", spec)
    found = [examine(model_cfg, dev, mode, quick=quick, shape=shape) for dev, mode in targets(model_cfg, device)]
    certificate = None
    if loaded is not None:
        usable = [t for t in found if t.checks is not None]
        trained_device = loaded.meta.device_name or str(reference_device())
        trained = (torch.device(trained_device).type, loaded.meta.precision_mode or REFERENCE_MODE)
        ref = next((t for t in usable if (t.device_type, t.mode) == trained), None) \
            or next(t for t in usable if is_reference_target(t))

        def as_pair(target: TargetResult) -> tuple:
            target_device = torch.device(target.device)
            return target_device, resolve_precision(target.mode, target_device, model=spec)

        certificate = certify(loaded, [as_pair(t) for t in usable], as_pair(ref))
        model_dir = cast(str, model_dir)  # cast: a model is loaded only from a model_dir
        write_certificate(model_dir, certificate)
        from alchemetric_ray.artifacts.ledger import record_look

        splits = loaded.manifest.splits  # the certificate's rank IC per backend is a score of the test segment
        record_look(model_dir, "doctor --model", splits["test_start"], splits["test_end"],
                    "the certificate's rank IC of each backend on the test segment")
    verdict = decide(found, certificate)
    write_records(model_cfg if loaded is None else loaded.config.replace(f"storage.path={cfg.storage.path}"), found)
    return DoctorReport(inventory, model_cfg.model.name, shape, found, certificate, verdict)
