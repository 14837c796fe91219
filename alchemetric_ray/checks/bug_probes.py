"""Known backend bugs: the table (``hardware/known_bugs.yaml``) against a trace of the run's step,
and a matmul probe at the exact shapes the trace recorded for every entry that matches (or that the
trace cannot decide), run after dirtying the allocator as training does."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from alchemetric_ray.checks.step import RunShape, first_line
from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import UserError
from alchemetric_ray.hardware import Precision
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware.device import reference_device, synchronize
from alchemetric_ray.hardware.optimizer import FUSED_ADAMW_KINDS
from alchemetric_ray.training.backend_check import step_rows, trace_run

SENTINEL = 1e4  # what the dirtied block holds: a read past an operand's end shows up as a large error
DIRTY_MIN_BYTES = 256 << 20
MAX_PROBE_BYTES = 1 << 30  # operands and output of one probe; a larger one is skipped (and says so)
NEAR = 0.5  # a matmul of a matched entry's ops with K >= NEAR x k_min comes near its trigger
PROBES_PER_ENTRY = 3
PROBE_TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 5e-3}  # max |error| / max |reference|


def _matmul(op: str, operands: list[torch.Tensor]) -> torch.Tensor:
    a, b = operands[0], operands[1]
    if op == "mm":
        return torch.mm(a, b)
    if op == "bmm":
        return torch.bmm(a, b)
    if op == "addmm":
        return torch.addmm(operands[2], a, b)
    return torch.baddbmm(operands[2], a, b)


def dirty_allocator(device: torch.device, dtype: torch.dtype, nbytes: int) -> None:
    """Fill a block of ``nbytes`` with :data:`SENTINEL` and free it.  A training step's operands sit
    in memory the caching allocator (CUDA, MPS) handed out before, full of earlier tensors; a kernel
    that reads past an operand's end reads those.  Freshly zeroed memory would hide the over-read
    (a zero adds nothing), so a probe allocates its operands only after this.  On the CPU, where
    freed memory goes back to the system, it changes nothing, and the probe checks the kernel only."""
    block = torch.empty(max(1, nbytes // (torch.finfo(dtype).bits // 8)), dtype=dtype, device=device)
    block.fill_(SENTINEL)
    synchronize(device)
    del block


def probe_matmul(op: str, m: int, k: int, n: int, device: torch.device, *, batch: int = 1,  # noqa: PLR0913 (a shape)
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """One matmul at the given shape on ``device`` after :func:`dirty_allocator`, against the float64
    product on the CPU of the very same (rounded to ``dtype``) operands: max |error| / max |reference|."""
    batched = op in ("bmm", "baddbmm")
    shapes: list[tuple[int, ...]] = [(batch, m, k), (batch, k, n)] if batched else [(m, k), (k, n)]
    if op in ("addmm", "baddbmm"):
        shapes.append((batch, m, n) if batched else (n,))
    shape = [batch, m, k, n] if batched else [m, k, n]
    call = str(kb.Matmul(op, m, k, n, batch, str(dtype).replace("torch.", "")))
    size = torch.finfo(dtype).bits // 8
    needed = (sum(math.prod(s) for s in shapes) + batch * m * n) * size
    result: dict[str, Any] = {"op": op, "shape": shape, "call": call, "dtype": str(dtype).replace("torch.", ""),
              "tolerance": PROBE_TOLERANCE[str(dtype).replace("torch.", "")]}
    if needed > MAX_PROBE_BYTES:
        return {**result, "max_rel_error": None, "passed": None,
                "skipped": f"skipped: {needed / 2**30:.1f} GiB of operands, over the probe's "
                           f"{MAX_PROBE_BYTES / 2**30:.0f} GiB"}
    g = torch.Generator().manual_seed(seed)
    host = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    dirty_allocator(device, dtype, max(DIRTY_MIN_BYTES, 2 * needed))
    operands = []
    for t in host:  # torch.empty, not zeros: the operands land in the dirtied memory as training's do
        operands.append(torch.empty(t.shape, dtype=dtype, device=device))
        operands[-1].copy_(t)
    got = _matmul(op, operands).to(reference_device(), torch.float64)
    del operands
    ref = _matmul(op, [t.double() for t in host])
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item() / max(scale, 1e-30)
    if not math.isfinite(err):
        err = float("inf")
    return {**result, "max_rel_error": err, "passed": bool(err <= result["tolerance"])}


def _largest_first(call: kb.Matmul) -> tuple:
    """Sort key: the largest K first, then the largest output (a fixed order for equal K)."""
    return (-call.k, -call.batch * call.m * call.n, call.op, call.m, call.n)


def probe_calls(findings: kb.Findings, trace: kb.Trace) -> list[tuple[kb.Matmul, list[str]]]:
    """The trace's matmuls to probe, each with the ids of the entries it is probed for.

    A matched matmul entry: the calls that meet its trigger, then those of its ops that come near it
    (K >= NEAR x k_min), at most :data:`PROBES_PER_ENTRY` shapes, the largest K first.  An "unknown:
    probe" entry (a layer runs the backend's own kernels): the largest-K calls of its ops, or, where
    the trace has none of them, the largest-K calls of any op run as its first op (batch 1)."""
    chosen: dict[kb.Matmul, list[str]] = {}

    def take(entry: kb.Entry, calls: list[kb.Matmul]) -> None:
        for call in list(dict.fromkeys(calls))[:PROBES_PER_ENTRY]:
            chosen.setdefault(call, []).append(entry.id)

    for match in findings.matched:
        if match.entry.kind != "matmul":
            continue
        rule = match.entry.trigger
        hits = sorted(set(match.calls), key=_largest_first)
        near = sorted((c for c in trace.matmuls if c.op in rule["ops"] and c.k >= NEAR * rule["k_min"]
                       and c not in hits), key=lambda c: (abs(c.k - rule["k_min"]), _largest_first(c)))
        take(match.entry, hits + near)
    for unknown in findings.unknown:
        if unknown.entry.kind != "matmul":
            continue
        ops = unknown.entry.trigger["ops"]
        own = [c for c in trace.matmuls if c.op in ops]
        calls = own or [dataclasses.replace(c, op=ops[0], batch=1) for c in trace.matmuls]
        take(unknown.entry, sorted(set(calls), key=_largest_first))
    return list(chosen.items())


def _table_needs_trace(backend: kb.Backend) -> bool:
    return any(e.kind in ("matmul", "dtype", "module") and e.applies(backend) is not False for e in kb.entries())


def known_bugs(cfg: RunConfig, shape: RunShape, device: torch.device, precision: Precision, *,
               backend: kb.Backend | None = None) -> dict:
    """The known-bug table against the run on ``device``, and a matmul probe on ``device`` at every
    shape :func:`probe_calls` picks (``backend``: the backend the table is matched against, by default
    ``device``'s own; a test may name another).  The probe computes in the precision's autocast dtype,
    as the run's matmuls do; the trace records the step at the run's per-step rows
    (``train.micro_batch_rows`` where set)."""
    backend = backend or kb.Backend.of(device)
    rows = step_rows(cfg)
    trace, trace_error = None, None
    if _table_needs_trace(backend):
        try:
            trace = trace_run(cfg, shape.n_features, shape.outputs, rows)
        except UserError:
            raise
        except Exception as exc:  # the run's own check would fail the same way: a finding, not a crash
            trace_error = f"{type(exc).__name__}: {first_line(exc)}"
    fused = backend.kind in FUSED_ADAMW_KINDS  # the loop's AdamW on that backend (hardware.adamw)
    findings = kb.evaluate(trace, backend, kb.RunTraits(grad_scaler=precision.use_scaler, fused_optimizer=fused))
    dtype = precision.autocast_dtype or torch.float32
    probes = [{"entries": ids, **probe_matmul(c.op, c.m, c.k, c.n, device, batch=c.batch, dtype=dtype)}
              for c, ids in (probe_calls(findings, trace) if trace is not None else [])]
    found = findings.as_dict()
    found["not_evaluable"] = [{"id": e.id, "source": e.source} for e in findings.not_evaluable]
    return {**found, "rows": rows, "trace_error": trace_error, "probes": probes,
            "passed": trace_error is None and all(p["passed"] is not False for p in probes)}

