"""The mixed-precision policy: which precision a device and a model train in, and why.

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
The step that trains in the chosen precision is ``optimizer.py``'s.
"""

from __future__ import annotations

import contextlib
import typing
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from alchemetric_ray.config import PrecisionMode
from alchemetric_ray.errors import PrecisionError
from alchemetric_ray.hardware import inventory
from alchemetric_ray.hardware.kinds import kind_of_device

MODES: tuple[str, ...] = typing.get_args(PrecisionMode)
EXPLICIT_MODES = tuple(mode for mode in MODES if mode != "auto")  # what the doctor examines


def refused_by_table(backend_kind: str, *, grad_scaler: bool = False, fused_optimizer: bool = False) -> list[str]:
    """The known-bug table's entries (``known_bugs.yaml``) whose precision or optimizer rule a run with a
    GradScaler / a fused optimizer on ``backend_kind`` meets, in this torch: ``"id (source)"`` each."""
    from alchemetric_ray.hardware import known_bugs

    backend = known_bugs.Backend(backend_kind, known_bugs._version(torch.__version__))
    traits = known_bugs.RunTraits(grad_scaler=grad_scaler, fused_optimizer=fused_optimizer)
    found = known_bugs.evaluate(None, backend, traits)
    return [f"{m.entry.id} ({m.entry.reference})" for m in found.matched]


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
        if not kind_of_device(self.device_type).tf32:
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
    is wrong for it, why (None = safe).  ``models.ModelSpec`` declares both (read-only: it is frozen)."""

    @property
    def name(self) -> str: ...

    @property
    def cpu_autocast_broken(self) -> str | None: ...


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
    policy = _POLICIES.get(kind)
    if policy is not None:
        return policy(requested, device, model, tf32)
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
    bugs = refused_by_table("mps", grad_scaler=True) if requested == "fp16" else []
    if bugs:
        raise PrecisionError(f"precision 'fp16' on MPS is refused: it needs a GradScaler, which meets the known "
                             f"backend bug(s) {', '.join(bugs)}; use bf16 or fp32")
    if requested == "fp16":  # no entry applies to this torch: fp16 on MPS is still not offered
        raise PrecisionError("precision 'fp16' on MPS is not supported here; use bf16 or fp32")
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


# The kinds with a policy of their own; any other kind trains in float32 only.
_POLICIES: dict[str, Callable[[str, torch.device, ModelTraits | None, bool], Precision]] = {
    "cuda": lambda requested, device, model, tf32: _cuda(requested, device, tf32),
    "mps": lambda requested, device, model, tf32: _mps(requested),
    "cpu": lambda requested, device, model, tf32: _cpu(requested, model),
}
