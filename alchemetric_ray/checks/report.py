"""The doctor's report as typed records, and its text.

:class:`DoctorReport` holds what one ``alchemetric-ray doctor`` found: the machine
(:class:`~alchemetric_ray.hardware.report.EnvironmentReport`), the run's shape, one :class:`TargetResult`
per (device, precision) examined, the certificate of a saved model, and the :class:`Verdict`.  Each
check's own outcome (``op_coverage``, ``known_bugs``, ``parity``, ``amp``, ``speed``, in :class:`Checks`)
stays the plain JSON-able dict its module returns: a map of free-form metrics.  ``as_dict`` gives the report's JSON
(``doctor --json``, the file ``scripts/mac_check.py`` sends back) with its keys in their order;
:func:`format_report` gives the lines the command prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alchemetric_ray.checks.step import RunShape
from alchemetric_ray.hardware.report import EnvironmentReport, summary_line


@dataclass
class Checks:
    """Every check's outcome on one target, each the dict of metrics its module returns (``parity``,
    ``amp`` and ``speed`` say ``skipped`` where the step needs operators the device lacks)."""

    precision: dict[str, Any]  # Precision.as_dict(): what the checks ran in
    op_coverage: dict[str, Any]
    known_bugs: dict[str, Any]
    parity: dict[str, Any]
    amp: dict[str, Any]
    speed: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "op_coverage": self.op_coverage, "known_bugs": self.known_bugs,
                "parity": self.parity, "amp": self.amp, "speed": self.speed}


@dataclass
class TargetResult:
    """One (device, precision) examined: its checks' outcomes, or (``refused``) the precision policy's
    refusal, in which case ``checks`` is None.

    ``blockers`` and ``passed`` are the decision's (:func:`~alchemetric_ray.checks.verdict.decide` sets
    them); until then ``passed`` is None and ``blockers`` holds only a refusal's line."""

    device: str  # as torch names it: "cpu", "cuda:0", "mps"
    device_type: str
    mode: str  # fp32 | bf16 | fp16
    run_precision: bool = False  # the precision the run's precision.mode resolves to on this device
    checks: Checks | None = None
    refused: str | None = None
    blockers: list[str] = field(default_factory=list)
    passed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        found = {"refused": self.refused} if self.checks is None else self.checks.as_dict()
        if self.passed is not None:  # decided
            decision: dict[str, Any] = {"blockers": self.blockers, "passed": self.passed}
        else:
            decision = {"blockers": self.blockers} if self.refused is not None else {}
        return {"device": self.device, "device_type": self.device_type, "mode": self.mode,
                "run_precision": self.run_precision, **found, **decision}


@dataclass(frozen=True)
class Recommendation:
    """The device and precision the verdict recommends."""

    device: str
    precision: str

    def as_dict(self) -> dict[str, str]:
        return {"device": self.device, "precision": self.precision}


@dataclass(frozen=True)
class Verdict:
    """The recommended target (None: no target passed), the command's exit code, and the reasons."""

    recommended: Recommendation | None
    exit_code: int
    reasons: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"recommended": self.recommended.as_dict() if self.recommended else None,
                "exit_code": self.exit_code, "reasons": self.reasons}


@dataclass(repr=False)
class DoctorReport:
    """What one doctor run found.  ``certificate`` (with ``--model``) is the dict written to the saved
    model's ``certificate.json``; ``run`` the step every check ran."""

    inventory: EnvironmentReport
    model: str
    run: RunShape
    targets: list[TargetResult]
    certificate: dict[str, Any] | None
    verdict: Verdict

    def __repr__(self) -> str:  # what the command prints: a notebook shows it as text, not as fields
        return format_report(self)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(format_report(self))}</pre>"

    def as_dict(self) -> dict[str, Any]:
        return {"inventory": self.inventory.as_dict(), "model": self.model,
                "run": {**self.run.to_json(), "describe": self.run.describe()},
                "targets": [t.as_dict() for t in self.targets], "certificate": self.certificate,
                "verdict": self.verdict.as_dict()}


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


def _target_lines(t: TargetResult) -> list[str]:
    head = f"  {t.device:8s} {t.mode:5s}{'*' if t.run_precision else ' '}"
    checks = t.checks
    if checks is None:
        return [f"{head} refused: {t.refused}"]
    cov, spd = checks.op_coverage, checks.speed
    lines = [f"{head} ops {cov['n_ops']} ({len(cov['unsupported'])} unsupported)  {_parity_text(checks.parity)}  "
             f"amp {_amp_text(checks.amp)}  "
             f"{spd['best_samples_per_s'] or 0:,.0f} samples/s  {'PASS' if t.passed else 'BLOCKED'}"]
    lines += _known_bug_lines(checks.known_bugs) if checks.known_bugs else []
    return lines + [f"      blocker: {b}" for b in t.blockers]


def _certificate_lines(c: dict[str, Any]) -> list[str]:
    return [f"  certificate {key:10s} vs {c['reference']}: rank corr {b['score_rank_corr']:.4f}, "
            f"flipped positions {b['flipped_positions']:.2%} (limit {c['max_flip_share']:.0%}), "
            f"rank IC change {b['rank_ic_change']:+.4f} (limit {c['max_rank_ic_change']:g}) "
            f"{'PASS' if b['passed'] else 'FAIL'}" for key, b in c["backends"].items()]


def format_report(report: DoctorReport) -> str:
    """The lines ``alchemetric-ray doctor`` prints: the run's shape, the machine, one line per target
    (with its known-bug findings and blockers), the certificate, and the verdict with its reasons."""
    lines = [f"doctor: model {report.model}",
             f"  checked at the run's shapes: {report.run.describe()}",
             f"  {summary_line(report.inventory)}"]
    for t in report.targets:
        lines += _target_lines(t)
    if any(t.run_precision for t in report.targets):
        lines.append("  (* the precision the run's precision.mode resolves to on that device)")
    if report.certificate:
        lines += _certificate_lines(report.certificate)
    rec = report.verdict.recommended
    lines.append(f"verdict: {'use ' + rec.device + ' ' + rec.precision if rec else 'no target passed'}")
    lines += [f"  - {r}" for r in report.verdict.reasons]
    return "\n".join(lines)
