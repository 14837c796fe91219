"""`alchemetric-ray doctor`: verify a model on CUDA, MPS or CPU before trusting it, and recommend one.

For every available device and every precision the policy allows there (a refusal is itself a
finding), the doctor runs the checks in ``checks.py`` and, with ``--model``, the backend
certificate.  ``decide`` turns the findings into a verdict: the recommended device and precision
with reasons, and the blocking conditions that say "do not adopt this backend yet".
"""

from __future__ import annotations

from typing import Any

import torch

from alchemetric_ray.config import DeviceName, RunConfig
from alchemetric_ray.doctor import checks
from alchemetric_ray.hardware import PrecisionError, resolve_device, resolve_precision
from alchemetric_ray.hardware.device import (
    is_reference,
    kinds_to_check,
    reference_device,
)
from alchemetric_ray.hardware.precision import EXPLICIT_MODES
from alchemetric_ray.hardware.records import write_records
from alchemetric_ray.hardware.report import environment_report, summary_line
from alchemetric_ray.models import model_spec

REFERENCE_MODE = "fp32"  # with the reference device: what every other target is compared with


def targets(cfg: RunConfig, requested: str | None) -> list[tuple[torch.device, str]]:
    """(device, mode) pairs to examine: the requested device (plus the reference) or every kind here."""
    if requested and requested != DeviceName.AUTO:
        dev = resolve_device(requested, source="--device").device
        devices = [dev] + ([] if is_reference(dev.type) else [reference_device()])
    else:
        devices = [resolve_device(kind, source="the doctor").device for kind in kinds_to_check()]
    return [(d, m) for d in devices for m in EXPLICIT_MODES]


def _is_reference(target: dict[str, Any]) -> bool:
    return is_reference(target["device_type"]) and target["mode"] == REFERENCE_MODE


def examine(cfg: RunConfig, device: torch.device, mode: str, *, quick: bool = False) -> dict[str, Any]:
    target: dict[str, Any] = {"device": str(device), "device_type": device.type, "mode": mode}
    try:
        precision = resolve_precision(mode, device, model=model_spec(cfg.model), tf32=cfg.precision.tf32)
    except PrecisionError as exc:
        target.update(refused=str(exc), blockers=[f"refused by the precision policy: {exc}"])
        return target
    target["precision"] = precision.as_dict()
    target["op_coverage"] = checks.op_coverage(cfg.model, device, precision)
    target["parity"] = checks.parity(cfg.model, device, precision)
    target["amp"] = checks.amp_sanity(cfg.model, device, precision, steps=30 if quick else 60) \
        if precision.autocast_dtype is not None else {"skipped": "float32 has no mixed precision", "passed": True}
    ladder = (256, 1024) if quick else (256, 1024, 4096)
    target["speed"] = checks.speed(cfg.model, device, precision, ladder=ladder, repeats=3 if quick else 5)
    return target


def decide(found: list[dict[str, Any]], certificate: dict | None = None) -> dict[str, Any]:
    """Blockers per target, then the fastest target with none; exit code 0 only when one exists."""
    cpu_fp32 = next((t for t in found if _is_reference(t) and "speed" in t), None)
    cpu_speed = cpu_fp32["speed"]["best_samples_per_s"] if cpu_fp32 else None
    for t in found:
        blockers = list(t.get("blockers", []))
        if "refused" not in t:
            cov = t["op_coverage"]
            if cov["unsupported"]:
                blockers.append(f"operators without a {t['device_type']} kernel (would fall back to the CPU): "
                                + ", ".join(sorted(cov["unsupported"])))
            if cov.get("error"):
                blockers.append(f"operator probe failed: {cov['error']}")
            if not t["parity"]["passed"]:
                p = t["parity"]
                blockers.append(f"numerical parity with CPU float32 failed (logits rel {p['logits_max_rel']:.2e}, "
                                f"grads rel {p['grads_max_rel']:.2e}, loss {p['loss_abs']:.2e}; "
                                f"tolerance {p['tolerance_rel']:g})")
            if not t["amp"]["passed"]:
                a = t["amp"]
                blockers.append(f"mixed precision diverged or drifted from float32 "
                                f"(final loss {a['final_loss']:.4f} vs {a['final_loss_fp32']:.4f}, "
                                f"{a['skipped_steps']} skipped steps)")
            rate = t["speed"]["best_samples_per_s"]
            if not is_reference(t["device_type"]) and cpu_speed and rate and rate < cpu_speed:
                blockers.append(f"slower than the CPU for this model ({rate:,.0f} vs {cpu_speed:,.0f} samples/s)")
            key = f"{t['device_type']}/{t['mode']}"
            if certificate and key in certificate["backends"] and not certificate["backends"][key]["passed"]:
                flips = certificate["backends"][key]["flipped_positions"]
                blockers.append(f"{flips:.1%} of the saved model's positions flip vs {certificate['reference']} "
                                f"(limit {certificate['max_flip_share']:.0%})")
        t["blockers"] = blockers
        t["passed"] = not blockers
    passing = [t for t in found if t["passed"]]
    best = max(passing, key=lambda t: t["speed"]["best_samples_per_s"] or 0, default=None)
    if best is None:
        return {"recommended": None, "exit_code": 1,
                "reasons": ["no device and precision passed every check: do not adopt any of them yet"]}
    reasons = [f"{best['device']} {best['mode']} passed operator coverage, parity and mixed-precision checks",
               f"fastest passing target: {best['speed']['best_samples_per_s']:,.0f} samples/s at batch "
               f"{best['speed']['best_batch']}"]
    if cpu_speed and best is not cpu_fp32:
        reasons.append(f"{best['speed']['best_samples_per_s'] / cpu_speed:.2f}x CPU float32")
    return {"recommended": {"device": best["device"], "precision": best["mode"]}, "exit_code": 0, "reasons": reasons}


