"""The one place that decides which device trains, predicts and is checked.

One decision, made once where the work is planned, then passed on:

* :func:`resolve_device` answers "which device here?" (the env report, the doctor, the export):
  explicit argument > ``ALCHEMETRIC_DEVICE`` > auto.  Auto tries the kinds of ``kinds.KINDS`` that
  say ``auto``, in the table's order (CUDA -> MPS -> XPU), then takes the CPU.
* :func:`train_accelerator` answers "which kind of device do the Ray workers (Train workers,
  prediction actors) use?" on the driver, from the same request, and names a decided kind (never
  "auto").  Each worker then only maps that kind to its own device with :func:`device_for_worker`,
  and fails with a one-line :class:`DeviceError` where the kind is not there.

Inside a Ray worker that Ray gave a GPU, the CUDA device comes from ``ray.train.torch.get_device()``:
Ray maps its GPU ids through CUDA_VISIBLE_DEVICES, so ``cuda:<local_rank>`` is wrong with several or
fractional GPUs per worker.  Ray advertises an Apple GPU as ``GPU: 1`` too, so a Ray GPU count never
implies CUDA: CUDA is whatever torch's own probe says.

An explicit request for a device that is not there raises :class:`DeviceError` naming what was
asked and what exists; there is no silent fallback.  What a user may write (the kinds, ``cuda:N``)
is :class:`alchemetric_ray.config.DeviceName`; what each kind is and does lives in ``kinds.py``;
whether it is here (the probes) and how a request for it becomes a device (``_RESOLVERS``) live here.
"""

from __future__ import annotations

import logging
import os
import typing
from dataclasses import dataclass, field
from typing import Callable

import torch

from alchemetric_ray.config import DeviceKind, DeviceName
from alchemetric_ray.errors import DeviceError
from alchemetric_ray.hardware.kinds import KINDS, Kind, kind_of, kind_of_device

ENV_VAR = "ALCHEMETRIC_DEVICE"
DEVICE_KINDS: tuple[str, ...] = typing.get_args(DeviceKind)
REFERENCE_KIND = "cpu"  # the device every other one is checked against (the doctor's reference)
log = logging.getLogger("alchemetric_ray.hardware")
_logged: set[str] = set()


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    reason: str

    @property
    def type(self) -> str:
        return self.device.type

    def __str__(self) -> str:
        return f"{self.device} ({self.reason})"


# ---- probes: the only calls into torch's device back-ends (patched in tests) ----------------


def cuda_available() -> bool:
    return torch.cuda.is_available()


def cuda_count() -> int:
    return torch.cuda.device_count() if cuda_available() else 0


def cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def cuda_capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def mps_built() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_built()


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def xpu_count() -> int:
    return torch.xpu.device_count() if xpu_available() else 0


def ray_worker_device() -> torch.device | None:
    """The CUDA device Ray Train assigned to this worker, or None outside such a worker."""
    try:
        import ray
        import ray.train.torch as rtt

        if not ray.is_initialized() or not ray.get_gpu_ids():
            return None
        dev = rtt.get_device()
    except Exception:  # not inside a Train worker, or Ray not installed (e.g. the GPU check)
        return None
    return dev if dev.type == "cuda" else None


# ---- describing a device -------------------------------------------------------------------


def _describe_cuda(index: int) -> str:
    major, minor = cuda_capability(index)
    return f"{cuda_name(index)}, capability {major}.{minor}"


def _inventory() -> str:
    found = []
    if cuda_available():
        found.append(f"{cuda_count()} CUDA device(s)")
    if mps_available():
        found.append("mps")
    if xpu_available():
        found.append(f"{xpu_count()} XPU device(s)")
    found.append("cpu")
    return ", ".join(found)


# ---- resolution ----------------------------------------------------------------------------


def _auto_cuda() -> DeviceChoice | None:
    if not cuda_available():
        return None
    return DeviceChoice(torch.device("cuda", 0), _describe_cuda(0))


