"""Multi-node on one machine: real Ray nodes (``ray.cluster_utils.Cluster``), a 2-worker run whose
workers land on different nodes, the refusal of node-local storage there and a node lost mid-training; and jobs
submitted to a cold autoscaling head (tests/fake_cluster.py) that must add nodes for them."""

import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_workers_on_two_nodes_and_a_node_lost_mid_training(stocknet_dir, tmp_path):
    """One real 3-node cluster in its own process (a head with no CPUs, two 2-CPU nodes; the test
    session's Ray stays untouched), and four things against it, in order:

    1. the features as Ray tasks over small groups land on both nodes and equal a build in one process;
    2. node-local storage is refused on a multi-node cluster;
    3. a 2-worker run with shared storage puts its workers on different nodes;
    4. the node running a 1-worker run is removed after the first checkpoint: the run restarts on the
       other node and finishes from that checkpoint, within a bounded time (this was
       tests/test_faults.py's own cluster)."""
    script = textwrap.dedent(f"""
        import json, os, threading, time
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.1"
        import ray
        from ray.cluster_utils import Cluster
        from alchemetric_ray.config import load_config
        from alchemetric_ray.errors import UserError
        from alchemetric_ray.training.trainer import run_training

        # A node that stops answering is declared dead after 3 missed health checks 0.5 s apart (Ray's
        # default: 5 x 3 s), so that the test does not wait 15 s for Ray to notice the loss.
        cluster = Cluster(initialize_head=True, head_node_args={{
            "num_cpus": 0, "include_dashboard": False,
            "_system_config": {{"health_check_period_ms": 500, "health_check_timeout_ms": 1000,
                               "health_check_failure_threshold": 3}}}})
        nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        out = {{}}
        try:
            # 1. the features as Ray tasks over small groups (several per node), and in this process
            from alchemetric_ray.data.shards import build_shards
            feats = ["data.path={stocknet_dir}", "data.source=files", "features.group_rows=5000",
                     "features.label=cs_rank", "features.names=[ret_1, ret_5_rel, vol_20]",
                     "features.cs_normalize=rank"]
            out["features"] = build_shards(load_config(None, feats + ["features.distributed=true"]),
                                           "{tmp_path / 'features-ray'}").manifest.build
            build_shards(load_config(None, feats + ["features.distributed=false"]), "{tmp_path / 'features-here'}")
            # 2. and 3. two workers, one per node: local storage refused, then shared storage
            base = ["data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT",
                    "storage.path={tmp_path / 'nfs'}", "storage.models_dir={tmp_path / 'models'}",
                    "storage.name=multi", "train.epochs=2", "model.hidden=16", "scaling.workers=2",
                    "scaling.cpus_per_worker=1", "scaling.placement=STRICT_SPREAD", "device.name=cpu"]
            try:
                run_training(load_config(None, base), progress=False)
            except UserError as exc:
                out["refused"] = str(exc)
            res = run_training(load_config(None, base + ["storage.shared=true"]), progress=False)
            out["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
            out["cpu_nodes"] = len([n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")])
            out["node_ids"] = res.summary.node_ids
            out["run_path"] = str(res.run_path)
            out["model_dir"] = str(res.model_dir)

            # 4. a node lost mid-training
            cfg = load_config(None, ["data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT",
                                     "storage.path={tmp_path / 'nfs'}", "storage.shared=true",
                                     "storage.models_dir={tmp_path / 'models'}", "storage.name=lost",
                                     "storage.run=lost", "train.epochs=6", "train.patience=0", "model.name=lstm",
                                     "model.hidden=32", "train.batch_size=32", "scaling.workers=1",
                                     "scaling.cpus_per_worker=1", "scaling.max_failures=2",
                                     # a cluster joined by ray.init(address=...) is planned as a cluster, whose
                                     # node types are unknown here: the device is named, as on such a cluster
                                     "device.name=cpu"])
            result, error = [], []
            def go():
                try:
                    result.append(run_training(cfg, progress=False))
                except BaseException as exc:
                    error.append(f"{{type(exc).__name__}}: {{exc}}")
            runner = threading.Thread(target=go, daemon=True)
            runner.start()
            first = "{tmp_path / 'nfs' / 'lost' / 'epoch-0000' / 'meta.json'}"
            deadline = time.monotonic() + 600
            while not os.path.exists(first) and time.monotonic() < deadline and runner.is_alive():
                time.sleep(0.05)
            # the worker group's placement group says where the worker runs (this cluster has no dashboard)
            placed = [pg["bundles_to_node_id"][0] for pg in ray.util.placement_group_table().values()
                      if pg["state"] == "CREATED" and pg["bundles"][0].get("CPU", 0) >= 1]
            if not placed:
                raise RuntimeError(f"no worker group's placement group; the run: {{error or 'still running'}}")
            lost = [n for n in nodes if n.node_id == placed[-1]][0]
            out["lost_node"] = lost.node_id
            cluster.remove_node(lost, allow_graceful=False)
            removed_at = time.monotonic()
            runner.join(600)
            out["seconds_after_loss"] = time.monotonic() - removed_at
            out["finished"] = not runner.is_alive()
            out["error"] = error[0] if error else None
            if result:
                out["epochs_run"] = result[0].summary.epochs_run
                out["lost_run_node_ids"] = result[0].summary.node_ids
                out["lost_model_dir"] = str(result[0].model_dir)
        finally:
            ray.shutdown()
            cluster.shutdown()
        print("RESULT:" + json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1500, cwd=REPO,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT:"):])
    assert out["nodes"] == 3 and out["cpu_nodes"] == 2, out
    # 1. the features: tasks on both nodes, the same shards as a build in one process
    assert out["features"]["mode"] == "ray" and out["features"]["nodes"] == 2, out["features"]
    assert out["features"]["groups"] > 4
    for split in ("train", "val", "test"):
        here, there = (pd.read_parquet(tmp_path / f"features-{where}" / f"split={split}") for where in ("here", "ray"))
        pd.testing.assert_frame_equal(there, here, check_exact=True)
    # 2. and 3.
    assert "is a local folder but the Ray cluster has 3 nodes" in out["refused"]
    assert len(out["node_ids"]) == 2 and out["node_ids"][0] != out["node_ids"][1]
    checkpoints = sorted(Path(out["run_path"]).glob("epoch-*/state.pt"))
    assert checkpoints and str(tmp_path / "nfs") in out["run_path"]
    assert (Path(out["model_dir"]) / "weights.pt").is_file()
    # 4. the node lost
    assert out["finished"], "the run neither recovered nor failed within 10 minutes of losing a node"
    assert out["error"] is None, out["error"]
    assert out["epochs_run"] == 6
    assert out["lost_node"] not in out["lost_run_node_ids"]  # the resumed session ran on the remaining node
    print(f"recovered and finished {out['seconds_after_loss']:.1f} s after the node was lost")
    assert (Path(out["lost_model_dir"]) / "weights.pt").is_file()


# ---- ray job submit against a cold autoscaling head (tests/fake_cluster.py) ------------------

# The node types of the cold clusters: a head with no CPUs (fake_cluster.py) and a CPU type large
# enough for the train job and two tune trials at once; the GPU test's cluster has a GPU type whose
# GPU is fake (this machine has none, and its torch is a CPU build: the preflight must stop a CUDA
# run there).  Two clusters, not one with both types: the fake nodes share this machine's disk, and
# a node that joins while a job runs unpacks the job's working_dir over the same folder (Ray
# overwrites it on a node's first use), deleting the cwd of the job's driver on the head; with one
# CPU type at its maximum, no node joins during the tune job.
NODE_TYPES = {"cpu_worker": {"resources": {"CPU": 4}, "max_workers": 1}}
GPU_NODE_TYPES = {"gpu_worker": {"resources": {"CPU": 2, "GPU": 1}, "max_workers": 1}}
RUN_ARGS = ["model.hidden=8", "train.epochs=1"]
TICKERS = "AAPL,MSFT,XOM"


def storage_args(bucket: str) -> list[str]:
    """Runs and models on the test session's S3 server (conftest.py), as on a real cluster: the fake
    nodes reach it through the AWS variables they inherit, like a node's instance role."""
    return [f"storage.path={bucket}/runs", f"storage.models_dir={bucket}/models"]


def shards_on(s3, bucket_name: str, stocknet_dir) -> str:
    """Feature shards built here and put on the bucket (`alchemetric-ray features --out s3://...`)."""
    from alchemetric_ray.cli import main

    bucket = s3.bucket(bucket_name)
    assert main(["features", "--data", str(stocknet_dir), "--out", f"{bucket}/shards", "--quiet",
                 f"data.tickers={TICKERS}", "features.group_rows=1000"]) == 0  # a group per ticker
    return bucket


@pytest.fixture(scope="module")
def cold_head():
    """One cold autoscaling head for this module's job tests (about 5 s to start, stopped alone)."""
    from fake_cluster import cold_cluster

    with cold_cluster(NODE_TYPES, max_workers=1) as cluster:
        yield cluster


def _submit(cluster, *entry) -> tuple[int, str]:
    import time

    # excludes anchored at the repository's root: an unanchored "models" also left alchemetric_ray/models
    # out of the uploaded package (the job then imported that room from wherever else it was installed)
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", f"--address={cluster.dashboard}",
           f"--working-dir={REPO}",
           "--runtime-env-json", json.dumps({"excludes": ["/.venv", "/.git", "/results", "/models", "/bench/results"]}),
           "--", sys.executable, *entry]
    for _ in range(30):  # the head's job agent starts a little after its dashboard answers
        done = subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=900)
        if "No available agent to submit job" not in done.stderr:
            break
        time.sleep(3)
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    return done.returncode, ansi.sub("", done.stdout + done.stderr)


