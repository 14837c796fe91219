"""What a default job plans on the clusters this project ships, read from the shipped files themselves.

* ``cluster.yaml``: the launcher config that ``ray up`` copies to the head as
  ``~/ray_bootstrap_config.yaml`` (the default ``scaling.cluster_config``), and the ``ray job
  submit`` line in its header;
* ``k8s/rayjob.yaml``: its entrypoint (with ``shlex``, through the CLI's own parser), its RayCluster
  spec through Ray's own KubeRay converter (``num-cpus`` from ``rayStartParams``, GPUs from the
  containers' ``nvidia.com/gpu`` limits), and the node-types ConfigMap the entrypoint reads.

On both, a default ``train``, ``tune`` and ``predict`` must plan CUDA workers, GPU bundles and an
autoscaler request that the node types hold, and a sweep that is never refused.  The job driver's
host (a cluster's head) has no CUDA and no MPS here, whatever this machine has.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import pytest
import yaml
from device_probes import cpu_only_machine
from test_kuberay import MANIFEST, _documents, _entrypoint, _rayjob

from alchemetric_ray.cli import build_parser, config_from_args
from alchemetric_ray.config import RunConfig, load_config
from alchemetric_ray.errors import DeviceError, PlanError
from alchemetric_ray.placement.autoscale import run_bundles
from alchemetric_ray.placement.capacity import Capacity, discover_capacity, from_kuberay_spec
from alchemetric_ray.placement.plan import ResourcePlan, nodes_needed, plan_resources
from alchemetric_ray.signals.predict import _actor_plan
from alchemetric_ray.sweeps.resources import plan_trials, runs_in_trial, trial_config

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster.yaml"
COLD = {"CPU": 0.0}  # ray.cluster_resources() when a job starts on a cold cluster: the CPU-less head alone


@pytest.fixture(autouse=True)
def driver(monkeypatch):
    cpu_only_machine(monkeypatch)


def _job_config(argv: list[str]) -> RunConfig:
    """The config `python jobs/<command>.py ARGS` builds (jobs/ call the CLI with the same argv)."""
    command = {"train.py": "train", "tune.py": "tune", "predict.py": "predict"}[Path(argv[0]).name]
    args = build_parser().parse_args([command, *argv[1:]])
    return config_from_args(args)


def _plans(cfg: RunConfig, capacity: Capacity) -> tuple[ResourcePlan, ResourcePlan, RunConfig]:
    """A default train's plan, and a sweep trial's plan with its config, as the commands make them."""
    train = plan_resources(cfg, COLD, capacity)
    trial_cfg = trial_config(cfg)
    return train, plan_resources(trial_cfg, COLD, capacity, trial=True), trial_cfg


def _check_gpu_plans(cfg: RunConfig, capacity: Capacity, node: str, node_cpus: float) -> None:
    """What a default job must plan on a cluster of 4-GPU nodes, at most 4 of them."""
    train, trial, trial_cfg = _plans(cfg, capacity)
    # train: CUDA, one DDP worker per GPU of one node, asked of the autoscaler in one request
    assert (train.accelerator, train.use_gpu, train.backend, train.num_workers) == ("cuda", True, "nccl", 4)
    assert (train.node_type, train.nodes, train.max_nodes, train.autoscale) == (node, 1, 4, True)
    assert train.worker_bundle() == {"CPU": 4.0, "GPU": 1.0}  # min(4, (node CPUs - 1 for Ray Data) / 4)
    assert run_bundles(train) == [{"CPU": 4.0, "GPU": 1.0}] * 4  # Ray Data reads with what the workers leave
    assert train.cpus_for_data == node_cpus - 16
    assert "no Apple GPU here: CUDA workers" in train.reasons.accelerator
    # tune: one-GPU trials, each running the loop in its own process, as many at once as the trials
    assert (trial.accelerator, trial.num_workers, trial.worker_bundle()) == ("cuda", 1, {"CPU": 1.0, "GPU": 1.0})
    assert runs_in_trial(trial_cfg, trial) and "one worker per trial" in trial.reasons.workers
    assert plan_trials(trial_cfg, trial, COLD) == (4, [{"CPU": 1.0, "GPU": 1.0}] * 4)  # tune.num_samples=4
    # a larger sweep fills the 4 nodes' 16 GPUs and is never refused
    for samples, at_once, nodes in ((16, 16, 4), (40, 16, 4), (6, 6, 2)):
        big = trial_cfg.replace(f"tune.num_samples={samples}")
        limit, bundles = plan_trials(big, trial, COLD)
        assert (limit, nodes_needed(trial, bundles)) == (at_once, nodes), samples
        assert bundles[:at_once] == [{"CPU": 1.0, "GPU": 1.0}] * at_once
    # only an explicit tune.max_concurrent_trials beyond the node types is refused, naming it
    with pytest.raises(PlanError, match=rf"'tune.max_concurrent_trials': 17 trial\(s\) at once need 5 {node} node"):
        plan_trials(trial_cfg.replace("tune.max_concurrent_trials=17"), trial, COLD)
    # predict: one CUDA actor per GPU of a node
    assert _actor_plan(cfg, 0.0, capacity) == (4, 1.0, "cuda")


# ---- cluster.yaml ---------------------------------------------------------------------------------


def _cluster_yaml_job() -> list[str]:
    """The `ray job submit ... -- python jobs/train.py ...` line of cluster.yaml's header, after `python`."""
    (line,) = [ln.lstrip("# ") for ln in CLUSTER.read_text().splitlines() if "ray job submit" in ln]
    argv = shlex.split(line)
    entry = argv[argv.index("--") + 1:]
    assert entry[0] == "python" and (REPO / entry[1]).is_file(), entry
    return entry[1:]


