"""Issue 43 item 5: a sweep's small one-worker trials share a GPU, planned from the shipped cluster files.

The job configs and node types come from the shipped ``cluster.yaml`` and ``k8s/rayjob.yaml``
themselves (``test_cluster_plans``' readers); a trial's plan is made as ``run_sweep`` makes it:
``plan_resources(trial=True)``, then ``share_trial_gpus`` with the model's meta-device footprint, then
``plan_trials``.  No GPU is needed: the planner works from node types.
"""

from __future__ import annotations

import pytest
import yaml
from device_probes import cpu_only_machine
from test_cluster_plans import CLUSTER, COLD, _cluster_yaml_job, _job_config, _kuberay_job

from alchemetric_ray.config import RunConfig, load_config
from alchemetric_ray.placement.capacity import Capacity, discover_capacity
from alchemetric_ray.placement.gpu_share import CUDA_CONTEXT_BYTES, SAFETY, instance_gpu
from alchemetric_ray.placement.plan import ResourcePlan, nodes_needed, plan_resources
from alchemetric_ray.sweeps.footprint import sweep_footprint, training_footprint
from alchemetric_ray.sweeps.resources import plan_trials, share_trial_gpus, trial_config

FEATURES, OUTPUTS = 16, 3  # the default `basic` feature set and a 3-class label
MANY = "tune.num_samples=64"  # more trials than the 4 nodes' 16 GPUs
BIG = ("model.name=transformer", "model.hidden=256", "train.batch_size=2048")  # ~8 GiB a trial


@pytest.fixture(autouse=True)
def driver(monkeypatch):
    cpu_only_machine(monkeypatch)


def _cluster_yaml() -> tuple[RunConfig, Capacity]:
    cfg = _job_config(_cluster_yaml_job())
    return cfg, discover_capacity(cfg.replace(f"scaling.cluster_config={CLUSTER}"), joined=True)


def _trial(cfg: RunConfig, capacity: Capacity, *overrides: str,
           cluster: dict[str, float] = COLD) -> tuple[RunConfig, ResourcePlan, int, list[dict]]:
    """A sweep trial's shared plan and the sweep's (trials at once, bundles), as run_sweep makes them."""
    trial_cfg = trial_config(cfg.replace(*overrides) if overrides else cfg)
    plan = share_trial_gpus(trial_cfg, plan_resources(trial_cfg, cluster, capacity, trial=True), cluster,
                            FEATURES, OUTPUTS)
    limit, bundles = plan_trials(trial_cfg, plan, cluster)
    return trial_cfg, plan, limit, bundles


def _check_four_mlp_trials_per_gpu(cfg: RunConfig, capacity: Capacity, node: str, gpu_words: str) -> None:
    _, shared, at_once, bundles = _trial(cfg, capacity, MANY)
    _, whole, whole_at_once, whole_bundles = _trial(cfg, capacity, MANY, "tune.trials_per_gpu=1")
    # a quarter of a GPU per MLP trial: 4x the trials at once on the same 4 nodes
    assert (shared.trials_per_gpu, shared.gpus_per_worker, shared.worker_bundle()) == (4, 0.25, {"CPU": 1.0,
                                                                                              "GPU": 0.25})
    assert (at_once, whole_at_once) == (64, 16) and at_once == 4 * whole_at_once
    assert bundles == [{"CPU": 1.0, "GPU": 0.25}] * 64 and nodes_needed(shared, bundles) == 4
    assert whole_bundles == [{"CPU": 1.0, "GPU": 1.0}] * 16 and nodes_needed(whole, whole_bundles) == 4
    # the plan says why
    need = training_footprint(trial_config(cfg), FEATURES, OUTPUTS).total_bytes + CUDA_CONTEXT_BYTES
    line = next(ln for ln in shared.describe().splitlines() if ln.startswith("trials per GPU"))
    assert line.startswith(f"trials per GPU   4  (mlp at 512 rows needs ~{need / 2**20:,.0f} MiB per trial with "
                           f"the CUDA context, of {gpu_words}")
    assert line.endswith(", at most 4; tune.trials_per_gpu=0 = automatic)")
    assert "per worker       1 CPU, 0.25 GPU" in shared.describe() and f"node type        {node} " in shared.describe()
    assert "/ 4 worker(s) per GPU" in shared.reasons.data_path  # the device cache's budget is split 4 ways
    assert "tune.trials_per_gpu=1: a whole GPU per trial" in whole.describe()


