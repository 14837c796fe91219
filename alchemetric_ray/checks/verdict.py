"""The doctor's decision: what blocks each target, and the one it recommends.

A target is blocked by its own checks (an operator without a kernel, parity or mixed precision off,
a rung of the speed ladder whose numbers differ from CPU float32, slower than the CPU), by the
known-bug table (an entry training refuses, a probe that came out wrong, a step that could not be
traced) and, with a saved model, by its certificate.  :func:`decide` recommends the fastest target
with no blocker.
"""

from __future__ import annotations

from typing import Any

from alchemetric_ray.checks.report import Checks, Recommendation, TargetResult, Verdict
from alchemetric_ray.hardware.device import is_reference

REFERENCE_MODE = "fp32"  # with the reference device: what every other target is compared with


def is_reference_target(t: TargetResult) -> bool:
    """Whether ``t`` is the reference every other target is compared with (CPU float32)."""
    return is_reference(t.device_type) and t.mode == REFERENCE_MODE


def _check_blockers(device_type: str, checks: Checks, cpu_speed: float | None) -> list[str]:
    """What in one target's own checks says "do not adopt it yet", one line each."""
    blockers = []
    cov = checks.op_coverage
    if cov["unsupported"]:
        where = "training would fail" if is_reference(device_type) else "would fall back to the CPU"
        blockers.append(f"operators without a {device_type} kernel ({where}): "
                        + ", ".join(sorted(cov["unsupported"])))
    if cov.get("error"):
        blockers.append(f"operator probe failed: {cov['error']}")
    for name, metrics in (("parity", checks.parity), ("amp", checks.amp), ("speed", checks.speed)):
        if metrics.get("error"):
            blockers.append(f"the {name} check failed: {metrics['error']}")
    p = checks.parity
    if "skipped" not in p and "error" not in p and not p["passed"]:
        blockers.append(f"numerical parity with CPU float32 failed (logits rel {p['logits_max_rel']:.2e}, "
                        f"grads rel {p['grads_max_rel']:.2e}, loss {p['loss_abs']:.2e}; "
                        f"tolerance {p['tolerance_rel']:g})")
    a = checks.amp
    if "skipped" not in a and "error" not in a and not a["passed"]:
        blockers.append(f"mixed precision diverged or drifted from float32 "
                        f"(final loss {a['final_loss']:.4f} vs {a['final_loss_fp32']:.4f}, "
                        f"{a['skipped_steps']} skipped steps)")
    spd = checks.speed
    for rung in spd["ladder"]:
        n = rung.get("numbers")
        if n and not n["passed"]:
            blockers.append(f"at batch {rung['batch']:,} the step differs from CPU float32 (outputs rel "
                            f"{n['logits_max_rel']:.2e}, grads rel {n['grads_max_rel']:.2e}, loss {n['loss_abs']:.2e}; "
                            f"tolerance {n['tolerance_rel']:g})")
    rate = spd["best_samples_per_s"]
    if rate is None and spd["ladder"] and "skipped" not in spd:
        blockers.append(f"the speed check ran no batch: {spd['ladder'][0]['error']}")
    if not is_reference(device_type) and cpu_speed and rate and rate < cpu_speed:
        blockers.append(f"slower than the CPU for this model ({rate:,.0f} vs {cpu_speed:,.0f} samples/s)")
    return blockers


def _known_bug_blockers(device: str, found: dict[str, Any]) -> list[str]:
    """A matched entry with no workaround (training refuses the run), a probe that came out wrong, and a
    step that could not be traced (training's own check would fail the same way)."""
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
            blockers.append(f"known backend bug {', '.join(p['entries'])}: {p['call']} on {device} is off by "
                            f"{p['max_rel_error']:.2e} of its scale after the allocator was dirtied "
                            f"(tolerance {p['tolerance']:g})")
    return blockers


def _certificate_blockers(t: TargetResult, certificate: dict[str, Any] | None) -> list[str]:
    key = f"{t.device_type}/{t.mode}"
    if not certificate or key not in certificate["backends"] or certificate["backends"][key]["passed"]:
        return []
    reasons = certificate["backends"][key]["reasons"]
    return [f"certificate vs {certificate['reference']}: {reason}" for reason in reasons]


def decide(found: list[TargetResult], certificate: dict[str, Any] | None = None) -> Verdict:
    """Blockers per target (set on each, with ``passed``), then the fastest target with none; exit code 0
    only when one exists."""
    cpu_fp32 = next(((t, t.checks) for t in found if is_reference_target(t) and t.checks is not None), None)
    cpu_speed = cpu_fp32[1].speed["best_samples_per_s"] if cpu_fp32 else None
    for t in found:
        blockers = list(t.blockers)
        if t.checks is not None:
            blockers += (_check_blockers(t.device_type, t.checks, cpu_speed)
                         + _known_bug_blockers(t.device, t.checks.known_bugs) + _certificate_blockers(t, certificate))
        t.blockers = blockers
        t.passed = not blockers
    passing = [(t, t.checks) for t in found if t.passed and t.checks is not None]  # a refused target never passes
    if not passing:
        return Verdict(None, 1, ["no device and precision passed every check: do not adopt any of them yet"])
    best, checks = max(passing, key=lambda pair: pair[1].speed["best_samples_per_s"] or 0)
    rate = checks.speed["best_samples_per_s"]
    reasons = [f"{best.device} {best.mode} passed operator coverage, known-bug probes, parity and "
               "mixed-precision checks",
               f"fastest passing target: {rate:,.0f} samples/s at batch {checks.speed['best_batch']}"]
    if cpu_speed and cpu_fp32 and best is not cpu_fp32[0]:
        reasons.append(f"{rate / cpu_speed:.2f}x CPU float32")
    return Verdict(Recommendation(best.device, best.mode), 0, reasons)
