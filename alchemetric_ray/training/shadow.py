"""The in-run shadow check: the backend's gradients against a float32 CPU copy, while it trains.

At a check the loop runs an *extra* forward and backward of the plain module (not DDP) in eval mode
(no dropout, so both sides compute one function) on its device, under the run's precision and
micro-batches, and the same on a float32 CPU copy with the same weights and batch.  The loss and each
whole gradient are compared by norm-relative error, ``|g_dev - g_cpu| / |g_cpu|``, and so is each
parameter's (against a floor where its gradient nearly cancels: :func:`_scale`); a scaler's gradients
are unscaled first.  An error above the precision's :data:`TOLERANCE` stops the run with one line
(epoch, step, the parameter with the largest error and its size, the table entry that could explain
it, the remedy).  The checkpoints written before it stay.  The training step itself is untouched:
the check's gradients never reach ``.grad``.

Each check reads the device once (the loss, the gradients and the weights in one transfer); under DDP
the verdict is then a collective (MAX over the ranks, a second read), so that every rank stops at
the same check.  The device is synchronised before a check (no read), so that its cost is its own.

How often: ``train.shadow_every`` steps when set; otherwise adaptive.  The first check runs at the
first step, the second after :data:`FIRST_GAP` steps; from then on the gap is the smallest number of
steps whose time is at least 1 / :data:`BUDGET` times the last check's cost, so that checks cost at
most 5 % of the step time.

Which runs: ``train.shadow=auto`` checks MPS (``hardware.device.shadowed_by_default``), the backend the seed rule
does not trust until verified; ``true`` checks any device: CUDA, or the CPU (which then checks its own
precision against float32); ``false`` none.  The CPU copy's modules carry ``shadow_reference = True``,
so that a fault-injection test can model a bug of the device's kernels alone.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np
import torch
from torch import nn

from alchemetric_ray.errors import ShadowDivergence
from alchemetric_ray.hardware.device import shadowed_by_default, synchronize
from alchemetric_ray.hardware.precision import Precision
from alchemetric_ray.models import is_cross_sectional
from alchemetric_ray.training.backend_check import forward
from alchemetric_ray.training.losses import DateGroups

BUDGET = 0.05  # adaptive checks cost at most this share of the step time
FIRST_GAP = 10  # steps between the first check and the second (which measures the step time)


@dataclass(frozen=True)
class Tolerance:
    loss: float  # the loss's relative error
    gradient: float  # the whole gradient's norm-relative error
    parameter: float  # any one parameter's (see _scale)


# By precision.  bf16: on the CPU (2026-12-02, a check at every step of 10 epochs, bench/shadow.py's
# models) bf16 autocast against float32 reached 5.5 % on the whole gradient, 23 % on one parameter
# (a LayerNorm weight) and 0.01 % on the loss: these are 2-3x that.  fp16 has 3 more mantissa bits
# (about 8x less rounding): bf16's divided by 3, not measured here (fp16 runs only on CUDA).  fp32:
# a backend's float32 differs from the CPU's only in the order of its sums.
TOLERANCE = {"fp32": Tolerance(loss=1e-3, gradient=1e-3, parameter=1e-2),
             "bf16": Tolerance(loss=0.05, gradient=0.15, parameter=0.5),
             "fp16": Tolerance(loss=0.02, gradient=0.05, parameter=0.2)}


# A gradient's error is measured against its own norm, or, where that is tiny (a gradient that nearly
# cancels), against this share of the norm it would have if the whole gradient were spread evenly over
# the values: so a near-zero gradient's rounding is not read as a divergence.
FLOOR = 0.1


def _scale(reference: np.ndarray, total: float, values: int) -> float:
    even = total * math.sqrt(reference.size / max(values, 1))
    return max(float(np.linalg.norm(reference)), FLOOR * even, 1e-12)


def shadow_wanted(setting: str, device: torch.device) -> bool:
    """``train.shadow``: auto (the device kinds :func:`shadowed_by_default` names), true or false."""
    return setting == "true" or (setting == "auto" and shadowed_by_default(device))


@dataclass
class ShadowStats:
    checks: int = 0
    every: int = 0  # the gap in steps now (the fixed one, or the adaptive one)
    max_error: float = 0.0  # the largest norm-relative error of the whole gradient seen
    max_parameter_error: float = 0.0  # the largest of any one parameter's
    max_error_param: str | None = None  # whose
    max_loss_error: float = 0.0
    seconds: float = 0.0  # spent in checks
    skipped_overflow: int = 0  # checks whose device gradients were not finite under a GradScaler
    epoch_max_error: float = 0.0  # the largest error of the current epoch (reset by the loop's row)

    def as_dict(self) -> dict:
        return {"checks": self.checks, "every": self.every, "max_error": self.max_error,
                "max_parameter_error": self.max_parameter_error, "max_error_param": self.max_error_param,
                "max_loss_error": self.max_loss_error,
                "seconds": round(self.seconds, 4), "skipped_overflow": self.skipped_overflow}


@dataclass(frozen=True)
class ShadowSettings:
    """How one worker's shadow check runs: ``every`` steps (0: the adaptive budget), the known-bug
    micro-batch size its forward uses (0: whole batches), the hint its failure line ends with, and the
    worker's place in its group (``world`` ranks, this one ``rank``)."""

    every: int = 0
    micro_rows: int = 0
    hint: str | None = None
    world: int = 1
    rank: int = 0


