"""A cold autoscaling Ray cluster on this machine, of the tests' own.

``cold_cluster(node_types)`` starts ``RAY_FAKE_CLUSTER=1 ray start --head --block --num-cpus=0
--autoscaling-config=CFG`` with its own free ports and its own short ``--temp-dir``: a head that
runs nothing, and an autoscaler whose provider (Ray's ``FakeMultiNodeProvider``) starts each
"node" as a set of Ray processes on this machine.  The workers scale from 0, so nothing runs until
the autoscaler adds a node.  CFG is written into the temp dir; the product learns the node types
from it through ``scaling.cluster_config=<CFG>`` (the launcher-YAML path a real head has at
``~/ray_bootstrap_config.yaml``).

Clean-up stops what the context started and nothing else: the head's process group (SIGTERM, 5 s,
then SIGKILL) and the fake nodes, which are not in that group but carry the head's temp dir in
their command line.  Never ``ray stop``: it ends every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

RAY_BIN = Path(sys.executable).parent / "ray"
PROVIDER_MODULE = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class FakeCluster:
    gcs_address: str  # 127.0.0.1:PORT
    dashboard: str  # http://127.0.0.1:PORT (ray job submit --address)
    temp_dir: str
    config_path: str  # the launcher YAML the autoscaler runs with
    head: subprocess.Popen
    env: dict[str, str]  # for CLI calls against this cluster (token auth on, no RAY_ADDRESS leak)

    def nodes(self) -> list[dict]:
        """The alive nodes: [{node_id, resources}], read from the GCS directly (no driver)."""
        return self._gcs("nodes")

    def resource_request(self) -> list[dict] | None:
        """The autoscaler's standing resource request (what ``request_resources`` last wrote for the
        v1 autoscaler: a list of bundles, ``[]`` once cleared), or None when nothing was ever asked."""
        return self._gcs("request")

    def _gcs(self, what: str):
        # in a child process: the client side of token authentication is read when Ray loads
        done = subprocess.run([sys.executable, "-c", _GCS_QUERY, self.gcs_address, what], env=self.env,
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"reading the fake cluster's GCS failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def pids(self) -> list[int]:
        """Processes of this cluster outside the head's group: those naming its temp dir."""
        return processes_naming(self.temp_dir)


_GCS_QUERY = """
import json, sys
from ray._private import ray_constants
from ray._raylet import GcsClient

client = GcsClient(address=sys.argv[1])
if sys.argv[2] == "nodes":
    out = [{"node_id": node_id.hex(), "resources": dict(info.resources_total)}
           for node_id, info in client.get_all_node_info(timeout=30).items() if info.state == 0]
else:
    raw = client.internal_kv_get(ray_constants.AUTOSCALER_RESOURCE_REQUEST_CHANNEL, namespace=None, timeout=30)
    out = None if raw is None else json.loads(raw)
print(json.dumps(out))
"""


def processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def launcher_config(gcs_port: int, worker_types: dict[str, dict], *, max_workers: int = 4,
                    idle_timeout_minutes: float = 5) -> dict:
    """A launcher YAML for the fake provider: a head of type ``ray.head.default`` with no CPUs,
    and ``worker_types`` ({name: {resources, min_workers, max_workers}})."""
    types = {"ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}}
    for name, spec in worker_types.items():
        types[name] = {"node_config": {}, "min_workers": 0, **spec}
    return {
        "cluster_name": "fake-cold",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {"type": "external", "module": PROVIDER_MODULE, "gcs_address": f"127.0.0.1:{gcs_port}",
                     "disable_launch_config_check": True, "disable_node_updaters": True,
                     "use_node_id_as_ip": True},
        "auth": {"ssh_user": "ray"},
        "docker": {},
        "head_node_type": "ray.head.default",
        "available_node_types": types,
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@contextlib.contextmanager
def cold_cluster(worker_types: dict[str, dict], *, max_workers: int = 4, ready_timeout_s: float = 180):
    """Start a cold autoscaling head (no CPUs, workers from 0) and stop exactly what it started."""
    gcs_port, dash = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="arf", dir="/tmp")  # short: Ray's socket paths stay under 108 bytes
    config_path = os.path.join(temp, "cluster.yaml")
    Path(config_path).write_text(yaml.safe_dump(launcher_config(gcs_port, worker_types, max_workers=max_workers)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    head = subprocess.Popen(
        [str(RAY_BIN), "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=0",
         f"--autoscaling-config={config_path}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
         f"--temp-dir={temp}", f"--ray-client-server-port={free_port()}",
         # the session's Ray already holds the default agent port (52365)
         f"--dashboard-agent-listen-port={free_port()}"],
        # the autoscaler looks at pending demand every second, not every 5 s: a scale-up starts sooner
        env={**env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster = FakeCluster(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash}", temp, config_path, head,
                          {**env, "RAY_AUTH_MODE": "token"})
    try:
        _wait_until_up(cluster, ready_timeout_s)
        yield cluster
    finally:
        stop(cluster)


def _wait_until_up(cluster: FakeCluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = subprocess.run([str(RAY_BIN), "job", "list", f"--address={cluster.dashboard}"], env=cluster.env,
                               capture_output=True, text=True, timeout=60)
        if ready.returncode == 0 and cluster.nodes():  # the dashboard answers before the head's raylet registers
            return
        if cluster.head.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the fake cluster's head did not come up: {ready.stderr[-1000:]}")
        time.sleep(2)


def stop(cluster: FakeCluster) -> None:
    """SIGTERM the head's process group, give it 5 s, SIGKILL it; then kill, by pid, every process
    still naming the cluster's temp dir (the fake nodes' raylets, workers and agents)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(cluster.head.pid, signal.SIGTERM)
    try:
        cluster.head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.head.pid, signal.SIGKILL)
        cluster.head.wait()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = cluster.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = cluster.pids()
        if not pids:
            break
    # a head group killed mid-way can leave its own children too (same temp dir: gone above)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
