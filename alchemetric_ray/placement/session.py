"""The Ray session a command runs in: Ray itself, the workers' environment, and the run storage.

``train``, ``tune`` and ``predict`` all start here: :func:`ensure_ray` joins the cluster a job runs
in or starts a local Ray; :func:`worker_env` is what every Ray worker needs before torch loads;
:func:`storage_location`, :func:`train_storage`, :func:`check_storage_access`,
:func:`check_storage_reaches_every_node` and :func:`run_name` say where a run keeps its checkpoints
(a local folder or object storage, ``storage.py``) and under what name.

It sits in the ``train`` layer, not at the bottom: it reads the machine's CPU count from
``hardware`` and sets Ray Train's own knobs (health-check interval, worker-group timeout), and
every command that needs it (train, tune, signals) is at or above ``train``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from alchemetric_ray import console, interrupts
from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import RayAddressError, StorageError, UserError
from alchemetric_ray.fsutil import is_uri, safe_child
from alchemetric_ray.outputs import check_writable
from alchemetric_ray.storage import S3_SETTINGS, Location, locate, preflight

# Each ray.train.report() waits up to this interval (Ray's default is 2 s): a deliberate,
# small value keeps the per-epoch overhead low without busy-polling the workers.
HEALTH_CHECK_INTERVAL_S = "0.25"
# Ray Train's per-attempt worker-group start timeout until a run sets its own from
# scaling.start_timeout_s (placement/autoscale.py: StartWindow); the value every Ray worker starts with.
WORKER_GROUP_START_TIMEOUT_S = "120"
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
_written_start_timeouts: set[str] = set()  # values of START_TIMEOUT_ENV this process set itself
# Where Ray's State API looks first for the dashboard it asks (ray/dashboard/utils.py:
# get_address_for_submission_client; then RAY_ADDRESS, then a scan of the machine's GCS processes,
# which fails with "Found multiple active Ray instances" wherever several Rays run). A URL: an
# address without "://" would be taken for a GCS address.
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
# what a local Ray of ours sets in this process for as long as it lives (the API puts it back around each call)
SESSION_ENV = (API_SERVER_ENV, START_TIMEOUT_ENV, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
_written_api_servers: set[str] = set()  # values of API_SERVER_ENV this process set itself


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Environment every Ray worker needs before torch loads."""
    env = {
        "PYTORCH_ENABLE_MPS_FALLBACK": "1" if cfg.device.mps_fallback == "warn" else "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
                                                            HEALTH_CHECK_INTERVAL_S),
    }
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):  # where the token lives, never the token itself
        env["RAY_AUTH_TOKEN_PATH"] = os.environ["RAY_AUTH_TOKEN_PATH"]
    # where object storage is (endpoint, region): addresses, never credentials, which every node
    # resolves from its own AWS chain
    env.update({name: os.environ[name] for name in S3_SETTINGS if os.environ.get(name)})
    if console.verbose():
        env[console.VERBOSE_ENV] = "1"
    return env


def ensure_ray(cfg: RunConfig) -> None:
    """Join the cluster this process runs in (``ray job submit`` sets RAY_ADDRESS), else start a local Ray."""
    import ray

    if ray.is_initialized():  # started by the caller (a notebook's ray.init()): quiet as our own, lines plain
        console.quiet_ray_logger()
        console.quiet_driver()
        return
    if os.environ.get(API_SERVER_ENV) in _written_api_servers:  # an earlier local Ray of ours, gone now
        del os.environ[API_SERVER_ENV]
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", HEALTH_CHECK_INTERVAL_S)
    if START_TIMEOUT_ENV not in os.environ:
        set_worker_group_start_timeout(WORKER_GROUP_START_TIMEOUT_S)
    env = {**worker_env(cfg), START_TIMEOUT_ENV: os.environ[START_TIMEOUT_ENV]}
    # every process of this job (Train's controller and workers, trials, readers): no traceback when Ray stops it
    # with a SIGTERM that lands in a finalizer (console.quiet_stop_in_finalizer)
    runtime_env = {"env_vars": env, "worker_process_setup_hook": "alchemetric_ray.console.quiet_stop_in_finalizer"}
    console.quiet_ray_logger()
    quiet: dict[str, Any] = {"logging_level": logging.INFO if console.verbose() else logging.WARNING,
                             "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address(os.environ["RAY_ADDRESS"])  # one line within seconds, not Ray's retries for minutes
        # Ray's own helpers in our actors (Train's placement-group cleaner) find the cluster through
        # RAY_ADDRESS too; without it they fail wherever several Ray instances share a machine.
        env["RAY_ADDRESS"] = os.environ["RAY_ADDRESS"]
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env, **quiet)
    else:
        # Ray's helpers in our actors (Train's placement-group cleaner asks the State API whether
        # the controller lives) must find this Ray, not scan the machine for one: its dashboard on
        # a port chosen here, named to every worker and to this process's own State API calls.
        # Not RAY_ADDRESS in this process: that says a cluster was joined (placement/capacity.py).
        port = reserve_local_port()
        env[API_SERVER_ENV] = f"http://127.0.0.1:{port}"
        # address="local": always a new Ray of our own, never one a `ray start` on this machine left running
        try:
            # in a kernel, its interrupt (SIGINT to the process group) must not end this Ray's processes
            with interrupts.spared_by_kernel_interrupts():
                ray.init(address="local", num_cpus=local_ray_cpus(), include_dashboard=True,
                         dashboard_host="127.0.0.1", dashboard_port=port, runtime_env=runtime_env, **quiet)
        except BaseException:  # a Ctrl-C or SIGTERM while Ray starts: none of its processes outlives this one
            _end_partial_start()
            raise
        _written_api_servers.add(env[API_SERVER_ENV])
        os.environ[API_SERVER_ENV] = env[API_SERVER_ENV]
        _ends_with_the_kernel()
    interrupts.reroute_after_ray()  # ray.init replaced SIGTERM's handler: a stop signal is a Ctrl-C again
    console.quiet_driver()
    logs = console.session_logs()
    if logs:
        print(f"ray: session logs in {logs}", flush=True)


