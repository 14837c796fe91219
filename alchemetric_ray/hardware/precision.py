"""The mixed-precision policy and the one optimizer-step function every loop uses.

Seed rule: mixed precision only where it is safe, i.e. on CUDA.  ``auto`` gives
  * CUDA with native bf16 (capability >= 8.0): bf16 autocast, no GradScaler;
  * older CUDA: fp16 autocast with ``torch.amp.GradScaler("cuda")``;
  * MPS, CPU, XPU: float32.
Explicit requests off CUDA are honoured only where they work: bf16 on MPS (torch >= 2.6,
macOS 14+, never with a GradScaler, and only once the doctor passed the model there: see
``records.py``), bf16 on CPU for models that do not declare CPU autocast broken.  Everything else
is refused with a one-line :class:`PrecisionError` that says why.

What the policy needs to know about a model comes from the model's own declaration
(:class:`ModelTraits`, which ``models.ModelSpec`` satisfies): hardware/ never imports models/.

One ``GradScaler`` built with ``enabled=False`` does nothing, so :class:`OptimizerStep` has a
single code path for fp32, fp16 and bf16: scale -> backward -> unscale -> clip -> step -> update.
"""

from __future__ import annotations

import contextlib
import math
import typing
from dataclasses import dataclass
from typing import Protocol

import torch

from alchemetric_ray.config import PrecisionMode
from alchemetric_ray.errors import UserError
from alchemetric_ray.hardware import inventory

MODES: tuple[str, ...] = typing.get_args(PrecisionMode)
EXPLICIT_MODES = tuple(mode for mode in MODES if mode != "auto")  # what the doctor examines
# Device kinds where explicit mixed precision also needs a passing doctor record of the model
# (records.require_doctor_checked_precision), with the name messages give them.
DOCTOR_GATED_KINDS = {"mps": "MPS"}
MPS_GRADSCALER_BUGS = "GradScaler on MPS had unscale and fused-Adam correctness bugs (pytorch#184286, #186360)"


class PrecisionError(UserError, ValueError):
    """A precision that this device/model cannot train in. The message is one line."""


@dataclass(frozen=True)
class Precision:
    mode: str  # fp32 | fp16 | bf16 (what actually runs; never "auto")
    device_type: str
    autocast_dtype: torch.dtype | None
    use_scaler: bool
    tf32: bool
    reason: str

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler)

    def apply_tf32_settings(self) -> None:
        """TF32 is a process-wide switch, for matmuls and for cuDNN (convolutions, RNNs) alike: set
        all of them explicitly on CUDA, either way, through one API.  torch >= 2.9 has the
        ``fp32_precision`` settings (cuDNN's default there is "tf32": a TCN's convolutions ran in TF32
        with ``precision.tf32=false``); older torch has only the ``allow_tf32`` flags.  Mixing the two
        makes torch refuse to read the flags, so exactly one of them is used."""
        if self.device_type != "cuda":
            return
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            value = "tf32" if self.tf32 else "ieee"
            torch.backends.cuda.matmul.fp32_precision = value
            torch.backends.cudnn.fp32_precision = value  # cuDNN's convolutions and RNNs follow it
        else:  # torch < 2.9
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "device_type": self.device_type,
            "autocast_dtype": str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else None,
            "grad_scaler": self.use_scaler,
            "tf32": self.tf32,
            "reason": self.reason,
        }

    def __str__(self) -> str:
        return f"{self.mode} ({self.reason})"


# ---- probes (patched in tests) -------------------------------------------------------------


def cuda_bf16_native() -> bool:
    return torch.cuda.is_bf16_supported(including_emulation=False)


def _cuda_capability(device: torch.device) -> str:
    from alchemetric_ray.hardware.device import cuda_capability

    major, minor = cuda_capability(device.index or 0)
    return f"{major}.{minor}"


# ---- the policy ----------------------------------------------------------------------------


class ModelTraits(Protocol):
    """What the policy needs to know about a model: its name (for messages) and, where CPU autocast
    is wrong for it, why (None = safe).  ``models.ModelSpec`` declares both."""

    name: str
    cpu_autocast_broken: str | None


def resolve_precision(
    requested: str,
    device: torch.device,
    *,
    model: ModelTraits | None = None,
    tf32: bool = False,
) -> Precision:
    """Choose the precision for ``device`` (and ``model``, the model's declaration), with a human-readable reason."""
    if requested not in MODES:
        raise PrecisionError(f"precision {requested!r} is not one of {', '.join(MODES)}")
    kind = device.type
    if kind == "cuda":
        return _cuda(requested, device, tf32)
    if kind == "mps":
        return _mps(requested)
    if kind == "cpu":
        return _cpu(requested, model)
    if requested in ("auto", "fp32"):
        return _fp32(kind, f"float32 on {kind}: mixed precision is automatic only on CUDA")
    raise PrecisionError(f"precision {requested!r} on {kind} is not supported here; use fp32")


def _fp32(kind: str, reason: str, tf32: bool = False) -> Precision:
    return Precision("fp32", kind, None, False, tf32, reason)


