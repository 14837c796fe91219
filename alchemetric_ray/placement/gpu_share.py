"""Sweep trials that share a GPU: how many one-worker trials one GPU holds, and why.

A small model (an MLP over daily bars) uses a sliver of a data-center GPU: a sweep whose trials each
hold a whole GPU leaves most of it idle.  A one-worker trial on a GPU plan reserves 1/N of a GPU
instead (a fractional Ray ``GPU`` resource, e.g. 0.25), so that N trials train on each GPU at once
and the sweep runs N times the trials at once on the same nodes:

* N = ``tune.trials_per_gpu`` where it is above 0 (1 = a whole GPU per trial);
* else automatic: ``SAFETY x the GPU's memory // the trial's need``, at most
  :data:`MAX_TRIALS_PER_GPU`, at least 1, where the need is the model's training memory (the sweep
  traces it on the meta device: ``sweeps/footprint.py``) plus the :data:`CUDA_CONTEXT_BYTES` every
  trial process holds; and no more per GPU than the sweep's trials need to run all at once on one
  node's GPUs (4 trials on a 4-GPU node get a GPU each, not a quarter of one while three idle), nor
  more than the node's CPUs feed (each trial holds its worker's CPUs).

The GPU's memory comes from its model, looked up in :data:`GPU_MEMORY_GIB`: Ray's own
``accelerator_type:<model>`` resource where the node type (or a node up now) advertises it, else the
node type's instance type (``node_config``'s ``InstanceType`` or ``machineType``) in
:data:`INSTANCE_GPUS`.  Where neither says (KubeRay's node types name neither), the smallest GPU of the
table (:data:`ASSUMED_GPU_GIB`) is assumed, and the reason says so.

Trials of several workers (DDP), a fractional ``scaling.gpus_per_worker`` set by hand and CPU plans
are left as they are.  Pure computation: the footprint comes in as a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from alchemetric_ray.config import RunConfig
from alchemetric_ray.hardware.staging import gpu_sharers, planned_data_path
from alchemetric_ray.placement.plan import DATA_CPU_RESERVE, ResourcePlan

MAX_TRIALS_PER_GPU = 4
SAFETY = 0.8  # of a GPU's memory: the rest for the allocator's slack and fragmentation
CUDA_CONTEXT_BYTES = 512 * 2**20  # each trial process's CUDA context and kernels: an allowance, not a measurement
GPU_SHARE_DECIMALS = 4  # Ray keeps fractional resources to 1/10,000

# GPU memory in GiB by Ray's accelerator_type names (ray.util.accelerators); a model sold in several
# sizes is listed at its smallest (A100: 40 GB, V100: 16 GB).
GPU_MEMORY_GIB: dict[str, float] = {
    "T4": 16, "V100": 16, "P100": 16, "A10G": 24, "L4": 24, "L40S": 48, "A100": 40, "A100-40G": 40,
    "A100-80G": 80, "H100": 80, "H20": 96, "H200": 141, "B200": 180,
}
ASSUMED_GPU_GIB = min(GPU_MEMORY_GIB.values())
# Cloud instance families and the GPU they carry (AWS: the part before the dot; GCP: the machine series).
INSTANCE_GPUS: dict[str, str] = {
    "g4dn": "T4", "g5": "A10G", "g6": "L4", "g6e": "L40S", "p3": "V100", "p3dn": "V100", "p4d": "A100",
    "p4de": "A100-80G", "p5": "H100", "p5e": "H200", "p5en": "H200",
    "a2-highgpu": "A100", "a2-megagpu": "A100", "a2-ultragpu": "A100-80G", "a3-highgpu": "H100",
    "a3-megagpu": "H100", "a3-ultragpu": "H200", "g2-standard": "L4",
}
ACCELERATOR_RESOURCE = "accelerator_type:"


@dataclass(frozen=True)
class GpuModel:
    """A GPU model, its memory and where it was learnt."""

    name: str
    memory_gib: float
    source: str  # "accelerator_type:A10G of node type gpu" / "g5.12xlarge of node type gpu_worker"


def gpu_of(plan: ResourcePlan, cluster: dict[str, float]) -> GpuModel | None:
    """The GPU model of the plan's workers: the node type's ``accelerator_type:`` resource, its
    instance type, or (no node types) the ``accelerator_type:`` resource of what is up; None if unknown."""
    where = f" of node type {plan.node_type}" if plan.node_type else " of the nodes up"
    for name in _accelerators(plan.node_resources if plan.node_type else cluster):
        if name in GPU_MEMORY_GIB:
            return GpuModel(name, GPU_MEMORY_GIB[name], f"{ACCELERATOR_RESOURCE}{name}{where}")
    carried = instance_gpu(plan.node_instance)
    if carried:
        return GpuModel(carried, GPU_MEMORY_GIB[carried], f"{plan.node_instance}{where}")
    return None


def instance_gpu(instance_type: str) -> str | None:
    """The GPU an instance type carries (``g5.12xlarge`` -> ``A10G``), None if not in :data:`INSTANCE_GPUS`."""
    for family in sorted(INSTANCE_GPUS, key=len, reverse=True):
        if instance_type == family or instance_type.startswith((family + ".", family + "-")):
            return INSTANCE_GPUS[family]
    return None


def _accelerators(resources: dict[str, float]) -> list[str]:
    return [key[len(ACCELERATOR_RESOURCE):] for key in resources if key.startswith(ACCELERATOR_RESOURCE)]


def shares_gpu(plan: ResourcePlan) -> bool:
    """Whether trials of this plan may share a GPU: one GPU worker per trial holding a whole GPU."""
    return plan.use_gpu and plan.num_workers == 1 and plan.gpus_per_worker == 1.0


def share_gpu(cfg: RunConfig, plan: ResourcePlan, need_bytes: int, what: str, cluster: dict[str, float],
              trials: int) -> ResourcePlan:
    """One trial's ``plan`` (``trial=True``) with each trial's GPU share set: 1/N of a GPU for N trials
    per GPU (the module docstring's rule), its reason in ``reasons.gpu_share``.  ``need_bytes``: the
    model's training memory (``what`` says whose, e.g. ``mlp at 512 rows``); ``trials``: how many the
    sweep would like at once (its trials, or tune.max_concurrent_trials)."""
    if not plan.use_gpu:
        return plan
    if not shares_gpu(plan):
        why = (f"trials of {plan.num_workers} workers (DDP) hold whole GPUs" if plan.num_workers > 1 else
               f"scaling.gpus_per_worker={plan.gpus_per_worker:g} stands (tune.trials_per_gpu applies at 1)")
        return _shared(cfg, plan, plan.gpus_per_worker, why)
    n, why = trials_per_gpu(cfg, plan, need_bytes, what, cluster, trials)
    return _shared(cfg, plan, math.floor(10**GPU_SHARE_DECIMALS / n) / 10**GPU_SHARE_DECIMALS, why)


def trials_per_gpu(cfg: RunConfig, plan: ResourcePlan, need_bytes: int, what: str, cluster: dict[str, float],
                   trials: int) -> tuple[int, str]:
    """N and why (see :func:`share_gpu`)."""
    setting = cfg.tune.trials_per_gpu
    need = need_bytes + CUDA_CONTEXT_BYTES
    gpu = gpu_of(plan, cluster)
    gib = gpu.memory_gib if gpu else ASSUMED_GPU_GIB
    needs = (f"{what} needs ~{_mib(need)} per trial with the CUDA context, of "
             + (f"{_article(gpu.name)} {gpu.name}'s {gib:g} GiB ({gpu.source})" if gpu else
                f"{gib:g} GiB assumed: {_unknown(plan)}, so the smallest GPU of the table (T4, V100-16GB)"))
    fit = int(SAFETY * gib * 2**30 // need)
    if setting == 1:
        return 1, "tune.trials_per_gpu=1: a whole GPU per trial"
    if setting > 1:
        warn = "" if fit >= setting else f"; beware: {needs}, and {SAFETY:g} x {gib:g} GiB holds {fit}"
        return setting, f"tune.trials_per_gpu={setting}{warn}"
    n = max(1, min(MAX_TRIALS_PER_GPU, fit))
    why = f"{needs}: {SAFETY:g} x {gib:g} GiB / {_mib(need)} = {fit}, at most {MAX_TRIALS_PER_GPU}"
    if fit < 1:
        why += "; not even one fits: a whole GPU, and it may run out of memory"
    node = plan.node_resources if plan.node_type else cluster
    per_node, cpus = int(node.get("GPU", 0)), float(node.get("CPU", 0))
    where = f"one {plan.node_type} node's" if plan.node_type else "the cluster's"
    spread = max(1, math.ceil(trials / per_node)) if per_node else n
    if spread < n:
        why += f"; the sweep's {trials} trial(s) at once need only {spread} per GPU on {where} {per_node} GPUs"
        n = spread
    fed = max(1, int((cpus - DATA_CPU_RESERVE) // plan.cpus_per_worker) // per_node) if per_node else n
    if fed < n:
        why += (f"; {where} {cpus:g} CPUs ({DATA_CPU_RESERVE:g} kept for Ray Data) feed {fed} per GPU at "
                f"{plan.cpus_per_worker:g} CPU a trial")
        n = fed
    return n, f"{why}; tune.trials_per_gpu=0 = automatic"


def _unknown(plan: ResourcePlan) -> str:
    if plan.node_type:
        instance = f"instance type {plan.node_instance} not in the table" if plan.node_instance else "no instance type"
        return (f"node type {plan.node_type} names no GPU model (no {ACCELERATOR_RESOURCE}<model> resource, "
                f"{instance})")
    return f"the nodes up advertise no {ACCELERATOR_RESOURCE}<model> resource"


def _shared(cfg: RunConfig, plan: ResourcePlan, gpus: float, why: str) -> ResourcePlan:
    shared = replace(plan, gpus_per_worker=gpus, trials_per_gpu=gpu_sharers(gpus),
                     reasons=replace(plan.reasons, gpu_share=why))
    if gpus != plan.gpus_per_worker:  # the data path's budget is split between the sharers
        shared.reasons.data_path = planned_data_path(plan.worker_device, cached=cfg.train.cache_data,
                                                     fraction=cfg.train.device_cache_fraction,
                                                     sharers=gpu_sharers(gpus))
    return shared


def _article(name: str) -> str:
    return "an" if name[:1] in "AEFHILMNORSX" else "a"  # as the letter is said: an A10G, an H100, a T4


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"
