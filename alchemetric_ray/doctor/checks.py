"""The doctor's measurements, one function per check; each returns a plain JSON-able dict.

Every check runs the run's own step, not a toy: the configured model (``model.module`` included), as
many features as the run would have, its outputs (one score for a regression target, else one logit
per class), ``features.window``, the run's loss (cross-entropy, MSE, or the per-date IC loss on
batches of whole dates) and ``train.batch_size`` rows (:class:`RunShape`).  A bug that shows only at
the run's shapes (a reduction dimension K of tens of thousands, an operator only the IC loss uses) is
then met by the doctor before training meets it.

* operator coverage: the aten operators one step uses (forward, the run's loss, backward, the loop's
  AdamW step), recorded on the CPU with a ``TorchDispatchMode``, then probed on the target device in
  a fresh subprocess where ``PYTORCH_ENABLE_MPS_FALLBACK=0`` is set before torch loads; the probe
  runs the same step under a dispatch mode that catches each unsupported operator, lists it, and
  finishes that one call in float32 on the CPU, so every gap is listed instead of only the first;
* known backend bugs: the table (``hardware/known_bugs.yaml``) against a trace of the run's step,
  and a matmul probe at the exact shapes the trace recorded for every entry that matches (or that the
  trace cannot decide), run after dirtying the allocator as training does;
* numerical parity: K steps from the same seed, batch and initial weights on CPU float32 and on
  the target; max absolute / relative differences of outputs, loss and gradients;
* mixed-precision sanity: a short run under the target precision vs float32 on the same device;
* speed and memory: samples/s over a ladder of batch sizes around the run's, with warm-up and
  repeats, peak memory, and at each rung the step's numbers against CPU float32 (the larger the
  batch, the larger a weight gradient's K).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from alchemetric_ray.config import ModelConfig, RunConfig, loss_of
from alchemetric_ray.data.features import resolve_feature_names
from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.errors import UserError
from alchemetric_ray.hardware import (
    NonFiniteLossError,
    OptimizerStep,
    Precision,
    adamw,
    resolve_device,
    resolve_precision,
)
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware.device import (
    is_reference,
    peak_memory,
    reference_device,
    reset_peak_memory,
    synchronize,
)
from alchemetric_ray.hardware.inventory import MPS_FALLBACK_VAR
from alchemetric_ray.hardware.precision import FUSED_ADAMW_KINDS
from alchemetric_ray.models import build_model, model_spec
from alchemetric_ray.train.backend_check import step_rows, trace_run
from alchemetric_ray.train.losses import DateGroups, make_loss

NAMES_PER_DATE = 50  # the IC loss correlates within a date: the doctor's batches hold dates of this many names
# Tolerances on max |difference| relative to the CPU float32 reference, by precision.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
LOSS_TOLERANCE = {"fp32": 1e-3, "bf16": 0.05, "fp16": 0.03}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line (its type where it has no text): what a report or blocker shows."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


# ---- the run's shapes ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunShape:
    """What one training step of the run looks like: model, features, outputs, window, loss, rows.

    Taken from the config the way the run takes it (the feature list ``features.names`` resolves to,
    the label's classes, :func:`~alchemetric_ray.config.loss_of`), or from a saved model's manifest,
    which records what the model was actually trained on."""

    model: ModelConfig
    n_features: int
    outputs: int  # one logit per class; 1 for a regression target
    window: int
    loss: str  # ce | mse | ic
    batch: int  # train.batch_size: the rows of one step

    @classmethod
    def of(cls, cfg: RunConfig, manifest: Any = None) -> RunShape:
        if manifest is not None:
            n_features, outputs = len(manifest.features), manifest.outputs
        else:
            n_features = len(resolve_feature_names(cfg.features.names))
            outputs = len(LabelSpec.from_config(cfg.features).classes) or 1  # as Manifest.outputs counts them
        return cls(cfg.model, n_features, outputs, cfg.features.window, loss_of(cfg), cfg.train.batch_size)

    @property
    def sequence(self) -> bool:
        return model_spec(self.model).inputs == "sequence"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunShape:
        return cls(**{**raw, "model": ModelConfig(**raw["model"])})

    def describe(self) -> str:
        inputs = f"{self.window} x {self.n_features}" if self.sequence else f"{self.n_features}"
        return (f"{self.model.name}: {inputs} features -> {self.outputs} output(s), {self.loss} loss, "
                f"{self.batch:,} rows a step")


def date_sizes(rows: int) -> list[int]:
    """Rows per date of a batch of ``rows`` rows made of whole dates (the last one may hold fewer names)."""
    full, rest = divmod(rows, NAMES_PER_DATE)
    return [NAMES_PER_DATE] * full + ([rest] if rest else [])


def make_batch(shape: RunShape, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Inputs, labels and the batch's date sizes: labels the inputs predict (so that a short run
    learns), class indices for cross-entropy, real values for MSE and the IC loss."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, shape.window, shape.n_features) if shape.sequence else (batch, shape.n_features),
                    generator=g)
    signal = (x[:, -1] if shape.sequence else x)[:, :4].sum(dim=-1)
    if shape.loss == "ce":
        y = torch.zeros(batch, dtype=torch.long)
        for threshold in range(shape.outputs - 1):  # 3 classes: down below 0, flat to 1, up above
            y += (signal > threshold).long()
    else:
        y = signal + 0.5 * torch.randn(batch, generator=g)
    return x, y, date_sizes(batch)


def _on(device: torch.device, shape: RunShape, batch) -> tuple[torch.Tensor, torch.Tensor, DateGroups | None]:
    """A batch on ``device``, with its dates numbered as the loop numbers them (the IC loss only)."""
    x, y, sizes = batch
    dates = DateGroups.from_sizes(sizes, device) if shape.loss == "ic" else None
    return x.to(device), y.to(device), dates


def make_model(shape: RunShape, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(shape.model, shape.n_features, shape.outputs, window=shape.window)


def _forward_loss(model, batch, precision: Precision, loss_fn):
    """The loop's forward: the model under autocast, the loss in float32 outside it."""
    x, y, dates = batch
    with precision.autocast():
        out = model(x)
    return out, loss_fn(out, y, dates)


def _step(model, batch, precision: Precision, step_fn, loss_fn):
    out, loss = _forward_loss(model, batch, precision, loss_fn)
    step_fn(loss, epoch=0, step=0)
    return out, loss


# ---- operator coverage ---------------------------------------------------------------------


def _op_name(func) -> str:
    return str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)


