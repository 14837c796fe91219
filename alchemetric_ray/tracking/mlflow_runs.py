"""MLflow experiment tracking and the model registry (``tracking.mlflow_uri``; off when empty).

The one module that talks to MLflow, imported lazily (``pip install 'alchemetric-ray[mlflow]'``).
One writer per run, in the driver: a ``train`` run is an MLflow run (the flattened config as
params, at the start; the loop's per-epoch history as metrics with their step, the plan's and the
workers' decisions as tags, the model folder as artifacts, once ``fit()`` returned its history);
a sweep is a parent run with one nested run per trial (``mlflow.parentRunId``), written from the
sweep's summary.  Each export is a model version of the registered model ``storage.name``.

Faults: :func:`preflight` refuses a server that does not answer ``/health`` in a few seconds (or an
uninstalled MLflow) in one line before any training; every call runs with bounded retries and
timeouts (``MLFLOW_HTTP_REQUEST_*``); after the first failed call nothing more is sent, the run
goes on, and :meth:`Tracker.finalize` says in one line what was not logged.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import TrackingError
from alchemetric_ray.storage import Location
from alchemetric_ray.tracking.logger import RUN_FILE, RunLog

REGISTERED = "registered.json"  # in a model downloaded from the registry: the version it is (name, version, alias)
HEALTH_TIMEOUT_S = 5.0
# bounded client calls: MLflow's defaults (7 retries, 120 s timeout) took minutes to fail on a dead server
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
EXTRA = "pip install 'alchemetric-ray[mlflow]'"


def enabled(cfg: RunConfig) -> bool:
    return bool(cfg.tracking.mlflow_uri)


def _mlflow():
    try:
        import mlflow
    except ImportError:
        raise TrackingError(f"config 'tracking.mlflow_uri' is set but MLflow is not installed: {EXTRA}") from None
    import logging

    # its "Waiting up to 300 seconds for model version to finish creation" on every registration: our lines only
    logging.getLogger("mlflow.store.model_registry.abstract_store").setLevel(logging.WARNING)
    return mlflow


def bounded_http_env() -> dict[str, str]:
    """Set the bounded retry/timeout settings in this process (unless the user set them); return them."""
    for name, value in HTTP_SETTINGS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in HTTP_SETTINGS}


def preflight(uri: str) -> None:
    """Before any training: MLflow installed, and the store reachable; one line otherwise."""
    _mlflow()
    bounded_http_env()
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.name or not db.parent.is_dir():
            raise TrackingError(f"config 'tracking.mlflow_uri': {uri}: the folder {db.parent} does not exist")
        return
    if not uri.startswith(("http://", "https://")):
        raise TrackingError(f"config 'tracking.mlflow_uri': {uri!r} is not sqlite:///path or http(s)://host:port")
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as response:
            if response.status != 200:
                raise TrackingError(f"config 'tracking.mlflow_uri': {url} answered HTTP {response.status}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise TrackingError(f"config 'tracking.mlflow_uri': no MLflow server answers at {url} ({why})") from None


def flatten(cfg: RunConfig) -> dict[str, str]:
    """The config as MLflow params: ``section.key`` -> its value as text (MLflow's 6000-character limit)."""
    return {key: str(value)[:6000] for key, value in cfg.flat().items()}


def _artifact_location(cfg: RunConfig) -> str | None:
    """An embedded (sqlite) store keeps its artifacts under the run storage, not in ./mlruns of the cwd."""
    if not cfg.tracking.mlflow_uri.startswith("sqlite:"):
        return None
    from alchemetric_ray.placement.session import storage_location

    where = storage_location(cfg) / "mlflow-artifacts"
    if where.is_local:
        where.local.mkdir(parents=True, exist_ok=True)
        return where.local.resolve().as_uri()
    return where.uri


class Tracker(RunLog):
    """The MLflow run of one ``train`` run or sweep, written from this process only."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.uri = cfg.tracking.mlflow_uri
        self.experiment = cfg.tracking.experiment or cfg.storage.name
        self.run_id: str | None = None
        self.not_logged: list[str] = []
        self.failure: str | None = None
        self.version: str | None = None
        self.model_name = cfg.storage.name  # the registered model its exports are versions of
        self._owned = True  # this process started (or resumed) the run: finalize() ends it
        self._run_file: Location | None = None
        self._saved: dict = {}  # what the run file records: the uri, run id, params, last logged epoch
        self._client = None
        self._experiment_id: str | None = None
        self._said = 0  # how many of not_logged a line already named
        self._figures: dict[str, float] = {}  # the run's figures (best epoch, test, verdict): tagged on its version

    # ---- calls that never stop the training ------------------------------------------------
    def _call(self, what: str, fn, *args, **kwargs):
        if self.failure is not None:
            self.not_logged.append(what)
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the tracker's fault (server gone, refused write): the run goes on
            self.failure = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            self.not_logged.append(what)
            return None

    @property
    def client(self):
        if self._client is None:
            bounded_http_env()
            mlflow = _mlflow()
            self._client = mlflow.MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = found.experiment_id if found else self.client.create_experiment(
                self.experiment, artifact_location=_artifact_location(self.cfg))
        return self._experiment_id

    # ---- the run -------------------------------------------------------------------------------
    def start(self, run_file: Location | None, name: str, *, tags: dict[str, str] | None = None,
              parent: str | None = None, start_time: float | None = None) -> None:
        """Start (or, where ``run_file`` names one, continue) the MLflow run; log the config as params.
        ``start_time`` (Unix seconds): when what the run records began, where it is logged after the fact
        (a sweep's trials); else now."""
        saved = _read_run_file(run_file)
        self._run_file = run_file
        params = flatten(self.cfg)
        if saved and saved.get("uri") == self.uri:
            self.run_id = saved["run_id"]
            self._call("resume", self.client.update_run, self.run_id, status="RUNNING")
            logged = saved.get("params", {})
            changed = {k: v for k, v in params.items() if k in logged and logged[k] != v}
            new = {k: v for k, v in params.items() if k not in logged}
            # MLflow refuses a param re-logged with another value: a changed one is a tag of the resume
            self._tags({f"resume.changed.{k}"[:250]: f"{logged[k]} -> {v}"[:5000] for k, v in changed.items()})
            self._params(new)
            params = {**logged, **new}
            self._saved = {"last_step": saved.get("last_step", 0)}
        else:
            all_tags = {"mlflow.runName": name, **(tags or {})}
            if parent:
                all_tags["mlflow.parentRunId"] = parent
            started = int(start_time * 1000) if start_time else None
            run = self._call("the run", lambda: self.client.create_run(self._experiment(), run_name=name,
                                                                       tags=all_tags, start_time=started))
            if run is None:
                return
            self.run_id = run.info.run_id
            self._params(params)
        if self.run_id:
            self._saved = {"uri": self.uri, "run_id": self.run_id, "params": params, **self._saved}
            self._write_run_file()

    def _write_run_file(self) -> None:
        if self._run_file is None:
            return
        try:
            self._run_file.write_json(self._saved)
        except Exception:  # the run folder is the run's own: a failed write only loses the resume link
            self.not_logged.append(f"{RUN_FILE} (resume link)")

    def _params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._call("params", self.client.log_batch, self.run_id, params=items[i:i + 100])

    def _tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items() if v is not None]
        for i in range(0, len(items), 100):
            self._call("tags", self.client.log_batch, self.run_id, tags=items[i:i + 100])

    def log_epochs(self, history: list[dict]) -> None:
        """Every epoch's numeric metrics, with the epoch's number (from 1, as the console counts) as the
        step; a resumed run's epochs that its first part already logged are not logged twice."""
        from mlflow.entities import Metric

        if not self.run_id:
            return
        now = int(time.time() * 1000)
        done = int(self._saved.get("last_step", 0))
        items, last = [], done
        for index, row in enumerate(history):
            step = int(row.get("epoch", index + 1))
            if step <= done:
                continue
            last = max(last, step)
            for key, value in row.items():
                if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and value == value:
                    items.append(Metric(key, float(value), now, step))
        failed = self.failure
        for i in range(0, len(items), 1000):
            self._call("metrics", self.client.log_batch, self.run_id, metrics=items[i:i + 1000])
        if self.failure is None and failed is None and last > done:
            self._saved["last_step"] = last
            self._write_run_file()

    def log_tags(self, tags: dict[str, Any]) -> None:
        if self.run_id:
            self._tags(tags)

    def log_outcome(self, outcome: Any) -> None:
        self.log_epochs(outcome.summary.history)
        self.log_tags(run_tags(outcome))
        best_row = outcome.best_metrics or {}
        self.log_figures("best", best_row, step=int(best_row.get("epoch") or 0))  # runs sort by them

    def log_figures(self, prefix: str, figures: dict[str, Any], *, step: int = 0) -> None:
        """The run's summary figures (``best.val_rank_ic``, ``test.rank_ic``, ``verdict.edge``) as metrics,
        so that runs sort by them in MLflow's UI, and as tags of its model version (now and once it is
        registered).  Numbers only: None, NaN and text are left out; booleans are 1 or 0."""
        from mlflow.entities import Metric

        if not self.run_id:
            return
        numbers = {f"{prefix}.{key}": number for key, value in figures.items()
                   if (number := _finite_number(value)) is not None}
        if not numbers:
            return
        now = int(time.time() * 1000)
        self._call("metrics", self.client.log_batch, self.run_id,
                   metrics=[Metric(key, value, now, step) for key, value in numbers.items()])
        self._figures.update(numbers)
        if self.version:
            self._tag_version(numbers)

    def _tag_version(self, numbers: dict[str, float]) -> None:
        for key, value in numbers.items():
            self._call("the figures of the model version", self.client.set_model_version_tag, self.model_name,
                       self.version, key, f"{value:.6g}")

    def log_artifacts(self, folder: Location | Path, artifact_path: str | None = None) -> None:
        if not self.run_id:
            return
        from alchemetric_ray.storage import local_copy

        with local_copy(folder) as local:
            if Path(local).is_file():
                self._call(f"artifact {Path(local).name}", self.client.log_artifact, self.run_id, str(local),
                           artifact_path)
            elif Path(local).is_dir():
                self._call(f"artifacts {artifact_path or Path(local).name}", self.client.log_artifacts, self.run_id,
                           str(local), artifact_path)

    def register(self, model_dir: Location, *, verdict: str | None = None) -> str | None:
        """The model folder as the run's ``model`` artifacts, and a version of the registered model ``storage.name``."""
        if not self.run_id:
            return None
        self.log_artifacts(model_dir, "model")
        name = self.model_name

        def _register():
            from mlflow.exceptions import MlflowException

            try:
                self.client.create_registered_model(name)
            except MlflowException as exc:
                if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                    raise
            tags = {"verdict": verdict} if verdict else None
            return self.client.create_model_version(name, source=f"runs:/{self.run_id}/model", run_id=self.run_id,
                                                    tags=tags)

        version = self._call("the model version", _register)
        self.version = version.version if version is not None else None
        if self.version and self._figures:
            self._tag_version(self._figures)
        return self.version

    def log_evaluation(self, report_dir: Location | Path, result) -> None:
        """An evaluation's report, evaluation.json, equity.png and the tear sheet's PNGs as artifacts; its
        verdict as tags, and the model's figures (rank IC and its interval, long-short Sharpe and return,
        signal, edge, the difference to the best baseline) as numbers (:meth:`log_figures`).  ``result``:
        the evaluation's record (``signals.records.Evaluation``), read here, never changed."""
        if not self.run_id:
            return
        sheet = getattr(result, "tear_sheet", None)  # its PNGs are named in the record: no import of the layer above
        pngs = sheet.as_dict().get("pngs", []) if sheet is not None else []
        for file in ("report.md", "evaluation.json", "equity.png", *pngs):
            path = Path(report_dir) / file if not isinstance(report_dir, Location) else report_dir / file
            exists = path.is_file()
            if exists:
                self.log_artifacts(path, "evaluation")
        self.log_figures("evaluation", evaluation_figures(result))
        verdict = result.verdict
        self.log_tags({"verdict": verdict.line, "verdict.edge": verdict.edge})
        if self.version:
            self._call("the verdict tag of the model version", self.client.set_model_version_tag,
                       self.model_name, self.version, "verdict", str(verdict.line)[:5000])

    def finalize(self, status: str = "FINISHED", *, end_time: float | None = None) -> str | None:
        """End the run (``end_time``, Unix seconds: when what it records ended, where it is logged after
        the fact); one line (printed) saying what was not logged, if anything."""
        if self.run_id and self._owned:
            ended = int(end_time * 1000) if end_time else None
            self._call("the run's end", self.client.set_terminated, self.run_id, status, ended)
        missing = self.not_logged[self._said:]
        if not missing:
            return None
        self._said = len(self.not_logged)
        line = (f"mlflow: not logged to {self.uri} (run {self.run_id or 'not created'}): "
                f"{', '.join(dict.fromkeys(missing))} ({self.failure}); the training run itself is complete")
        print(line, flush=True)
        return line

    def live(self, where: Location, every_s: float) -> LiveEpochs:
        return LiveEpochs(self, where, every_s)


def run_log(cfg: RunConfig, run_folder: Location, name: str, *, tags: dict[str, str]) -> RunLog:
    """The log of the run in ``run_folder``: MLflow's where ``tracking.mlflow_uri`` is set (continuing the
    run a resumed run logged into), else one that logs nothing."""
    if not cfg.tracking.mlflow_uri:
        return RunLog()
    tracker = Tracker(cfg)
    tracker.start(run_folder / RUN_FILE, name, tags=tags)
    return tracker


class LiveEpochs:
    """While a ``train`` run trains: a driver thread logs each newly finished epoch to MLflow.

    Every ``tracking.live_every_s`` seconds it reads the run folder's latest complete checkpoint (the
    loop writes one after each epoch, in this process or on the workers; its ``meta.json`` holds the
    history so far) and logs the epochs after the last one logged.  The driver stays the one writer:
    the thread stops before the run's end logs the rest (:meth:`Tracker.log_epochs` skips what is
    logged).  A store that fails makes the tracker stop calling it, as elsewhere."""

    def __init__(self, tracker: Tracker, where: Location, every_s: float):
        import threading

        self.tracker, self.where, self.every_s = tracker, where, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlflow-live-epochs", daemon=True)

    def __enter__(self) -> LiveEpochs:
        if self.every_s > 0 and self.tracker.run_id:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)  # a call in flight, bounded by the HTTP timeouts (bounded_http_env)

    def _run(self) -> None:
        from alchemetric_ray.artifacts.run_folder import RunFolder

        folder = RunFolder(self.where)  # its own: the loop's folder object is not shared across threads
        seen = -1
        while not self._stop.wait(self.every_s):
            try:
                latest = folder.latest(warn=False)
                if latest is not None and latest.epoch > seen:
                    seen = latest.epoch
                    self.tracker.log_epochs(latest.history)
            except Exception:  # a folder being pruned or written as it is read: the next look, or the run's end
                continue


