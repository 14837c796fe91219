"""``ar.submit``: run a command on a Ray cluster through its job server, and follow it from a notebook.

The job is ``python -m alchemetric_ray.cli <command> --config config.yaml [args]``, submitted with
Ray's ``JobSubmissionClient``.  What travels with it:

- the config, written as ``config.yaml`` into a temporary folder of its own that is the job's
  ``working_dir`` (never the caller's folder: a notebook's folder can hold anything);
- the package: by default it is taken to be installed on the cluster (the same version, in the
  cluster's image or environment); ``py_modules=True`` sends this process's ``alchemetric_ray``
  folder as the job's ``py_modules`` (its dependencies must still be on the cluster);
- a pinned ``storage.run`` (``name``, else ``storage.run``, else one chosen here), so the submitter knows
  the folder the result will be in before the job starts.

What the head must see is checked before anything is sent, each refusal one line: a local path
(``data``, ``data.path``, ``storage.path``, ``storage.models_dir``, ``--out``, ``--model``) is seen by
the head only where the head runs on this machine (``127.0.0.1``, ``localhost``, ``::1``), and is then
sent as an absolute path; a URI (``s3://``, ``gs://``, ...) is seen from anywhere.  ``storage.path``
and ``storage.models_dir`` may also be local on a remote head with ``storage.shared=true`` (a mount
that the cluster and this machine share).  A head that gives no answer within
:data:`PROBE_TIMEOUT_S` is refused too (our own probe: the client sets no timeout on its requests).

Ray's own address variables (``RAY_ADDRESS``, ``RAY_API_SERVER_ADDRESS``) would silently replace the
``address`` given here inside the client; they are set aside while it is made.  Where a Ray token
exists on this machine (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``) it is sent to the head, as
``ray.init(address=...)`` does, unless token authentication is off (``RAY_AUTH_MODE`` set to ``disabled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import re
import secrets
import shlex
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload
from urllib.parse import urlsplit

from alchemetric_ray import console
from alchemetric_ray.errors import (
    DataError,
    JobError,
    JobFailed,
    JobTimeout,
    RayAddressError,
    ResultError,
    StorageError,
    UserError,
)

if TYPE_CHECKING:
    from alchemetric_ray.config import RunConfig

PROBE_TIMEOUT_S = 20.0  # a head that does not answer /api/version within this is refused
STOP_TIMEOUT_S = 120.0  # how long stop() waits for Ray to report the stopped job's final status
POLL_S = 1.0
CONFIG_FILE = "config.yaml"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
ADDRESS_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")  # each replaces the client's address argument
# the Ray client's own INFO lines ("Uploading package ...", "WebSocket closed ..."): not in a notebook's cell
CLIENT_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                  "ray._private.runtime_env.packaging")
META = "alchemetric"  # the job's metadata key: {"command", "run", "result"} as JSON





# ---- the job ---------------------------------------------------------------------------------


class Job:
    """A command submitted to a Ray cluster: ``.id``, ``.status()``, ``.logs()``, ``.wait()``,
    ``.stop()``, ``.result()``.  ``Job.attach(id, address=...)`` finds one again (after a restart)."""

    def __init__(self, client: Any, job_id: str, *, address: str, command: str, run: str | None,
                 result_at: str | None) -> None:
        self._client = client
        self.id = job_id
        self.address = address
        self.command = command
        self.run = run  # the pinned storage.run
        self.result_at = result_at  # where the saved result will be (a URI or an absolute path); None: no result
        self._seen: str | None = None  # the last status read, for repr (which asks nothing of the head)

    def __repr__(self) -> str:
        run = f" run {self.run}" if self.run else ""
        seen = f", {self._seen}" if self._seen else ""
        return f"<Job {self.id}: {self.command}{run} on {self.address}{seen}>"

    @classmethod
    def attach(cls, job_id: str, *, address: str) -> Job:
        """The job ``job_id`` submitted earlier by :func:`submit` to the head at ``address``."""
        url = _dashboard_url(address)
        client = _client(url)
        info = _ask(lambda: client.get_job_info(job_id), url)
        meta = json.loads((info.metadata or {}).get(META) or "{}")
        job = cls(client, job_id, address=url, command=meta.get("command", info.entrypoint), run=meta.get("run"),
                  result_at=meta.get("result"))
        job._seen = _status_name(info.status)
        return job

    def status(self) -> str:
        """The job's status as Ray reports it: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
        self._seen = _status_name(_ask(lambda: self._client.get_job_status(self.id), self.address))
        return self._seen

    @overload
    def logs(self, *, follow: Literal[False] = ..., raw: bool = ...) -> str: ...

    @overload
    def logs(self, *, follow: Literal[True], raw: bool = ...) -> None: ...

    @overload
    def logs(self, *, follow: bool, raw: bool = ...) -> str | None: ...

    def logs(self, *, follow: bool = False, raw: bool = False) -> str | None:
        """The job's output so far, our lines only (Ray's own lines dropped; ``raw=True`` keeps them).
        ``follow=True`` prints the lines as they arrive until the job ends (:meth:`follow` yields them)."""
        if follow:
            for line in self.follow(raw=raw):
                print(line, flush=True)
            return None
        text = _ask(lambda: self._client.get_job_logs(self.id), self.address)
        if raw:
            return text
        keep = LineFilter()
        return "".join(line + "\n" for line in text.splitlines() if keep(line))

    def follow(self, *, raw: bool = False) -> Iterator[str]:
        """Each line of the job's output as it arrives (from its start), until the job ends.

        Ray's log tail is an async iterator; it runs on a thread of its own with its own event loop,
        so that this works where the caller's loop is already running (a Jupyter kernel's)."""
        lines: queue.Queue = queue.Queue()
        done = object()
        tail = _Tail(self._client, self.id, lines, done)
        tail.start()
        keep = LineFilter()
        partial = ""
        try:
            with _quiet_client():
                while True:
                    item = lines.get()
                    if item is done:
                        break
                    if isinstance(item, BaseException):
                        raise JobError(f"job {self.id}: its log stream from {self.address} broke "
                                       f"({_first_line(item)}); job.logs() reads what was written") from None
                    *complete, partial = (partial + item).split("\n")
                    yield from (line for line in complete if raw or keep(line))
            if partial and (raw or keep(partial)):
                yield partial
        finally:
            tail.cancel()

    def wait(self, timeout: float | None = None) -> str:
        """Wait for the job to end; its final status (SUCCEEDED or STOPPED).  A FAILED job raises
        :class:`JobFailed` with its last error line; ``timeout`` (seconds) passing first, :class:`JobTimeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.status()) not in TERMINAL:
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {self.id} ({self.command}) is still {status} after {timeout:g} s on "
                                 f"{self.address}; wait again, or job.stop()")
            time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
        if status == "FAILED":
            raise JobFailed(f"job {self.id} ({self.command}) failed: {self._error_line()}")
        return status

    def stop(self) -> str:
        """Ask Ray to stop the job, then wait for its final status (STOPPED, or how it ended first)."""
        if self.status() not in TERMINAL:
            _ask(lambda: self._client.stop_job(self.id), self.address)
        try:
            return self.wait(timeout=STOP_TIMEOUT_S)
        except JobFailed:
            return "FAILED"  # it failed before the stop reached it: that is its final status

    def result(self) -> Any:
        """The run's saved result (``result.json`` in its folder, on object storage or a path that both
        sides see), typed as ``ar.load_result`` reads it.  Only once the job SUCCEEDED."""
        status = self.status()
        if status != "SUCCEEDED":
            hint = "job.wait() first" if status not in TERMINAL else "it saved no result"
            raise ResultError(f"job {self.id} ({self.command}) is {status}: {hint}")
        if self.result_at is None:
            raise ResultError(f"job {self.id}: `{self.command}` saves no result; its output is job.logs()")
        return _load_result(self.result_at)

    def _error_line(self) -> str:
        """The job's last error line: the CLI's ``alchemetric-ray CMD: error: ...``, else its last line, else Ray's."""
        try:
            lines = [line for line in self.logs().splitlines() if line.strip()]
        except UserError:
            lines = []
        ours = [line for line in lines if _CLI_ERROR.match(line)]
        if ours or lines:
            return (ours or lines)[-1].strip()
        info = _ask(lambda: self._client.get_job_info(self.id), self.address)
        return _first_line(info.message or "no output")


