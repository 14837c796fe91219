"""Autoscaling clusters: node types learnt from launcher YAML files, plans made against them, and the
start window; one real-Ray test of the wait's progress lines, its timeout and the cleared request.

The cold-cluster runs (a real fake-autoscaling head adding nodes) are in test_cluster.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import yaml
from device_probes import cpu_only_machine
from fake_cluster import launcher_config

from alchemetric_ray.config import load_config
from alchemetric_ray.errors import CapacityError, ConfigError, DeviceError, PlanError, UserError
from alchemetric_ray.hardware.device import GpuWorkerReport, gpu_worker_problem
from alchemetric_ray.placement import autoscale
from alchemetric_ray.placement.capacity import Capacity, discover_capacity, from_launcher_config
from alchemetric_ray.placement.plan import plan_resources

CPU_ONLY = {"cpu_worker": {"resources": {"CPU": 4}, "max_workers": 2}}
WITH_GPUS = {**CPU_ONLY, "gpu_worker": {"resources": {"CPU": 8, "GPU": 4}, "max_workers": 2}}
COLD = {"CPU": 0.0}  # what ray.cluster_resources() says on a cold cluster: a head with no CPUs


@pytest.fixture
def driver(monkeypatch):
    """The job driver's host (a cluster's head): no CUDA and no MPS, whatever this host has; the GPUs
    are the cluster's."""
    cpu_only_machine(monkeypatch)


def _capacity(tmp_path, worker_types, **kw) -> Capacity:
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(launcher_config(6379, worker_types, **kw)))
    cfg = load_config(None, [f"scaling.cluster_config={path}"])
    return discover_capacity(cfg, joined=True)


def _plan(args, capacity):
    return plan_resources(load_config(None, args), COLD, capacity)


def test_node_types_come_from_the_launcher_yaml(tmp_path):
    cap = _capacity(tmp_path, WITH_GPUS, max_workers=3)
    assert cap.kind == "node_types" and cap.source == f"launcher config {tmp_path / 'bootstrap.yaml'}"
    assert {t.name: (t.resources, t.min_workers, t.max_workers) for t in cap.workers} == {
        "cpu_worker": ({"CPU": 4.0}, 0, 2), "gpu_worker": ({"CPU": 8.0, "GPU": 4.0}, 0, 2)}
    assert cap.head.name == "ray.head.default" and cap.max_workers == 3


def test_cuda_on_cpu_only_node_types_is_refused_in_one_line(tmp_path, driver):
    with pytest.raises(DeviceError, match="asked for device 'cuda' but no node type in this cluster has a GPU") as err:
        _plan(["device.name=cuda"], _capacity(tmp_path, CPU_ONLY))
    assert "cpu_worker {CPU: 4} x 0-2" in str(err.value) and "\n" not in str(err.value)


def test_more_workers_than_the_node_types_hold_names_the_numbers(tmp_path, driver):
    with pytest.raises(PlanError, match=r"config 'scaling.workers': 9 workers x 1 GPU need 9 GPUs; the node types "
                                        r"provide at most 8 such workers \(gpu_worker: 4 GPU x at most 2 node"):
        _plan(["device.name=cuda", "scaling.workers=9"], _capacity(tmp_path, WITH_GPUS))
    # the cluster-wide max_workers caps each type too
    with pytest.raises(PlanError, match="provide at most 4 such workers"):
        _plan(["device.name=cuda", "scaling.workers=5"], _capacity(tmp_path, WITH_GPUS, max_workers=1))
    with pytest.raises(PlanError, match=r"3 worker\(s\) x \{CPU: 4\} .* need 4 cpu_worker node\(s\); it scales to "
                                        r"at most 2"):
        _plan(["device.name=cpu", "scaling.workers=3", "scaling.cpus_per_worker=4"], _capacity(tmp_path, CPU_ONLY))