def _finite_number(value: Any) -> float | None:
    """``value`` as a finite float (numpy numbers and booleans too), else None."""
    if value is None or isinstance(value, (str, bytes, dict, list)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def evaluation_figures(result) -> dict[str, Any]:
    """The model's figures in an evaluation's record (its first row, ``signals.contenders.ContenderRow``:
    the long-short figures None where its book never traded) and its verdict, flat."""
    model, verdict = result.rows[0], result.verdict
    rank_ic, traded = model.rank_ic, model.trades
    return {"rank_ic": rank_ic.mean, "rank_ic_ci_low": rank_ic.ci_low, "rank_ic_ci_high": rank_ic.ci_high,
            "ls_sharpe": model.long_short.sharpe if traded else None,
            "ls_annual_return": model.long_short.annual_return if traded else None, "signal": verdict.signal,
            "edge": verdict.edge, "edge_difference": verdict.difference.mean if verdict.difference else None}


def registered_version(uri: str, cfg: RunConfig) -> Tracker:
    """The run and model version behind ``models:/NAME/VERSION`` (or ``@alias``), for an ``evaluate`` of
    it to log its report into that run and tag the version with its verdict (the run stays as it ended)."""
    store = cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    tracker = Tracker(cfg.replace(f"tracking.mlflow_uri={store}"))
    tracker._owned = False
    tracker.model_name = _model_uri_parts(uri)[0]
    version = tracker._call("the model version", _lookup_version, tracker.client, uri)
    if version is not None:
        tracker.run_id, tracker.version = version.run_id, version.version
    return tracker


def _model_uri_parts(uri: str) -> tuple[str, str, bool]:
    """``models:/NAME/VERSION`` -> (NAME, VERSION, False); ``models:/NAME@alias`` -> (NAME, alias, True)."""
    path = uri[len("models:/"):]
    if "@" in path:
        name, alias = path.split("@", 1)
        return name, alias, True
    name, _, version = path.rpartition("/")
    return name, version, False


def _lookup_version(client, uri: str):
    name, which, by_alias = _model_uri_parts(uri)
    return client.get_model_version_by_alias(name, which) if by_alias else client.get_model_version(name, which)


def _read_run_file(run_file: Location | None) -> dict | None:
    import json

    if run_file is None:
        return None
    try:
        return json.loads(run_file.read_text()) if run_file.is_file() else None
    except (OSError, ValueError):
        return None


def environment_tags(shards: Location | None) -> dict[str, Any]:
    """What a run's figures depend on besides its config: torch, Ray, the data and the code."""
    import ray
    import torch

    return {"torch_version": torch.__version__, "ray_version": ray.__version__,
            "data.manifest_sha256": manifest_hash(shards), "git_commit": git_commit()}


def run_tags(outcome: Any) -> dict[str, Any]:
    """The plan's and the workers' decisions with their reasons, the versions and the data, as tags."""
    plan, summary = outcome.plan, outcome.summary
    reasons = plan.reasons
    tags: dict[str, Any] = {
        "plan.accelerator": plan.accelerator, "plan.accelerator.reason": reasons.accelerator,
        "plan.workers": plan.num_workers, "plan.workers.reason": reasons.workers,
        "plan.data.reason": reasons.data, "plan.data_path.reason": reasons.data_path,
        "device": summary.device, "device.reason": summary.device_reason,
        "precision": (summary.precision or {}).get("mode"),
        "precision.detail": summary.precision,
        "data_path": (summary.data_path or [None])[0],
        **environment_tags(outcome.shards),
    }
    return tags


def manifest_hash(shards: Location | None) -> str | None:
    import hashlib

    from alchemetric_ray.data.manifest import MANIFEST

    try:
        # cast: None stays as it was, its TypeError caught below (no shards: no hash)
        return hashlib.sha256((cast(Location, shards) / MANIFEST).read_text().encode()).hexdigest()
    except Exception:
        return None


def git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def download_model(uri: str, cfg: RunConfig, into: str | Path | None = None) -> Path:
    """A ``models:/NAME/VERSION`` (or ``models:/NAME@alias``) as a local model folder, for the project's
    loader; ``into``: the folder to download into (None: a new temporary folder, the caller's to remove)."""
    tracking = cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not tracking:
        raise TrackingError(f"--model {uri}: set tracking.mlflow_uri (or MLFLOW_TRACKING_URI) to the registry's store")
    preflight(tracking)
    mlflow = _mlflow()
    from mlflow.exceptions import MlflowException

    into = Path(into) if into is not None else Path(tempfile.mkdtemp(prefix="alchemetric-registry-"))
    # the version looked up with a client of this store (no process-wide registry URI is set), then
    # its source (``runs:/<run>/model``) downloaded from the same store
    client = mlflow.MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # our own lines only, on a terminal or not
    try:
        version = _lookup_version(client, uri)
        local = mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(into),
                                                    tracking_uri=tracking)
    except MlflowException as exc:
        raise TrackingError(f"--model {uri}: {str(exc).splitlines()[0][:300]}") from None
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
    # what the copy is a version of: its signals and reports name it (signals/predict.py:model_id)
    name, which, by_alias = _model_uri_parts(uri)
    import json

    (Path(local) / REGISTERED).write_text(json.dumps({"uri": uri, "name": name, "version": str(version.version),
                                                      "alias": which if by_alias else None}))
    return Path(local)