def _auto_mps() -> DeviceChoice | None:
    if not mps_available():
        return None
    return DeviceChoice(torch.device("mps"), "Apple GPU; no CUDA")


def _auto_xpu() -> DeviceChoice | None:
    if not xpu_available():
        return None
    return DeviceChoice(torch.device("xpu", 0), "Intel GPU; no CUDA or MPS")


def _request(requested: str | None, source: str) -> tuple[str, str]:
    """What was asked for, and by whom: explicit argument > ``ALCHEMETRIC_DEVICE`` > auto."""
    if requested and requested != DeviceName.AUTO:
        return requested, source
    env = os.environ.get(ENV_VAR, "").strip()
    if env and env != DeviceName.AUTO:
        return env, ENV_VAR
    return DeviceName.AUTO, source


def _parse(requested: str, source: str) -> tuple[str, int | None]:
    """``requested`` as (kind, index), or a DeviceError naming who asked for what."""
    try:
        kind, index = DeviceName.split(requested)
    except ValueError:
        raise DeviceError(f"{source} asked for device {requested!r}: not a device name "
                          f"(try {DeviceName.expected()})") from None
    if kind not in DEVICE_KINDS:
        raise DeviceError(f"{source} asked for device {requested!r}: unknown device kind "
                          f"(use {DeviceName.expected()})")
    return kind, index


def _explicit_cpu(index: int | None, asked: str, source: str, in_ray_worker: bool) -> DeviceChoice:
    return DeviceChoice(torch.device("cpu"), f"requested by {source}")


def _explicit_cuda(index: int | None, asked: str, source: str, in_ray_worker: bool) -> DeviceChoice:
    if not cuda_available():
        raise DeviceError(f"{asked} but CUDA is not available (found: {_inventory()})")
    if index is None:
        dev = ray_worker_device() if in_ray_worker else None
        if dev is not None:
            return DeviceChoice(dev, f"{_describe_cuda(dev.index or 0)}; requested by {source}, assigned by Ray Train")
        index = 0
    if index >= cuda_count():
        raise DeviceError(f"{asked} but this machine has {cuda_count()} CUDA device(s) "
                          f"(cuda:0..cuda:{cuda_count() - 1})")
    return DeviceChoice(torch.device("cuda", index), f"{_describe_cuda(index)}; requested by {source}")


def _explicit_mps(index: int | None, asked: str, source: str, in_ray_worker: bool) -> DeviceChoice:
    if index:
        raise DeviceError(f"{asked}: MPS has a single device, use 'mps'")
    if not mps_available():
        why = "this torch build has no MPS" if not mps_built() else "MPS is not available on this machine"
        raise DeviceError(f"{asked} but {why} (found: {_inventory()})")
    return DeviceChoice(torch.device("mps"), f"Apple GPU; requested by {source}")


def _explicit_xpu(index: int | None, asked: str, source: str, in_ray_worker: bool) -> DeviceChoice:
    if not xpu_available():
        raise DeviceError(f"{asked} but XPU is not available (found: {_inventory()})")
    index = index or 0
    if index >= xpu_count():
        raise DeviceError(f"{asked} but this machine has {xpu_count()} XPU device(s)")
    return DeviceChoice(torch.device("xpu", index), f"Intel GPU; requested by {source}")


@dataclass(frozen=True)
class _Resolver:
    """How this module finds one kind of ``kinds.KINDS`` on this machine: whether it is here, the device
    ``auto`` takes there (None: not here), and the device an explicit request gets (or a DeviceError)."""

    available: Callable[[], bool]
    auto: Callable[[], DeviceChoice | None]
    explicit: Callable[[int | None, str, str, bool], DeviceChoice]