def _ends_with_the_kernel() -> None:
    """In a Jupyter kernel, the local Ray started here shuts down first when the kernel is shut down or
    restarted: ipykernel's shutdown signals the kernel's child processes and waits until none is left,
    but Ray's own children (its GCS and raylet) stay as zombies until ``ray.shutdown()`` reaps them, so
    the kernel took 29 s (its whole SIGTERM-then-SIGKILL schedule) to exit, and Jupyter's server, which
    waits 5 s, killed it instead.  Done once per kernel: the hook finds whichever Ray is up then."""
    from alchemetric_ray.console import in_notebook

    if not in_notebook():
        return
    import IPython

    kernel = getattr(IPython.get_ipython(), "kernel", None)
    if kernel is None or getattr(kernel, "_alchemetric_ray_ends_first", False):
        return
    shut_down = kernel.do_shutdown

    def do_shutdown(restart: bool):
        import ray

        if ray.is_initialized():
            ray.shutdown()
        return shut_down(restart)

    kernel.do_shutdown = do_shutdown
    kernel._alchemetric_ray_ends_first = True


def local_ray_cpus() -> int:
    """The CPUs a local Ray of ours advertises: logical CPUs above the physical count let Train
    workers and Ray Data readers coexist on a small laptop without waiting on each other (the plan
    still keeps one free for Ray Data)."""
    from alchemetric_ray.hardware.inventory import cpu_count

    return max(4, cpu_count())


def machine_resources() -> dict[str, float]:
    """What a local Ray of ours would advertise (its CPUs, this machine's CUDA GPUs), read without
    starting one: the resources a run on this machine is planned with before it knows whether it
    needs Ray at all."""
    from alchemetric_ray.hardware.device import cuda_count

    return {"CPU": float(local_ray_cpus()), "GPU": float(cuda_count())}


RAY_HEAD_PROBE_S = 5.0  # how long a head named by RAY_ADDRESS has to accept a connection