def _cuda(requested: str, device: torch.device, tf32: bool) -> Precision:
    cap = _cuda_capability(device)
    native_bf16 = cuda_bf16_native()
    if requested == "fp32":
        tf = "TF32 matmuls on (precision.tf32=true)" if tf32 else "TF32 matmuls off (precision.tf32=false)"
        return _fp32("cuda", f"float32 as requested; {tf}", tf32)
    if requested == "bf16" or (requested == "auto" and native_bf16):
        if not native_bf16:
            raise PrecisionError(f"precision 'bf16' requested but this GPU (capability {cap}) has no native bf16; "
                                 "use fp16 or fp32")
        why = "requested" if requested == "bf16" else "auto"
        return Precision("bf16", "cuda", torch.bfloat16, False, tf32,
                         f"bf16 autocast ({why}): native bf16 on capability {cap}; no GradScaler needed")
    why = "requested" if requested == "fp16" else f"auto: capability {cap} has no native bf16"
    return Precision("fp16", "cuda", torch.float16, True, tf32, f"fp16 autocast with GradScaler ({why})")


def _mps(requested: str) -> Precision:
    if requested in ("auto", "fp32"):
        why = "requested" if requested == "fp32" else "mixed precision is automatic only on CUDA"
        return _fp32("mps", f"float32 on MPS ({why})")
    if requested == "fp16":
        raise PrecisionError(f"precision 'fp16' on MPS is refused: it needs a GradScaler, and {MPS_GRADSCALER_BUGS}; "
                             "use bf16 or fp32")
    tv = inventory.torch_version()
    if tv < (2, 6):
        raise PrecisionError(f"precision 'bf16' on MPS needs torch >= 2.6 (installed {tv[0]}.{tv[1]}); use fp32")
    mac = inventory.macos_version()
    if mac is None or mac < (14,):
        shown = ".".join(map(str, mac)) if mac else "unknown"
        raise PrecisionError(f"precision 'bf16' on MPS needs macOS 14 or newer (found {shown}); use fp32")
    return Precision("bf16", "mps", torch.bfloat16, False, False,
                     "bf16 autocast on MPS as requested (torch >= 2.6, macOS 14+); no GradScaler on MPS")


def _cpu(requested: str, model: ModelTraits | None) -> Precision:
    if requested in ("auto", "fp32"):
        why = "requested" if requested == "fp32" else "mixed precision is automatic only on CUDA"
        return _fp32("cpu", f"float32 on CPU ({why})")
    if requested == "fp16":
        raise PrecisionError("precision 'fp16' on CPU is refused: it needs a GradScaler and runs slower than float32 "
                             "on CPUs; use fp32 or bf16")
    if model is not None and model.cpu_autocast_broken:
        raise PrecisionError(f"precision 'bf16' on CPU is refused for model '{model.name}': "
                             f"{model.cpu_autocast_broken}; use fp32")
    if inventory.cpu_has_bf16():
        note = "this CPU has bf16 instructions"
    else:
        note = "warning: this CPU has no bf16 instructions (avx512_bf16/amx), so it is often slower than float32"
    return Precision("bf16", "cpu", torch.bfloat16, False, False, f"bf16 autocast on CPU as requested; {note}")


# ---- the optimizer step --------------------------------------------------------------------


class NonFiniteLossError(UserError, FloatingPointError):
    """A NaN/inf loss (or gradient) where no GradScaler can skip the step.

    The user's to fix (learning rate, data), so a UserError: one line naming epoch and step."""


class TooManySkippedSteps(UserError, RuntimeError):
    """The GradScaler skipped too many steps in a row: training is not recovering (one line)."""


@dataclass(frozen=True)
class StepOutcome:
    grad_norm: float
    skipped: bool


class OptimizerStep:
    """scale -> backward -> unscale -> clip grad norm -> step -> update, for every precision."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        *,
        grad_clip: float = 1.0,
        max_skipped_steps: int = 100,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.scaler = scaler if scaler is not None else precision.make_scaler()
        self.grad_clip = grad_clip if grad_clip > 0 else math.inf
        self.max_skipped_steps = max_skipped_steps
        self.skipped_total = 0
        self.skipped_in_row = 0
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    def __call__(self, loss: torch.Tensor, *, epoch: int, step: int) -> StepOutcome:
        scaling = self.scaler.is_enabled()
        if not scaling and not torch.isfinite(loss.detach()):
            raise NonFiniteLossError(
                f"non-finite loss ({loss.item()}) at epoch {epoch} step {step} under {self.precision.mode} "
                "with no GradScaler to skip it; lower train.lr or check the data")
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        if not scaling and not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"non-finite gradient norm ({grad_norm}) at epoch {epoch} step {step} under {self.precision.mode} "
                "with no GradScaler to skip it; lower train.lr or check the data")
        scale_before = self.scaler.get_scale() if scaling else 1.0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = scaling and self.scaler.get_scale() < scale_before
        self.optimizer.zero_grad(set_to_none=True)
        if skipped:
            self.skipped_total += 1
            self.skipped_in_row += 1
            if self.skipped_in_row >= self.max_skipped_steps:
                raise TooManySkippedSteps(
                    f"{self.skipped_in_row} optimizer steps in a row skipped for non-finite gradients "
                    f"(last at epoch {epoch} step {step}, scale {self.scaler.get_scale():g}); "
                    "training is not recovering: lower train.lr or use precision.mode=fp32")
        else:
            self.skipped_in_row = 0
        return StepOutcome(grad_norm, skipped)