# One resolver per kind of the table.  The lambdas look the probes up when called, so that tests can patch them.
_RESOLVERS: dict[str, _Resolver] = {
    "cuda": _Resolver(lambda: cuda_available(), _auto_cuda, _explicit_cuda),
    "mps": _Resolver(lambda: mps_available(), _auto_mps, _explicit_mps),
    "xpu": _Resolver(lambda: xpu_available(), _auto_xpu, _explicit_xpu),
    "cpu": _Resolver(lambda: True, lambda: None, _explicit_cpu),  # never tried by auto: what auto falls back to
}


def _explicit(requested: str, source: str, in_ray_worker: bool = False) -> DeviceChoice:
    kind, index = _parse(requested, source)
    asked = f"{source} asked for device {requested!r}"
    resolver = _RESOLVERS.get(kind)
    if resolver is None:
        raise DeviceError(f"{asked}: device kind {kind!r} has no resolver here yet")
    return resolver.explicit(index, asked, source, in_ray_worker)


def resolve_device(requested: str | None = None, *, source: str = "the config") -> DeviceChoice:
    """Decide the device of this process. ``requested`` is "auto"/None, "cpu", "cuda", "cuda:N", "mps" or "xpu".

    ``source`` names who asked, for the reason and for errors.  Ray workers do not call this:
    they get a decided kind from :func:`train_accelerator` and map it with :func:`device_for_worker`.
    """
    name, source = _request(requested, source)
    choice: DeviceChoice | None
    if name != DeviceName.AUTO:
        choice = _explicit(name, source)
    else:
        choice = None
        for kind in KINDS.values():
            choice = _RESOLVERS[kind.name].auto() if kind.auto else None
            if choice is not None:
                break
        if choice is None:
            choice = DeviceChoice(torch.device("cpu"), "no CUDA, MPS or XPU available")
    _log_once(f"device: {choice}")
    return choice


def device_for_worker(kind: str, *, source: str) -> DeviceChoice:
    """The device of a Ray worker (Train worker, prediction actor) for the kind the driver decided.

    ``kind`` comes from :func:`train_accelerator` (never "auto", and no environment variable is read
    again here).  A CUDA worker takes the GPU Ray assigned to it; a kind this worker's torch does
    not see fails with a one-line DeviceError, so a worker never trains elsewhere than planned.
    """
    if kind == DeviceName.AUTO:
        raise ValueError("device_for_worker needs the decided device kind, not 'auto' (see train_accelerator)")
    choice = _explicit(kind, source, in_ray_worker=True)
    _log_once(f"device: {choice}")
    return choice


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.info(message)


def device_kind_available(kind: str) -> bool:
    """Whether a device kind exists here (for planners that must not guess from Ray's GPU count)."""
    resolver = _RESOLVERS.get(kind)
    return resolver is not None and resolver.available()


def kinds_to_check() -> list[str]:
    """The device kinds the doctor examines on this machine (CUDA, MPS, CPU; those that are here)."""
    return [kind.name for kind in KINDS.values() if kind.doctor_checked and device_kind_available(kind.name)]


def reference_device() -> torch.device:
    """The device every other one is checked against."""
    return torch.device(REFERENCE_KIND)


def is_reference(device_type: str) -> bool:
    return device_type == REFERENCE_KIND


