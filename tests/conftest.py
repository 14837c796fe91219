"""Test harness: one real local Ray per test session, with the dashboard (state API) up."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Each ray.train.report() waits up to this interval; the default 2 s dominates small tests.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A 2-core machine under load can take over a minute to start a worker group; Ray's default
# (60 s) then fails the run. Bounded all the same.
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
os.environ.pop("ALCHEMETRIC_DEVICE", None)

import pytest

REPO = Path(__file__).resolve().parents[1]
# Logical CPUs for the session's Ray: enough that Train workers (fractional CPUs), Tune trial
# drivers and Ray Data readers never wait on each other on this 2-core machine.
RAY_LOGICAL_CPUS = 8


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """Start Ray once for the whole session (about 4 s here) and always shut it down."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # Some tests start Ray heads and clusters of their own beside this one.  Ray's helpers inside
    # our actors (Train's placement-group cleaner) look the cluster up by RAY_API_SERVER_ADDRESS,
    # else by scanning the machine, which fails where two Rays run: the raylet that ray.init
    # starts hands this variable to every worker, so it is set while ray.init runs, then removed
    # (the test clusters that subprocesses start must not inherit it).
    temp_dir = tempfile.mkdtemp(prefix="ar-", dir="/tmp")
    dashboard_port = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
    try:
        ray.init(
            address="local",
            num_cpus=RAY_LOGICAL_CPUS,
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            log_to_driver=True,
            # Train/Tune loop functions defined in test modules are pickled by reference: the
            # workers must be able to import the test modules (and the package) too.
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}},
            # short: Ray's socket paths must stay under 108 bytes (pytest's temp folders are long)
            _temp_dir=temp_dir,
        )
    finally:
        os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def stocknet_dir(tmp_path_factory) -> Path:
    """The packaged stocknet prices written out as the source's per-ticker CSVs (byte for byte),
    once per session, for tests that read or edit files."""
    from alchemetric_ray.data.stocknet import write_csvs

    return write_csvs(tmp_path_factory.mktemp("stocknet"))

