"""What a sweep's trials hold and how many run at once: the trial's own resources, the GPU share of a
one-worker GPU trial (several small trials per GPU, from the model's memory footprint), the bundles a
sweep asks the autoscaler for, and the concurrency that fits on the cluster or its node types."""

from __future__ import annotations

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import PlanError
from alchemetric_ray.placement.autoscale import run_bundles
from alchemetric_ray.placement.gpu_share import share_gpu, shares_gpu
from alchemetric_ray.placement.plan import DATA_CPU_RESERVE, ResourcePlan, nodes_needed, runs_in_trial
from alchemetric_ray.sweeps.space import trial_count

TRIAL_DRIVER_CPU = 0.1  # a trial function that only waits on its TorchTrainer


def trial_resources(cfg: RunConfig, plan: ResourcePlan) -> dict[str, float]:
    """What the trial itself holds: the worker's bundle when it runs the loop, else a driver's sliver."""
    return plan.worker_bundle() if runs_in_trial(cfg, plan) else {"CPU": TRIAL_DRIVER_CPU}


def sweep_bundles(cfg: RunConfig, plan: ResourcePlan, trials: int) -> list[dict]:
    """What a sweep asks the autoscaler for: the concurrent trials' workers and their drivers' shares
    (a trial that runs the loop itself is its worker, with no driver beside it)."""
    return run_bundles(plan, trials, None if runs_in_trial(cfg, plan) else {"CPU": TRIAL_DRIVER_CPU})


def concurrency(cfg: RunConfig, plan: ResourcePlan, cluster: dict[str, float]) -> int:
    """Trials at once, at most as many as the sweep has (:func:`trial_count`).

    On an autoscaling cluster's node types: the most trials whose bundles (:func:`sweep_bundles`:
    their GPUs and CPUs, a trainer trial's driver share, Ray Data's CPU) fit on the nodes the node type
    scales to.  Elsewhere, what is up (``cluster``, ``ray.cluster_resources()``): each trial needs its
    workers' CPUs plus a sliver for the trial's own process (a driver waiting on its TorchTrainer, or a
    one-worker trial's Ray Data iterator and reports), Ray Data keeps ``DATA_CPU_RESERVE`` CPUs (so a
    2-CPU laptop neither deadlocks nor idles), and a GPU trial needs its workers' GPUs.  Unknown node
    types: what the plan asks the autoscaler for (one trial's workers)."""
    if cfg.tune.max_concurrent_trials:
        return cfg.tune.max_concurrent_trials
    most = trial_count(cfg)
    if plan.autoscale and plan.node_type:
        fits = 1
        while fits < most and nodes_needed(plan, sweep_bundles(cfg, plan, fits + 1)) <= plan.max_nodes:
            fits += 1
        return fits
    cpus = plan.cluster_cpus if plan.autoscale else float(cluster.get("CPU", 0))
    per_trial = plan.num_workers * plan.cpus_per_worker + TRIAL_DRIVER_CPU
    fits = int((cpus - DATA_CPU_RESERVE) // per_trial)
    if plan.use_gpu and not plan.autoscale:
        fits = min(fits, int(float(cluster.get("GPU", 0)) // (plan.num_workers * plan.gpus_per_worker)))
    return max(1, min(most, fits))


def trial_config(cfg: RunConfig) -> RunConfig:
    """The config each trial's plan is made from: one CPU per worker unless scaling.cpus_per_worker says."""
    return cfg if cfg.scaling.cpus_per_worker else cfg.replace("scaling.cpus_per_worker=1")


def share_trial_gpus(trial_cfg: RunConfig, plan: ResourcePlan, cluster: dict[str, float], n_features: int,
                     outputs: int) -> ResourcePlan:
    """One trial's ``plan`` (made with ``trial=True``) with its GPU share: a one-worker GPU trial reserves
    1/N of a GPU, N from tune.trials_per_gpu or, at 0, from the largest model the sweep can train
    (``sweeps/footprint.py``, a meta-device trace at ``n_features`` features and ``outputs`` outputs)
    against the GPU's memory (``placement/gpu_share.py``); the reason is in ``reasons.gpu_share``.
    Trials of several workers and CPU plans keep their plan."""
    if not plan.use_gpu:
        return plan
    need, what = 0, trial_cfg.model.name
    if shares_gpu(plan) and trial_cfg.tune.trials_per_gpu != 1:
        from alchemetric_ray.sweeps.footprint import sweep_footprint  # torch: only where a GPU trial is planned

        footprint = sweep_footprint(trial_cfg, n_features, outputs)
        need, what = footprint.total_bytes, f"{footprint.model} at {footprint.rows:,} rows"
    at_once = min(trial_count(trial_cfg), trial_cfg.tune.max_concurrent_trials or trial_count(trial_cfg))
    return share_gpu(trial_cfg, plan, need, what, cluster, at_once)


def plan_trials(trial_cfg: RunConfig, plan: ResourcePlan, cluster: dict[str, float]) -> tuple[int, list[dict]]:
    """Trials at once and what the sweep asks the autoscaler for, for one trial's ``plan`` (made with
    ``trial=True``) on a cluster with ``cluster`` up; an explicit tune.max_concurrent_trials that the
    node types cannot hold is refused in one line.  An autoscaling plan counts on the nodes its node
    types scale to, not on what is up now."""
    limit = concurrency(trial_cfg, plan, cluster)
    bundles = sweep_bundles(trial_cfg, plan, limit)
    _check_trials_fit(plan, bundles, limit)
    return limit, bundles


def _check_trials_fit(plan: ResourcePlan, bundles: list[dict], limit: int) -> None:
    """On known node types, the concurrent trials must fit in what the node type scales to."""
    if not (plan.autoscale and plan.node_type):
        return
    nodes = nodes_needed(plan, bundles)
    if nodes > plan.max_nodes:
        raise PlanError(f"config 'tune.max_concurrent_trials': {limit} trial(s) at once need {nodes} {plan.node_type} "
                        f"node(s); it scales to at most {plan.max_nodes} ({plan.capacity}); lower "
                        "tune.max_concurrent_trials or scaling.workers")