def on_reference(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the reference device (itself if it is there already, as host-memory batches are)."""
    return t if is_reference(t.device.type) else t.to(REFERENCE_KIND)


def shadowed_by_default(device: torch.device) -> bool:
    """Whether ``train.shadow=auto`` checks a run on ``device`` against a float32 CPU copy: MPS, the
    backend the seed rule does not trust until verified (its silent bugs: hardware/known_bugs.yaml)."""
    return kind_of_device(device).shadowed


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (for honest timings)."""
    kind_of_device(device).synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`peak_memory` where the device keeps one (CUDA)."""
    kind_of_device(device).reset_peak_memory(device)


def peak_memory(device: torch.device) -> int | None:
    """Peak device memory in bytes; on the CPU the process's resident high-water mark (it never goes
    down, so a rise along a batch ladder is what the larger batch needed)."""
    return kind_of_device(device).peak_memory(device)


@dataclass(frozen=True)
class TrainAccelerator:
    """What a Ray Train run should ask Ray for, decided from torch's probes, never Ray's GPU count."""

    kind: str  # "cuda" | "mps" | "cpu": decided, never "auto"
    use_gpu: bool  # ask Ray for GPUs (CUDA only)
    backend: str  # collective backend: nccl (CUDA) or gloo
    reason: str

    @property
    def worker_device(self) -> str:
        """What each worker passes to :func:`device_for_worker`: the decided kind itself."""
        return self.kind

    @property
    def default_workers_reason(self) -> str:
        kind = kind_of(self.kind)
        if not kind.ddp:
            return f"one worker on {kind.label} (DDP needs CUDA or CPU workers)"
        return "one CPU worker (laptop default; --workers N for more)"

    @classmethod
    def on(cls, kind: Kind, reason: str) -> TrainAccelerator:
        """Workers of ``kind``: Ray's GPUs and the collective backend as its record says."""
        return cls(kind.name, kind.ray_gpu, kind.ddp_backend, reason)


def train_accelerator(requested: str | None, cluster_gpus: float, world_size: int, *,
                      node_types: str | None = None, gpus_unknown: str | None = None) -> TrainAccelerator:
    """Decide the Ray workers' accelerator for a cluster advertising ``cluster_gpus`` GPUs.

    On an autoscaling cluster ``cluster_gpus`` counts what its node types can provide and
    ``node_types`` says which types and where they were learnt (for the reason and the error).
    ``gpus_unknown`` (how to declare them, and where they were looked for) marks a cluster whose node
    types could not be learnt: an explicit CUDA request is trusted and its GPUs are asked of the
    autoscaler; auto takes the GPUs that are up, and where none is up it refuses in one line rather
    than train on the CPU of whatever node the autoscaler brings (a GPU node, on a GPU cluster).

    The request is read as :func:`resolve_device` reads it (argument > ``ALCHEMETRIC_DEVICE`` >
    auto); a ``cuda:N`` index is the driver's business, a worker takes the GPU Ray assigns it.
    Ray advertises an Apple GPU as ``GPU: 1``, so on a Mac (MPS here, no CUDA) the run takes no
    Ray GPUs and its single worker uses MPS; several workers without CUDA are CPU workers
    (gloo has no MPS).  A CPU-only head of a GPU cluster (no local CUDA or MPS) trusts the
    cluster's GPUs to be CUDA: Ray only advertises Apple GPUs on Macs.
    """
    name, source = _request(requested, "the config")
    req = DeviceName.AUTO if name == DeviceName.AUTO else _parse(name, source)[0]
    if req == "cpu":
        return TrainAccelerator.on(kind_of("cpu"), "CPU requested")
    local_mps = mps_available() and not cuda_available()
    # node types come from a launcher config: their GPUs are a cloud's, never this Mac's Apple GPU
    if req in (DeviceName.AUTO, "cuda") and cluster_gpus > 0 and (not local_mps or node_types):
        where = "on the cluster's node types" if node_types else "in the Ray cluster"
        return TrainAccelerator.on(kind_of("cuda"),
                                   f"{cluster_gpus:g} GPU(s) {where} and no Apple GPU here: CUDA workers")
    if req == "cuda" and gpus_unknown and not local_mps:
        return TrainAccelerator.on(kind_of("cuda"), f"CUDA requested by {source}; the cluster's node types are "
                                   "unknown, so its GPUs are asked of the autoscaler")
    if req == DeviceName.AUTO and gpus_unknown and not local_mps:
        raise DeviceError("device auto on a Ray cluster with unknown node types and no GPU up: whether its nodes "
                          "will have GPUs cannot be told, and auto never trains on the CPU in silence; pass --device "
                          f"cuda (with --workers N for N GPU workers) or --device cpu, or {gpus_unknown}")
    if req == "cuda" and node_types:
        raise DeviceError(f"{source} asked for device 'cuda' but no node type in this cluster has a GPU "
                          f"({node_types})")
    if req == "cuda":
        raise DeviceError(f"{source} asked for device 'cuda' but no node of the Ray cluster has a CUDA GPU "
                          f"(cluster GPUs: {cluster_gpus:g}{', an Apple GPU' if local_mps else ''})")
    if req in (DeviceName.AUTO, "mps") and local_mps:
        if world_size > 1:
            if req == "mps":
                raise DeviceError(f"device 'mps' with {world_size} workers: DDP on MPS is not supported "
                                  "(gloo has no MPS); use one worker or device cpu")
            return TrainAccelerator.on(kind_of("cpu"),
                                       f"{world_size} workers without CUDA: CPU workers with gloo (gloo has no MPS)")
        return TrainAccelerator.on(kind_of("mps"),
                                   "Apple GPU (mps): one worker with use_gpu=False uses MPS"
                                   + (" (Ray's GPU: 1 is the Apple GPU, not CUDA)" if cluster_gpus else ""))
    if req == "mps":
        raise DeviceError(f"{source} asked for device 'mps' but MPS is not available (found: {_inventory()})")
    if req == "xpu":
        raise DeviceError("device 'xpu' is not supported for Ray Train runs yet; use cpu")
    return TrainAccelerator.on(kind_of("cpu"), "no CUDA GPU in the Ray cluster and no Apple GPU: CPU workers")