def _cleared(cluster, ours: dict) -> None:
    """The run asked (the request key exists) and its request is gone.  The v1 autoscaler keeps one
    standing request per cluster, which Ray Data's autoscaling coordinator rewrites with its own
    requests (they expire after 180 s), so the check is that none of OUR bundles stands."""
    standing = cluster.resource_request()
    assert standing is not None, "no resource request was ever made on this cluster"
    assert ours not in standing, standing


@pytest.mark.slow
def test_ray_job_submit_train_tune_and_a_failing_job(cold_head, s3, stocknet_dir, tmp_path):
    """Jobs submitted with the working dir to a COLD autoscaling head of the test's own (no CPUs on
    the head, workers from 0; own ports and temp dir, token authentication on, dashboard on
    127.0.0.1), with shards, runs and models on object storage (the session's S3 server): the plan
    is made against the node types of the launcher YAML, the autoscaler adds a node for the run,
    the model and the sweep's report land in the bucket, and the run's resource request is cleared."""
    assert len(cold_head.nodes()) == 1 and cold_head.resource_request() is None  # cold: the head alone
    bucket = shards_on(s3, "ar-jobs", stocknet_dir)
    data = ["--data", f"{bucket}/shards"]  # flags first, then key=value overrides
    common = [*RUN_ARGS, *storage_args(bucket), "device.name=cpu", f"scaling.cluster_config={cold_head.config_path}"]
    rc, out = _submit(cold_head, "jobs/train.py", *data, *common, "storage.name=job-train")
    assert rc == 0 and "succeeded" in out.lower(), out[-3000:]
    assert "saved model: s3://ar-jobs/models/job-train" in out
    assert {"models/job-train/weights.pt", "models/job-train/meta.json"} <= set(s3.keys("ar-jobs", "models/"))
    # planned on the node types, not on the cold cluster's 0 CPUs; the autoscaler added the node
    assert "node type        cpu_worker {CPU: 4} x 1 (of at most 1" in out, out[-3000:]
    assert "autoscaler: asked for 1 x {CPU: 3} (node type cpu_worker)" in out
    nodes = cold_head.nodes()
    assert len(nodes) == 2 and any(n["resources"].get("CPU") == 4 for n in nodes), nodes
    _cleared(cold_head, {"CPU": 3.0})

    # the features as a job, as Ray tasks on the node the autoscaler added: the shards built here
    rc, out = _submit(cold_head, "-m", "alchemetric_ray.cli", "features", "--data", str(stocknet_dir), "--out",
                      f"{bucket}/shards-ray", "--quiet", f"data.tickers={TICKERS}", "features.group_rows=1000",
                      "features.distributed=true")
    assert rc == 0 and "succeeded" in out.lower(), out[-3000:]
    built = {name: json.loads(s3.read("ar-jobs", f"{name}/manifest.json")) for name in ("shards", "shards-ray")}
    assert built["shards-ray"]["build"]["mode"] == "ray" and built["shards-ray"]["build"]["groups"] == 3
    assert built["shards-ray"]["build"]["tasks"] >= 3
    for split in built["shards"]["files"]:
        here, there = (pd.concat([pd.read_parquet(io.BytesIO(s3.read("ar-jobs", f"{name}/{file}")))
                                  for file in built[name]["files"][split]]) for name in ("shards", "shards-ray"))
        pd.testing.assert_frame_equal(there, here, check_exact=True)

    rc, out = _submit(cold_head, "jobs/tune.py", *data, *common, "storage.name=job-tune", "tune.search=grid",
                      "tune.space={train.lr: [0.01, 0.001]}", "tune.max_concurrent_trials=2",
                      "scaling.cpus_per_worker=1.5")  # both trials at once on the cpu_worker's 4 CPUs
    assert rc == 0 and "succeeded" in out.lower(), out[-3000:]
    assert "2 configurations tried" in out
    assert "models/job-tune/metrics.json" in s3.keys("ar-jobs", "models/")  # the best trial, exported
    keys = s3.keys("ar-jobs", "runs/sweep-job-tune-")  # the sweep, its trials' checkpoints inside it
    summaries = [k for k in keys if k.endswith("/sweep_summary.json")]
    assert len(summaries) == 1 and summaries[0].replace("sweep_summary.json", "report/index.html") in keys, keys
    # each one-worker trial runs its loop in its own process, holding the worker's CPUs (no driver's
    # share); 1.5 CPUs, a bundle Ray Data's own requests never hold
    assert "autoscaler: asked for 2 x {CPU: 1.5} (node type cpu_worker)" in out
    assert any("/checkpoint_" in k and k.endswith("/meta.json") for k in keys), keys
    assert "Checkpoint successfully created" not in out  # Tune's line per checkpoint: only with --verbose
    _cleared(cold_head, {"CPU": 1.5})

    # a failing job: a local storage.path reaches neither the nodes that are up nor those the
    # autoscaler adds; the job fails with our one line
    rc, out = _submit(cold_head, "jobs/train.py", *data, *RUN_ARGS, f"storage.path={tmp_path / 'results'}",
                      f"scaling.cluster_config={cold_head.config_path}", "device.name=cpu")
    error = f"alchemetric-ray train: error: config 'storage.path': {tmp_path / 'results'} is a local folder but "
    assert rc != 0 and "failed" in out.lower() and error in out and "set storage.shared=true" in out, out[-3000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_default_jobs_on_a_gpu_cluster_plan_cuda_and_stop_at_the_gpu_preflight(s3, stocknet_dir, stock_model,
                                                                                  tmp_path):
    """jobs/train.py, jobs/tune.py and jobs/predict.py submitted with NO device to a cold cluster whose
    only worker type advertises a GPU: each plans CUDA on that type, the autoscaler starts the
    (fake-GPU) node, and the GPU preflight stops the job with our one line (exit 2), because this
    torch has no CUDA: the proof that no default job trains or predicts on that node's CPU in
    silence.  The resource request is cleared on this failure too.  Where the node types cannot be
    learnt, the default job is refused before anything starts."""
    from fake_cluster import cold_cluster

    with cold_cluster(GPU_NODE_TYPES, max_workers=1) as gpu_head:
        bucket = shards_on(s3, "ar-gpu", stocknet_dir)
        # first, while the cluster is cold: node types unknown (no launcher config where
        # scaling.cluster_config points) and no GPU up, so auto is refused rather than planned on the CPU
        rc, out = _submit(gpu_head, "jobs/train.py", "--data", f"{bucket}/shards", *RUN_ARGS, *storage_args(bucket),
                          f"scaling.cluster_config={tmp_path / 'none.yaml'}")
        error = {ln for ln in out.splitlines() if ln.startswith("alchemetric-ray train: error: device auto on a Ray "
                                                                  "cluster with unknown node types and no GPU up")}
        assert rc != 0 and len(error) == 1 and "--device cuda (with --workers N" in error.pop(), out[-3000:]
        assert len(gpu_head.nodes()) == 1  # nothing was asked for
        types = f"scaling.cluster_config={gpu_head.config_path}"
        common = [*RUN_ARGS, *storage_args(bucket), types]
        jobs = {
            "train": ["jobs/train.py", "--data", f"{bucket}/shards", *common, "storage.name=job-gpu"],
            "tune": ["jobs/tune.py", "--data", f"{bucket}/shards", *common, "storage.name=job-gpu-tune",
                     "tune.search=grid", "tune.space={train.lr: [0.01, 0.001]}"],
            "predict": ["jobs/predict.py", "--model", str(stock_model), "--data", str(stocknet_dir),
                        "--out", str(tmp_path / "signals.parquet"), types],
        }
        for command, entry in jobs.items():
            rc, out = _submit(gpu_head, *entry)
            assert rc != 0 and "exit code 2" in out, (command, out[-3000:])
            if command != "predict":  # predict prints no plan: its actors' GPUs are the preflight's
                assert "node type        gpu_worker {CPU: 2, GPU: 1} x 1 (of at most 1" in out, out[-3000:]
                assert "use_gpu          True  (1 GPU(s) on the cluster's node types" in out, out[-3000:]
            assert "GPU preflight: 1 task(s) with 1 GPU each" in out, (command, out[-3000:])
            if command == "tune":  # one-GPU trials: one at a time on the one node's one GPU
                assert "up to 1 trial(s) at once" in out and "autoscaler: asked for 1 x {GPU: 1, CPU: 1}" in out
            # one error line (`ray job submit` shows the driver's output, then repeats its last line)
            errors = {ln for ln in out.splitlines() if ln.startswith(f"alchemetric-ray {command}: error: node ")}
            assert len(errors) == 1, (command, out[-3000:])
            error = errors.pop()
            assert "Ray gave this worker GPU 0 (CUDA_VISIBLE_DEVICES=0) but torch " in error
            assert "torch.version.cuda=None, torch.cuda.is_available()=False); install a CUDA build of torch" in error
        assert any(n["resources"].get("GPU") == 1 for n in gpu_head.nodes())  # the autoscaler started it
        _cleared(gpu_head, {"CPU": 1.0, "GPU": 1.0})  # cleared on the failure path too
        assert s3.keys("ar-gpu", "models/") == [] and s3.keys("ar-gpu", "runs/") == []  # nothing written
        assert not (tmp_path / "signals.parquet").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args, named", [
    (["--device", "cuda"], "asked for device 'cuda' but no node type in this cluster has a GPU"),
    (["device.name=cpu", "scaling.workers=2", "scaling.cpus_per_worker=4"],
     "config 'scaling.workers': 2 worker(s) x {CPU: 4}"),
], ids=["cuda-without-a-gpu-node-type", "more-workers-than-nodes"])
def test_what_no_node_type_can_hold_is_refused_before_anything_starts(cold_head, stocknet_dir, tmp_path, args, named):
    """A job driver on the cold cluster (RAY_ADDRESS) whose request the node types can never hold:
    one line, exit code 2, no node asked for and nothing written (the v1 autoscaler would wait forever)."""
    config = cold_head.config_path  # its one worker type: cpu_worker {CPU: 4}, at most 1 node
    done = subprocess.run([sys.executable, "jobs/train.py", *args, f"data.path={stocknet_dir}", "data.source=files",
                           f"data.tickers={TICKERS}", f"storage.path={tmp_path / 'results'}", "storage.shared=true",
                           f"storage.models_dir={tmp_path / 'models'}", f"scaling.cluster_config={config}"],
                          env={**cold_head.env, "RAY_ADDRESS": cold_head.gcs_address}, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("alchemetric-ray train: error: ")]
    assert done.returncode == 2 and len(errors) == 1 and named in errors[0], done.stderr[-3000:]
    assert "cpu_worker" in errors[0] and f"launcher config {config}" in errors[0]  # the types, and where from
    assert not (tmp_path / "results").exists() and not (tmp_path / "models").exists()
    asked = cold_head.resource_request() or []  # Ray Data's own {CPU: 1} requests may stand there
    assert not any(b.get("GPU") or b.get("CPU", 0) >= 4 for b in asked), asked  # nothing of this run


def test_job_entry_points_are_the_cli_commands():
    """What `ray job submit ... -- python jobs/<x>.py` runs: the CLI's own command, same flags."""
    for job, command, flag in (("train.py", "train", "--evaluate"), ("tune.py", "tune", "--resume")):
        done = subprocess.run([sys.executable, str(REPO / "jobs" / job), "--help"], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"usage: alchemetric-ray {command} ") and flag in done.stdout
        assert "section.key=value" in done.stdout