def test_cuda_on_a_cold_cluster_is_planned_on_the_gpu_node_type(tmp_path, driver):
    cap = _capacity(tmp_path, WITH_GPUS)
    plan = _plan(["device.name=cuda", "scaling.workers=4"], cap)
    assert (plan.use_gpu, plan.worker_device, plan.num_workers, plan.autoscale) == (True, "cuda", 4, True)
    assert (plan.node_type, plan.nodes, plan.max_nodes) == ("gpu_worker", 1, 2)
    assert plan.worker_bundle() == {"CPU": 1.75, "GPU": 1.0}  # (8 CPUs - 1 for Ray Data) / 4 workers
    assert plan.cpus_for_data == 1.0  # Ray Data gets what the workers leave on the nodes that will exist
    assert autoscale.run_bundles(plan) == [{"CPU": 1.75, "GPU": 1.0}] * 4  # Ray Data's CPU is on that node
    text = plan.describe()
    assert "node type        gpu_worker {CPU: 8, GPU: 4} x 1 (of at most 2" in text
    assert f"capacity         launcher config {tmp_path / 'bootstrap.yaml'}" in text
    assert _plan([], cap).num_workers == 4  # auto: one per GPU of one node of the type
    # a CPU run stays off the GPU nodes while a CPU-only type exists
    cpu = _plan(["device.name=cpu", "scaling.workers=2"], cap)
    assert (cpu.use_gpu, cpu.node_type, cpu.nodes, cpu.worker_bundle()) == (False, "cpu_worker", 1, {"CPU": 1.5})


def test_a_one_gpu_sweep_trial_holds_the_workers_gpu_and_asks_for_it(tmp_path, driver):
    """A one-worker CUDA sweep on a cold cluster: each trial runs the loop in its own process, so the
    trial itself holds the worker's GPU (Tune sets its CUDA_VISIBLE_DEVICES), and the autoscaler is
    asked for one worker bundle per concurrent trial, with no driver's share beside it."""
    from alchemetric_ray.sweeps.resources import runs_in_trial, sweep_bundles, trial_resources

    args = ["device.name=cuda", "scaling.workers=1"]
    plan = _plan(args, _capacity(tmp_path, WITH_GPUS))
    cfg = load_config(None, args)
    assert runs_in_trial(cfg, plan) and trial_resources(cfg, plan) == {"CPU": 4.0, "GPU": 1.0}
    # two trials fill a node's 8 CPUs, so Ray Data's CPU is asked for too; no driver's {CPU: 0.1} beside them
    assert sweep_bundles(cfg, plan, 2) == [{"CPU": 4.0, "GPU": 1.0}] * 2 + [{"CPU": 0.5}]
    # a TorchTrainer per trial: each trial's driver beside its worker (two nodes then, with room for Ray Data)
    trainer = cfg.replace("tune.trial_loop=trainer")
    assert sweep_bundles(trainer, plan, 2) == [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 0.1}] * 2


def test_ray_data_gets_a_cpu_from_the_nodes_that_will_exist(tmp_path, driver):
    small = {"one_cpu": {"resources": {"CPU": 1}, "max_workers": 2}}
    plan = _plan(["device.name=cpu", "scaling.cpus_per_worker=1"], _capacity(tmp_path, small))
    assert (plan.nodes, plan.cpus_for_data) == (2, 1.0)  # the worker fills one node; Ray Data needs a second
    assert autoscale.run_bundles(plan) == [{"CPU": 1.0}, {"CPU": 0.5}]  # so its CPU is asked for too
    with pytest.raises(PlanError, match=r"need 2 one_cpu node\(s\); it scales to at most 1"):
        _plan(["device.name=cpu", "scaling.cpus_per_worker=1"], _capacity(tmp_path, small, max_workers=1))