def run_doctor(cfg: RunConfig, *, device: str | None = None, model_dir: str | None = None,
               quick: bool = False) -> dict[str, Any]:
    from alchemetric_ray.doctor.certificate import certify, write_certificate
    from alchemetric_ray.train.export import load_model

    loaded = load_model(model_dir) if model_dir else None
    model_cfg = loaded.config if loaded else cfg
    spec = model_spec(model_cfg.model)
    report: dict[str, Any] = {"inventory": environment_report(cfg.device.name, "auto", spec),
                              "model": model_cfg.model.name}
    found = [examine(model_cfg, dev, mode, quick=quick) for dev, mode in targets(model_cfg, device)]
    certificate = None
    if loaded is not None:
        usable = [t for t in found if "refused" not in t]
        trained_device = loaded.meta.get("device", {}).get("device") or str(reference_device())
        trained = (torch.device(trained_device).type, loaded.meta.get("precision", {}).get("mode", REFERENCE_MODE))
        ref = next((t for t in usable if (t["device_type"], t["mode"]) == trained), None) \
            or next(t for t in usable if _is_reference(t))

        def as_pair(target: dict) -> tuple:
            target_device = torch.device(target["device"])
            return target_device, resolve_precision(target["mode"], target_device, model=spec)

        certificate = certify(loaded, [as_pair(t) for t in usable], as_pair(ref))
        write_certificate(model_dir, certificate)
    report["targets"] = found
    report["certificate"] = certificate
    report["verdict"] = decide(found, certificate)
    write_records(model_cfg if loaded is None else loaded.config.replace(f"storage.path={cfg.storage.path}"), found)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [f"doctor: model {report['model']}"]
    lines.append(f"  {summary_line(report['inventory'])}")
    for t in report["targets"]:
        head = f"  {t['device']:8s} {t['mode']:5s}"
        if "refused" in t:
            lines.append(f"{head} refused: {t['refused']}")
            continue
        cov, par, spd = t["op_coverage"], t["parity"], t["speed"]
        lines.append(f"{head} ops {cov['n_ops']} ({len(cov['unsupported'])} unsupported)  "
                     f"parity rel {par['logits_max_rel']:.1e}  "
                     f"amp {'ok' if t['amp']['passed'] else 'FAIL'}  {spd['best_samples_per_s'] or 0:,.0f} samples/s  "
                     f"{'PASS' if t['passed'] else 'BLOCKED'}")
        for b in t["blockers"]:
            lines.append(f"      blocker: {b}")
    if report.get("certificate"):
        c = report["certificate"]
        for key, b in c["backends"].items():
            lines.append(f"  certificate {key:10s} vs {c['reference']}: rank corr {b['score_rank_corr']:.4f}, "
                         f"flipped positions {b['flipped_positions']:.2%}, rank IC change {b['rank_ic_change']:+.4f}")
    v = report["verdict"]
    rec = v["recommended"]
    lines.append(f"verdict: {'use ' + rec['device'] + ' ' + rec['precision'] if rec else 'no target passed'}")
    lines += [f"  - {r}" for r in v["reasons"]]
    return "\n".join(lines)
