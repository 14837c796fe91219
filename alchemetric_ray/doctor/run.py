"""`alchemetric-ray doctor`: verify a model on CUDA, MPS or CPU before trusting it, and recommend one.

For every available device and every precision the policy allows there (a refusal is itself a
finding), the doctor runs the checks (``coverage``, ``bug_probes``, ``parity``, ``amp``, ``speed``)
and, with ``--model``, the backend certificate.  Every check runs the run's own step
(``step.RunShape``: its model, features, outputs, window, loss and batch rows), and the known-bug
table is checked against a trace of that step, with a matmul probe at every shape it flags.
``decide`` turns the findings into a verdict: the recommended device and precision with reasons, and
the blocking conditions that say "do not adopt this backend yet".
"""

from __future__ import annotations

from typing import Any

import torch

from alchemetric_ray.config import DeviceName, RunConfig
from alchemetric_ray.doctor.amp import amp_sanity
from alchemetric_ray.doctor.bug_probes import known_bugs
from alchemetric_ray.doctor.coverage import op_coverage
from alchemetric_ray.doctor.parity import parity
from alchemetric_ray.doctor.speed import speed, speed_ladder
from alchemetric_ray.doctor.step import RunShape, first_line
from alchemetric_ray.errors import UserError
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
            shape: RunShape | None = None) -> dict[str, Any]:
    """Every check of one (device, precision) on the run's own shapes (``shape``: from a saved model's
    manifest; by default from ``cfg``).  Where the step needs operators the device lacks, the numeric
    checks are skipped: their numbers would be the CPU's, computed by the prober's fallback."""
    shape = shape or RunShape.of(cfg)
    target: dict[str, Any] = {"device": str(device), "device_type": device.type, "mode": mode,
                              "run_precision": run_mode(cfg, device) == mode}
    try:
        precision = resolve_precision(mode, device, model=model_spec(cfg.model), tf32=cfg.precision.tf32)
    except PrecisionError as exc:
        target.update(refused=str(exc), blockers=[f"refused by the precision policy: {exc}"])
        return target
    target["precision"] = precision.as_dict()
    target["op_coverage"] = op_coverage(shape, device, precision)
    target["known_bugs"] = known_bugs(cfg, shape, device, precision)
    if not target["op_coverage"]["passed"]:
        why = "skipped: the step needs operators this device cannot run (see op_coverage)"
        target["parity"] = {"skipped": why}
        target["amp"] = {"skipped": why}
        target["speed"] = {"skipped": why, "ladder": [], "best_samples_per_s": None, "best_batch": None}
        return target
    target["parity"] = _guarded(parity, shape, device, precision)
    if precision.autocast_dtype is None:
        target["amp"] = {"skipped": "float32 has no mixed precision", "passed": True}
    else:
        target["amp"] = _guarded(amp_sanity, shape, device, precision, steps=30 if quick else 60,
                                 batch=min(shape.batch, 256) if quick else shape.batch)
    target["speed"] = _guarded(speed, shape, device, precision, ladder=speed_ladder(shape.batch, quick),
                               repeats=3 if quick else 5)
    return target


def _check_blockers(t: dict[str, Any], cpu_speed: float | None) -> list[str]:
    """What in one target's own checks says "do not adopt it yet", one line each."""
    blockers = []
    cov = t["op_coverage"]
    if cov["unsupported"]:
        where = "training would fail" if is_reference(t["device_type"]) else "would fall back to the CPU"
        blockers.append(f"operators without a {t['device_type']} kernel ({where}): "
                        + ", ".join(sorted(cov["unsupported"])))
    if cov.get("error"):
        blockers.append(f"operator probe failed: {cov['error']}")
    for name in ("parity", "amp", "speed"):
        if t[name].get("error"):
            blockers.append(f"the {name} check failed: {t[name]['error']}")
    p = t["parity"]
    if "skipped" not in p and "error" not in p and not p["passed"]:
        blockers.append(f"numerical parity with CPU float32 failed (logits rel {p['logits_max_rel']:.2e}, "
                        f"grads rel {p['grads_max_rel']:.2e}, loss {p['loss_abs']:.2e}; "
                        f"tolerance {p['tolerance_rel']:g})")
    a = t["amp"]
    if "skipped" not in a and "error" not in a and not a["passed"]:
        blockers.append(f"mixed precision diverged or drifted from float32 "
                        f"(final loss {a['final_loss']:.4f} vs {a['final_loss_fp32']:.4f}, "
                        f"{a['skipped_steps']} skipped steps)")
    for rung in t["speed"]["ladder"]:
        n = rung.get("numbers")
        if n and not n["passed"]:
            blockers.append(f"at batch {rung['batch']:,} the step differs from CPU float32 (outputs rel "
                            f"{n['logits_max_rel']:.2e}, grads rel {n['grads_max_rel']:.2e}, loss {n['loss_abs']:.2e}; "
                            f"tolerance {n['tolerance_rel']:g})")
    rate = t["speed"]["best_samples_per_s"]
    if rate is None and t["speed"]["ladder"] and "skipped" not in t["speed"]:
        blockers.append(f"the speed check ran no batch: {t['speed']['ladder'][0]['error']}")
    if not is_reference(t["device_type"]) and cpu_speed and rate and rate < cpu_speed:
        blockers.append(f"slower than the CPU for this model ({rate:,.0f} vs {cpu_speed:,.0f} samples/s)")
    return blockers