_CLI_ERROR = re.compile(r"^alchemetric-ray \w+: (error|interrupted)")


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status))


def _load_result(where: str) -> Any:
    try:
        from alchemetric_ray.api.history import load_result
    except ImportError:  # the typed results not there: the parsed file
        from alchemetric_ray.storage import locate

        file = locate(where) if where.endswith(".json") else locate(where) / "result.json"
        if not file.exists():
            raise ResultError(f"{where}: no result.json here") from None
        return json.loads(file.read_text())
    return load_result(where)


class _Tail(threading.Thread):
    """Ray's async log tail on its own thread and event loop; chunks (and a failure) go to ``lines``."""

    def __init__(self, client: Any, job_id: str, lines: queue.Queue, done: object) -> None:
        super().__init__(name=f"alchemetric-logs-{job_id}", daemon=True)
        self._client, self._job_id, self._lines, self._done = client, job_id, lines, done
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            self._loop = loop
            self._task = loop.create_task(self._pump())
            self._ready.set()
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # handed to the reader, which raises it as one line
            self._lines.put(exc)
        finally:
            self._ready.set()
            self._lines.put(self._done)
            loop.close()

    async def _pump(self) -> None:
        async for chunk in self._client.tail_job_logs(self._job_id):
            self._lines.put(chunk)

    def cancel(self) -> None:
        """The reader stopped early (or the job ended): end the tail."""
        self._ready.wait(timeout=5)
        loop, task = self._loop, self._task
        if loop is not None and task is not None and self.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(task.cancel)


