"""The known-bug table (``hardware/known_bugs.py``) checked against this run, where the loop runs.

The configured model is built on the ``meta`` device and one step at the run's per-step batch shape
(``train.batch_size`` rows, or ``train.micro_batch_rows``) is traced, forward and backward, with the
run's own loss.  An entry that matches is either worked around exactly or refuses the run:

* ``micro_batches``: each step's batch is split into micro-batches of at most R rows, small enough
  that no matmul's reduction dimension reaches the entry's ``k_min`` (R x window for a Linear over a
  sequence); the micro-batches' outputs are concatenated and the run's loss and backward run once over
  the whole batch, so the gradient is the whole batch's (each weight gradient is summed from the
  micro-batches' matmuls instead of one large one).  The step is traced again at R rows to confirm.
  Under DDP (several workers) the workaround is not applied (DDP wants one forward per backward): the
  run is refused instead; on MPS there is one worker anyway.
* anything else: :class:`~alchemetric_ray.hardware.known_bugs.KnownBugError`, one line naming the
  entry, what in the run meets it, and the remedy.

Entries the trace cannot decide (a layer that runs the backend's own kernels) are said once, as
"unknown: probe".  Local runs check in the driver (the loop runs there); worker-group runs in each
worker, on its own device, before the first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import KnownBugError
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware.precision import Precision
from alchemetric_ray.models import build_model, is_cross_sectional, model_spec
from alchemetric_ray.scoring.objective import loss_of
from alchemetric_ray.training.losses import DateGroups, loss_kind


@dataclass
class BackendCheck:
    """What the table says of this run: its findings, the micro-batch rows (0: whole batches) and the
    lines the loop says."""

    findings: kb.Findings
    micro_rows: int = 0
    lines: list[str] = field(default_factory=list)

    def hint(self) -> str | None:
        """The entries that could explain a divergence seen on this backend (the shadow check's message)."""
        ids = [m.entry.id + f" ({m.entry.reference})" for m in self.findings.matched] + \
              [u.entry.id + f" ({u.entry.reference})" for u in self.findings.unknown]
        return ", ".join(dict.fromkeys(ids)) or None

    def as_dict(self) -> dict:
        return {**self.findings.as_dict(), "micro_batch_rows": self.micro_rows}


def step_rows(cfg: RunConfig) -> int:
    """The rows one forward holds: a micro-batch's when ``train.micro_batch_rows`` is set, else the batch's."""
    batch = cfg.train.batch_size
    return min(batch, cfg.train.micro_batch_rows) if cfg.train.micro_batch_rows else batch


def trace_run(cfg: RunConfig, n_features: int, outputs: int, rows: int) -> kb.Trace:
    """One step of the configured model and loss at ``rows`` rows, traced on the meta device."""
    window = cfg.features.window
    with torch.device("meta"):
        model = build_model(cfg.model, n_features, outputs, window=window)
    sequence = model_spec(cfg.model).inputs == "sequence"
    loss = loss_kind(loss_of(cfg))
    loss_fn = loss.make(None, torch.device("meta"))

    def step(module):
        x = torch.empty((rows, window, n_features) if sequence else (rows, n_features), device="meta")
        y = torch.empty(rows, dtype=torch.float32 if loss.float_labels else torch.long, device="meta")
        dates = DateGroups.from_sizes([rows], torch.device("meta")) if loss.per_date else None
        return loss_fn(module(x), y, dates)

    return kb.trace_step(model, step, rows)


def _needs_trace(backend: kb.Backend) -> bool:
    return any(e.rule.on_trace and e.applies(backend) is not False for e in kb.entries())


def check_backend(cfg: RunConfig, n_features: int, outputs: int, device: torch.device,  # noqa: PLR0913 (a run's shape)
                  precision: Precision, *, world: int = 1, fused_optimizer: bool = False,
                  backend: kb.Backend | None = None) -> BackendCheck:
    """The table against this run on ``device`` (``backend``: the backend as given, for tests and the
    GPU preflight's report; by default the one this process runs on)."""
    backend = backend or kb.Backend.of(device)
    if cfg.train.micro_batch_rows and world > 1:
        raise KnownBugError(f"config 'train.micro_batch_rows': {cfg.train.micro_batch_rows} needs one worker "
                               f"(DDP wants one forward per backward; this run has {world}); set it to 0")
    traits = kb.RunTraits(grad_scaler=precision.use_scaler, fused_optimizer=fused_optimizer)
    rows = step_rows(cfg)
    trace = trace_run(cfg, n_features, outputs, rows) if _needs_trace(backend) else None
    findings = kb.evaluate(trace, backend, traits)
    check = BackendCheck(findings, cfg.train.micro_batch_rows if rows < cfg.train.batch_size else 0)
    fixable = [m for m in findings.matched if m.entry.workaround == "micro_batches"]
    others = [m for m in findings.matched if m.entry.workaround != "micro_batches"]
    if others:
        raise KnownBugError(others[0].line(backend))
    if fixable:
        # trace None: no rule on the trace ran, so no matched call for rows_below to measure
        micro = kb.rows_below(fixable, cast(kb.Trace, trace), backend) if world == 1 else None
        if is_cross_sectional(model_spec(cfg.model)):
            raise KnownBugError(f"{fixable[0].line(backend)} (the workaround, micro-batches, would cut the dates of "
                                f"the cross-sectional model {cfg.model.name!r} apart; lower train.batch_size)")
        if not micro:
            why = ("the workaround (micro-batches) needs one worker" if world > 1
                   else "micro-batches cannot bring K under the limit")
            raise KnownBugError(f"{fixable[0].line(backend)} ({why})")
        again = kb.evaluate(trace_run(cfg, n_features, outputs, micro), backend, traits)
        if again.matched:
            raise KnownBugError(f"{again.matched[0].line(backend)} (even at micro-batches of {micro} rows)")
        worst = fixable[0]
        check.micro_rows = micro
        check.lines.append(f"known backend bug {worst.entry.id} ({worst.entry.reference}) on {backend}: "
                           f"{worst.evidence}; working around it: micro-batches of {micro:,} rows, one loss and one "
                           "backward over the whole batch (the same gradient, summed from smaller matmuls)")
    seen: dict[str, list[str]] = {}
    for u in findings.unknown:
        seen.setdefault(u.why, []).append(f"{u.entry.id} ({u.entry.reference})")
    for why, ids in seen.items():
        check.lines.append(f"known backend bug(s) {', '.join(ids)} may apply on {backend}: {why} "
                           "(`alchemetric-ray doctor` probes the run's shapes; the shadow check watches the gradients)")
    return check


def forward(model: torch.nn.Module, x: torch.Tensor, micro_rows: int, date: torch.Tensor | None = None) -> torch.Tensor:
    """``model(x)``, in micro-batches of ``micro_rows`` rows when set and smaller than the batch (their
    outputs concatenated: the caller's one loss and backward give the whole batch's gradient).  A
    cross-sectional model gets each row's date code (``date``) and its batch whole: check_backend
    refuses micro-batches for it, since they would cut its dates apart."""
    if date is not None:
        return model(x, date)
    if not micro_rows or len(x) <= micro_rows:
        return model(x)
    return torch.cat([model(part) for part in x.split(micro_rows)])
