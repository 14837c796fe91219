"""``ar.submit`` against a real Ray head of the tests' own (``ray start --head`` on 127.0.0.1, 2 CPUs):
a job that succeeds, one that fails, one followed from inside a running event loop and stopped, the
refusals before anything is sent, and the package sent as ``py_modules``.  Clean-up stops that head
and its processes by pid, never ``ray stop`` (it would end every Ray on the machine)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import free_port

from alchemetric_ray.api.jobs import _RAY_LOG, Job, JobFailed, _client, submit
from alchemetric_ray.config import load_config
from alchemetric_ray.errors import ConfigError, DataError, RayAddressError, ResultError, StorageError

REPO = Path(__file__).resolve().parents[1]
RAY_BIN = Path(sys.executable).parent / "ray"
TINY = ["data.tickers=AAPL,MSFT"]  # two tickers of the packaged data


@dataclass
class Head:
    url: str  # http://127.0.0.1:PORT, the job server
    temp_dir: str
    process: subprocess.Popen
    gcs: str = ""  # 127.0.0.1:PORT, what ray.init(address=...) joins

    def jobs(self) -> int:
        return len(_client(self.url).list_jobs())


@pytest.fixture(scope="module")
def head():
    for attempt in (1, 2):  # a second try with fresh ports: another test's Ray may take one between look and use
        up = _start_head()
        try:
            _wait_until_it_runs_jobs(up)
            break
        except RuntimeError:
            _stop(up)
            if attempt == 2:
                raise
    try:
        yield up
    finally:
        _stop(up)


def _start_head() -> Head:
    temp_dir = tempfile.mkdtemp(prefix="arj", dir="/tmp")  # short: Ray's socket paths stay under 108 bytes
    dashboard, gcs = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    # a job's `python` is this interpreter, and it imports this checkout
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    with (Path(temp_dir) / "head.out").open("wb") as out:
        process = subprocess.Popen(
            [str(RAY_BIN), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
             "--include-dashboard=true", f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
             f"--temp-dir={temp_dir}", f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
            env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    return Head(f"http://127.0.0.1:{dashboard}", temp_dir, process, f"127.0.0.1:{gcs}")


def _wait_until_it_runs_jobs(head: Head, timeout_s: float = 300) -> None:
    """The dashboard answers before the head's job agent takes jobs: until a trivial job runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        if head.process.poll() is not None or time.monotonic() > deadline:
            said = (Path(head.temp_dir) / "head.out").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the test's Ray head did not come up: {said}")
        try:
            client = _client(head.url)
            job_id = client.submit_job(entrypoint="true")
            break
        except (RayAddressError, RuntimeError):
            time.sleep(2)
    while str(client.get_job_status(job_id).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(1)


def _stop(head: Head) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.process.pid, signal.SIGTERM)
    try:
        head.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.process.pid, signal.SIGKILL)
        head.process.wait()
    for sig in (signal.SIGTERM, signal.SIGKILL):  # what left the group: it names the head's temp dir
        for pid in _naming(head.temp_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(1)
    shutil.rmtree(head.temp_dir, ignore_errors=True)


def _naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
    return found


def _in_a_kernel(fn):
    """``fn()`` called from inside a running event loop, as a Jupyter cell runs."""
    async def cell():
        asyncio.get_running_loop()
        return fn()

    return asyncio.run(cell())


@pytest.mark.slow
def test_a_job_runs_and_its_lines_are_ours(head, tmp_path, capsys):
    cfg = load_config(None, [f"storage.path={tmp_path / 'runs'}"])
    job = submit("features", cfg, address=head.url, overrides=TINY, args=["--quiet"], name="shards-1")
    assert job.run == "shards-1" and job.result_at == str(tmp_path / "runs" / "shards-1")
    assert job.wait(timeout=600) == "SUCCEEDED" and job.status() == "SUCCEEDED"
    logs = job.logs()
    assert f"wrote {tmp_path / 'runs' / 'shards-1'}: 2 tickers" in logs  # the config file reached the command
    raw = job.logs(raw=True)
    assert "Running entrypoint for job" in raw and any(_RAY_LOG.match(line) for line in raw.splitlines())
    assert "Running entrypoint" not in logs and not any(_RAY_LOG.match(line) for line in logs.splitlines())
    assert "\x1b" not in logs
    assert (tmp_path / "runs" / "shards-1" / "manifest.json").is_file()
    shards = job.result()  # the run's result.json, on a path both sides see
    assert type(shards).__name__ == "Shards" and shards.tickers == ["AAPL", "MSFT"]
    assert shards.where == job.result_at
    shown = repr(job)
    assert "\n" not in shown and job.id in shown and "features" in shown
    again = Job.attach(job.id, address=head.url)
    assert (again.command, again.run, again.result_at) == ("features", "shards-1", job.result_at)
    # follow=True prints the same lines, its tail on its own thread while the caller's loop runs
    capsys.readouterr()
    _in_a_kernel(lambda: job.logs(follow=True))
    assert capsys.readouterr().out == logs


@pytest.mark.slow
def test_a_failing_job_raises_its_error_line(head, tmp_path):
    cfg = load_config(None, [f"storage.path={tmp_path / 'runs'}"])
    job = submit("features", cfg, address=head.url, overrides=["data.tickers=ZZZZ"], args=["--quiet"])
    with pytest.raises(JobFailed) as failed:
        job.wait(timeout=600)
    message = str(failed.value)
    assert "\n" not in message and job.id in message
    assert "alchemetric-ray features: error: requested ticker ZZZZ not in" in message
    assert job.status() == "FAILED"
    with pytest.raises(ResultError, match="FAILED"):
        job.result()
    # a key that does not exist is refused here, before anything is sent
    before = head.jobs()
    with pytest.raises(ConfigError):
        submit("features", cfg, address=head.url, overrides=["features.no_such_key=1"])
    assert head.jobs() == before


@pytest.mark.slow
def test_followed_from_a_running_loop_then_stopped(head, tmp_path):
    cfg = load_config(None, [f"storage.path={tmp_path / 'runs'}", f"storage.models_dir={tmp_path / 'models'}",
                             "train.epochs=500", "model.hidden=8", "device.name=cpu", *TINY])
    job = submit("train", cfg, address=head.url)

    def cell():
        seen, threads = [], set()
        for line in job.follow():
            seen.append(line)
            threads |= {t.name for t in threading.enumerate()}
            if line.startswith("epoch "):  # training is under way: this line came while the job runs
                return seen, threads, job.status(), job.stop()
        raise AssertionError(f"the job ended without an epoch line: {seen[-20:]}")

    seen, threads, running, stopped = _in_a_kernel(cell)
    assert running == "RUNNING" and stopped == "STOPPED" and job.status() == "STOPPED"
    assert f"alchemetric-logs-{job.id}" in threads
    assert not any(_RAY_LOG.match(line) or line.startswith("(") for line in seen), seen
    assert job.wait() == "STOPPED"


@pytest.mark.slow  # the module's real head takes a minute to start: make test only
def test_refused_before_anything_is_sent(head, tmp_path):
    (tmp_path / "prices.csv").write_text("ticker,date,open,high,low,close,volume\n")
    elsewhere = f"http://{socket.gethostname()}:8265"  # not this machine's loopback: the head cannot see our files
    before = head.jobs()
    started = time.monotonic()
    with pytest.raises(DataError) as refused:
        submit("features", address=elsewhere, data=tmp_path / "prices.csv")
    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path / "prices.csv") in message and "cannot see" in message
    with pytest.raises(StorageError, match="storage.path .* cannot see"):  # where the run would be written
        submit("train", address=elsewhere, data="s3://bucket/prices")
    with pytest.raises(DataError, match="a path or URI"):
        submit("features", address=head.url, data=object())
    assert head.jobs() == before