def finish_on_reference(func, args: tuple, kwargs: dict):
    """Run ``func`` in float32 on the CPU and hand its results back as the call would have made them.

    Why float32: the CPU lacks half-precision kernels too (``linalg_eigh``, ``cholesky`` in bfloat16),
    so an operator missing on a device in half precision would fail again on the CPU.  Half and
    bfloat16 tensor arguments are cast to float32, floating outputs cast back to the dtype the
    original arguments promote to and moved back to their device; an argument the operator writes
    (an in-place update, an optimizer's ``_foreach_*_``) gets the result copied into it."""
    ref = reference_device()
    leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    home = leaves[0].device if leaves else ref
    floats = [t.dtype for t in leaves if t.is_floating_point()]
    out_dtype = functools.reduce(torch.promote_types, floats) if set(floats) & set(LOW_PRECISION) else None

    def lift(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(ref, torch.float32 if t.dtype in LOW_PRECISION else t.dtype)

    new_args, new_kwargs = tree_map(lift, args), tree_map(lift, kwargs)
    out = func(*new_args, **new_kwargs)
    written: list[tuple[torch.Tensor, torch.Tensor]] = []  # (the lifted tensor, the caller's)
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else []):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        old, new = (args[i], new_args[i]) if i < len(args) else (kwargs.get(arg.name), new_kwargs.get(arg.name))
        for o, n in zip(tree_leaves(old), tree_leaves(new)):
            if isinstance(o, torch.Tensor) and n is not o:
                o.copy_(n)
                written.append((n, o))

    def back(t):
        if not isinstance(t, torch.Tensor):
            return t
        for lifted, caller in written:
            if t is lifted:  # an in-place operator returns the tensor it wrote: the caller's
                return caller
        return t.to(home, out_dtype if out_dtype is not None and t.is_floating_point() else t.dtype)

    return tree_map(back, out)


