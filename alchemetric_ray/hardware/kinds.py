"""What each kind of device is to this package: one :class:`Kind` record per kind, in one table.

A record says what a run may do on the kind and how torch is asked about it: whether ``auto`` tries
it (in the table's order), what Ray Train asks Ray for and which collective backend its workers use,
whether the loop's AdamW is fused there, whether the doctor examines it and gates explicit mixed
precision on it, whether ``train.shadow=auto`` checks a run on it, whether it has TF32 switches,
whether a worker's cached shard may live on it (``staging.py``), and how to wait for its queued
work and read its free and peak memory.  Code that depends on a kind reads its record (``kind_of(name)``)
instead of comparing the kind's name.

Whether a kind is present on this machine, and how a request for it becomes a device, is
``device.py``'s (its probes are the only calls that ask torch what exists, and tests patch them
there).  The behaviours here call torch when they are called, never at import.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch


def _no_sync(device: torch.device) -> None:
    pass


def _cuda_sync(device: torch.device) -> None:
    torch.cuda.synchronize(device)


def _mps_sync(device: torch.device) -> None:
    torch.mps.synchronize()


def _cuda_reset_peak(device: torch.device) -> None:
    torch.cuda.reset_peak_memory_stats(device)


def _cuda_peak(device: torch.device) -> int:
    return int(torch.cuda.max_memory_allocated(device))


def _mps_peak(device: torch.device) -> int:
    return int(torch.mps.driver_allocated_memory())


def _cuda_free(device: torch.device) -> int | None:
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def _unknown_free(device: torch.device) -> int | None:
    return None


def _host_peak(device: torch.device) -> int:
    """The process's resident high-water mark (it never goes down)."""
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


@dataclass(frozen=True)
class Kind:
    """One kind of device: its facts, and the few torch calls that differ by kind."""

    name: str  # as torch.device and the config write it
    label: str  # as messages write it
    auto: bool  # tried by device=auto, in the table's order (the CPU is what auto falls back to)
    ray_gpu: bool  # a Ray Train worker on it asks Ray for a GPU (CUDA only: Ray calls an Apple GPU a GPU too)
    ddp_backend: str  # the collective backend of workers on it: nccl or gloo
    ddp: bool  # several workers may train on it under DDP (gloo has no MPS)
    fused_adamw: bool  # the loop's AdamW is the fused kernel here (see optimizer.adamw)
    doctor_checked: bool  # the doctor examines it, in the table's order
    doctor_gated: bool  # explicit mixed precision on it needs a passing doctor record of the model (records.py)
    shadowed: bool  # train.shadow=auto checks a run on it against a float32 CPU copy
    tf32: bool  # it has TF32 switches (precision.tf32 sets them, either way)
    device_cache: bool  # a worker's cached shard may live on it, or reach it through pinned staging
    synchronize: Callable[[torch.device], None] = _no_sync  # wait for its queued work
    reset_peak_memory: Callable[[torch.device], None] = _no_sync  # start a new peak, where it keeps one
    peak_memory: Callable[[torch.device], int] = _host_peak  # peak memory in bytes
    free_memory: Callable[[torch.device], int | None] = _unknown_free  # bytes free, where torch can say


# Not MPS for fused AdamW: its fused Adam ignored found_inf (known_bugs.yaml:
# mps-fused-adam-ignores-found-inf), and with no GradScaler there, fusing buys MPS no sync.
# MPS is shadowed: the backend the seed rule does not trust until verified (its silent bugs: known_bugs.yaml).
KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("cuda", "CUDA", auto=True, ray_gpu=True, ddp_backend="nccl", ddp=True, fused_adamw=True,
         doctor_checked=True, doctor_gated=False, shadowed=False, tf32=True, device_cache=True,
         synchronize=_cuda_sync, reset_peak_memory=_cuda_reset_peak, peak_memory=_cuda_peak, free_memory=_cuda_free),
    Kind("mps", "MPS", auto=True, ray_gpu=False, ddp_backend="gloo", ddp=False, fused_adamw=False,
         doctor_checked=True, doctor_gated=True, shadowed=True, tf32=False, device_cache=False,
         synchronize=_mps_sync, peak_memory=_mps_peak),
    Kind("xpu", "XPU", auto=True, ray_gpu=False, ddp_backend="gloo", ddp=False, fused_adamw=False,
         doctor_checked=False, doctor_gated=False, shadowed=False, tf32=False, device_cache=False),
    Kind("cpu", "CPU", auto=False, ray_gpu=False, ddp_backend="gloo", ddp=True, fused_adamw=True,
         doctor_checked=True, doctor_gated=False, shadowed=False, tf32=False, device_cache=False),
)}
HOST = KINDS["cpu"]


def kind_of(name: str) -> Kind:
    """The record of the kind ``name`` (``"cuda"``, not ``"cuda:1"``); a ValueError for a kind not in the table."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"device kind {name!r} is not one of {', '.join(KINDS)}") from None


def kind_of_device(device: torch.device | str) -> Kind:
    """The record of ``device``'s kind (a device or its name: ``"cuda:1"``); a device of a kind not in the
    table (``meta``) behaves as the host."""
    name = device.type if isinstance(device, torch.device) else device.split(":")[0]
    return KINDS.get(name, HOST)