def check_ray_address(address: str) -> None:
    """Refuse, in one line, a ``RAY_ADDRESS`` that cannot be joined: the dashboard's ``http://`` address
    (the one ``ray job submit`` takes) or a head whose port does not accept a connection within
    :data:`RAY_HEAD_PROBE_S` (``ray.init`` would retry for minutes).  ``auto``, ``local`` and
    ``ray://`` (Ray Client) addresses are Ray's to resolve."""
    import socket
    from urllib.parse import urlsplit

    if address in ("auto", "local") or address.startswith("ray://"):
        return
    if address.startswith(("http://", "https://")):
        raise RayAddressError(f"RAY_ADDRESS={address} is a Ray dashboard's address, the one `ray job submit` "
                              "takes: unset RAY_ADDRESS for a local run (e.g. env -u RAY_ADDRESS ...), or submit "
                              f"this command with: ray job submit --address {address} -- alchemetric-ray ...")
    parts = urlsplit(f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise RayAddressError(f"RAY_ADDRESS={address} is not a Ray head's HOST:PORT (e.g. 10.0.0.5:6379); unset it "
                              "for a local run")
    try:
        socket.create_connection((host, port), timeout=RAY_HEAD_PROBE_S).close()
    except OSError as exc:
        raise RayAddressError(f"RAY_ADDRESS={address}: no Ray head answers there ({exc.strerror or exc}); start that "
                              "head or check the address, or unset RAY_ADDRESS for a local run") from None


def _end_partial_start() -> None:
    """After a ``ray.init`` that did not finish: shut down what it registered, then end the processes it
    started before it could register them (children of this process, and theirs)."""
    import signal
    import subprocess

    import ray

    try:
        ray.shutdown()
    except Exception:
        pass
    found, todo = [], [os.getpid()]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout
        children = [int(pid) for pid in out.split()]
        found += children
        todo += children
    for pid in reversed(found):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def reserve_local_port() -> int:
    """A free TCP port on 127.0.0.1 that stays free for a while: it is left in TIME_WAIT, where no
    other process's free-port pick (another run's Ray starting beside this one, or this Ray's
    own GCS and raylet ports) gets it, while a server that binds it by number with SO_REUSEADDR
    (Ray's port check and its dashboard both do) still can."""
    import socket

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        address = server.getsockname()
        with socket.socket() as client:
            client.connect(address)
            accepted, _ = server.accept()
            accepted.close()  # the accepted side closes first: the port's end goes to TIME_WAIT
    return address[1]


def set_worker_group_start_timeout(value: str) -> None:
    """Ray Train's per-attempt worker-group start timeout for the next ``fit()`` in this process
    (Train hands the driver's value to its controller)."""
    _written_start_timeouts.add(value)
    os.environ[START_TIMEOUT_ENV] = value


def user_worker_group_start_timeout() -> float | None:
    """RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S as the user set it, or None (unset, or set by us)."""
    value = os.environ.get(START_TIMEOUT_ENV)
    if value is None or value in _written_start_timeouts:
        return None
    try:
        return float(value)
    except ValueError:
        raise UserError(f"environment variable {START_TIMEOUT_ENV}={value!r} is not a number of seconds") from None


def check_storage_reaches_every_node(cfg: RunConfig) -> None:
    """Checkpoints must be on storage every node sees: refuse a plain local path on a multi-node
    cluster unless the user says it is a shared mount (storage.shared=true)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and not is_uri(cfg.storage.path) and not cfg.storage.shared:
        raise StorageError(f"config 'storage.path': {cfg.storage.path} is a local folder but the Ray cluster has "
                           f"{len(nodes)} nodes; use storage every node sees (s3://..., gs://...) or, for an NFS/EFS "
                           "mount at the same path on every node, set storage.shared=true")


def storage_location(cfg: RunConfig) -> Location:
    """``storage.path``: where Ray Train and Tune keep runs, and where shards are built when needed."""
    return locate(cfg.storage.path)


def train_storage(cfg: RunConfig) -> dict:
    """``storage_path`` and ``storage_filesystem`` for Ray Train's and Tune's ``RunConfig``: a local
    folder as an absolute path; object storage as a path on this process's one file system."""
    where = storage_location(cfg)
    if where.is_local:
        return {"storage_path": str(where.local), "storage_filesystem": None}
    return {"storage_path": where.path, "storage_filesystem": where.filesystem}


def check_storage_access(cfg: RunConfig, *, export: bool = True) -> None:
    """Before any work (and before Ray starts): every object-storage location the run will use has
    credentials, an endpoint that answers and a bucket (``storage.preflight``), and a local
    ``storage.path`` can be written (not a read-only file system); one line otherwise."""
    places = [cfg.storage.path, *([cfg.storage.models_dir] if export else []),
              *([cfg.data.path] if cfg.data.path and is_uri(cfg.data.path) else [])]
    for place in places:
        preflight(locate(place))
    check_writable(cfg.storage.path, "config 'storage.path':", inside=True)


def run_name(cfg: RunConfig, *, sweep: bool = False) -> str:
    """The name of a Train run or, with ``sweep``, a Tune sweep: storage.run as given; with
    storage.resume, the latest run (sweep) of this name; else a fresh one with the time in it.

    A sweep's names start with ``sweep-`` so that runs and sweeps of one name never mix."""
    base = ("sweep-" if sweep else "") + safe_child(".", cfg.storage.name, "storage.name").name
    if cfg.storage.run:
        return safe_child(".", cfg.storage.run, "storage.run").name
    if cfg.storage.resume:
        earlier = storage_location(cfg).listing(f"{base}-*", folders=True)
        if not earlier:
            raise StorageError(f"--resume (storage.resume=true): no earlier {'sweep' if sweep else 'run'} named "
                               f"{base}-* in {cfg.storage.path}")
        return earlier[-1]
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}"
