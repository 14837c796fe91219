"""`alchemetric-ray env`: what this machine offers and what a run here would choose, with reasons.

:func:`environment_report` gathers it into one :class:`EnvironmentReport` (versions, the CUDA, MPS
and XPU devices, the CPU and its flags, the MPS fallback variable, the known-bug entries that apply
here, and the device and precision decisions); its ``as_dict`` is the JSON ``env --json`` prints and
the doctor's report holds as ``inventory``; :func:`format_report` gives the lines ``env`` prints.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from alchemetric_ray import startup
from alchemetric_ray.errors import PrecisionError
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.hardware import inventory
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware.precision import ModelTraits, Precision, cuda_bf16_native, resolve_precision


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    capability: str  # "major.minor"


@dataclass(frozen=True)
class CudaReport:
    built: str | None  # the CUDA version torch was built with
    available: bool
    devices: list[CudaDevice]
    bf16_native: bool | None  # None where CUDA is not available


@dataclass(frozen=True)
class MpsReport:
    built: bool
    available: bool


@dataclass(frozen=True)
class XpuReport:
    available: bool


@dataclass(frozen=True)
class CpuReport:
    model: str
    cores: int
    torch_threads: int
    avx512_bf16: bool
    amx_bf16: bool
    avx2: bool


@dataclass(frozen=True)
class MpsFallback:
    """``PYTORCH_ENABLE_MPS_FALLBACK`` as this process sees it, and whether it was set before torch loaded
    (only then does torch read it)."""

    value: str | None
    set_before_torch_loaded: bool


@dataclass(frozen=True)
class KnownBugRow:
    """One entry of the known-bug table that applies to a backend here, and how it is checked."""

    id: str
    backend: str
    source: str
    reference: str
    versions: str
    silent: bool
    rule: str
    checked: str
    family_unknown: bool  # the GPU family is not known here: the entry may apply


@dataclass(frozen=True)
class KnownBugsHere:
    """How many entries the table holds, the backends of this machine, and the entries that apply."""

    entries: int
    backends: list[str]
    apply: list[KnownBugRow]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceDecision:
    """The device a run would take here and why, or (``error``) why the request was refused."""

    device: str | None = None
    reason: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.error} if self.error is not None else {"device": self.device, "reason": self.reason}


@dataclass(frozen=True)
class PrecisionDecision:
    """The precision a run would train in on the decided device, or (``error``) why it was refused."""

    precision: Precision | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.error} if self.precision is None else self.precision.as_dict()


@dataclass(frozen=True, repr=False)
class EnvironmentReport:
    """What this machine offers and what a run here would choose.  ``precision`` is None where no device
    was decided."""

    python: str
    platform: str
    macos: str | None
    torch: str
    ray: str | None  # None: Ray is not installed
    alchemetric_ray: str
    cuda: CudaReport
    mps: MpsReport
    xpu: XpuReport
    cpu: CpuReport
    mps_fallback: MpsFallback
    known_bugs: KnownBugsHere
    device: DeviceDecision
    precision: PrecisionDecision | None

    @property
    def refused(self) -> bool:
        """Whether the device or the precision asked for was refused here."""
        return self.device.error is not None or (self.precision is not None and self.precision.error is not None)

    def __repr__(self) -> str:  # what the command prints: a notebook shows it as text, not as fields
        return format_report(self)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(format_report(self))}</pre>"

    def as_dict(self) -> dict[str, Any]:
        precision = {} if self.precision is None else {"precision": self.precision.as_dict()}
        return {"python": self.python, "platform": self.platform, "macos": self.macos, "torch": self.torch,
                "ray": self.ray, "alchemetric_ray": self.alchemetric_ray, "cuda": asdict(self.cuda),
                "mps": asdict(self.mps), "xpu": asdict(self.xpu), "cpu": asdict(self.cpu),
                "mps_fallback": asdict(self.mps_fallback), "known_bugs": self.known_bugs.as_dict(),
                "device": self.device.as_dict(), **precision}


def _ray_version() -> str | None:
    try:
        import ray
    except ImportError:
        return None
    return ray.__version__


def _cuda() -> CudaReport:
    devices = []
    if dev.cuda_available():
        for i in range(dev.cuda_count()):
            major, minor = dev.cuda_capability(i)
            devices.append(CudaDevice(i, dev.cuda_name(i), f"{major}.{minor}"))
    return CudaReport(torch.version.cuda, dev.cuda_available(), devices,
                      cuda_bf16_native() if dev.cuda_available() else None)


def _cpu() -> CpuReport:
    flags = inventory.cpu_flags()
    return CpuReport(inventory.cpu_model(), inventory.cpu_count(), torch.get_num_threads(),
                     "avx512_bf16" in flags, "amx_bf16" in flags, "avx2" in flags)


def _decisions(device_name: str, precision_mode: str, model: ModelTraits | None,
               tf32: bool) -> tuple[DeviceDecision, PrecisionDecision | None]:
    """The device ``device_name`` resolves to here and the precision ``precision_mode`` resolves to on it,
    each with its reason or its refusal (no precision where the device was refused)."""
    try:
        choice = dev.resolve_device(device_name)
    except dev.DeviceError as exc:
        return DeviceDecision(error=str(exc)), None
    decided = DeviceDecision(str(choice.device), choice.reason)
    try:
        return decided, PrecisionDecision(resolve_precision(precision_mode, choice.device, model=model, tf32=tf32))
    except PrecisionError as exc:
        return decided, PrecisionDecision(error=str(exc))


def environment_report(device_name: str = "auto", precision_mode: str = "auto", model: ModelTraits | None = None,
                       tf32: bool = False) -> EnvironmentReport:
    """Versions, devices and CPU flags, and the device and precision a run of ``model`` would choose here."""
    ray_version = _ray_version()
    cuda, cpu = _cuda(), _cpu()
    macos = inventory.macos_version()
    fallback = MpsFallback(os.environ.get(inventory.MPS_FALLBACK_VAR),
                           startup.MPS_FALLBACK_AT_IMPORT is not None
                           and not startup.TORCH_LOADED_BEFORE_US)
    known = applicable_bugs()
    device, precision = _decisions(device_name, precision_mode, model, tf32)
    return EnvironmentReport(
        python=sys.version.split()[0], platform=platform.platform(),
        macos=".".join(map(str, macos)) if macos else None, torch=torch.__version__, ray=ray_version,
        alchemetric_ray=startup.VERSION, cuda=cuda,
        mps=MpsReport(dev.mps_built(), dev.mps_available()), xpu=XpuReport(dev.xpu_available()), cpu=cpu,
        mps_fallback=fallback, known_bugs=known, device=device, precision=precision)


def applicable_bugs() -> KnownBugsHere:
    """The entries of the known-bug table that apply to a backend of this machine (the CPU, and MPS or
    CUDA where available), and how each is checked: by rule on every run, or not at all (listed only)."""
    kinds = ["cpu"] + [kind for kind in ("mps", "cuda") if dev.device_kind_available(kind)]
    backends = [kb.Backend.of(kind) for kind in kinds]
    rows = []
    for entry, backend, applies in kb.applicable_here(backends):
        rows.append(KnownBugRow(
            id=entry.id, backend=str(backend), source=entry.source, reference=entry.reference,
            versions=entry.versions, silent=entry.silent, rule=entry.kind,
            checked="listed only: no rule to evaluate" if not entry.rule.evaluable
            else "checked on every run by rule" + (" (worked around)" if entry.workaround else " (refused)"),
            family_unknown=applies is None))
    return KnownBugsHere(len(kb.entries()), [str(b) for b in backends], rows)


def known_bugs_here() -> dict[str, Any]:
    """:func:`applicable_bugs` as its JSON (what ``scripts/mac_check.py`` sends back)."""
    return applicable_bugs().as_dict()


def _known_bug_lines(bugs: KnownBugsHere) -> list[str]:
    lines = []
    if not bugs.apply:
        lines.append(f"known bugs        none of the table's {bugs.entries} entries applies here "
                     f"({'; '.join(bugs.backends)})")
    for row in bugs.apply:
        maybe = " (GPU family unknown: may apply)" if row.family_unknown else ""
        lines.append(f"known bug         {row.id} ({row.reference}), {row.versions}{maybe}: {row.checked}")
    return lines


def format_report(report: EnvironmentReport) -> str:
    """The lines ``alchemetric-ray env`` prints."""
    cuda, cpu, mf = report.cuda, report.cpu, report.mps_fallback
    lines = [
        f"python            {report.python}  ({report.platform})",
        f"torch             {report.torch}   ray {report.ray or 'not installed'}   "
        f"alchemetric-ray {report.alchemetric_ray}",
        f"CUDA              build {cuda.built or 'none'}, available: {cuda.available}"
        + (f", bf16 native: {cuda.bf16_native}" if cuda.available else ""),
    ]
    for d in cuda.devices:
        lines.append(f"  cuda:{d.index}          {d.name} (capability {d.capability})")
    lines += [
        f"MPS               built: {report.mps.built}, available: {report.mps.available}"
        + (f", macOS {report.macos}" if report.macos else ""),
        f"CPU               {cpu.model}, {cpu.cores} cores, torch threads {cpu.torch_threads}, "
        f"avx512_bf16: {cpu.avx512_bf16}, amx_bf16: {cpu.amx_bf16}",
        f"MPS fallback      PYTORCH_ENABLE_MPS_FALLBACK={mf.value if mf.value is not None else '(unset)'}, "
        f"set before torch loaded: {mf.set_before_torch_loaded}",
    ]
    device = report.device
    lines.append(f"device            {device.device} ({device.reason})" if device.error is None
                 else f"device            ERROR: {device.error}")
    lines += _known_bug_lines(report.known_bugs)
    if report.precision is not None:
        chosen = report.precision.precision
        lines.append(f"precision         {chosen.mode} ({chosen.reason})" if chosen is not None
                     else f"precision         ERROR: {report.precision.error}")
    return "\n".join(lines)


def summary_line(report: EnvironmentReport) -> str:
    """One line of the report: torch, the accelerators and the CPU (the doctor's header)."""
    return (f"torch {report.torch}, CUDA available {report.cuda.available}, "
            f"MPS available {report.mps.available}, CPU {report.cpu.model}")