def _known_bug_blockers(t: dict[str, Any]) -> list[str]:
    """A matched entry with no workaround (training refuses the run), a probe that came out wrong, and a
    step that could not be traced (training's own check would fail the same way)."""
    found = t.get("known_bugs")
    if not found:
        return []
    blockers = []
    if found.get("trace_error"):
        blockers.append(f"the known-bug table could not be checked: tracing the step failed ({found['trace_error']})")
    for m in found["matched"]:
        if m["workaround"] is None:
            blockers.append(f"known backend bug {m['id']} ({m['source']}): {m['evidence']}; training refuses this run")
    for p in found["probes"]:
        if p["passed"] is False:
            blockers.append(f"known backend bug {', '.join(p['entries'])}: {p['call']} on {t['device']} is off by "
                            f"{p['max_rel_error']:.2e} of its scale after the allocator was dirtied "
                            f"(tolerance {p['tolerance']:g})")
    return blockers


def _certificate_blockers(t: dict[str, Any], certificate: dict | None) -> list[str]:
    key = f"{t['device_type']}/{t['mode']}"
    if not certificate or key not in certificate["backends"] or certificate["backends"][key]["passed"]:
        return []
    reasons = certificate["backends"][key]["reasons"]
    return [f"certificate vs {certificate['reference']}: {reason}" for reason in reasons]


def decide(found: list[dict[str, Any]], certificate: dict | None = None) -> dict[str, Any]:
    """Blockers per target, then the fastest target with none; exit code 0 only when one exists."""
    cpu_fp32 = next((t for t in found if _is_reference(t) and "speed" in t), None)
    cpu_speed = cpu_fp32["speed"]["best_samples_per_s"] if cpu_fp32 else None
    for t in found:
        blockers = list(t.get("blockers", []))
        if "refused" not in t:
            blockers += _check_blockers(t, cpu_speed) + _known_bug_blockers(t) + _certificate_blockers(t, certificate)
        t["blockers"] = blockers
        t["passed"] = not blockers
    passing = [t for t in found if t["passed"]]
    best = max(passing, key=lambda t: t["speed"]["best_samples_per_s"] or 0, default=None)
    if best is None:
        return {"recommended": None, "exit_code": 1,
                "reasons": ["no device and precision passed every check: do not adopt any of them yet"]}
    reasons = [f"{best['device']} {best['mode']} passed operator coverage, known-bug probes, parity and "
               "mixed-precision checks",
               f"fastest passing target: {best['speed']['best_samples_per_s']:,.0f} samples/s at batch "
               f"{best['speed']['best_batch']}"]
    if cpu_speed and best is not cpu_fp32:
        reasons.append(f"{best['speed']['best_samples_per_s'] / cpu_speed:.2f}x CPU float32")
    return {"recommended": {"device": best["device"], "precision": best["mode"]}, "exit_code": 0, "reasons": reasons}