def test_unknown_node_types_accept_the_request_and_ask_for_it(tmp_path, driver):
    cfg = load_config(None, [f"scaling.cluster_config={tmp_path / 'none.yaml'}"])
    cap = discover_capacity(cfg, joined=True)
    assert cap.kind == "unknown" and f"no launcher config at {tmp_path / 'none.yaml'}" in cap.source
    plan = _plan(["device.name=cuda", "scaling.workers=4"], cap)
    assert (plan.use_gpu, plan.num_workers, plan.autoscale, plan.node_type) == (True, 4, True, None)
    assert autoscale.run_bundles(plan) == [{"CPU": 1.0, "GPU": 1.0}] * 4 + [{"CPU": 0.5}]
    # what is up already holds it: no waiting
    held = plan_resources(load_config(None, ["device.name=cpu"]), {"CPU": 8.0}, cap)
    assert not held.autoscale and "the nodes that are up hold it" in held.capacity


def test_a_local_ray_plans_from_what_is_up_whatever_yaml_is_there(tmp_path, driver):
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(launcher_config(6379, WITH_GPUS)))
    cap = discover_capacity(load_config(None, [f"scaling.cluster_config={path}"]), joined=False)
    assert cap.kind == "now" and not cap.autoscaling
    with pytest.raises(PlanError, match="leave 0 CPU for Ray Data"):  # as before: nothing to ask
        plan_resources(load_config(None, ["device.name=cpu"]), COLD, cap)


def test_a_broken_launcher_yaml_is_one_line_naming_the_key(tmp_path):
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump({"available_node_types": {"gpu_worker": {"resources": {"GPU": "four"}}}}))
    with pytest.raises(CapacityError, match=r"config 'scaling.cluster_config': launcher config .*bootstrap.yaml: "
                                            r"available_node_types.gpu_worker.resources"):
        discover_capacity(load_config(None, [f"scaling.cluster_config={path}"]), joined=True)
    path.write_text("max_workers: [")
    with pytest.raises(CapacityError, match="cannot be read as YAML"):
        discover_capacity(load_config(None, [f"scaling.cluster_config={path}"]), joined=True)
    with pytest.raises(ConfigError, match=r"config 'scaling.start_timeout_s': -1.0 is invalid, expected >= 0"):
        load_config(None, ["scaling.start_timeout_s=-1"])
    with pytest.raises(CapacityError, match="x: not a Ray cluster launcher config"):
        from_launcher_config([], "x")


def test_the_start_window_maps_onto_ray_trains_attempts(tmp_path, driver, monkeypatch):
    cap = _capacity(tmp_path, WITH_GPUS)
    plan = _plan(["device.name=cuda"], cap)
    window = autoscale.start_window(load_config(), plan)
    assert window.total_s == autoscale.AUTOSCALING_START_TIMEOUT_S == 1200
    # nothing waited yet: R / (CONTROLLER_FAILURE_LIMIT + 1) per worker-group start attempt
    assert window.attempt_timeout_s() == pytest.approx(1200 / 3, abs=1)
    window.started -= 1190  # our own wait used almost all of it: Train still gets its floor
    assert window.attempt_timeout_s() == autoscale.MIN_ATTEMPT_TIMEOUT_S
    set_by_hand = autoscale.start_window(load_config(None, ["scaling.start_timeout_s=90"]), plan)
    assert set_by_hand.total_s == 90 and set_by_hand.attempt_timeout_s() == pytest.approx(30, abs=1)
    # no autoscaler and no scaling.start_timeout_s: the user's own Ray knob stands
    local = plan_resources(load_config(None, ["device.name=cpu"]), {"CPU": 8.0})
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
    assert autoscale.start_window(load_config(), local).apply() == "300"
    assert autoscale.start_window(load_config(), local).attempt_timeout_s() == 300  # still theirs, run after run
    # an autoscaling plan's window replaces it for the fit it runs
    value = autoscale.start_window(load_config(), plan).apply()
    assert float(value) == pytest.approx(400, abs=1) and os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] == value


