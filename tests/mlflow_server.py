"""A real ``mlflow server`` on 127.0.0.1 for the tests (sqlite backend; artifacts proxied from a local
folder or the suite's S3 server); ``conftest.py``'s session fixture ``mlflow_server`` starts one for the
whole session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port


def start_server(root: Path, artifacts: str | None = None) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` serving its artifacts (proxied: clients need no access to where they land)
    from a local folder, or from ``artifacts`` (an s3:// URI on the suite's S3 server)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_S3_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", artifacts or str(root / "artifacts")],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: the server and its workers
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_server(proc)
            pytest.fail("mlflow server did not start")
        time.sleep(0.5)
    return proc, uri


def kill_server(proc: subprocess.Popen) -> None:
    """The server's whole process group (`mlflow server` serves from child worker processes)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
