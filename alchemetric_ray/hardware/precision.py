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


def refused_by_table(backend_kind: str, *, grad_scaler: bool = False, fused_optimizer: bool = False) -> list[str]:
    """The known-bug table's entries (``known_bugs.yaml``) whose precision or optimizer rule a run with a
    GradScaler / a fused optimizer on ``backend_kind`` meets, in this torch: ``"id (source)"`` each."""
    from alchemetric_ray.hardware import known_bugs

    backend = known_bugs.Backend(backend_kind, known_bugs._version(torch.__version__))
    traits = known_bugs.RunTraits(grad_scaler=grad_scaler, fused_optimizer=fused_optimizer)
    found = known_bugs.evaluate(None, backend, traits)
    return [f"{m.entry.id} ({m.entry.reference})" for m in found.matched]


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


# ---- the optimizer step --------------------------------------------------------------------

# Device kinds whose fused AdamW kernel the loop uses.  Not MPS: its fused Adam ignored found_inf
# (known_bugs.yaml: mps-fused-adam-ignores-found-inf), and with no GradScaler there, fusing buys MPS no sync.
FUSED_ADAMW_KINDS = ("cuda", "cpu")


def fused_adamw_supported(params: list[torch.Tensor]) -> bool:
    """Whether ``torch.optim.AdamW(..., fused=True)`` can take ``params``: every one floating point and
    on a device kind in :data:`FUSED_ADAMW_KINDS` (fused AdamW raises on anything else)."""
    return bool(params) and all(p.is_floating_point() and p.device.type in FUSED_ADAMW_KINDS for p in params)


