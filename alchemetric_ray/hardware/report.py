"""`alchemetric-ray env`: what this machine offers and what a run here would choose, with reasons."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch

import alchemetric_ray
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.hardware import inventory
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware.precision import (
    ModelTraits,
    PrecisionError,
    cuda_bf16_native,
    resolve_precision,
)


def environment_report(device_name: str = "auto", precision_mode: str = "auto", model: ModelTraits | None = None,
                       tf32: bool = False) -> dict[str, Any]:
    """Versions, devices and CPU flags, and the device and precision a run of ``model`` would choose here."""
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    cuda_devices = []
    if dev.cuda_available():
        for i in range(dev.cuda_count()):
            major, minor = dev.cuda_capability(i)
            cuda_devices.append({"index": i, "name": dev.cuda_name(i), "capability": f"{major}.{minor}"})
    flags = inventory.cpu_flags()
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "macos": ".".join(map(str, inventory.macos_version())) if inventory.macos_version() else None,
        "torch": torch.__version__,
        "ray": ray_version,
        "alchemetric_ray": alchemetric_ray.__version__,
        "cuda": {
            "built": torch.version.cuda,
            "available": dev.cuda_available(),
            "devices": cuda_devices,
            "bf16_native": cuda_bf16_native() if dev.cuda_available() else None,
        },
        "mps": {"built": dev.mps_built(), "available": dev.mps_available()},
        "xpu": {"available": dev.xpu_available()},
        "cpu": {
            "model": inventory.cpu_model(),
            "cores": inventory.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags,
            "avx2": "avx2" in flags,
        },
        "mps_fallback": {
            "value": os.environ.get(inventory.MPS_FALLBACK_VAR),
            "set_before_torch_loaded": (alchemetric_ray.MPS_FALLBACK_AT_IMPORT is not None
                                        and not alchemetric_ray.TORCH_LOADED_BEFORE_US),
        },
    }
    report["known_bugs"] = known_bugs_here()
    try:
        choice = dev.resolve_device(device_name)
        report["device"] = {"device": str(choice.device), "reason": choice.reason}
        try:
            prec = resolve_precision(precision_mode, choice.device, model=model, tf32=tf32)
            report["precision"] = prec.as_dict()
        except PrecisionError as exc:
            report["precision"] = {"error": str(exc)}
    except dev.DeviceError as exc:
        report["device"] = {"error": str(exc)}
    return report


def known_bugs_here() -> dict[str, Any]:
    """The entries of the known-bug table that apply to a backend of this machine (the CPU, and MPS or
    CUDA where available), and how each is checked: by rule on every run, or not at all (listed only)."""
    kinds = ["cpu"] + [kind for kind in ("mps", "cuda") if dev.device_kind_available(kind)]
    backends = [kb.Backend.of(kind) for kind in kinds]
    rows = []
    for entry, backend, applies in kb.applicable_here(backends):
        rows.append({"id": entry.id, "backend": str(backend), "source": entry.source, "reference": entry.reference,
                     "versions": entry.versions, "silent": entry.silent, "rule": entry.kind,
                     "checked": "listed only: no rule to evaluate" if not entry.rule.evaluable
                     else "checked on every run by rule" + (" (worked around)" if entry.workaround else " (refused)"),
                     "family_unknown": applies is None})
    return {"entries": len(kb.entries()), "backends": [str(b) for b in backends], "apply": rows}


def format_report(report: dict[str, Any]) -> str:
    cuda, cpu, mf = report["cuda"], report["cpu"], report["mps_fallback"]
    lines = [
        f"python            {report['python']}  ({report['platform']})",
        f"torch             {report['torch']}   ray {report['ray'] or 'not installed'}   "
        f"alchemetric-ray {report['alchemetric_ray']}",
        f"CUDA              build {cuda['built'] or 'none'}, available: {cuda['available']}"
        + (f", bf16 native: {cuda['bf16_native']}" if cuda["available"] else ""),
    ]
    for d in cuda["devices"]:
        lines.append(f"  cuda:{d['index']}          {d['name']} (capability {d['capability']})")
    lines += [
        f"MPS               built: {report['mps']['built']}, available: {report['mps']['available']}"
        + (f", macOS {report['macos']}" if report["macos"] else ""),
        f"CPU               {cpu['model']}, {cpu['cores']} cores, torch threads {cpu['torch_threads']}, "
        f"avx512_bf16: {cpu['avx512_bf16']}, amx_bf16: {cpu['amx_bf16']}",
        f"MPS fallback      PYTORCH_ENABLE_MPS_FALLBACK={mf['value'] if mf['value'] is not None else '(unset)'}, "
        f"set before torch loaded: {mf['set_before_torch_loaded']}",
    ]
    device = report["device"]
    lines.append(f"device            {device['device']} ({device['reason']})" if "device" in device
                 else f"device            ERROR: {device['error']}")
    bugs = report["known_bugs"]
    if not bugs["apply"]:
        lines.append(f"known bugs        none of the table's {bugs['entries']} entries applies here "
                     f"({'; '.join(bugs['backends'])})")
    for row in bugs["apply"]:
        maybe = " (GPU family unknown: may apply)" if row["family_unknown"] else ""
        lines.append(f"known bug         {row['id']} ({row['reference']}), {row['versions']}{maybe}: {row['checked']}")
    precision = report.get("precision")
    if precision is not None:
        lines.append(f"precision         {precision['mode']} ({precision['reason']})" if "mode" in precision
                     else f"precision         ERROR: {precision['error']}")
    return "\n".join(lines)


def summary_line(report: dict[str, Any]) -> str:
    """One line of the report: torch, the accelerators and the CPU (the doctor's header)."""
    return (f"torch {report['torch']}, CUDA available {report['cuda']['available']}, "
            f"MPS available {report['mps']['available']}, CPU {report['cpu']['model']}")
