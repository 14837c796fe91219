"""Speed and memory: samples/s over a ladder of batch sizes around the run's, with warm-up and
repeats, peak memory, and at each rung the step's numbers against CPU float32 (the larger the
batch, the larger a weight gradient's K)."""

from __future__ import annotations

import time
from typing import cast

import torch

from alchemetric_ray.checks.parity import _forward_backward, compare
from alchemetric_ray.checks.step import RunShape, _on, _step, first_line, make_batch, make_model
from alchemetric_ray.hardware import OptimizerStep, Precision, adamw, resolve_precision
from alchemetric_ray.hardware.device import is_reference, peak_memory, reference_device, reset_peak_memory, synchronize
from alchemetric_ray.training.losses import make_loss


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
    best = max((r for r in rows if "samples_per_s" in r), key=lambda r: cast(float, r["samples_per_s"]),
               default=None)  # cast: the rows that have samples_per_s hold it as a float
    return {"ladder": rows, "best_samples_per_s": best["samples_per_s"] if best else None,
            "best_batch": best["batch"] if best else None}