# ---- which lines are ours ------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's log format: "2026-12-05 06:32:55,298\tINFO job_manager.py:581 -- Runtime env is setting up."
_RAY_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+:\d+ -- ")
# a line a Ray process printed, forwarded with its prefix: "(RayTrainWorker pid=12, ip=10.0.0.5) ...", "(raylet) ..."
_RAY_PREFIX = re.compile(r"^\((raylet|autoscaler|gcs_server|monitor|[^()\s]+ pid=\d+[^()]*)\)( |$)")
# a Python warning raised inside Ray: "/.../ray/train/x.py:12: DeprecationWarning: ..." and its source line
_RAY_WARNING = re.compile(r"^\S*[/\\]ray[/\\]\S+\.py:\d+: \w*Warning\b")
_RAY_JOB_LINES = ("Running entrypoint for job ",)  # the job supervisor's first line


class LineFilter:
    """``keep(line)``: whether a line of a job's log is ours (what the CLI prints), line by line in order.

    Dropped: lines in Ray's log format, lines that Ray processes print under their ``(name pid=...)``
    prefix, Python warnings raised inside Ray (with the source line after them), the job supervisor's
    "Running entrypoint" line, and the messages of ``console``'s lists.  ANSI colour codes are removed
    from what is kept by the caller (:func:`_plain`).  ``ALCHEMETRIC_VERBOSE=1`` keeps everything."""

    def __init__(self) -> None:
        self._after_warning = False
        self._verbose = console.verbose()

    def __call__(self, line: str) -> bool:
        if self._verbose:
            return True
        text = _plain(line)
        if self._after_warning:
            self._after_warning = False
            if text[:1].isspace():
                return False
        if _RAY_WARNING.match(text):
            self._after_warning = True
            return False
        if _RAY_LOG.match(text) or _RAY_PREFIX.match(text) or text.startswith(_RAY_JOB_LINES):
            return False
        return not any(m in text for m in (*console.RAY_LOG_LINES, *console.RAY_LOG_MESSAGES))


def _plain(line: str) -> str:
    return _ANSI.sub("", line).rstrip("\r")


# ---- submitting ----------------------------------------------------------------------------


