"""Facts about this machine that are not torch device probes: CPU, OS, versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache

# Recorded by alchemetric_ray/__init__.py before anything imports torch.
MPS_FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"


@lru_cache(maxsize=1)
def cpu_model() -> str:
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    """AVX512-BF16 or AMX (x86) - the CPU instructions that make bf16 autocast worthwhile."""
    flags = cpu_flags()
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def macos_version() -> tuple[int, ...] | None:
    release = platform.mac_ver()[0]
    if not release:
        return None
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
