"""The resource plan: how many workers, what each holds, what is left for Ray Data, and why.

Every decision comes with a reason, like the device resolver's.  Ray's known infinite waits
become errors before anything starts: Ray Data with no CPU left (2 x 1-CPU workers on a 2-CPU
machine wait forever), a GPU asked for that no node has, a worker group that cannot fit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import UserError
from alchemetric_ray.hardware.device import train_accelerator

DATA_CPU_RESERVE = 1.0  # logical CPUs kept free for Ray Data's read tasks
MIN_DATA_CPUS = 0.5


class PlanError(UserError, RuntimeError):
    pass


@dataclass
class ResourcePlan:
    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    gpus_per_worker: float
    threads_per_worker: int  # 0 = each worker: its node's cores // workers on that node
    cpus_for_data: float
    backend: str
    worker_device: str
    accelerator: str
    reasons: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        threads = self.threads_per_worker or "auto (node cores // workers on the node)"
        lines = [
            f"workers          {self.num_workers}  ({self.reasons['workers']})",
            f"per worker       {self.cpus_per_worker:g} CPU"
            + (f", {self.gpus_per_worker:g} GPU" if self.use_gpu else "")
            + f"  ({self.reasons['cpus']})",
            f"torch threads    {threads}",
            f"left for data    {self.cpus_for_data:g} CPU  ({self.reasons['data']})",
            f"use_gpu          {self.use_gpu}  ({self.reasons['accelerator']})",
            f"backend          {self.backend}",
        ]
        return "\n".join(lines)


def plan_resources(cfg: RunConfig, cluster: dict[str, float]) -> ResourcePlan:
    """Plan a Train run for a Ray cluster with ``cluster`` total resources (``ray.cluster_resources()``)."""
    scaling = cfg.scaling
    total_cpus = float(cluster.get("CPU", 0))
    total_gpus = float(cluster.get("GPU", 0))
    accelerator = train_accelerator(cfg.device.name, total_gpus, max(1, scaling.workers))
    reasons = {"accelerator": accelerator.reason}

    if accelerator.use_gpu:
        max_workers = int(total_gpus // scaling.gpus_per_worker)
        if max_workers < 1:
            raise PlanError(f"config 'scaling.gpus_per_worker': {scaling.gpus_per_worker:g} GPU per worker "
                            f"but the cluster has {total_gpus:g} GPU(s)")
        workers = scaling.workers or max_workers
        if workers > max_workers:
            raise PlanError(f"config 'scaling.workers': {workers} workers x {scaling.gpus_per_worker:g} GPU need "
                            f"{workers * scaling.gpus_per_worker:g} GPUs; the cluster has {total_gpus:g}")
        reasons["workers"] = ("scaling.workers" if scaling.workers
                              else f"one per GPU ({total_gpus:g} GPU(s) / {scaling.gpus_per_worker:g} per worker)")
    else:
        workers = scaling.workers or 1
        reasons["workers"] = "scaling.workers" if scaling.workers else accelerator.default_workers_reason

    free = total_cpus - DATA_CPU_RESERVE
    if scaling.cpus_per_worker:
        cpus_per_worker = scaling.cpus_per_worker
        reasons["cpus"] = "scaling.cpus_per_worker"
    else:
        cpus_per_worker = max(0.25, min(4.0, _round_down(free / workers, 0.25))) if free > 0 else 0.25
        reasons["cpus"] = (f"{total_cpus:g} logical CPUs minus {DATA_CPU_RESERVE:g} for Ray Data, "
                           f"shared by {workers} worker(s)")
    data_cpus = total_cpus - workers * cpus_per_worker
    reasons["data"] = "Ray Data reads Parquet with what the workers leave"
    if data_cpus < MIN_DATA_CPUS:
        raise PlanError(
            f"{workers} worker(s) x {cpus_per_worker:g} CPU on a cluster of {total_cpus:g} CPUs "
            f"leave {max(data_cpus, 0):g} CPU for Ray Data, which would wait forever for a CPU to read the shards; "
            f"lower scaling.cpus_per_worker "
            f"(e.g. {max(0.25, _round_down((total_cpus - MIN_DATA_CPUS) / workers, 0.25)):g}) or scaling.workers")
    return ResourcePlan(
        num_workers=workers, use_gpu=accelerator.use_gpu, cpus_per_worker=cpus_per_worker,
        gpus_per_worker=scaling.gpus_per_worker if accelerator.use_gpu else 0.0,
        threads_per_worker=scaling.threads_per_worker, cpus_for_data=data_cpus, backend=accelerator.backend,
        worker_device=accelerator.worker_device,
        accelerator=accelerator.kind, reasons=reasons,
    )


def _round_down(value: float, step: float) -> float:
    return int(value / step) * step
