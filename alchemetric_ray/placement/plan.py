"""The resource plan: how many workers, what each holds, what is left for Ray Data, and why.

Every decision comes with a reason, like the device resolver's.  Ray's known infinite waits
become errors before anything starts: Ray Data with no CPU left (2 x 1-CPU workers on a 2-CPU
machine wait forever), a GPU asked for that no node has, a worker group that cannot fit.

On an autoscaling cluster the plan is made against what the cluster can become (the node types
``placement/capacity.py`` learnt), not what is up: the workers go on one node type, Ray Data gets the
CPUs those nodes leave, and a request no node type can ever hold is refused here (the v1
autoscaler never says so; it would wait forever).  This module only computes: it takes the
cluster's resources and the :class:`~alchemetric_ray.placement.capacity.Capacity` as data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import cast

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import PlanError, UserError
from alchemetric_ray.hardware.device import TrainAccelerator, train_accelerator
from alchemetric_ray.hardware.staging import gpu_sharers, planned_data_path
from alchemetric_ray.placement.capacity import UP_NOW, Capacity, NodeType, now
from alchemetric_ray.placement.capacity import shape as _shape

DATA_CPU_RESERVE = 1.0  # logical CPUs kept free for Ray Data's read tasks
MIN_DATA_CPUS = 0.5


@dataclass
class PlanReasons:
    """Why each planned value is what it is, one field per decision (``describe()`` shows them)."""

    accelerator: str  # the device kind and use_gpu (hardware.train_accelerator)
    workers: str
    cpus: str  # CPUs per worker
    data: str  # what Ray Data reads with
    node_type: str = ""  # on an autoscaling cluster's node types: why that type
    data_path: str = ""  # where a worker's batches will live (hardware.staging)
    ray: str = ""  # what the run uses Ray for, if anything (train/trainer.py: uses_ray)
    gpu_share: str = ""  # a sweep trial's plan: how many trials share a GPU (placement/gpu_share.py)


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
    reasons: PlanReasons
    # where the resources were learnt (placement/capacity.py), and on an autoscaling cluster what to ask for
    capacity: str = UP_NOW
    autoscale: bool = False  # ask the autoscaler for the workers' bundles and wait for them
    node_type: str | None = None  # the node type the workers are expected on (None: the nodes up now)
    node_resources: dict[str, float] = field(default_factory=dict)  # one node of that type
    nodes: int = 0  # nodes of node_type this plan needs
    max_nodes: int = 0  # nodes of node_type the autoscaler may run
    head_resources: dict[str, float] = field(default_factory=dict)  # the head's, from the node types
    cluster_cpus: float = 0.0  # the CPUs the plan counts on (up now, or on the nodes it asks for)
    node_instance: str = ""  # node_type's instance type, where the cluster file names it (its GPU model)
    trials_per_gpu: int = 0  # a GPU sweep trial's plan: trials that share one GPU (placement/gpu_share.py)

    def as_dict(self) -> dict:
        return asdict(self)

    def worker_bundle(self) -> dict[str, float]:
        """What one Train worker asks Ray for."""
        bundle = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            bundle["GPU"] = self.gpus_per_worker
        return bundle

    def describe(self) -> str:
        threads = self.threads_per_worker or "auto (node cores // workers on the node)"
        why = self.reasons
        lines = [
            f"workers          {self.num_workers}  ({why.workers})",
            f"per worker       {self.cpus_per_worker:g} CPU"
            + (f", {self.gpus_per_worker:g} GPU" if self.use_gpu else "")
            + f"  ({why.cpus})",
            f"torch threads    {threads}",
            f"left for data    {self.cpus_for_data:g} CPU  ({why.data})",
            f"use_gpu          {self.use_gpu}  ({why.accelerator})",
            f"backend          {self.backend}",
        ]
        if why.gpu_share:
            lines.append(f"trials per GPU   {self.trials_per_gpu}  ({why.gpu_share})")
        if why.data_path:
            lines.append(f"data path        {why.data_path}")
        if why.ray:
            lines.append(f"ray              {why.ray}")
        if self.node_type:
            lines.append(f"node type        {self.node_type} {_shape(self.node_resources)} x {self.nodes} "
                         f"(of at most {self.max_nodes}; {why.node_type})")
        if self.capacity != UP_NOW:  # a local Ray's plan reads as it always did
            lines.append(f"capacity         {self.capacity}"
                         + ("; the autoscaler is asked for the workers' nodes" if self.autoscale else ""))
        return "\n".join(lines)


# A sweep's trials each train on one worker unless told otherwise: a daily-bar model (an MLP or an RNN
# over a few hundred thousand rows) is far too small to keep several GPUs busy under DDP, where every
# step waits on an all-reduce; independent one-GPU trials keep a node's GPUs busy without that wait.
# scaling.workers=N makes each trial N-worker DDP.
ONE_WORKER_PER_TRIAL = ("one worker per trial (a sweep's default: small daily-bar models train as fast on one "
                        "GPU, so trials run side by side; scaling.workers=N for DDP trials)")


def runs_in_trial(cfg: RunConfig, plan: ResourcePlan) -> bool:
    """Whether each trial of a sweep runs the loop in its own process (one worker) instead of a ``TorchTrainer``;
    such a trial that caches its shard reads it with pyarrow, with no Ray Data (``sweeps/trial.py``)."""
    return cfg.tune.trial_loop == "auto" and plan.num_workers == 1


def plan_resources(cfg: RunConfig, cluster: dict[str, float], capacity: Capacity | None = None, *,
                   trial: bool = False) -> ResourcePlan:
    """Plan a Train run (``trial``: one sweep trial) for a Ray cluster with ``cluster`` total resources
    (``ray.cluster_resources()``) and, where it autoscales, the node types in ``capacity`` (None: what
    is up is all there is)."""
    plan = _plan_workers(cfg, cluster, capacity or now(), trial)
    plan.reasons.data_path = planned_data_path(plan.worker_device, cached=cfg.train.cache_data,
                                               fraction=cfg.train.device_cache_fraction,
                                               sharers=gpu_sharers(plan.gpus_per_worker))
    return plan


def _plan_workers(cfg: RunConfig, cluster: dict[str, float], capacity: Capacity, trial: bool) -> ResourcePlan:
    if capacity.node_types_known:
        return _plan_on_node_types(cfg, cluster, capacity, trial)
    unknown = capacity.node_types_unknown
    # One device decision, on what is up; where the node types are unknown, auto with no GPU up is refused.
    accelerator = train_accelerator(cfg.device.name, float(cluster.get("GPU", 0)), max(1, cfg.scaling.workers),
                                    gpus_unknown=capacity.unknown_hint() if unknown else None)
    if not unknown:
        return _plan_on_what_is_up(cfg, cluster, accelerator, trial)
    try:
        plan = _plan_on_what_is_up(cfg, cluster, accelerator, trial)
    except UserError:  # more than is up: ask the autoscaler for it, and wait
        return _plan_unknown(cfg, cluster, capacity, accelerator, trial)
    plan.capacity = f"the nodes that are up hold it ({capacity.source})"
    return plan


def _workers(cfg: RunConfig, accelerator: TrainAccelerator, trial: bool, gpu_default: tuple[int, str]
             ) -> tuple[int, str]:
    """How many workers, and why: scaling.workers when set; else one per trial in a sweep, the
    planner's ``gpu_default`` for CUDA, one worker otherwise."""
    if cfg.scaling.workers:
        return cfg.scaling.workers, "scaling.workers"
    if trial:
        return 1, ONE_WORKER_PER_TRIAL
    if accelerator.use_gpu:
        return gpu_default
    return 1, accelerator.default_workers_reason


