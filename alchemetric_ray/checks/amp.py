"""Mixed-precision sanity: a short run under the target precision vs float32 on the same device."""

from __future__ import annotations

import math

import torch

from alchemetric_ray.checks.step import RunShape, _forward_loss, _on, make_batch, make_model
from alchemetric_ray.hardware import OptimizerStep, Precision, adamw, resolve_precision
from alchemetric_ray.training.losses import make_loss


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