def test_cluster_yaml_runs_four_mlp_trials_per_a10g():
    cfg, capacity = _cluster_yaml()
    _check_four_mlp_trials_per_gpu(cfg, capacity, "gpu_worker",
                                   "an A10G's 24 GiB (g5.12xlarge of node type gpu_worker): 0.8 x 24 GiB / ")


def test_kuberay_job_runs_four_mlp_trials_per_gpu_of_an_assumed_16_gib(tmp_path):
    cfg, capacity = _kuberay_job(tmp_path)
    _check_four_mlp_trials_per_gpu(cfg, capacity, "gpu", (
        "16 GiB assumed: node type gpu names no GPU model (no accelerator_type:<model> resource, no instance type), "
        "so the smallest GPU of the table (T4, V100-16GB): 0.8 x 16 GiB / "))


def test_a_big_model_gets_fewer_trials_per_gpu(tmp_path):
    need = training_footprint(trial_config(load_config(None, list(BIG))), FEATURES, OUTPUTS).total_bytes
    need += CUDA_CONTEXT_BYTES
    assert int(SAFETY * 24 * 2**30 // need) == 2 and int(SAFETY * 16 * 2**30 // need) == 1  # the case it is
    for (cfg, capacity), n in ((_cluster_yaml(), 2), (_kuberay_job(tmp_path), 1)):
        _, plan, at_once, bundles = _trial(cfg, capacity, MANY, *BIG)
        assert (plan.trials_per_gpu, plan.gpus_per_worker, at_once) == (n, 1 / n, 16 * n)
        assert f"transformer at 2,048 rows needs ~{need / 2**20:,.0f} MiB per trial" in plan.reasons.gpu_share
        assert f"/ {need / 2**20:,.0f} MiB = {n}, at most 4" in plan.reasons.gpu_share


def test_trials_per_gpu_is_honoured_and_warned_of_when_the_model_does_not_fit():
    cfg, capacity = _cluster_yaml()
    _, two, at_once, bundles = _trial(cfg, capacity, MANY, "tune.trials_per_gpu=2")
    assert (two.trials_per_gpu, two.worker_bundle(), at_once) == (2, {"CPU": 1.0, "GPU": 0.5}, 32)
    assert two.reasons.gpu_share == "tune.trials_per_gpu=2"
    _, four, at_once, _ = _trial(cfg, capacity, MANY, "tune.trials_per_gpu=4", *BIG)  # the user's word stands
    assert (four.trials_per_gpu, four.gpus_per_worker, at_once) == (4, 0.25, 64)
    assert four.reasons.gpu_share.startswith("tune.trials_per_gpu=4; beware: transformer at 2,048 rows needs ~")
    assert four.reasons.gpu_share.endswith("and 0.8 x 24 GiB holds 2")
    _, three, _, _ = _trial(cfg, capacity, MANY, "tune.trials_per_gpu=3")
    assert (three.trials_per_gpu, three.gpus_per_worker) == (3, 0.3333)  # Ray's 1/10,000 steps, 3 fit in one GPU


def test_a_small_sweep_spreads_over_the_nodes_gpus_before_sharing_one():
    """The default 4 trials on a 4-GPU node: a whole GPU each, not a quarter of one while three idle."""
    cfg, capacity = _cluster_yaml()
    _, plan, at_once, bundles = _trial(cfg, capacity)  # tune.num_samples=4
    assert (plan.trials_per_gpu, at_once, bundles) == (1, 4, [{"CPU": 1.0, "GPU": 1.0}] * 4)
    assert "the sweep's 4 trial(s) at once need only 1 per GPU on one gpu_worker node's 4 GPUs" in \
           plan.reasons.gpu_share
    _, plan, at_once, _ = _trial(cfg, capacity, "tune.num_samples=8")
    assert (plan.trials_per_gpu, at_once) == (2, 8)


def test_no_more_trials_per_gpu_than_a_nodes_cpus_feed(tmp_path):
    """A node type of 2 CPUs and 1 GPU (the suite's fake GPU cluster's): one 1-CPU trial at a time is all
    its CPUs feed beside Ray Data, so the trial keeps a whole GPU."""
    data = yaml.safe_load(CLUSTER.read_text())
    data["available_node_types"]["gpu_worker"].update(resources={"CPU": 2, "GPU": 1}, max_workers=1)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = _job_config(_cluster_yaml_job())
    capacity = discover_capacity(cfg.replace(f"scaling.cluster_config={path}"), joined=True)
    _, plan, at_once, bundles = _trial(cfg, capacity, "tune.num_samples=2")
    assert (plan.trials_per_gpu, at_once, bundles[:1]) == (1, 1, [{"CPU": 1.0, "GPU": 1.0}])
    assert plan.reasons.gpu_share.endswith("; one gpu_worker node's 2 CPUs (1 kept for Ray Data) feed 1 per GPU at 1 "
                                           "CPU a trial; tune.trials_per_gpu=0 = automatic")


def test_ddp_trials_cpu_plans_and_a_hand_set_gpu_share_are_unchanged():
    cfg, capacity = _cluster_yaml()
    _, ddp, _, bundles = _trial(cfg, capacity, MANY, "scaling.workers=2")
    assert (ddp.num_workers, ddp.gpus_per_worker, ddp.trials_per_gpu) == (2, 1.0, 1)
    assert ddp.reasons.gpu_share == "trials of 2 workers (DDP) hold whole GPUs"
    assert {b.get("GPU") for b in bundles} <= {1.0, None}
    _, cpu, _, _ = _trial(cfg, capacity, MANY, "device.name=cpu")
    assert (cpu.use_gpu, cpu.trials_per_gpu, cpu.reasons.gpu_share) == (False, 0, "")
    assert "trials per GPU" not in cpu.describe()
    _, half, at_once, _ = _trial(cfg, capacity, MANY, "scaling.gpus_per_worker=0.5")
    assert (half.gpus_per_worker, half.trials_per_gpu, at_once) == (0.5, 2, 32)
    assert half.reasons.gpu_share == "scaling.gpus_per_worker=0.5 stands (tune.trials_per_gpu applies at 1)"


def test_the_gpu_model_comes_from_rays_accelerator_type_resource(tmp_path):
    """A node type that declares Ray's accelerator_type:<model> resource (as Ray advertises on a GPU node)
    is sized by it, before its instance type; the nodes up (no node types) likewise."""
    data = yaml.safe_load(CLUSTER.read_text())
    data["available_node_types"]["gpu_worker"]["resources"]["accelerator_type:H100"] = 1
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = _job_config(_cluster_yaml_job())
    capacity = discover_capacity(cfg.replace(f"scaling.cluster_config={path}"), joined=True)
    _, plan, _, _ = _trial(cfg, capacity, MANY, *BIG)
    assert plan.trials_per_gpu == 4 and "of an H100's 80 GiB (accelerator_type:H100 of node type gpu_worker)" in \
           plan.reasons.gpu_share
    # a local Ray with one T4 up: 4 MLP trials on it at once, 1 with a whole GPU each
    up = {"CPU": 16.0, "GPU": 1.0, "accelerator_type:T4": 1.0}
    local = load_config(None, [MANY])
    _, plan, at_once, _ = _trial(local, Capacity("now", "up"), cluster=up)
    assert (plan.trials_per_gpu, at_once) == (4, 4) and "of a T4's 16 GiB (accelerator_type:T4 of the nodes up)" in \
           plan.reasons.gpu_share
    assert _trial(local, Capacity("now", "up"), "tune.trials_per_gpu=1", cluster=up)[2] == 1
    assert [instance_gpu(t) for t in ("g5.xlarge", "g6e.12xlarge", "p4de.24xlarge", "a2-ultragpu-1g", "m5.large")] \
        == ["A10G", "L40S", "A100-80G", "A100-80G", None]


def test_the_footprint_is_the_largest_the_space_can_draw():
    cfg = load_config(None, ["tune.space={model.hidden: [32, 1024], train.lr: {loguniform: [0.0001, 0.01]}}"])
    largest = sweep_footprint(cfg, FEATURES, OUTPUTS)
    assert largest == training_footprint(cfg.replace("model.hidden=1024"), FEATURES, OUTPUTS)
    assert largest.total_bytes > training_footprint(cfg.replace("model.hidden=32"), FEATURES, OUTPUTS).total_bytes
    mlp = training_footprint(load_config(), FEATURES, OUTPUTS)  # 16 -> 64 -> 64 -> 3: weights and biases
    assert mlp.parameters == 16 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3 and mlp.state_bytes == 16 * mlp.parameters
    # a model the space cannot build (hidden not divisible by heads) is left out, not a failure
    odd = load_config(None, ["model.name=transformer", "model.heads=4", "tune.space={model.hidden: [30, 64]}"])
    assert sweep_footprint(odd, FEATURES, OUTPUTS) == training_footprint(odd.replace("model.hidden=64"), FEATURES,
                                                                         OUTPUTS)