def _plan(cfg: RunConfig, accelerator: TrainAccelerator, workers: int, cpus_per_worker: float, cpus_for_data: float,
          reasons: PlanReasons, **where) -> ResourcePlan:
    """The plan every planner returns: the decided accelerator and counts, and where they hold."""
    return ResourcePlan(
        num_workers=workers, use_gpu=accelerator.use_gpu, cpus_per_worker=cpus_per_worker,
        gpus_per_worker=cfg.scaling.gpus_per_worker if accelerator.use_gpu else 0.0,
        threads_per_worker=cfg.scaling.threads_per_worker, cpus_for_data=cpus_for_data, backend=accelerator.backend,
        worker_device=accelerator.worker_device, accelerator=accelerator.kind, reasons=reasons, **where)


def _plan_on_what_is_up(cfg: RunConfig, cluster: dict[str, float], accelerator: TrainAccelerator,
                        trial: bool) -> ResourcePlan:
    scaling = cfg.scaling
    total_cpus = float(cluster.get("CPU", 0))
    total_gpus = float(cluster.get("GPU", 0))
    max_workers = int(total_gpus // scaling.gpus_per_worker)
    if accelerator.use_gpu and max_workers < 1:
        raise PlanError(f"config 'scaling.gpus_per_worker': {scaling.gpus_per_worker:g} GPU per worker "
                        f"but the cluster has {total_gpus:g} GPU(s)")
    workers, workers_why = _workers(cfg, accelerator, trial, (
        max_workers, f"one per GPU ({total_gpus:g} GPU(s) / {scaling.gpus_per_worker:g} per worker)"))
    if accelerator.use_gpu and workers > max_workers:
        raise PlanError(f"config 'scaling.workers': {workers} workers x {scaling.gpus_per_worker:g} GPU need "
                        f"{workers * scaling.gpus_per_worker:g} GPUs; the cluster has {total_gpus:g}")

    free = total_cpus - DATA_CPU_RESERVE
    if scaling.cpus_per_worker:
        cpus_per_worker, cpus_why = scaling.cpus_per_worker, "scaling.cpus_per_worker"
    else:
        cpus_per_worker = max(0.25, min(4.0, _round_down(free / workers, 0.25))) if free > 0 else 0.25
        cpus_why = (f"{total_cpus:g} logical CPUs minus {DATA_CPU_RESERVE:g} for Ray Data, "
                    f"shared by {workers} worker(s)")
    data_cpus = total_cpus - workers * cpus_per_worker
    if data_cpus < MIN_DATA_CPUS:
        raise PlanError(
            f"{workers} worker(s) x {cpus_per_worker:g} CPU on a cluster of {total_cpus:g} CPUs "
            f"leave {max(data_cpus, 0):g} CPU for Ray Data, which would wait forever for a CPU to read the shards; "
            f"lower scaling.cpus_per_worker "
            f"(e.g. {max(0.25, _round_down((total_cpus - MIN_DATA_CPUS) / workers, 0.25)):g}) or scaling.workers")
    reasons = PlanReasons(accelerator.reason, workers_why, cpus_why,
                          "Ray Data reads Parquet with what the workers leave")
    return _plan(cfg, accelerator, workers, cpus_per_worker, data_cpus, reasons, cluster_cpus=total_cpus)


def _plan_on_node_types(cfg: RunConfig, cluster: dict[str, float], capacity: Capacity, trial: bool) -> ResourcePlan:
    """Plan for what the node types can become: the workers on one node type (the GPU type with the
    most GPUs for CUDA; a CPU type without GPUs, the largest, otherwise), as many nodes of it as the
    workers and Ray Data's share need, within its max_workers."""
    scaling = cfg.scaling
    types = capacity.describe_types()
    head = capacity.head
    head_resources = dict(head.resources) if head else {}
    usable = [t for t in capacity.workers if capacity.limit(t) > 0]
    gpu_types = [t for t in usable if t.resources.get("GPU", 0) > 0]
    best_gpu = max(gpu_types, key=lambda t: t.resources["GPU"] * capacity.limit(t), default=None)
    possible_gpus = best_gpu.resources["GPU"] * capacity.limit(best_gpu) if best_gpu else 0.0
    accelerator = train_accelerator(cfg.device.name, possible_gpus, max(1, scaling.workers), node_types=types)

    if accelerator.use_gpu:
        node = cast(NodeType, best_gpu)  # a GPU run here: possible_gpus > 0, so best_gpu is a type
        gpus = node.resources["GPU"]
        per_node = int(gpus // scaling.gpus_per_worker)
        if per_node < 1:
            raise PlanError(f"config 'scaling.gpus_per_worker': {scaling.gpus_per_worker:g} GPU per worker but the "
                            f"node type with the most GPUs ({node.name}) has {gpus:g} ({types})")
        most = per_node * capacity.limit(node)
        gpus_up = float(cluster.get("GPU", 0))
        workers, workers_why = _workers(cfg, accelerator, trial, (
            min(most, max(per_node, int(gpus_up // scaling.gpus_per_worker))),
            f"one per GPU of a {node.name} node ({gpus:g} GPU / {scaling.gpus_per_worker:g} per worker)"))
        if workers > most:
            raise PlanError(f"config 'scaling.workers': {workers} workers x {scaling.gpus_per_worker:g} GPU need "
                            f"{workers * scaling.gpus_per_worker:g} GPUs; the node types provide at most {most} such "
                            f"workers ({node.name}: {gpus:g} GPU x at most {capacity.limit(node)} node(s); {types})")
        node_why = f"the node type with the most GPUs, from {capacity.source}"
        on_node = min(per_node, workers)
    else:
        cpu_types = [t for t in usable if t.resources.get("CPU", 0) > 0]
        if not cpu_types:
            raise PlanError(f"no node type in this cluster has a CPU for the workers ({types})")
        # a CPU run leaves the GPU nodes alone where a CPU-only type exists
        node = max(cpu_types, key=lambda t: (t.resources.get("GPU", 0) == 0, t.resources["CPU"]))
        workers, workers_why = _workers(cfg, accelerator, trial, (1, ""))
        node_why = ("the largest CPU node type" + (" without GPUs" if not node.resources.get("GPU") else "")
                    + f", from {capacity.source}")
        on_node = workers
    node_cpus = node.resources.get("CPU", 0.0)
    head_cpus = head_resources.get("CPU", 0.0)
    if scaling.cpus_per_worker:
        cpus_per_worker, cpus_why = scaling.cpus_per_worker, "scaling.cpus_per_worker"
    else:
        share = (node_cpus + (0 if accelerator.use_gpu else head_cpus) - DATA_CPU_RESERVE) / on_node
        cpus_per_worker = max(0.25, min(4.0, node_cpus, _round_down(share, 0.25))) if share > 0 else 0.25
        cpus_why = (f"a {node.name} node's {node_cpus:g} CPUs minus {DATA_CPU_RESERVE:g} for Ray Data, "
                    f"shared by {on_node} worker(s) on it")
    if cpus_per_worker > node_cpus:
        raise PlanError(f"config 'scaling.cpus_per_worker': {cpus_per_worker:g} CPUs per worker but a {node.name} node "
                        f"has {node_cpus:g} ({types})")
    reasons = PlanReasons(accelerator.reason, workers_why, cpus_why, "", node_type=node_why)
    plan = _plan(cfg, accelerator, workers, cpus_per_worker, 0.0, reasons, capacity=capacity.source, autoscale=True,
                 node_type=node.name, node_resources=dict(node.resources), max_nodes=capacity.limit(node),
                 head_resources=head_resources, node_instance=node.instance_type)
    nodes = nodes_needed(plan, [plan.worker_bundle()] * workers + [data_bundle()])
    if nodes > plan.max_nodes:
        raise PlanError(f"config 'scaling.workers': {workers} worker(s) x {_shape(plan.worker_bundle())} and "
                        f"{MIN_DATA_CPUS:g} CPU for Ray Data need {nodes} {node.name} node(s); it scales to at most "
                        f"{plan.max_nodes} ({types}); lower scaling.workers or scaling.cpus_per_worker")
    plan.nodes = nodes
    plan.cluster_cpus = head_cpus + nodes * node_cpus
    plan.cpus_for_data = plan.cluster_cpus - workers * cpus_per_worker
    reasons.data = f"what the workers leave on the {nodes} {node.name} node(s)" + (" and the head" if head_cpus else "")
    return plan


def _plan_unknown(cfg: RunConfig, cluster: dict[str, float], capacity: Capacity, accelerator: TrainAccelerator,
                  trial: bool) -> ResourcePlan:
    """More than is up, on a cluster whose node types are unknown: plan the request as configured
    (1 CPU per worker unless told), ask the autoscaler for it and let the start timeout decide."""
    scaling = cfg.scaling
    gpus_up = float(cluster.get("GPU", 0))
    workers, workers_why = _workers(cfg, accelerator, trial, (
        max(1, int(gpus_up // scaling.gpus_per_worker)), "one (node types unknown; --workers N for more)"))
    cpus_per_worker = scaling.cpus_per_worker or 1.0
    cpus_why = "scaling.cpus_per_worker" if scaling.cpus_per_worker else "1 CPU per worker (node types unknown)"
    reasons = PlanReasons(accelerator.reason, workers_why, cpus_why,
                          f"{MIN_DATA_CPUS:g} CPU asked of the autoscaler beside the workers")
    return _plan(cfg, accelerator, workers, cpus_per_worker, MIN_DATA_CPUS, reasons, capacity=capacity.source,
                 autoscale=True, cluster_cpus=workers * cpus_per_worker + MIN_DATA_CPUS)


def data_bundle() -> dict[str, float]:
    """What the autoscaler is asked for beside the workers, so that Ray Data has a CPU to read with."""
    return {"CPU": MIN_DATA_CPUS}


def nodes_needed(plan: ResourcePlan, bundles: list[dict[str, float]]) -> int:
    """How many nodes of the plan's node type hold ``bundles`` (after what fits on the head); a huge
    number when a bundle fits no node of that type."""
    unplaced, opened = pack(bundles, [plan.head_resources], new_node=plan.node_resources)
    return 1 << 30 if unplaced else opened


def pack(bundles: list[dict[str, float]], nodes: list[dict[str, float]],
         new_node: dict[str, float] | None = None) -> tuple[list[dict[str, float]], int]:
    """Place ``bundles`` on ``nodes`` (their resources), first fit, largest first, opening nodes of
    ``new_node`` where none has room (when given).  Returns the bundles that found no place and how
    many nodes were opened.  The one packing the plan, the wait and its timeout message all use."""
    free = [dict(node) for node in nodes]
    unplaced, opened = [], 0
    for bundle in sorted(bundles, key=lambda b: (b.get("GPU", 0.0), b.get("CPU", 0.0)), reverse=True):
        spot = next((node for node in free if fits(bundle, node)), None)
        if spot is None and new_node is not None and fits(bundle, new_node):
            spot = dict(new_node)
            free.append(spot)
            opened += 1
        if spot is None:
            unplaced.append(bundle)
            continue
        for key, amount in bundle.items():
            spot[key] = spot.get(key, 0.0) - amount
    return unplaced, opened


def fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(key, 0.0) + 1e-9 >= amount for key, amount in bundle.items() if amount > 0)


def _round_down(value: float, step: float) -> float:
    return int(value / step) * step