class ShadowCheck:
    """The check for one worker's training (see the module docstring).  ``losses``: the run's loss on
    the worker's device and on the CPU copy's."""

    def __init__(self, core: nn.Module, precision: Precision, losses: tuple, device: torch.device,
                 settings: ShadowSettings = ShadowSettings(), *, scaler: torch.amp.GradScaler | None = None):
        self.core, self.precision, self.device = core, precision, device
        self.loss_fn, self.reference_loss_fn = losses
        every = self.fixed = settings.every
        self.micro_rows = settings.micro_rows
        self.scaler = scaler
        self.hint = settings.hint
        self.world, self.rank = settings.world, settings.rank
        self.tolerance = TOLERANCE[precision.mode]
        self.names = [name for name, p in core.named_parameters() if p.requires_grad]
        self.params = [p for p in core.parameters() if p.requires_grad]
        self.reference = copy.deepcopy(core).to("cpu", torch.float32)
        for module in self.reference.modules():  # marks the copy (a fault-injection test's model reads it)
            module.shadow_reference = True  # type: ignore[assignment]  # a marker; torch types attributes as tensors
        self.reference_params = [p for p in self.reference.parameters() if p.requires_grad]
        self.stats = ShadowStats(every=every or FIRST_GAP)
        self._until = 0  # steps to go before the next check (0: the first step checks)
        self._steps_since = 0
        self._since: float | None = None  # perf_counter at the end of the last check, or at the epoch's start
        self._step_time: float | None = None  # seconds per training step, as last measured between checks

    # ---- when ---------------------------------------------------------------------------------

    def epoch_started(self) -> None:
        """Called by the loop before an epoch's first step: the step time is measured over training
        steps only, never over the validation, checkpoint and report between two epochs."""
        self._since = time.perf_counter()
        self._steps_since = 0

    def due(self) -> bool:
        """Called once per training step, before it: whether this step is checked."""
        if self._until > 0:
            self._until -= 1
            self._steps_since += 1
            return False
        return True

    def _schedule(self, cost: float, step_time: float | None) -> None:
        if self.fixed:
            gap = self.fixed
        elif step_time is None or step_time <= 0:
            gap = FIRST_GAP
        else:
            gap = max(1, math.ceil(cost / (BUDGET * step_time)))
        self.stats.every = gap
        self._until = gap - 1
        self._steps_since = 0

    # ---- the check ----------------------------------------------------------------------------

    def __call__(self, batch: tuple, cpu_batch: tuple, *, epoch: int, step: int) -> None:
        """Check at this step: ``batch`` = (x, y, dates) as the step has them on the device,
        ``cpu_batch`` the same on the CPU.  ``epoch`` and ``step`` label the message (epochs from 1)."""
        synchronize(self.device)
        started = time.perf_counter()
        if self._since is not None and self._steps_since:
            self._step_time = (started - self._since) / self._steps_since
        found = self._compare(batch, cpu_batch)
        ratio = found.ratio(self.tolerance)
        if self.world > 1:  # the verdict is the group's: every rank stops at the same check
            flag = torch.tensor([ratio], device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            group_ratio = float(flag)
        else:
            group_ratio = ratio
        self._record(found)
        cost = time.perf_counter() - started
        self.stats.seconds += cost
        if group_ratio > 1:
            raise ShadowDivergence(self._message(found, ratio, epoch, step))
        self._since = time.perf_counter()
        self._schedule(cost, self._step_time)

    def _record(self, found: _Errors) -> None:
        stats = self.stats
        stats.checks += 1
        if not found.finite:
            stats.skipped_overflow += 1
            return
        worst = found.worst
        stats.epoch_max_error = max(stats.epoch_max_error, found.gradient)
        stats.max_error = max(stats.max_error, found.gradient)
        if worst is not None and found.parameters[worst] >= stats.max_parameter_error:
            stats.max_parameter_error, stats.max_error_param = found.parameters[worst], self.names[worst]
        stats.max_loss_error = max(stats.max_loss_error, found.loss)

    def _compare(self, batch: tuple, cpu_batch: tuple) -> _Errors:
        x, y, dates = batch
        was = self.core.training
        self.core.eval()
        try:
            with self.precision.autocast():
                out = forward(self.core, x, self.micro_rows, _code(self.core, dates))
            loss = self.loss_fn(out, y, dates)
            scaling = self.scaler is not None and self.scaler.is_enabled()
            scaler = cast(torch.amp.GradScaler, self.scaler)  # read below only when scaling: not None
            target = scaler.scale(loss) if scaling else loss
            grads: Sequence[torch.Tensor] = torch.autograd.grad(target, self.params, allow_unused=True)
            inverse = (1.0 / cast(torch.Tensor, scaler._scale).float()) if scaling else None  # scale() set it
            grads = [torch.zeros_like(p) if g is None
                     else (g.float() * cast(torch.Tensor, inverse) if scaling else g.float())
                     for p, g in zip(self.params, grads)]
            # the one read of the check: the loss, the gradients and the weights in one transfer
            flat = torch.cat([loss.detach().float().reshape(1), *(g.reshape(-1) for g in grads),
                              *(p.detach().float().reshape(-1) for p in self.params)]).cpu()
        finally:
            self.core.train(was)
        sizes = [p.numel() for p in self.params]
        n = sum(sizes)
        with torch.no_grad():  # the CPU copy takes the device's weights, from the one transfer
            for p, w in zip(self.reference_params, flat[1 + n:].split(sizes)):
                p.copy_(w.view_as(p))
        self.reference.eval()
        cx, cy, cdates = cpu_batch
        code = _code(self.reference, cdates)
        reference_out = self.reference(cx.float()) if code is None else self.reference(cx.float(), code)
        reference_loss = self.reference_loss_fn(reference_out, cy, cdates)
        reference_grads = torch.autograd.grad(reference_loss, self.reference_params, allow_unused=True)
        # the comparison in numpy, on host memory only (nothing here reads the device again)
        reference = torch.cat([reference_loss.detach().reshape(1)] + [
            torch.zeros(p.numel()) if g is None else g.reshape(-1) for p, g in zip(self.reference_params,
                                                                                 reference_grads)]).numpy()
        device = flat[:1 + n].numpy()
        bounds = np.cumsum([1, *sizes])
        references = np.split(reference[1:], bounds[1:-1] - 1)
        differences = np.split(device[1:] - reference[1:], bounds[1:-1] - 1)
        total = float(np.linalg.norm(reference[1:]))
        return _Errors(
            loss=abs(float(device[0]) - float(reference[0])) / max(abs(float(reference[0])), 1e-6),
            gradient=float(np.linalg.norm(device[1:] - reference[1:])) / max(total, 1e-12),
            parameters=[float(np.linalg.norm(d)) / _scale(r, total, n) for d, r in zip(differences, references)],
            finite=bool(np.isfinite(device).all()))

    def _message(self, found: _Errors, ratio: float, epoch: int, step: int) -> str:
        tol = self.tolerance
        on = f"on {self.device.type} {self.precision.mode}"
        if ratio <= 1:  # only another rank's check failed
            what = "another rank's gradients left its float32 CPU copy's"
        else:
            worst = found.worst
            p = self.params[worst] if worst is not None else None
            shape = ("x".join(map(str, p.shape)) or "scalar") if p is not None else ""
            at = cast(int, worst)  # read only where p is not None, i.e. worst is not None
            largest = (f"; the largest is {self.names[at]}'s ({shape}, {p.numel():,} values), off by "
                       f"{found.parameters[at]:.2%} (tolerance {tol.parameter:.1%})" if p is not None else "")
            what = (f"the gradient {on} is off by {found.gradient:.2%} of its norm from a float32 CPU copy's "
                    f"(tolerance {tol.gradient:.1%}), the loss by {found.loss:.2%} (tolerance {tol.loss:.1%}){largest}")
        entry = f"known backend bugs that could explain it: {self.hint}" if self.hint else \
            "no entry of the known-bug table matches this run"
        return (f"shadow check failed at epoch {epoch} step {step}: {what}; {entry}; the checkpoints of earlier "
                "epochs are kept; remedy: train on the CPU (--device cpu) or in precision.mode=fp32, and report it "
                "with the run's summary and `alchemetric-ray env`'s output")


@dataclass(frozen=True)
class _Errors:
    """One check's errors against the CPU copy: the loss's relative error, the whole gradient's
    norm-relative error, each parameter's (see :func:`_scale`), and whether the device's were finite."""

    loss: float
    gradient: float
    parameters: list[float]
    finite: bool

    @property
    def worst(self) -> int | None:
        return max(range(len(self.parameters)), key=self.parameters.__getitem__) if self.parameters else None

    def ratio(self, tol: Tolerance) -> float:
        """The largest error as a multiple of its tolerance (> 1: the check fails); 0 for a check whose
        device gradients overflowed under a GradScaler (the step itself is skipped then)."""
        if not self.finite:
            return 0.0
        return max(self.loss / tol.loss, self.gradient / tol.gradient,
                   max(self.parameters, default=0.0) / tol.parameter)


def _code(model: nn.Module, dates) -> torch.Tensor | None:
    """Each row's date code for a cross-sectional model (its batches hold whole dates), else None."""
    return dates.code if is_cross_sectional(model) and isinstance(dates, DateGroups) else None