def run_doctor(cfg: RunConfig, *, device: str | None = None, model_dir: str | None = None,
               quick: bool = False) -> dict[str, Any]:
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.doctor.certificate import certify, write_certificate

    loaded = load_model(model_dir) if model_dir else None
    model_cfg = loaded.config if loaded else cfg
    spec = model_spec(model_cfg.model)
    shape = RunShape.of(model_cfg, loaded.manifest if loaded else None)
    report: dict[str, Any] = {"inventory": environment_report(cfg.device.name, "auto", spec),
                              "model": model_cfg.model.name, "run": {**shape.to_json(), "describe": shape.describe()}}
    found = [examine(model_cfg, dev, mode, quick=quick, shape=shape) for dev, mode in targets(model_cfg, device)]
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
        from alchemetric_ray.artifacts.ledger import record_look

        splits = loaded.manifest.splits  # the certificate's rank IC per backend is a score of the test segment
        record_look(model_dir, "doctor --model", splits["test_start"], splits["test_end"],
                    "the certificate's rank IC of each backend on the test segment")
    report["targets"] = found
    report["certificate"] = certificate
    report["verdict"] = decide(found, certificate)
    write_records(model_cfg if loaded is None else loaded.config.replace(f"storage.path={cfg.storage.path}"), found)
    return report


def _known_bug_lines(found: dict[str, Any]) -> list[str]:
    lines = []
    named = [f"matched {m['id']} ({m['source']})" for m in found["matched"]]
    named += [f"unknown {u['id']} ({u['source']})" for u in found["unknown"]]
    if named:
        lines.append(f"      known bugs at {found['rows']:,} rows: " + "; ".join(named))
    if found["not_evaluable"]:
        lines.append("      known bugs not evaluable here: " + ", ".join(e["id"] for e in found["not_evaluable"]))
    for p in found["probes"]:
        verdict = p.get("skipped") or f"rel error {p['max_rel_error']:.1e} (tolerance {p['tolerance']:g}) " + \
            ("ok" if p["passed"] else "FAIL")
        lines.append(f"      probe {p['call']} in {p['dtype']}: {verdict}")
    return lines


def _parity_text(par: dict[str, Any]) -> str:
    if "logits_max_rel" in par:
        return f"parity rel {par['logits_max_rel']:.1e}"
    return "parity skipped" if "skipped" in par else "parity ERROR"


def _amp_text(amp: dict[str, Any]) -> str:
    if amp.get("passed"):
        return "ok"
    return "skipped" if "skipped" in amp else "FAIL"


def format_report(report: dict[str, Any]) -> str:
    lines = [f"doctor: model {report['model']}"]
    if report.get("run"):
        lines.append(f"  checked at the run's shapes: {report['run']['describe']}")
    lines.append(f"  {summary_line(report['inventory'])}")
    for t in report["targets"]:
        head = f"  {t['device']:8s} {t['mode']:5s}{'*' if t.get('run_precision') else ' '}"
        if "refused" in t:
            lines.append(f"{head} refused: {t['refused']}")
            continue
        cov, spd = t["op_coverage"], t["speed"]
        lines.append(f"{head} ops {cov['n_ops']} ({len(cov['unsupported'])} unsupported)  {_parity_text(t['parity'])}  "
                     f"amp {_amp_text(t['amp'])}  "
                     f"{spd['best_samples_per_s'] or 0:,.0f} samples/s  {'PASS' if t['passed'] else 'BLOCKED'}")
        lines += _known_bug_lines(t["known_bugs"]) if t.get("known_bugs") else []
        for b in t["blockers"]:
            lines.append(f"      blocker: {b}")
    if any(t.get("run_precision") for t in report["targets"]):
        lines.append("  (* the precision the run's precision.mode resolves to on that device)")
    if report.get("certificate"):
        c = report["certificate"]
        for key, b in c["backends"].items():
            lines.append(f"  certificate {key:10s} vs {c['reference']}: rank corr {b['score_rank_corr']:.4f}, "
                         f"flipped positions {b['flipped_positions']:.2%} (limit {c['max_flip_share']:.0%}), "
                         f"rank IC change {b['rank_ic_change']:+.4f} (limit {c['max_rank_ic_change']:g}) "
                         f"{'PASS' if b['passed'] else 'FAIL'}")
    v = report["verdict"]
    rec = v["recommended"]
    lines.append(f"verdict: {'use ' + rec['device'] + ' ' + rec['precision'] if rec else 'no target passed'}")
    lines += [f"  - {r}" for r in v["reasons"]]
    return "\n".join(lines)