def adamw(params, **kwargs) -> torch.optim.AdamW:
    """The loop's AdamW: fused where :func:`fused_adamw_supported`, else the plain one.

    Fused because its kernel takes the GradScaler's found-inf flag as a tensor and skips the update
    on the device, where the plain AdamW reads the flag on the host (a sync every fp16 step); one
    choice for every precision, so that fp32, bf16 and fp16 runs update the weights the same way.
    On the CPU (torch 2.13) it is as close to a float64 reference as the plain AdamW, and faster: a
    6k-parameter MLP's optimizer step 41 vs 145 us, its whole training step 478 vs 637 us (2 cores)."""
    params = list(params)
    return torch.optim.AdamW(params, fused=fused_adamw_supported(params), **kwargs)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, but the optimizer goes on stepping as it was built to
    (fused or not: :func:`adamw`'s choice for this process's device), whatever the checkpoint's did.

    A checkpoint brings back every hyperparameter of its groups, ``fused`` among them: one written
    by a plain AdamW (before the loop fused it, or on MPS) would turn the fused one plain while
    GradScaler still hands it a found-inf flag, which a plain AdamW refuses.  A fused step wants its
    step counters on the parameters' device; a plain one keeps them in host memory."""
    fused = [group.get("fused") for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, was in zip(optimizer.param_groups, fused):
        if "fused" not in group or group["fused"] == was:
            continue
        group["fused"] = was
        for p in group["params"]:
            counter = optimizer.state.get(p, {}).get("step")
            if torch.is_tensor(counter):
                on_device = was or group.get("capturable")
                optimizer.state[p]["step"] = (counter.to(p.device, torch.float32) if on_device
                                              else counter.to("cpu"))


class NonFiniteLossError(UserError, FloatingPointError):
    """A NaN/inf loss (or gradient) where no GradScaler can skip the step.

    The user's to fix (learning rate, data), so a UserError: one line naming epoch and step."""


class TooManySkippedSteps(UserError, RuntimeError):
    """The GradScaler skipped too many steps in a row: training is not recovering (one line)."""


@dataclass(frozen=True)
class StepOutcome:
    """One step's gradient norm (after unscaling, before clipping) and whether its update was skipped
    (a GradScaler's found inf, or a non-finite loss/gradient without one): 0-dim tensors on the
    device, so that a caller reads them (a host sync) only if it wants them."""

    grad_norm: torch.Tensor
    skipped: torch.Tensor


_NO_STEP = -1  # "no such step yet" in the step-index tensors


class OptimizerStep:
    """scale -> backward -> unscale -> clip grad norm -> step -> update, for every precision.

    No step reads anything back to the host.  What the host must act on is kept on the device:
    the first non-finite loss or gradient norm where no GradScaler skips it (its step, loss and
    norm), the skipped steps in all and in a row, and the first time the run of skips reached
    ``max_skipped_steps``.  :meth:`check` reads all of it in one transfer and raises; it runs after
    every ``check_every`` steps (1, the default, for callers that want a verdict after every step)
    and whenever the caller asks, as the loop does before each report and checkpoint.
    Under DDP the verdict is a collective (MAX over the ranks), so every rank stops at one check.

    A non-finite loss or gradient without a GradScaler does not update the weights: the step is
    masked on the device (a fused optimizer skips it through the found-inf flag GradScaler uses;
    any other gets zero gradients), so the weights stay finite between checks even if the run
    then stops.  (Under DDP a loss non-finite on one rank alone, with finite gradients, is masked
    there only: the ranks part until the check stops them all.)  ``epoch`` and ``step`` are the
    caller's labels for the step, as its messages show them (the loop counts epochs from 1, as its
    epoch lines do).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        *,
        grad_clip: float = 1.0,
        max_skipped_steps: int = 100,
        scaler: torch.amp.GradScaler | None = None,
        check_every: int = 1,
    ) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.scaler = scaler if scaler is not None else precision.make_scaler()
        self.grad_clip = grad_clip if grad_clip > 0 else math.inf
        self.max_skipped_steps = max_skipped_steps
        self.check_every = max(1, check_every)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        # The optimizer skips an update itself given a found-inf tensor (fused AdamW/Adam/SGD).
        self._skips_on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        self._labels: list[tuple[int, int]] = []  # (epoch, step) of each step since the last check
        self._state: dict[str, torch.Tensor] | None = None  # made on the first step, on its device

    def _device_state(self, like: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._state is None:
            def scalar(value, dtype):
                return torch.full((), value, dtype=dtype, device=like.device)

            self._state = {
                "steps": scalar(0, torch.long),  # steps since the last check
                "bad_at": scalar(_NO_STEP, torch.long),  # the first non-finite one without a scaler
                "bad_loss": scalar(0.0, torch.float32), "bad_norm": scalar(0.0, torch.float32),
                "skipped": scalar(0, torch.long), "in_row": scalar(0, torch.long),
                "tripped_at": scalar(_NO_STEP, torch.long), "tripped_scale": scalar(0.0, torch.float32),
            }
        return self._state

    def __call__(self, loss: torch.Tensor, *, epoch: int, step: int) -> StepOutcome:
        st = self._device_state(loss)
        scaling = self.scaler.is_enabled()
        loss_value = loss.detach().float()
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        if scaling:
            # Skipped = the found-inf flag that the fused kernel and update() act on, summed over devices:
            # exactly what happened, where comparing the scale before and after would miss a skip that
            # does not lower it (backoff_factor=1, or a scale that reached 0).
            found = self.scaler._found_inf_per_device(self.optimizer)
            skipped = sum(t.to(loss.device, non_blocking=True) for t in found.values()) > 0
            self.scaler.step(self.optimizer)  # a fused optimizer: no sync (GradScaler reads no flag itself)
            self.scaler.update()
        else:
            skipped = ~(torch.isfinite(loss_value) & torch.isfinite(grad_norm))
            self._masked_step(skipped)
        self.optimizer.zero_grad(set_to_none=True)
        self._record(st, skipped, loss_value, grad_norm.detach().float(), scaling)
        self._labels.append((epoch, step))
        if len(self._labels) >= self.check_every:
            self.check()
        return StepOutcome(grad_norm.detach(), skipped)

    def _masked_step(self, bad: torch.Tensor) -> None:
        """The optimizer's step, which leaves the weights as they are where ``bad`` (no host sync)."""
        if self._skips_on_device:
            self.optimizer.found_inf = bad.float()  # GradScaler's protocol: the kernel skips, step counts too
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
            return
        for p in self.params:  # zero gradients: SGD stays put; momentum and weight decay still act (finitely)
            if p.grad is not None:
                p.grad.masked_fill_(bad, 0.0)
        self.optimizer.step()

    def _record(self, st: dict[str, torch.Tensor], skipped: torch.Tensor, loss_value: torch.Tensor,
                grad_norm: torch.Tensor, scaling: bool) -> None:
        index = st["steps"]
        if scaling:
            skip = skipped.long()
            st["skipped"].add_(skip)
            st["in_row"].copy_((st["in_row"] + skip) * skip)  # +1 per skip, back to 0 on a taken step
            trips = (st["in_row"] >= self.max_skipped_steps) & (st["tripped_at"] == _NO_STEP)
            st["tripped_at"].copy_(torch.where(trips, index, st["tripped_at"]))
            st["tripped_scale"].copy_(torch.where(trips, self.scaler._scale.float(), st["tripped_scale"]))
        else:
            first = skipped & (st["bad_at"] == _NO_STEP)
            st["bad_at"].copy_(torch.where(first, index, st["bad_at"]))
            st["bad_loss"].copy_(torch.where(first, loss_value, st["bad_loss"]))
            st["bad_norm"].copy_(torch.where(first, grad_norm, st["bad_norm"]))
        index.add_(1)

    def check(self, *also: torch.Tensor) -> list[float]:
        """Read the verdicts of the steps since the last check, raise if the run must stop, and
        return the values of ``also`` (0-dim tensors on the step's device, read in the same transfer).

        One host sync; under DDP (torch.distributed initialised, world size > 1) first an all_reduce
        (MAX) of the two stop flags, so that every rank raises at the same check (call it on every
        rank alike).  A verdict raised is cleared, so that a caller who goes on starts afresh."""
        labels, self._labels = self._labels, []
        if self._state is None:
            return [float(t) for t in also]
        st = self._state
        flags = torch.stack([(st["bad_at"] != _NO_STEP).float(), (st["tripped_at"] != _NO_STEP).float()])
        if _distributed():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        values = torch.cat([flags, torch.stack([st["bad_at"].float(), st["bad_loss"], st["bad_norm"],
                                                st["tripped_at"].float(), st["tripped_scale"]]),
                            *(t.detach().float().reshape(1).to(flags.device) for t in also)]).tolist()
        bad, tripped, bad_at, bad_loss, bad_norm, tripped_at, tripped_scale = values[:7]
        st["steps"].zero_()
        if bad:
            st["bad_at"].fill_(_NO_STEP)
            raise NonFiniteLossError(self._nonfinite_message(labels, int(bad_at), bad_loss, bad_norm))
        if tripped:
            st["tripped_at"].fill_(_NO_STEP)
            st["in_row"].zero_()
            raise TooManySkippedSteps(self._skipped_message(labels, int(tripped_at), tripped_scale))
        return values[7:]

    def _seen(self, labels: list[tuple[int, int]], at: int) -> tuple[str, str]:
        """("epoch E step S" of step ``at`` since the last check, "(seen at the check after ...)")."""
        epoch, step = labels[at]
        last_epoch, last_step = labels[-1]
        after = f"step {last_step}" if last_epoch == epoch else f"epoch {last_epoch} step {last_step}"
        return f"epoch {epoch} step {step}", f"seen at the check after {after}"

    def _nonfinite_message(self, labels: list[tuple[int, int]], at: int, loss: float, norm: float) -> str:
        if at < 0:  # only another rank's flag was up (DDP)
            last_epoch, last_step = labels[-1] if labels else ("?", "?")
            return (f"non-finite loss or gradient on another rank under {self.precision.mode} with no GradScaler "
                    f"to skip it (seen at the check after epoch {last_epoch} step {last_step}); "
                    "lower train.lr or check the data")
        where, seen = self._seen(labels, at)
        what = f"loss ({loss})" if not math.isfinite(loss) else f"gradient norm ({norm})"
        return (f"non-finite {what} at {where} under {self.precision.mode} with no GradScaler to skip it ({seen}); "
                "lower train.lr or check the data")

    def _skipped_message(self, labels: list[tuple[int, int]], at: int, scale: float) -> str:
        if at < 0:
            last_epoch, last_step = labels[-1] if labels else ("?", "?")
            return (f"{self.max_skipped_steps} optimizer steps in a row skipped for non-finite gradients on another "
                    f"rank (seen at the check after epoch {last_epoch} step {last_step}); "
                    "training is not recovering: lower train.lr or use precision.mode=fp32")
        where, seen = self._seen(labels, at)
        return (f"{self.max_skipped_steps} optimizer steps in a row skipped for non-finite gradients "
                f"(last at {where}, scale {scale:g}; {seen}); "
                "training is not recovering: lower train.lr or use precision.mode=fp32")

    @property
    def skipped_total(self) -> int:
        """Steps a GradScaler skipped so far (reads the device: for callers outside the step loop)."""
        return int(self._state["skipped"]) if self._state is not None else 0

    @property
    def skipped_in_row(self) -> int:
        """The skipped steps since the last taken one (reads the device, like :attr:`skipped_total`)."""
        return int(self._state["in_row"]) if self._state is not None else 0

    def skipped_steps(self) -> torch.Tensor | None:
        """The device's count of skipped steps (a 0-dim tensor, for :meth:`check`), None before any step."""
        return self._state["skipped"] if self._state is not None else None


def _distributed() -> bool:
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)