def submit(command: str, cfg: RunConfig | None = None, *, address: str, data: Any = None,  # noqa: PLR0913
           overrides: Sequence[str] = (), name: str | None = None, args: Sequence[str] = (),
           py_modules: bool = False) -> Job:
    """Submit ``alchemetric-ray <command>`` to the Ray cluster whose job server is at ``address``
    (``http://HEAD:8265``); a :class:`Job` to follow, wait for, stop and read the result of.

    ``cfg``: a ``RunConfig`` (None: the defaults) with ``overrides`` (``section.key=value``) applied
    here, so a wrong key is refused before anything is sent; ``data``: what ``--data`` takes, a path
    that the head can see (a URI, or a local path where the head runs on this machine); ``name``: the
    run's name (``storage.run``; default ``<storage.name>-<time>``, ``sweep-...`` for tune);
    ``args``: the command's own flags (``["--evaluate"]``, ``["--model", "s3://..."]``); ``--out``
    defaults to the run's folder (``storage.path/<run>``, for predict its ``signals.parquet``).
    The package must be installed on the cluster, unless ``py_modules=True`` sends this one."""
    from alchemetric_ray.config import RunConfig

    if command not in COMMANDS:
        raise JobError(f"submit: unknown command {command!r} (one of: {', '.join(COMMANDS)})")
    url = _dashboard_url(address)
    local = (urlsplit(url).hostname or "") in LOCAL_HOSTS
    cfg = (cfg or RunConfig()).replace(*overrides, *_data_overrides(data, local, url))
    plan = _plan(command, cfg, name, list(args), local, url)
    client = _client(url)
    with tempfile.TemporaryDirectory(prefix="alchemetric-job-") as folder:
        import yaml

        plain = json.loads(plan.cfg.to_json())  # plain types: a config value may be a str subclass
        (Path(folder) / CONFIG_FILE).write_text(yaml.safe_dump(plain, sort_keys=False))
        runtime_env: dict[str, Any] = {"working_dir": folder}
        if py_modules:
            runtime_env["py_modules"] = [str(Path(__file__).resolve().parents[1])]
            runtime_env["excludes"] = ["__pycache__", "*.pyc"]
        entrypoint = shlex.join(["python", "-m", "alchemetric_ray.cli", command, "--config", CONFIG_FILE,
                                 *plan.args])
        meta = {META: json.dumps({"command": command, "run": plan.run, "result": plan.result_at})}
        job_id = f"{plan.run or command}-{secrets.token_hex(3)}"
        with _quiet_client():
            _ask(lambda: client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, metadata=meta,
                                           submission_id=job_id), url)
    return Job(client, job_id, address=url, command=command, run=plan.run, result_at=plan.result_at)


class _Plan:
    def __init__(self, cfg: RunConfig, run: str | None, args: list[str], result_at: str | None) -> None:
        self.cfg, self.run, self.args, self.result_at = cfg, run, args, result_at


# cli.py's (tests/test_api.py)
COMMANDS = ("env", "features", "train", "tune", "predict", "evaluate", "doctor", "promote", "refit")
RESULT_COMMANDS = ("features", "train", "tune", "predict", "evaluate")  # the commands that save a result
OUT_COMMANDS = ("features", "predict", "evaluate")  # the commands with a required --out


def _plan(command: str, cfg: RunConfig, name: str | None, args: list[str], local: bool, url: str) -> _Plan:
    """The config and flags as sent: the run pinned, every local path made absolute or refused."""
    for flag in ("--config", "--data"):
        if flag in args:
            raise JobError(f"submit: {flag} is submit's own (cfg=..., data=...), not one of args")
    if command not in RESULT_COMMANDS:
        return _Plan(cfg, None, _seen_args(args, local, url), None)
    # where the command writes: the run folder (and the --out in it, unless one is given), the exported model
    written = ("path", "models_dir") if command in ("train", "tune") else () if "--out" in args else ("path",)
    for key in written:
        value = _seen_by_head(getattr(cfg.storage, key), local or cfg.storage.shared, url, f"storage.{key}",
                              StorageError)
        cfg = cfg.replace(f"storage.{key}={value}")
    run = name or cfg.storage.run
    if run is None and (cfg.storage.resume or "--resume" in args):
        raise JobError("submit: storage.resume=true needs the run to continue: name=... (its storage.run)")
    run = run or f"{'sweep-' if command == 'tune' else ''}{cfg.storage.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = cfg.replace(f"storage.run={run}")
    folder = f"{cfg.storage.path.rstrip('/')}/{run}"
    if command in OUT_COMMANDS and "--out" not in args:
        args += ["--out", f"{folder}/signals.parquet" if command == "predict" else folder]
    args = _seen_args(args, local, url)
    out = args[args.index("--out") + 1] if "--out" in args else folder
    return _Plan(cfg, run, args, out)


def _seen_args(args: list[str], local: bool, url: str) -> list[str]:
    """``--out`` and ``--model`` values: local paths the head can see, made absolute."""
    args = list(args)
    for i, flag in enumerate(args[:-1]):
        if flag in ("--out", "--model") and not args[i + 1].startswith("models:/"):
            args[i + 1] = _seen_by_head(args[i + 1], local, url, flag, DataError)
    return args


def _data_overrides(data: Any, local: bool, url: str) -> list[str]:
    if data is None:
        return []
    if not isinstance(data, (str, os.PathLike)):
        raise DataError(f"submit: data must be a path or URI the head can see (got a {type(data).__name__}); "
                        "write it to object storage and pass the URI")
    return [f"data.path={_seen_by_head(os.fspath(data), local, url, 'data', DataError)}", "data.source=files"]


