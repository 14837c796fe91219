"""The doctor's measurements, one function per check; each returns a plain JSON-able dict.

* operator coverage: the aten operators a model uses in forward + backward + optimizer step,
  recorded on the CPU with a ``TorchDispatchMode``, then probed on the target device in a fresh
  subprocess where ``PYTORCH_ENABLE_MPS_FALLBACK=0`` is set before torch loads; the probe runs the
  same step under a dispatch mode that catches each unsupported operator, lists it, and finishes
  that one call on the CPU, so every gap is listed instead of only the first;
* numerical parity: K steps from the same seed, batch and initial weights on CPU float32 and on
  the target; max absolute / relative differences of logits, loss and gradients;
* mixed-precision sanity: a short run under the target precision vs float32 on the same device;
* speed and memory: forward+backward samples/s over a ladder of batch sizes, with warm-up and
  repeats, and peak memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from alchemetric_ray.config import ModelConfig
from alchemetric_ray.hardware import (
    NonFiniteLossError,
    OptimizerStep,
    Precision,
    resolve_device,
    resolve_precision,
)
from alchemetric_ray.hardware.device import (
    peak_memory,
    reference_device,
    reset_peak_memory,
    synchronize,
)
from alchemetric_ray.hardware.inventory import MPS_FALLBACK_VAR
from alchemetric_ray.models import build_model, model_spec

N_FEATURES, N_CLASSES, WINDOW = 16, 3, 20
# Tolerances on max |difference| relative to the CPU float32 reference, by precision.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
LOSS_TOLERANCE = {"fp32": 1e-3, "bf16": 0.05, "fp16": 0.03}


def make_batch(model_cfg: ModelConfig, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    seq = model_spec(model_cfg).inputs == "sequence"
    x = torch.randn((batch, WINDOW, N_FEATURES) if seq else (batch, N_FEATURES), generator=g)
    signal = x[:, -1, :4] if seq else x[:, :4]
    y = (signal.sum(dim=-1) > 0).long() + (signal.sum(dim=-1) > 1).long()
    return x, y


def make_model(model_cfg: ModelConfig, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(model_cfg, N_FEATURES, N_CLASSES, window=WINDOW)


def _step(model, x, y, precision: Precision, opt, step_fn):
    with precision.autocast():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
    step_fn(loss, epoch=0, step=0)
    return logits, loss


# ---- operator coverage ---------------------------------------------------------------------


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func))
        return func(*args, **(kwargs or {}))


def record_ops(model_cfg: ModelConfig, batch: int = 32) -> list[str]:
    """The aten operators one forward + backward + AdamW step uses, recorded on the CPU."""
    model = make_model(model_cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = make_batch(model_cfg, batch)
    rec = _Recorder()
    with rec:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return sorted(rec.ops)


class _Prober(TorchDispatchMode):
    """Run every op on the target; an unsupported one is listed and finished on the CPU."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.unsupported = device, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            self.unsupported.setdefault(name, str(exc).splitlines()[0][:200])

            def to_cpu(t):
                return t.cpu() if isinstance(t, torch.Tensor) else t

            def back(t):
                return t.to(self.device) if isinstance(t, torch.Tensor) else t

            out = func(*torch.utils._pytree.tree_map(to_cpu, args), **torch.utils._pytree.tree_map(to_cpu, kwargs))
            return torch.utils._pytree.tree_map(back, out)


def probe_in_process(model_cfg: dict, device: str, mode: str) -> dict:
    """Run in the fresh subprocess: one step on ``device`` in precision ``mode`` under the prober."""
    cfg = ModelConfig(**model_cfg)
    dev = resolve_device(device, source="the doctor").device
    prec = resolve_precision(mode, dev, model=model_spec(cfg))  # the parent's policy decision, made again here
    model = make_model(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = OptimizerStep(opt, prec)
    x, y = make_batch(cfg, 32)
    prober = _Prober(dev)
    error = None
    try:
        with prober:
            _step(model, x.to(dev), y.to(dev), prec, opt, step_fn)
    except Exception as exc:  # something the prober could not finish on the CPU either
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
    return {"unsupported": prober.unsupported, "error": error}


def op_coverage(model_cfg: ModelConfig, device: torch.device, precision: Precision, timeout: int = 300) -> dict:
    """Probe the model's operators on ``device`` in a fresh process with fallback disabled."""
    ops = record_ops(model_cfg)
    env = {**os.environ, MPS_FALLBACK_VAR: "0"}
    code = ("import json,sys; from alchemetric_ray.doctor.checks import probe_in_process; "
            "a=json.loads(sys.argv[1]); print('DOCTOR:'+json.dumps(probe_in_process(a['m'], a['d'], a['p'])))")
    arg = json.dumps({"m": model_cfg.__dict__, "d": str(device), "p": precision.mode})
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("DOCTOR:")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        probe = {"unsupported": {}, "error": f"probe process failed: {tail}"}
    else:
        probe = json.loads(lines[-1][len("DOCTOR:"):])
    return {"ops": ops, "n_ops": len(ops), "unsupported": probe["unsupported"], "error": probe["error"],
            "fallback_env": f"{MPS_FALLBACK_VAR}=0", "seconds": round(time.monotonic() - started, 2),
            "passed": not probe["unsupported"] and probe["error"] is None}


# ---- numerical parity ----------------------------------------------------------------------


def _run_steps(model_cfg: ModelConfig, device: torch.device, precision: Precision, steps: int, batch: int):
    """Logits and loss of the last of ``steps`` SGD steps, and the gradients it applied (None where
    they were not finite: a GradScaler skipped the step, or float32/bf16 met a NaN)."""
    model = make_model(model_cfg).to(device)
    model.train(False)  # no dropout: the same function on both sides
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step_fn = OptimizerStep(opt, precision, grad_clip=0)
    grads: list[torch.Tensor] = []

    def keep_grads(*_):  # what the optimizer is about to apply: unscaled, and unclipped (grad_clip=0)
        grads[:] = [p.grad.detach().float().cpu().clone() for p in model.parameters() if p.grad is not None]

    opt.register_step_pre_hook(keep_grads)
    x, y = make_batch(model_cfg, batch)
    x, y = x.to(device), y.to(device)
    logits = loss = outcome = None
    for step in range(steps):
        with precision.autocast():
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.float(), y)
        try:
            outcome = step_fn(loss, epoch=0, step=step)
        except NonFiniteLossError:  # no GradScaler to skip the step: it fails parity, it does not stop the doctor
            return logits.detach().float().cpu(), float(loss.detach()), None
    return logits.detach().float().cpu(), float(loss.detach()), None if outcome.skipped else grads