def test_a_default_job_on_cluster_yaml_plans_cuda_workers_and_a_sweep_that_fits():
    argv = _cluster_yaml_job()
    cfg = _job_config(argv)
    assert cfg.device.name == "auto"  # the documented job names no device
    # `ray up` copies cluster.yaml to the head as ~/ray_bootstrap_config.yaml, the default scaling.cluster_config
    assert cfg.scaling.cluster_config == "~/ray_bootstrap_config.yaml"
    capacity = discover_capacity(cfg.replace(f"scaling.cluster_config={CLUSTER}"), joined=True)
    assert capacity.kind == "node_types" and "gpu_worker {CPU: 48, GPU: 4} x 0-4" in capacity.describe_types()
    _check_gpu_plans(cfg, capacity, "gpu_worker", 48.0)


# ---- k8s/rayjob.yaml ------------------------------------------------------------------------------


def _cluster_spec() -> dict:
    return _rayjob()["spec"]["rayClusterSpec"]


def _mounted_node_types(cfg: RunConfig) -> str:
    """The text the job's scaling.cluster_config names on the head: a ConfigMap key mounted there."""
    path = Path(cfg.scaling.cluster_config)
    head = _cluster_spec()["headGroupSpec"]["template"]["spec"]
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
    maps = {d["metadata"]["name"]: d for d in _documents(MANIFEST) if d["kind"] == "ConfigMap"}
    return maps[volume["configMap"]["name"]]["data"][path.name]


def _kuberay_job(tmp_path) -> tuple[RunConfig, Capacity]:
    """The RayJob's own entrypoint config, and the node types it reads (the mounted ConfigMap, put
    where this test can read it)."""
    cfg = _job_config(_entrypoint(_rayjob())[1:])
    local = tmp_path / "node-types.yaml"
    local.write_text(_mounted_node_types(cfg))
    return cfg, discover_capacity(cfg.replace(f"scaling.cluster_config={local}"), joined=True)


def test_the_node_types_configmap_is_what_kuberays_converter_derives_from_the_manifest():
    cfg = _job_config(_entrypoint(_rayjob())[1:])
    assert cfg.scaling.cluster_config.endswith(".yaml") and cfg.device.name == "auto"
    derived = from_kuberay_spec(_cluster_spec(), _rayjob()["metadata"]["name"])
    assert yaml.safe_load(_mounted_node_types(cfg)) == derived, (
        "k8s/rayjob.yaml: the node-types ConfigMap differs from the workerGroupSpecs; regenerate it with "
        "`python scripts/kuberay_node_types.py k8s/rayjob.yaml`")
    # Ray's converter reads GPUs from the containers' limits and CPUs from rayStartParams (head: num-cpus 0)
    assert derived["available_node_types"]["gpu"]["resources"]["GPU"] == 4
    assert derived["available_node_types"]["headgroup"]["resources"]["CPU"] == 0


def test_a_default_kuberay_job_plans_cuda_workers_and_a_sweep_that_fits(tmp_path):
    cfg, capacity = _kuberay_job(tmp_path)
    assert capacity.kind == "node_types" and "gpu {CPU: 44, GPU: 4" in capacity.describe_types()
    _check_gpu_plans(cfg, capacity, "gpu", 44.0)