# ---- the GPU preflight: what a Ray GPU worker's torch sees -----------------------------------


@dataclass(frozen=True)
class GpuWorkerReport:
    """What torch sees in a process Ray gave GPUs to (:func:`gpu_worker_report`); the GPU preflight
    (``placement/autoscale.py``) adds where it ran, the GPUs Ray gave it, and the known-bug table's
    entries for its GPU and torch."""

    cuda_visible_devices: str | None
    torch: str  # torch's version
    torch_cuda: str | None  # torch.version.cuda: None for a build without CUDA
    available: bool  # torch.cuda.is_available()
    devices: int  # torch.cuda.device_count()
    gpu_ids: list[str] = field(default_factory=list)  # ray.get_gpu_ids()
    node_ip: str = ""
    node_id: str = ""
    backend: str | None = None  # the known-bug table's name of the GPU and torch, where it has CUDA
    known_bugs: list[str] = field(default_factory=list)  # the table's entries that apply there


def gpu_worker_report() -> GpuWorkerReport:
    """What torch sees in a process Ray gave GPUs to (the preflight runs it on every GPU node
    before a run starts): CUDA_VISIBLE_DEVICES, torch's version and CUDA build, and its probe."""
    return GpuWorkerReport(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), torch=torch.__version__,
                           torch_cuda=torch.version.cuda, available=cuda_available(), devices=cuda_count())


def gpu_worker_problem(report: GpuWorkerReport, where: str) -> str | None:
    """One line saying why the GPUs Ray gave a worker (``report`` from :func:`gpu_worker_report`,
    with its ``gpu_ids`` from Ray) are no use to torch there, or None when torch can use them."""
    if report.available and report.devices > 0:
        return None
    ids = ",".join(str(i) for i in report.gpu_ids or []) or "none"
    fix = ("install a CUDA build of torch on the GPU nodes" if report.torch_cuda is None
           else "check the NVIDIA driver there (nvidia-smi) and that it matches this CUDA build")
    return (f"{where}: Ray gave this worker GPU {ids} (CUDA_VISIBLE_DEVICES={report.cuda_visible_devices}) "
            f"but torch {report.torch} there has no usable CUDA (torch.version.cuda={report.torch_cuda}, "
            f"torch.cuda.is_available()={report.available}); {fix}")