def _max_diffs(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    diff = (a - b).abs().max().item()
    rel = diff / max(b.abs().max().item(), 1e-12)
    return diff, rel


def parity(model_cfg: ModelConfig, device: torch.device, precision: Precision, *, steps: int = 3,
           batch: int = 64) -> dict:
    reference = reference_device()
    ref = _run_steps(model_cfg, reference, resolve_precision("fp32", reference), steps, batch)
    got = _run_steps(model_cfg, device, precision, steps, batch)
    logit_abs, logit_rel = _max_diffs(got[0], ref[0])
    if got[2] is None:  # the gradients were not finite
        grad_rel = float("inf")
    else:
        grad_rel = max((_max_diffs(g, r)[1] for g, r in zip(got[2], ref[2])), default=0.0)
    loss_abs = abs(got[1] - ref[1])
    tol = TOLERANCE[precision.mode]
    passed = logit_rel <= tol and grad_rel <= tol * 10 and loss_abs <= LOSS_TOLERANCE[precision.mode]
    return {"steps": steps, "logits_max_abs": logit_abs, "logits_max_rel": logit_rel, "loss_abs": loss_abs,
            "grads_max_rel": grad_rel, "tolerance_rel": tol, "loss_tolerance": LOSS_TOLERANCE[precision.mode],
            "passed": bool(passed)}


# ---- mixed-precision sanity ----------------------------------------------------------------


def amp_sanity(model_cfg: ModelConfig, device: torch.device, precision: Precision, *, steps: int = 60,
               batch: int = 128) -> dict:
    def run(prec: Precision):
        model = make_model(model_cfg).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        step_fn = OptimizerStep(opt, prec, grad_clip=1.0, max_skipped_steps=steps + 1)
        losses, scales = [], []
        for step in range(steps):
            x, y = make_batch(model_cfg, batch, seed=step)
            x, y = x.to(device), y.to(device)
            with prec.autocast():
                loss = nn.functional.cross_entropy(model(x).float(), y)
            losses.append(float(loss.detach()))
            step_fn(loss, epoch=0, step=step)
            if step_fn.scaler.is_enabled():
                scales.append(step_fn.scaler.get_scale())
        return losses, scales, step_fn.skipped_total

    ref_losses, _, _ = run(resolve_precision("fp32", device))
    losses, scales, skipped = run(precision)
    final_ref = sum(ref_losses[-10:]) / 10
    final = sum(losses[-10:]) / 10
    finite = all(loss == loss and abs(loss) != float("inf") for loss in losses)
    diverged = not finite or final > losses[0] * 1.5
    passed = finite and not diverged and abs(final - final_ref) <= max(0.05, 0.1 * final_ref)
    return {"steps": steps, "final_loss": final, "final_loss_fp32": final_ref, "first_loss": losses[0],
            "diverged": diverged, "skipped_steps": skipped, "scale_history": scales[:: max(1, len(scales) // 10)],
            "passed": bool(passed)}


# ---- speed and memory ----------------------------------------------------------------------


def speed(model_cfg: ModelConfig, device: torch.device, precision: Precision, *, ladder=(256, 1024, 4096),
          warmup: int = 3, repeats: int = 5) -> dict:
    rows = []
    for batch in ladder:
        model = make_model(model_cfg).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step_fn = OptimizerStep(opt, precision)
        x, y = make_batch(model_cfg, batch)
        x, y = x.to(device), y.to(device)
        reset_peak_memory(device)
        try:
            for _ in range(warmup):
                _step(model, x, y, precision, opt, step_fn)
            synchronize(device)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                _step(model, x, y, precision, opt, step_fn)
                synchronize(device)
                times.append(time.perf_counter() - start)
        except RuntimeError as exc:  # out of memory at this batch size: the ladder stops here
            rows.append({"batch": batch, "error": str(exc).splitlines()[0][:200]})
            break
        times.sort()
        median = times[len(times) // 2]
        rows.append({"batch": batch, "samples_per_s": batch / median, "median_s": median,
                     "peak_memory_bytes": peak_memory(device)})
    best = max((r for r in rows if "samples_per_s" in r), key=lambda r: r["samples_per_s"], default=None)
    return {"ladder": rows, "best_samples_per_s": best["samples_per_s"] if best else None,
            "best_batch": best["batch"] if best else None}