class _Prober(TorchDispatchMode):
    """Run every op where its tensors are; one that has no kernel there is listed (with its error's
    first line) and finished in float32 on the CPU (:func:`finish_on_reference`), so that the step
    goes on and every gap of the step is listed, not only the first.  Every op's name is recorded."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()
        self.unsupported: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        self.ops.add(name)
        try:
            return func(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise  # a full device is no missing kernel
        except (NotImplementedError, RuntimeError) as exc:
            try:
                out = finish_on_reference(func, args, kwargs)
            except Exception:
                raise exc from None  # fails in float32 on the CPU too: the call itself is wrong
            self.unsupported.setdefault(name, first_line(exc))
            return out


def record_ops(shape: RunShape, batch: int | None = None) -> list[str]:
    """The aten operators one forward + loss + backward + AdamW step uses, recorded on the CPU (an
    operator the CPU lacks is finished in float32 there, so that the rest of the step is recorded)."""
    model = make_model(shape)
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), resolve_precision("fp32", reference_device()))
    data = _on(reference_device(), shape, make_batch(shape, batch or shape.batch))
    loss_fn = make_loss(shape.loss, None, reference_device())
    rec = _Prober()
    with rec:
        _step(model, data, resolve_precision("fp32", reference_device()), step_fn, loss_fn)
    return sorted(rec.ops)


def probe_in_process(shape: dict, device: str, mode: str, tf32: bool = False) -> dict:
    """Run in the fresh subprocess: one step of the run on ``device`` in precision ``mode`` under the prober."""
    run = RunShape.from_json(shape)
    dev = resolve_device(device, source="the doctor").device
    prec = resolve_precision(mode, dev, model=model_spec(run.model), tf32=tf32)  # the parent's decision, made again
    model = make_model(run).to(dev)
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), prec)
    loss_fn = make_loss(run.loss, None, dev)
    host = make_batch(run, run.batch)
    prober = _Prober()
    error = None
    try:
        with prober:
            _step(model, _on(dev, run, host), prec, step_fn, loss_fn)
    except Exception as exc:  # something the prober could not finish on the CPU either
        error = f"{type(exc).__name__}: {first_line(exc)}"
    return {"unsupported": prober.unsupported, "error": error}


def module_folder(model_cfg: ModelConfig) -> str | None:
    """The folder ``model.module`` is imported from (None: no module, or nowhere on disk).  This
    process may see it through its own launcher (pytest's rootdir, a notebook's working folder); the
    probe's fresh process sees it only through ``PYTHONPATH``."""
    if not model_cfg.module:
        return None
    spec = importlib.util.find_spec(model_cfg.module.split(".")[0])
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the folder that holds it
        return str(Path(next(iter(spec.submodule_search_locations))).parent)
    return str(Path(spec.origin).parent) if spec.has_location and spec.origin else None