def test_a_head_that_does_not_answer_is_refused_within_the_probe_timeout(monkeypatch):
    from alchemetric_ray.api import jobs

    assert jobs.PROBE_TIMEOUT_S == 20.0  # what a user waits at most; the mute head below gets 2 s
    started = time.monotonic()
    with pytest.raises(RayAddressError) as nobody:
        submit("env", address=f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 20
    assert "\n" not in str(nobody.value) and "no Ray head answers" in str(nobody.value)
    monkeypatch.setattr(jobs, "PROBE_TIMEOUT_S", 2.0)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        with pytest.raises(RayAddressError) as mute:
            submit("env", address=f"127.0.0.1:{silent.getsockname()[1]}")
        assert 2 <= time.monotonic() - started < 7
    assert "\n" not in str(mute.value) and "within 2 s" in str(mute.value)


@pytest.mark.slow
def test_the_package_sent_as_py_modules(head):
    job = submit("env", address=head.url, py_modules=True)
    assert job.wait(timeout=600) == "SUCCEEDED"
    info = _client(head.url).get_job_info(job.id)
    assert info.runtime_env.get("py_modules"), info.runtime_env
    assert "torch" in job.logs() and job.run is None
    with pytest.raises(ResultError, match="saves no result"):
        job.result()


@pytest.mark.slow  # the module's real head takes a minute to start: make test only
def test_a_cluster_joined_by_ray_init_is_planned_as_a_cluster(head, ray_session):
    """A notebook's ``ray.init(address=...)`` (no RAY_ADDRESS): Ray's own state says the cluster was
    joined, so its capacity is asked of the cluster, not taken as a local Ray's; a local ray.init() is not
    (this process's: the test session's own local Ray)."""
    from alchemetric_ray.placement.capacity import discover_capacity, joined_cluster

    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
             "from alchemetric_ray.config import load_config; "
             "from alchemetric_ray.placement.capacity import discover_capacity, joined_cluster; "
             "print('joined', joined_cluster(), discover_capacity(load_config()).kind); ray.shutdown()")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", probe, head.gcs], capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "token"}, cwd=tempfile.mkdtemp())
    lines = [line for line in out.stdout.splitlines() if line.startswith("joined")] or [out.stderr[-2000:]]
    assert lines[0].startswith("joined True") and not lines[0].endswith(" now"), out.stdout + out.stderr
    assert ray_session.is_initialized() and "RAY_ADDRESS" not in os.environ
    assert (joined_cluster(), discover_capacity(load_config()).kind) == (False, "now")
