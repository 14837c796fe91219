"""Make torch's device probes report a fixed machine, so a test means the same on any host.

The product asks torch about devices only through ``alchemetric_ray/hardware/device.py``
(``torch.cuda.is_available``, ``torch.cuda.device_count``, ``torch.backends.mps.is_available`` and
``is_built``, ``torch.xpu.is_available``).  These helpers patch those same calls with pytest's
``monkeypatch`` (undone after the test), in this process only: a subprocess or a Ray worker still
sees the real host.  tests/test_portable.py counts a call to one of them as pinning the device.
"""

from __future__ import annotations

import torch


def no_cuda(monkeypatch) -> None:
    """CUDA absent, whatever the host has (a CUDA box included); MPS and XPU left as they are."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def cpu_only_machine(monkeypatch) -> None:
    """A CPU-only machine: no CUDA, no MPS (not even built into torch), no XPU."""
    no_cuda(monkeypatch)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    if getattr(torch, "xpu", None) is not None:
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
