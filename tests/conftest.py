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


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Object storage for the tests: a real S3-compatible server (moto's standalone HTTP server) on
# 127.0.0.1, reached the way every AWS SDK reaches an endpoint: AWS_ENDPOINT_URL plus credentials
# from the environment.  Set before the session's Ray starts, so that its workers resolve the same
# chain (as every node of a cluster does from its instance or pod role); the developer's own
# ~/.aws files are kept out.  The server itself starts only for the tests that use it (``s3``).
S3_PORT = free_port()
S3_SECRET = "alchemetric-test-secret-never-in-outputs"
os.environ.update({
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{S3_PORT}",
    "AWS_ACCESS_KEY_ID": "alchemetric-test-key",
    "AWS_SECRET_ACCESS_KEY": S3_SECRET,
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": str(REPO / "tests" / ".no-aws-config"),
    "AWS_SHARED_CREDENTIALS_FILE": str(REPO / "tests" / ".no-aws-credentials"),
})
for _name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
    os.environ.pop(_name, None)
# Logical CPUs for the session's Ray: enough that Train workers (fractional CPUs), Tune trial
# drivers and Ray Data readers never wait on each other on this 2-core machine.
RAY_LOGICAL_CPUS = 8
TEST_MODEL_MODULES = ("tiny_model", "fault_model", "unsupported_model")  # ``model.module=`` files in tests/


@pytest.fixture(autouse=True)
def model_registry():
    """The model registry as it was before each test: the models a test's ``model.module`` (or the
    test itself) registers are dropped after it, so that no other test sees them in ``known: ...``."""
    import sys

    from alchemetric_ray.models import MODELS

    before = dict(MODELS)
    yield MODELS
    MODELS.clear()
    MODELS.update(before)
    for name in TEST_MODEL_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The folders ``artifacts.export.load_model`` (a ``torch.load`` and a model build, on object storage
    a whole download) is called with in this process while the test runs, in order."""
    from alchemetric_ray.artifacts import export

    seen: list[str] = []
    real = export.load_model

    def counting(path):
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(export, "load_model", counting)
    return seen


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
    from alchemetric_ray.bars.stocknet import write_csvs

    return write_csvs(tmp_path_factory.mktemp("stocknet"))


@pytest.fixture(scope="session")
def stocknet_shards(stocknet_dir, tmp_path_factory):
    """``stocknet_shards("AAPL,MSFT", "features.window=8")``: feature shards of some packaged tickers
    (read from their CSVs), built once per session for each distinct set of tickers and overrides."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.shards import build_shards

    built: dict[tuple, Path] = {}

    def shards(tickers: str, *overrides: str) -> Path:
        key = (tickers, *overrides)
        if key not in built:
            cfg = load_config(None, [f"data.path={stocknet_dir}", "data.source=files", f"data.tickers={tickers}",
                                     *overrides])
            built[key] = build_shards(cfg, tmp_path_factory.mktemp("shards") / "shards").out
        return built[key]

    return shards


STOCK_MODEL_TICKERS = ("AAPL", "MSFT", "XOM")


@pytest.fixture(scope="session")
def stock_model(ray_session, stocknet_dir, tmp_path_factory) -> Path:
    """A small MLP trained once per session on three stocknet tickers (STOCK_MODEL_TICKERS), for
    every test that needs *a* saved model (predict, evaluate, the doctor's certificate, bad input,
    an interrupted replace): such a test reads it, or works on a copy of it, and never changes it, but
    for the looks that `evaluate` records in its ``looks/`` (a test that counts looks works on a copy)."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.training.trainer import run_training

    root = tmp_path_factory.mktemp("stock-model")
    cfg = load_config(None, [f"data.path={stocknet_dir}", "data.source=files",
                             f"data.tickers={','.join(STOCK_MODEL_TICKERS)}", f"storage.path={root / 'results'}",
                             f"storage.models_dir={root / 'models'}", "storage.name=stock", "train.epochs=2",
                             "model.hidden=16", "device.name=cpu"])
    return run_training(cfg, progress=False).model_dir



class S3Server:
    """The tests' S3 server: its endpoint, and buckets made on it with boto3 (the test's own client)."""

    def __init__(self, endpoint: str):
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint)

    def bucket(self, name: str) -> str:
        """A new empty bucket; returns its s3:// URI."""
        self.client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture(scope="session")
def s3() -> S3Server:
    """A real S3-compatible server (moto) on 127.0.0.1:S3_PORT for the whole session."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=S3_PORT, verbose=False)
    server.start()
    try:
        yield S3Server(os.environ["AWS_ENDPOINT_URL"])
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real ``mlflow server`` on 127.0.0.1 for the session (``tests/mlflow_server.py``): its URI.  The
    tests that share it use registered-model names of their own."""
    from mlflow_server import kill_server, start_server

    proc, uri = start_server(tmp_path_factory.mktemp("mlflow-server"))
    yield uri
    kill_server(proc)