def _seen_by_head(where: str, local: bool, url: str, what: str, error: type[UserError]) -> str:
    """``where`` as the head reads it: a URI as it is; a local path, absolute, only where the head sees it."""
    scheme = urlsplit(where).scheme if "://" in where else ""
    if scheme and scheme != "file":
        return where
    path = Path(where[len("file://"):] if scheme == "file" else where).expanduser()
    if not local:
        raise error(f"submit: {what} {where} is a local path that the Ray head at {url} cannot see; put it on "
                    "object storage (s3://..., gs://...) and pass the URI")
    return str(path.resolve())


# ---- the client ----------------------------------------------------------------------------


def _dashboard_url(address: str) -> str:
    """``http(s)://HOST:PORT`` of a head's job server, from what the user wrote (``HOST:PORT`` too)."""
    text = str(address).strip().rstrip("/")
    if "://" not in text:
        text = f"http://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RayAddressError(f"submit: address {address!r} is not a Ray head's job server "
                              "(expected http://HEAD:8265, the address of `ray job submit`)")
    return text


def _client(url: str) -> Any:
    """A ``JobSubmissionClient`` for the head at ``url``, once the head answered our probe."""
    headers = _auth_headers()
    _probe(url, headers)
    from ray.job_submission import JobSubmissionClient

    saved = {name: os.environ.pop(name) for name in ADDRESS_ENV if name in os.environ}
    try:
        with _quiet_client():
            return _ask(lambda: JobSubmissionClient(url, headers=headers or None), url)
    finally:
        os.environ.update(saved)


def _auth_headers() -> dict[str, str]:
    """The Authorization header of this machine's Ray token, where there is one (and auth is not off)."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return {}
    try:
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]  # Cython, no stub

        return dict(AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True) or {})
    except Exception:  # no token, or a Ray without token auth: the client's own defaults
        return {}


def _probe(url: str, headers: dict[str, str]) -> None:
    """One GET of ``<url>/api/version``: an answer within :data:`PROBE_TIMEOUT_S`, from a Ray head."""
    import requests

    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["response"] = requests.get(f"{url}/api/version", headers=headers, timeout=PROBE_TIMEOUT_S)
        except Exception as exc:  # reported below as one line
            answer["error"] = exc

    asker = threading.Thread(target=ask, name="alchemetric-probe", daemon=True)
    asker.start()
    asker.join(PROBE_TIMEOUT_S)
    if asker.is_alive() or isinstance(answer.get("error"), requests.Timeout):
        raise RayAddressError(f"submit: no Ray head answered at {url} within {PROBE_TIMEOUT_S:.0f} s; check the "
                              "address (the dashboard's, port 8265 by default) and that the head is up")
    if "error" in answer:
        raise RayAddressError(f"submit: no Ray head answers at {url} ({_reason(answer['error'])}); check the "
                              "address (the dashboard's, port 8265 by default) and that the head is up")
    response = answer["response"]
    if response.status_code in (401, 403):
        raise RayAddressError(f"submit: the Ray head at {url} refused our token (HTTP {response.status_code}); "
                              "put the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN")
    try:
        version = response.json().get("ray_version")
    except ValueError:
        version = None
    if response.status_code != 200 or not version:
        raise RayAddressError(f"submit: {url} answers, but not as a Ray head's job server (HTTP "
                              f"{response.status_code}); give the dashboard's address (port 8265 by default)")


def _ask(call: Any, url: str) -> Any:
    """One request to the head through the client; its failures as one line."""
    import requests

    try:
        return call()
    except requests.RequestException as exc:
        raise RayAddressError(f"the Ray head at {url} stopped answering ({_reason(exc)})") from None
    except (RuntimeError, ValueError) as exc:  # the job server's refusal (no such job, an id in use, ...)
        raise JobError(f"the Ray head at {url}: {_first_line(exc)}") from None


@contextlib.contextmanager
def _quiet_client() -> Iterator[None]:
    """The Ray client's INFO lines off while it works; the loggers' levels put back after."""
    if console.verbose():
        yield
        return
    loggers = [logging.getLogger(name) for name in CLIENT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _reason(exc: BaseException) -> str:
    found = re.search(r"\[Errno -?\d+\] [^'\")\]]+", str(exc))
    return found.group(0).strip() if found else _first_line(exc)[:200]


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
