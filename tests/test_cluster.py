"""Multi-node on one machine: a real second Ray node (``ray.cluster_utils.Cluster``) and a 2-worker
run whose workers land on different nodes; and the refusal of node-local storage there."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_workers_on_two_nodes_with_shared_storage(stocknet_dir, tmp_path):
    # its own cluster in its own process: the test session's Ray stays untouched
    script = textwrap.dedent(f"""
        import json, os
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.1"
        import ray
        from ray.cluster_utils import Cluster
        from alchemetric_ray.config import load_config
        from alchemetric_ray.errors import UserError
        from alchemetric_ray.train.trainer import run_training

        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 2}})
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        out = {{}}
        try:
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
            out["node_ids"] = res.summary["node_ids"]
            out["run_path"] = str(res.run_path)
            out["model_dir"] = str(res.model_dir)
        finally:
            ray.shutdown()
            cluster.shutdown()
        print("RESULT:" + json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT:"):])
    assert out["nodes"] == 2
    assert "is a local folder but the Ray cluster has 2 nodes" in out["refused"]
    assert len(out["node_ids"]) == 2 and out["node_ids"][0] != out["node_ids"][1]
    checkpoints = sorted(Path(out["run_path"]).glob("epoch-*/state.pt"))
    assert checkpoints and str(tmp_path / "nfs") in out["run_path"]
    assert (Path(out["model_dir"]) / "weights.pt").is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ray_job_submit_train_tune_and_a_failing_job(stocknet_dir, tmp_path):
    """A real head of its own (own ports and temp dir, token authentication on, dashboard on
    127.0.0.1), jobs submitted with the working dir, and only that head stopped afterwards."""
    import os
    import signal
    import tempfile
    import time


    ray_bin = Path(sys.executable).parent / "ray"
    dash = _free_port()
    temp = tempfile.mkdtemp(prefix="arj", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={_free_port()}",
                             f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--num-cpus=4",
                             f"--temp-dir={temp}", f"--ray-client-server-port={_free_port()}",
                             # the session's Ray already holds the default agent port (52365)
                             f"--dashboard-agent-listen-port={_free_port()}"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the client side of token authentication: the token file Ray keeps, never the token in the repo
    cli_env = {**env, "RAY_AUTH_MODE": "token"}
    address = f"http://127.0.0.1:{dash}"

    def submit(*entry):
        cmd = [str(ray_bin), "job", "submit", f"--address={address}", f"--working-dir={REPO}",
               "--runtime-env-json", json.dumps({"excludes": [".venv", ".git", "results", "models", "bench/results"]}),
               "--", sys.executable, *entry]
        for _ in range(30):  # the head's job agent starts a little after its dashboard answers
            done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=900)
            if "No available agent to submit job" not in done.stderr:
                break
            time.sleep(3)
        ansi = re.compile(r"\x1b\[[0-9;]*m")
        return done.returncode, ansi.sub("", done.stdout + done.stderr)

    try:
        for _ in range(90):
            ready = subprocess.run([str(ray_bin), "job", "list", f"--address={address}"], env=cli_env,
                                   capture_output=True, text=True, timeout=60)
            if ready.returncode == 0:
                break
            time.sleep(2)
        assert ready.returncode == 0, f"the test head did not come up: {ready.stderr[-1000:]}"
        common = [f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT,XOM",
                  f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                  "model.hidden=8", "train.epochs=1"]
        rc, out = submit("jobs/train.py", *common, "storage.name=job-train")
        assert rc == 0 and "succeeded" in out.lower(), out[-3000:]
        assert "saved model:" in out
        assert (tmp_path / "models" / "job-train" / "weights.pt").is_file()

        rc, out = submit("jobs/tune.py", *common, "storage.name=job-tune", "tune.search=grid",
                         "tune.space={train.lr: [0.01, 0.001]}", "tune.max_concurrent_trials=2",
                         "scaling.cpus_per_worker=1")  # both trials at once on the head's 4 CPUs
        assert rc == 0 and "succeeded" in out.lower(), out[-3000:]
        assert "2 configurations tried" in out
        assert (tmp_path / "models" / "job-tune" / "metrics.json").is_file()

        rc, out = submit("jobs/train.py", "train.lr=0")
        assert rc != 0 and "failed" in out.lower()
        assert "alchemetric-ray train: error: config 'train.lr': 0.0 is invalid, expected > 0" in out
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # this head's process group only: never `ray stop`
        try:
            # `ray start --block` exits within a second or two of its processes, or never: it waited
            # out a 30 s timeout on every run here, so it gets 5 s before the whole group is killed.
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


def test_job_entry_points_are_the_cli_commands():
    """What `ray job submit ... -- python jobs/<x>.py` runs: the CLI's own command, same flags."""
    for job, command, flag in (("train.py", "train", "--evaluate"), ("tune.py", "tune", "--resume")):
        done = subprocess.run([sys.executable, str(REPO / "jobs" / job), "--help"], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"usage: alchemetric-ray {command} ") and flag in done.stdout
        assert "section.key=value" in done.stdout