def op_coverage(shape: RunShape, device: torch.device, precision: Precision, timeout: int = 300) -> dict:
    """Probe the run's operators on ``device`` in a fresh process with fallback disabled."""
    ops = record_ops(shape)
    env = {**os.environ, MPS_FALLBACK_VAR: "0"}
    folder = module_folder(shape.model)
    if folder:
        env["PYTHONPATH"] = os.pathsep.join([folder] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = ("import json,sys; from alchemetric_ray.doctor.checks import probe_in_process; a=json.loads(sys.argv[1]); "
            "print('DOCTOR:'+json.dumps(probe_in_process(a['s'], a['d'], a['p'], a['t'])))")
    arg = json.dumps({"s": shape.to_json(), "d": str(device), "p": precision.mode, "t": precision.tf32})
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("DOCTOR:")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        probe = {"unsupported": {}, "error": f"probe process failed: {tail}"}
    else:
        probe = json.loads(lines[-1][len("DOCTOR:"):])
    return {"ops": ops, "n_ops": len(ops), "rows": shape.batch, "unsupported": probe["unsupported"],
            "error": probe["error"], "fallback_env": f"{MPS_FALLBACK_VAR}=0",
            "seconds": round(time.monotonic() - started, 2),
            "passed": not probe["unsupported"] and probe["error"] is None}


# ---- known backend bugs: the table, and matmul probes at the run's shapes ---------------------

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


def probe_matmul(op: str, m: int, k: int, n: int, device: torch.device, *, batch: int = 1,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """One matmul at the given shape on ``device`` after :func:`dirty_allocator`, against the float64
    product on the CPU of the very same (rounded to ``dtype``) operands: max |error| / max |reference|."""
    batched = op in ("bmm", "baddbmm")
    shapes = [(batch, m, k), (batch, k, n)] if batched else [(m, k), (k, n)]
    if op in ("addmm", "baddbmm"):
        shapes.append((batch, m, n) if batched else (n,))
    shape = [batch, m, k, n] if batched else [m, k, n]
    call = str(kb.Matmul(op, m, k, n, batch, str(dtype).replace("torch.", "")))
    size = torch.finfo(dtype).bits // 8
    needed = (sum(math.prod(s) for s in shapes) + batch * m * n) * size
    result = {"op": op, "shape": shape, "call": call, "dtype": str(dtype).replace("torch.", ""),
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


# ---- numerical parity ----------------------------------------------------------------------


def _run_steps(shape: RunShape, device: torch.device, precision: Precision, steps: int, batch: int):
    """Outputs and loss of the last of ``steps`` SGD steps, and the gradients it applied (None where
    they were not finite: a GradScaler skipped the step, or float32/bf16 met a NaN)."""
    model = make_model(shape).to(device)
    model.train(False)  # no dropout: the same function on both sides
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step_fn = OptimizerStep(opt, precision, grad_clip=0)
    loss_fn = make_loss(shape.loss, None, device)
    grads: list[torch.Tensor] = []

    def keep_grads(*_):  # what the optimizer is about to apply: unscaled, and unclipped (grad_clip=0)
        grads[:] = [p.grad.detach().float().cpu().clone() for p in model.parameters() if p.grad is not None]

    opt.register_step_pre_hook(keep_grads)
    data = _on(device, shape, make_batch(shape, batch))
    out = loss = outcome = None
    for step in range(steps):
        out, loss = _forward_loss(model, data, precision, loss_fn)
        try:
            outcome = step_fn(loss, epoch=0, step=step)
        except NonFiniteLossError:  # no GradScaler to skip the step: it fails parity, it does not stop the doctor
            return out.detach().float().cpu(), float(loss.detach()), None
    return out.detach().float().cpu(), float(loss.detach()), None if outcome.skipped else grads


def _forward_backward(shape: RunShape, device: torch.device, precision: Precision, batch: int):
    """Outputs, loss and gradients of one forward and backward from the seed's weights (no optimizer,
    no GradScaler: what a step computes before it updates anything); gradients None if not finite."""
    model = make_model(shape).to(device)
    model.train(False)
    out, loss = _forward_loss(model, _on(device, shape, make_batch(shape, batch)), precision,
                              make_loss(shape.loss, None, device))
    loss.backward()
    grads = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    finite = math.isfinite(float(loss.detach())) and all(bool(torch.isfinite(g).all()) for g in grads)
    return out.detach().float().cpu(), float(loss.detach()), grads if finite else None


def _max_diffs(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> tuple[float, float]:
    diff = (a - b).abs().max().item()
    rel = diff / max(b.abs().max().item(), floor)
    return diff, rel


def _grads_max_rel(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """The largest difference of a gradient tensor relative to its reference's scale, that scale taken
    as at least 1% of the largest reference gradient: a tensor whose exact gradient is zero (the output
    bias under the IC loss, which a shift of a date's scores does not change) holds only rounding,
    which no tolerance relative to itself could pass."""
    scale = max((r.abs().max().item() for r in ref if r.numel()), default=0.0)
    return max((_max_diffs(g, r, max(1e-12, 1e-2 * scale))[1] for g, r in zip(got, ref) if r.numel()), default=0.0)


def compare(got, ref, mode: str) -> dict:
    """Outputs, loss and gradients of a step on a target against the same step on CPU float32."""
    logit_abs, logit_rel = _max_diffs(got[0], ref[0])
    if got[2] is None or ref[2] is None:  # the gradients were not finite
        grad_rel = float("inf")
    else:
        grad_rel = _grads_max_rel(got[2], ref[2])
    loss_abs = abs(got[1] - ref[1])
    if not math.isfinite(loss_abs):
        loss_abs = float("inf")
    tol = TOLERANCE[mode]
    passed = logit_rel <= tol and grad_rel <= tol * 10 and loss_abs <= LOSS_TOLERANCE[mode]
    return {"logits_max_abs": logit_abs, "logits_max_rel": logit_rel, "loss_abs": loss_abs,
            "grads_max_rel": grad_rel, "tolerance_rel": tol, "loss_tolerance": LOSS_TOLERANCE[mode],
            "passed": bool(passed)}


def parity(shape: RunShape, device: torch.device, precision: Precision, *, steps: int = 3,
           batch: int | None = None) -> dict:
    """``steps`` steps at the run's batch (``batch``: another size) on the target vs CPU float32."""
    batch = batch or shape.batch
    reference = reference_device()
    ref = _run_steps(shape, reference, resolve_precision("fp32", reference), steps, batch)
    got = _run_steps(shape, device, precision, steps, batch)
    return {"steps": steps, "batch": batch, **compare(got, ref, precision.mode)}


# ---- mixed-precision sanity ----------------------------------------------------------------


def amp_sanity(shape: RunShape, device: torch.device, precision: Precision, *, steps: int = 60,
               batch: int | None = None) -> dict:
    """A short AdamW run under ``precision`` vs float32 on the same device, on fresh batches each step.
    Losses may be negative (the IC loss): divergence and drift are measured on their magnitudes."""
    batch = batch or shape.batch
    loss_fn = make_loss(shape.loss, None, device)

    def run(prec: Precision):
        model = make_model(shape).to(device)
        step_fn = OptimizerStep(adamw(model.parameters(), lr=3e-3), prec, grad_clip=1.0, max_skipped_steps=steps + 1)
        losses, scales = [], []
        for step in range(steps):
            _, loss = _forward_loss(model, _on(device, shape, make_batch(shape, batch, seed=step)), prec, loss_fn)
            losses.append(float(loss.detach()))
            step_fn(loss, epoch=0, step=step)
            if step_fn.scaler.is_enabled():
                scales.append(step_fn.scaler.get_scale())
        return losses, scales, step_fn.skipped_total

    ref_losses, _, _ = run(resolve_precision("fp32", device))
    losses, scales, skipped = run(precision)
    tail = min(10, steps)
    final_ref = sum(ref_losses[-tail:]) / tail
    final = sum(losses[-tail:]) / tail
    finite = all(math.isfinite(loss) for loss in losses)
    diverged = not finite or final > losses[0] + 0.5 * abs(losses[0])
    passed = finite and not diverged and abs(final - final_ref) <= max(0.05, 0.1 * abs(final_ref))
    return {"steps": steps, "batch": batch, "final_loss": final, "final_loss_fp32": final_ref,
            "first_loss": losses[0], "diverged": diverged, "skipped_steps": skipped,
            "scale_history": scales[:: max(1, len(scales) // 10)], "passed": bool(passed)}


# ---- speed and memory ----------------------------------------------------------------------


def speed_ladder(batch: int, quick: bool = False) -> tuple[int, ...]:
    """Batch sizes around the run's: a quarter of it, it, and (not quick) four times it."""
    rungs = (batch // 4, batch) if quick else (batch // 4, batch, batch * 4)
    return tuple(sorted({max(1, r) for r in rungs}))


def speed(shape: RunShape, device: torch.device, precision: Precision, *, ladder: tuple[int, ...] | None = None,
          warmup: int = 3, repeats: int = 5) -> dict:
    """Samples/s of the run's step at each batch of ``ladder`` (default: :func:`speed_ladder`), and at
    each the step's outputs, loss and gradients against CPU float32 (not for CPU float32 itself)."""
    compared = not (is_reference(device.type) and precision.mode == "fp32")
    reference = reference_device()
    loss_fn = make_loss(shape.loss, None, device)
    rows = []
    for batch in ladder or speed_ladder(shape.batch):
        model = make_model(shape).to(device)
        step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), precision)
        data = _on(device, shape, make_batch(shape, batch))
        reset_peak_memory(device)
        try:
            for _ in range(warmup):
                _step(model, data, precision, step_fn, loss_fn)
            synchronize(device)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                _step(model, data, precision, step_fn, loss_fn)
                synchronize(device)
                times.append(time.perf_counter() - start)
            numbers = compare(_forward_backward(shape, device, precision, batch),
                              _forward_backward(shape, reference, resolve_precision("fp32", reference), batch),
                              precision.mode) if compared else None
        except RuntimeError as exc:  # out of memory at this batch size: the ladder stops here
            rows.append({"batch": batch, "error": first_line(exc)})
            break
        times.sort()
        median = times[len(times) // 2]
        rows.append({"batch": batch, "samples_per_s": batch / median, "median_s": median,
                     "peak_memory_bytes": peak_memory(device), "numbers": numbers})
    best = max((r for r in rows if "samples_per_s" in r), key=lambda r: r["samples_per_s"], default=None)
    return {"ladder": rows, "best_samples_per_s": best["samples_per_s"] if best else None,
            "best_batch": best["batch"] if best else None}