def test_bundles_up_count_first_fit_on_node_totals():
    bundles = [{"CPU": 1.75, "GPU": 1.0}] * 4 + [{"CPU": 0.5}]
    assert autoscale.placed(bundles, [{"CPU": 0.0}]) == 0
    assert autoscale.placed(bundles, [{"CPU": 0.0}, {"CPU": 8.0, "GPU": 4.0}]) == 5
    assert autoscale.placed(bundles, [{"CPU": 4.0, "GPU": 2.0}]) == 3


def test_gpu_preflight_problem_names_what_torch_sees():
    report = GpuWorkerReport(cuda_visible_devices="0", torch="2.13.0+cpu", torch_cuda=None, available=False,
                             devices=0, gpu_ids=["0"])
    assert gpu_worker_problem(report, "node 10.0.0.5") == (
        "node 10.0.0.5: Ray gave this worker GPU 0 (CUDA_VISIBLE_DEVICES=0) but torch 2.13.0+cpu there has no "
        "usable CUDA (torch.version.cuda=None, torch.cuda.is_available()=False); install a CUDA build of torch on "
        "the GPU nodes")
    assert gpu_worker_problem(replace(report, torch_cuda="12.8", available=True, devices=1), "n") is None


@pytest.mark.slow
def test_a_request_that_never_comes_times_out_in_one_line_and_is_cleared(ray_session, monkeypatch, capsys):
    """On the session's (non-autoscaling) Ray: an autoscaling plan whose bundles can never fit waits
    with progress lines, fails with StartTimeout naming what never came, and clears the request."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    monkeypatch.setattr(autoscale, "PROGRESS_INTERVAL_S", 0.5)
    plan = plan_resources(load_config(None, ["device.name=cpu", "scaling.cpus_per_worker=1000"]), COLD,
                          Capacity("unknown", "unknown node types (test)"))
    cfg = load_config(None, ["scaling.start_timeout_s=2"])
    with pytest.raises(autoscale.StartTimeout) as err:
        with autoscale.scale_up(cfg, plan, autoscale.run_bundles(plan)):
            pytest.fail("the body must not run when the workers never came")
    message = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in message
    assert "1 x {CPU: 1000} never came (1 of 2 bundles up)" in message and "scaling.start_timeout_s" in message
    out = capsys.readouterr().out
    assert "autoscaler: asked for 1 x {CPU: 1000} + 1 x {CPU: 0.5}; waiting up to 2s" in out
    assert "waiting for 1 x {CPU: 1000} + 1 x {CPU: 0.5}: 1 of 2 up, " in out
    assert json.loads(_internal_kv_get(ray_constants.AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == []


def test_prediction_actors_on_a_cold_gpu_cluster_get_cuda_not_cpu(tmp_path, driver):
    from alchemetric_ray.signals.predict import _actor_plan

    cap = _capacity(tmp_path, WITH_GPUS)
    assert _actor_plan(load_config(), 0.0, cap) == (4, 1.0, "cuda")  # one actor per GPU of a gpu_worker node
    assert _actor_plan(load_config(None, ["device.name=cpu"]), 0.0, cap) == (1, 0.0, "cpu")
    assert _actor_plan(load_config(), 0.0, _capacity(tmp_path, CPU_ONLY)) == (1, 0.0, "cpu")
    with pytest.raises(DeviceError, match="no node type in this cluster has a GPU"):
        _actor_plan(load_config(None, ["device.name=cuda"]), 0.0, _capacity(tmp_path, CPU_ONLY))


def test_a_mac_driver_plans_cuda_on_the_clusters_gpu_node_types(tmp_path, monkeypatch):
    """Ray advertises a Mac's Apple GPU as GPU: 1, so a local Mac plan never trusts Ray's GPUs; the
    GPUs of a launcher config's node types are a cloud's, so they stay CUDA."""
    from alchemetric_ray.hardware import device as dev

    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: True)
    plan = _plan(["device.name=cuda", "scaling.workers=2"], _capacity(tmp_path, WITH_GPUS))
    assert (plan.use_gpu, plan.worker_device, plan.node_type) == (True, "cuda", "gpu_worker")