def test_a_manifest_edit_that_drops_the_gpus_no_longer_matches_the_configmap():
    """The drift the ConfigMap check exists for: a worker group without its GPU limit derives a CPU node
    type, so the committed ConfigMap (4 GPUs) no longer equals what the manifest gives KubeRay."""
    spec = copy.deepcopy(_cluster_spec())
    for kind in ("requests", "limits"):
        spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][kind].pop("nvidia.com/gpu")
    derived = from_kuberay_spec(spec)
    assert "GPU" not in derived["available_node_types"]["gpu"]["resources"]
    cfg = _job_config(_entrypoint(_rayjob())[1:])
    assert yaml.safe_load(_mounted_node_types(cfg)) != derived
    spec["workerGroupSpecs"][0]["rayStartParams"] = {"num-gpus": "2"}  # rayStartParams win over the limits
    assert from_kuberay_spec(spec)["available_node_types"]["gpu"]["resources"]["GPU"] == 2


def test_without_node_types_auto_stops_in_one_line_instead_of_training_on_the_cpu(tmp_path):
    """A KubeRay job whose node types cannot be learnt (no ConfigMap mounted): nothing up has a GPU,
    and auto refuses rather than plan the CPU; explicit requests are still planned."""
    cfg = _job_config(_entrypoint(_rayjob())[1:]).replace(f"scaling.cluster_config={tmp_path / 'none.yaml'}")
    capacity = discover_capacity(cfg, joined=True)
    assert capacity.kind == "unknown"
    # a CPU group at minReplicas >= 1 is up, the GPU group scales from 0: still no CPU plan in silence
    for up in (COLD, {"CPU": 8.0}):
        for plan in (lambda: plan_resources(cfg, up, capacity), lambda: _actor_plan(cfg, 0.0, capacity)):
            with pytest.raises(DeviceError) as err:
                plan()
            line = str(err.value)
            assert "\n" not in line and line.startswith("device auto on a Ray cluster with unknown node types and "
                                                        "no GPU up: ")
            assert "pass --device cuda (with --workers N for N GPU workers) or --device cpu, or declare the node " \
                   "types with scaling.cluster_config=PATH" in line
            assert line.endswith(f"none found: no cluster config in the GCS; no launcher config at "
                                 f"{tmp_path / 'none.yaml'} (scaling.cluster_config)")
    cuda = plan_resources(cfg.replace("device.name=cuda"), {"CPU": 8.0}, capacity)
    assert (cuda.accelerator, cuda.num_workers, cuda.autoscale) == ("cuda", 1, True)
    assert "--workers N for more" in cuda.reasons.workers
    assert plan_resources(cfg.replace("device.name=cpu"), {"CPU": 8.0}, capacity).accelerator == "cpu"
    # GPUs up: auto takes them
    assert plan_resources(cfg, {"CPU": 16.0, "GPU": 2.0}, capacity).num_workers == 2


def test_a_cpu_group_beside_the_gpu_group_still_plans_cuda_on_declared_node_types(tmp_path):
    """KubeRay with a CPU group at minReplicas 1 and the GPU group from 0: with the node types declared,
    auto plans CUDA on the GPU group even while only the CPU node is up."""
    spec = copy.deepcopy(_cluster_spec())
    cpu_group = copy.deepcopy(spec["workerGroupSpecs"][0])
    cpu_group.update(groupName="cpu", minReplicas=1, replicas=1, maxReplicas=2)
    resources = cpu_group["template"]["spec"]["containers"][0]["resources"]
    for kind in ("requests", "limits"):
        resources[kind] = {"cpu": "16", "memory": "64Gi"}
    spec["workerGroupSpecs"].insert(0, cpu_group)
    path = tmp_path / "node-types.yaml"
    path.write_text(yaml.safe_dump(from_kuberay_spec(spec)))
    capacity = discover_capacity(load_config(None, [f"scaling.cluster_config={path}"]), joined=True)
    plan = plan_resources(load_config(), {"CPU": 16.0}, capacity)
    assert (plan.accelerator, plan.node_type, plan.num_workers) == ("cuda", "gpu", 4)
    cpu = plan_resources(load_config(None, ["device.name=cpu"]), {"CPU": 16.0}, capacity)
    assert (cpu.accelerator, cpu.node_type) == ("cpu", "cpu")  # a CPU run stays off the GPU nodes
