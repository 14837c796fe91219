"""Numerical parity: K steps from the same seed, batch and initial weights on CPU float32 and on
the target; max absolute / relative differences of outputs, loss and gradients (:func:`compare`,
which the speed check applies at each batch size too)."""

from __future__ import annotations

import math
from typing import cast

import torch

from alchemetric_ray.checks.step import RunShape, _forward_loss, _on, make_batch, make_model
from alchemetric_ray.errors import NonFiniteLossError
from alchemetric_ray.hardware import OptimizerStep, Precision, StepOutcome, resolve_precision
from alchemetric_ray.hardware.device import reference_device
from alchemetric_ray.training.losses import make_loss

# Tolerances on max |difference| relative to the CPU float32 reference, by precision.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
LOSS_TOLERANCE = {"fp32": 1e-3, "bf16": 0.05, "fp16": 0.03}


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
    # cast: the loop ran (steps >= 1), so out, loss and outcome are set
    out, loss, outcome = cast(torch.Tensor, out), cast(torch.Tensor, loss), cast(StepOutcome, outcome)
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

