"""`alchemetric-ray refit --model models:/NAME@champion --data NEW --out DIR`: a nightly refit with a gate.

1. **Append** the new bars to the champion's shard folder (``features --append``): the folder it
   trained on where that is here (its config's ``data.path``), else ``DIR/champion-shards/<id>``,
   built once from the champion's own data and settings.  No bar after the folder's last date: the
   champion stays, nothing is trained (exit 0).
2. **The days to judge on**: the labelled trading days after the champion's test segment, which
   neither model trains on.  Fewer than ``refit.min_days``: the champion stays, nothing is trained.
3. **The challenger**: the champion's config (and the command's overrides), trained on shards of
   the kept bars split so that its test segment is exactly those days (its validation segment the
   same share of the dates before them as the champion's, an embargo between), in
   ``DIR/refits/<stamp>/``; ``refit.warm_start`` starts it from the champion's weights,
   ``refit.sweep`` finds it with a sweep.  With tracking on it is logged and registered as a
   version of the champion's registered model, as ``train`` does.
4. **Both scored on those days** against the same labels, and :func:`~alchemetric_ray.refits.gate.gate`
   decides (``refit.walk_forward`` adds the pooled walk-forward of both configs).
5. **Promote or keep**: the decision and its figures as tags on both versions, in ``decision.json``
   and the challenger's model card; where the gate passed, ``champion`` moves to the challenger
   (``tracking/registry.py``: the old one becomes ``previous``).
6. **The day's signals** from whichever model is champion now: ``signals.parquet``, the rows of the
   new bars' dates (its ``model_id`` names the registered version).

``DIR/state.json`` records how far the refit got.  Killed before the decision, the next refit
redoes it (the bars are already appended); killed after it, the next refit completes it (the
promotion is idempotent) before anything else.  ``DIR/refit.lock`` keeps a second refit of the
same folder from starting while one runs (a lock left by a killed process, whose pid is gone, is
taken over).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import RefitError, UserError
from alchemetric_ray.fsutil import atomic_write_json, atomic_write_text, is_uri
from alchemetric_ray.refits.gate import Comparison, GateResult, gate
from alchemetric_ray.storage import local_copy

LOCK, STATE, DECISION, SIGNALS = "refit.lock", "state.json", "decision.json", "signals.parquet"
JUDGED = "champion-signals.parquet"  # the champion's predictions over the kept bars, made to judge it
SCRATCH = ".scratch"  # DIR/.scratch: what a refit downloads or computes on the side while it runs


@dataclass
class RefitOutcome:
    """What a refit did: ``decision`` is ``promoted``, ``kept`` (the gate failed, or nothing to judge) or
    ``completed`` (an interrupted refit's promotion finished); ``line()`` is the command's last line."""

    model: str
    decision: str
    reason: str
    champion: str | None = None  # the champion it started from (models:/NAME/VERSION or a folder)
    challenger: str | None = None  # the challenger (a version or its model folder), where one was trained
    now_champion: str | None = None  # the champion after the refit
    appended: str | None = None  # the append's line
    window: dict[str, Any] | None = None  # the judged days: start, end, days
    gate: GateResult | None = None
    folder: str | None = None  # DIR/refits/<stamp>
    signals: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.decision == "promoted":
            return f"promoted {self.challenger} over {self.champion}: {self.reason}"
        if self.decision == "completed":
            return f"completed the interrupted refit: {self.reason}"
        return f"kept {self.champion}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "decision": self.decision, "reason": self.reason, "champion": self.champion,
                "challenger": self.challenger, "now_champion": self.now_champion, "appended": self.appended,
                "window": self.window, "gate": self.gate.as_dict() if self.gate else None, "folder": self.folder,
                "signals": self.signals, "seconds": round(self.seconds, 1), "notes": self.notes, "line": self.line()}


# ---- the champion -------------------------------------------------------------------------------


@dataclass
class _Champion:
    loaded: Any  # artifacts.export.LoadedModel
    uri: str  # what --model named
    name: str | None  # the registered model, or None for a model folder
    version: str | None

    @property
    def id(self) -> str:
        return f"models:/{self.name}/{self.version}" if self.name else str(self.loaded.path)

    @property
    def test_end(self) -> str:
        return str(self.loaded.manifest.splits["test_end"])


def _store(cfg: RunConfig) -> str:
    return cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")


def _registry(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the registry's store named (``tracking.mlflow_uri``, else MLFLOW_TRACKING_URI)."""
    return cfg.replace(f"tracking.mlflow_uri={_store(cfg)}")


def _load_champion(model: str, cfg: RunConfig, scratch: contextlib.ExitStack, out: Path) -> _Champion:
    """The champion ``model`` names; one from the registry is downloaded into ``out``'s scratch folder."""
    from alchemetric_ray.artifacts.export import load_model

    if not model.startswith("models:/"):
        return _Champion(load_model(model), model, None, None)
    from alchemetric_ray.tracking.mlflow_runs import download_model

    where = download_model(model, cfg, Path(scratch.enter_context(tempfile.TemporaryDirectory(
        prefix="champion-", dir=_scratch_dir(out)))))
    registered = json.loads((where / "registered.json").read_text())
    return _Champion(load_model(where), model, registered["name"], registered["version"])


# ---- the lock and the state ---------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _scratch_dir(out: Path) -> Path:
    return out / SCRATCH


@contextlib.contextmanager
def _scratch(out: Path) -> Iterator[None]:
    """``DIR/.scratch`` while the refit runs (it holds the lock): the champion downloaded from the registry,
    the walk-forward's folders; removed at the end.  One that a killed refit (SIGKILL: no clean-up runs)
    left is removed by the next refit before it starts, not left to pile up in the machine's /tmp.  It
    carries the product's mark; a ``.scratch`` without it is not ours to remove, and is refused."""
    import shutil

    from alchemetric_ray.outputs import MARK, kind_of, mark_bytes
    from alchemetric_ray.storage import locate

    where = _scratch_dir(out)
    if where.exists() or where.is_symlink():
        if where.is_symlink() or not where.is_dir() or kind_of(locate(where)) != "refit-scratch":
            raise RefitError(f"--out {out}: {where} was not made by a refit (no mark of ours in it); move it away, "
                             "a refit keeps its scratch files there")
        shutil.rmtree(where)
    where.mkdir()
    (where / MARK).write_bytes(mark_bytes("refit-scratch"))
    try:
        yield
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def _lock(out: Path, model: str) -> Iterator[None]:
    """``DIR/refit.lock``, created exclusively; a second refit refuses in one line while the holder lives."""
    path = out / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(), "model": model,
          "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text())
            except (OSError, ValueError):
                holder = {}
            if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
                print(f"refit: taking over the lock of a refit that ended without removing it (pid {holder['pid']}, "
                      f"since {holder.get('since')})", flush=True)
                path.unlink(missing_ok=True)
                continue
            raise RefitError(f"another refit of {holder.get('model', 'a model')} is running in {out} (pid "
                             f"{holder.get('pid')} on {holder.get('host')} since {holder.get('since')}; lock "
                             f"{path}): nothing done") from None
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _read_state(out: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((out / STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RefitError(f"{out / STATE} is not readable ({type(exc).__name__}); move it away to start "
                         "afresh") from None
    return state if isinstance(state, dict) else None


def _write_state(out: Path, state: dict[str, Any]) -> None:
    atomic_write_json(out / STATE, state)


# ---- the days, the challenger's split ------------------------------------------------------------


def _calendar(shards: Path) -> np.ndarray:
    """Every date of the kept bars (``shards/bars``), sorted."""
    from alchemetric_ray.data.bars_store import BARS_DIR

    dates = [pq.read_table(p, columns=["date"]).column("date").to_numpy() for p in sorted((shards / BARS_DIR)
                                                                                         .glob("*.parquet"))]
    return np.unique(np.concatenate(dates).astype("datetime64[D]")) if dates else np.zeros(0, "datetime64[D]")


def _bars_file(shards: Path, folder: Path) -> str:
    """The kept bars (``shards/bars``: a part per build group and append) as one long Parquet file in
    ``folder``: what the challenger's shards are built from and both models score."""
    import pyarrow as pa

    from alchemetric_ray.data.bars_store import BARS_DIR

    path = folder / "bars.parquet"
    if not path.is_file():
        table = pa.concat_tables([pq.read_table(p) for p in sorted((shards / BARS_DIR).glob("*.parquet"))])
        tmp = path.with_name(".bars.parquet.tmp")
        pq.write_table(table.sort_by([("ticker", "ascending"), ("date", "ascending")]), tmp)
        os.replace(tmp, path)
    return str(path)


def _day(value: Any) -> str:
    return str(np.datetime64(value, "D"))


def _window(champion: _Champion, manifest: Any, calendar: np.ndarray) -> dict[str, Any]:
    """The labelled days after the champion's test segment: the first, the last, how many."""
    last = np.datetime64(manifest.splits["test_end"], "D")  # the shards' last labelled date, after the append
    days = calendar[(calendar > np.datetime64(champion.test_end, "D")) & (calendar <= last)]
    return {"start": _day(days[0]) if len(days) else None, "end": _day(days[-1]) if len(days) else None,
            "days": int(len(days))}


def _split(champion: _Champion, calendar: np.ndarray, start: str) -> tuple[str, str]:
    """``features.train_end``/``val_end`` for a challenger whose test segment starts at ``start``:
    validation the champion's share of the dates before it, an embargo before each boundary."""
    from alchemetric_ray.data.splits import SplitPlan, boundaries

    fc, embargo = champion.loaded.config.features, int(champion.loaded.manifest.splits["embargo"])
    test_lo = int(np.searchsorted(calendar, np.datetime64(start, "D")))
    train_n = test_lo - embargo
    val_lo = int(round(train_n * (1 - fc.val_frac / (fc.train_frac + fc.val_frac))))
    if val_lo - embargo < 1 or test_lo - embargo - 1 < val_lo:
        raise RefitError(f"{test_lo} trading dates before {start} cannot hold a train and a validation "
                         f"segment with an embargo of {embargo}")
    plan = SplitPlan(train_start=_day(calendar[0]), train_end=_day(calendar[val_lo - embargo - 1]),
                     val_start=_day(calendar[val_lo]), val_end=_day(calendar[test_lo - embargo - 1]),
                     test_start=_day(calendar[test_lo]), test_end=_day(calendar[-1]), embargo=embargo)
    return boundaries(calendar, plan)


# ---- the steps ----------------------------------------------------------------------------------


def _champion_shards(champion: _Champion, out: Path) -> Path:
    """The shard folder the champion trained on where it is here, else one built once from its data."""
    from alchemetric_ray.data.manifest import MANIFEST
    from alchemetric_ray.data.shards import build_shards

    own = champion.loaded.config.data.path
    if own and not is_uri(own) and (Path(own) / MANIFEST).is_file():
        return Path(own)
    key = f"{champion.name}-{champion.version}" if champion.name else Path(str(champion.loaded.path)).name
    folder = out / "champion-shards" / key
    if not (folder / MANIFEST).is_file():
        print(f"refit: the champion's shard folder is not here; building it from its own data "
              f"({own or champion.loaded.config.data.source}) into {folder}", flush=True)
        build_shards(champion.loaded.config, folder)
    return folder


def _train_challenger(champion: _Champion, shards: Path, folder: Path, cfg: RunConfig, overrides: list[str],
                      start: str) -> Any:
    """Shards of the kept bars split for the challenger, then its run (or sweep); the run's outcome."""
    from alchemetric_ray.data.shards import build_shards

    train_end, val_end = _split(champion, _calendar(shards), start)
    name = champion.name or champion.loaded.config.storage.name
    settings = [*overrides, f"data.path={_bars_file(shards, folder)}", "data.source=files",
                f"features.train_end={train_end}", f"features.val_end={val_end}", f"storage.path={folder / 'results'}",
                f"storage.models_dir={folder / 'models'}", f"storage.name={name}", "storage.run=null",
                "storage.resume=false", f"tracking.mlflow_uri={json.dumps(_store(cfg) if champion.name else '')}",
                f"tracking.experiment={json.dumps(cfg.tracking.experiment)}", f"device.name={cfg.device.name}",
                *([f"train.init_weights={champion.loaded.path}"] if cfg.refit.warm_start else [])]
    challenger_cfg = champion.loaded.config.replace(*settings)
    build_shards(challenger_cfg, folder / "shards")
    challenger_cfg = challenger_cfg.replace(f"data.path={folder / 'shards'}")
    print(f"refit: training the challenger on {train_end} and before (validation through {val_end}), its test "
          f"segment the days judged{' (warm start from the champion)' if cfg.refit.warm_start else ''}", flush=True)
    if cfg.refit.sweep:
        from alchemetric_ray.sweeps.sweep import run_sweep

        return run_sweep(challenger_cfg, progress=False)
    from alchemetric_ray.training.trainer import run_training

    return run_training(challenger_cfg, progress=False)


def _scored(loaded: Any, bars: str, window: dict[str, Any], cfg: RunConfig, where: Path) -> Any:
    """The model's row (rank IC, the book and its Sharpe ratios) on the judged days."""
    from alchemetric_ray.signals.evaluate import evaluate_signals
    from alchemetric_ray.signals.predict import inputs_frame, predict

    score_cfg = loaded.config.replace(f"device.name={cfg.device.name}")
    signals = predict(loaded, bars, where, score_cfg)
    inputs = inputs_frame(loaded, bars)
    return evaluate_signals(signals, inputs, loaded.manifest, score_cfg,
                            segment=(window["start"], window["end"])).deep_model


def _pooled(loaded: Any, bars: str, cfg: RunConfig, tmp: Path) -> Any:
    from alchemetric_ray.signals.walk_forward import pooled_walk_forward

    return pooled_walk_forward(loaded.config.replace(f"device.name={cfg.device.name}"), bars, loaded, tmp).pooled


def _judge(champion: _Champion, challenger: Any, shards: Path, window: dict[str, Any], cfg: RunConfig,
           folder: Path) -> GateResult:
    bars = _bars_file(shards, folder)
    mine = _scored(champion.loaded, bars, window, cfg, folder / JUDGED)
    theirs = _scored(challenger, bars, window, cfg, folder / "challenger-signals.parquet")
    comparisons = [Comparison.of("the days after the champion's test segment", window["start"], window["end"],
                                 mine.rank_ic, theirs.rank_ic)]
    if cfg.refit.walk_forward:
        with tempfile.TemporaryDirectory(prefix="walk-forward-", dir=_scratch_dir(folder.parent.parent)) as tmp:
            a, b = _pooled(champion.loaded, bars, cfg, Path(tmp) / "a"), _pooled(challenger, bars, cfg,
                                                                                 Path(tmp) / "b")
        comparisons.append(Comparison.of("the pooled walk-forward", a.segment.start, a.segment.end,
                                         a.rows[0].rank_ic, b.rows[0].rank_ic))
    return gate(comparisons, mine, theirs, cfg.refit)


def _record(champion: _Champion, challenger: dict[str, Any], result: GateResult, folder: Path, cfg: RunConfig,
            log: Any) -> None:
    """The decision in ``decision.json``, the challenger's model card and, with a registry, as tags on both
    versions and the challenger's card logged into its run."""
    decision = "promoted" if result.passed else "kept"
    record = {"champion": champion.id, "challenger": challenger, "decision": decision, "gate": result.as_dict()}
    atomic_write_json(folder / DECISION, record)
    card = Path(challenger["model_dir"]) / "model_card.md"
    if card.is_file():
        atomic_write_text(card, card.read_text() + _card_section(champion, result))
    if not champion.name or not challenger.get("version"):
        return
    client = _tag(champion, cfg, {"refit.challenger": challenger["version"], "refit.challenger_decision": decision})
    _tag(champion, cfg, {"refit.decision": decision, "refit.champion": str(champion.version),
                         "refit.reason": result.reason(), "refit.gate": json.dumps(result.as_dict())},
         version=challenger["version"])
    if getattr(log, "run_id", None) and card.is_file():
        client.log_artifact(log.run_id, str(card), "model")  # the registered version's card, with its decision
        client.log_artifact(log.run_id, str(folder / DECISION), "refit")


def _tag(champion: _Champion, cfg: RunConfig, tags: dict[str, str], version: str | None = None) -> Any:
    """Tags on a version of the champion's registered model (the champion's own by default); the client."""
    if not champion.name:
        return None
    from alchemetric_ray.tracking.registry import client_of

    client = client_of(_registry(cfg), "refit")
    for key, value in tags.items():
        client.set_model_version_tag(champion.name, str(version or champion.version), key, str(value)[:5000])
    return client


def _card_section(champion: _Champion, result: GateResult) -> str:
    lines = ["", "## Refit decision", "",
             f"Challenger of {champion.id}: **{'promoted' if result.passed else 'kept out'}** by the gate "
             f"(margin {result.margin:g}, max deflated-Sharpe drop {result.max_dsr_drop:g}).", ""]
    return "\n".join([*lines, *[f"- {reason}" for reason in result.reasons], ""])


def _promote(champion: _Champion, challenger: dict[str, Any], reason: str, cfg: RunConfig) -> str:
    """``champion`` moved to the challenger's version (idempotent); the new champion's id."""
    if not champion.name:
        return str(challenger["model_dir"])
    from alchemetric_ray.tracking.registry import promote

    uri = f"models:/{champion.name}/{challenger['version']}"
    print(promote(uri, _registry(cfg), reason=f"refit: {reason}").line(), flush=True)
    return uri


def _signals(now_champion: str, champion: _Champion, shards: Path, first_new: str | None, folder: Path,
             cfg: RunConfig) -> str:
    """``signals.parquet``: the champion's (now) signals on the new bars' dates, its model id inside.  A
    champion that stays predicted these bars when it was judged (``champion-signals.parquet``, the same
    model and bars): those rows are taken, not predicted again."""
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.predict import predict

    out, source = folder / SIGNALS, folder / JUDGED
    if now_champion != champion.id or not source.is_file():
        with contextlib.ExitStack() as scratch:
            loaded = champion.loaded if now_champion == champion.id else None
            if loaded is None:
                loaded = (_load_champion(f"models:/{champion.name}@champion", cfg, scratch, folder.parent.parent).loaded
                          if champion.name
                          else load_model(now_champion))
            predict(loaded, _bars_file(shards, folder), out, loaded.config.replace(f"device.name={cfg.device.name}"))
        source = out
    if first_new or source != out:
        import pyarrow.compute as pc

        table = pq.read_table(source)
        if first_new:
            table = table.filter(pc.greater_equal(table.column("date"), np.datetime64(first_new, "ns")))
        tmp = out.with_name(f".{SIGNALS}.tmp")
        pq.write_table(table, tmp)  # the schema's metadata (the model id, the config) travels with the table
        os.replace(tmp, out)
    return str(out)


# ---- the refit ----------------------------------------------------------------------------------


def run_refit(model: str, data: str, out: str | Path, cfg: RunConfig, *, overrides: list[str] | None = None
              ) -> RefitOutcome:
    """The refit the module docstring describes; ``cfg``: the command's config (``refit.*``, the registry,
    the device), ``overrides``: what the challenger changes of the champion's config."""
    from alchemetric_ray.data.append import append_bars

    started = time.monotonic()
    if is_uri(str(out)):
        raise RefitError(f"--out {out}: a local folder (it keeps the lock, the state and each refit's "
                         "shards and runs)")
    out = Path(out)
    if model.startswith("models:/"):  # the registry is checked before anything is read, appended or trained
        from alchemetric_ray.tracking.registry import client_of

        client_of(_registry(cfg), "refit")
    out.mkdir(parents=True, exist_ok=True)
    with _lock(out, model), _scratch(out), contextlib.ExitStack() as scratch:
        champion = _load_champion(model, cfg, scratch, out)
        state = _read_state(out)
        if state and state.get("champion") != champion.id and not _moved_to_challenger(state, champion):
            print(f"refit: {out / STATE} was about {state.get('champion')}, not the champion {champion.id}: set "
                  "aside", flush=True)
            state = None
        if state and state.get("decision"):
            return _complete(champion, state, out, cfg, started)
        shards = _champion_shards(champion, out)
        bars = str(scratch.enter_context(local_copy(data))) if is_uri(data) else data  # s3://...: a local copy
        appended = append_bars(champion.loaded.config.replace(f"data.path={bars}", "data.source=files"), shards)
        print(f"refit: {appended.line}", flush=True)
        outcome = RefitOutcome(model=model, decision="kept", reason="", champion=champion.id,
                               now_champion=champion.id, appended=appended.line)
        if not appended.appended and state is None:
            outcome.reason = f"no new bars in {data}: nothing trained"
            return _done(outcome, started)
        window = _window(champion, appended.manifest, _calendar(shards))
        outcome.window = window
        if window["days"] < cfg.refit.min_days:
            outcome.reason = (f"{window['days']} labelled day(s) after its test segment (through "
                              f"{champion.test_end}), fewer than refit.min_days={cfg.refit.min_days}: nothing trained")
            return _done(outcome, started)
        folder = _new_folder(out / "refits")
        state = {"champion": champion.id, "model": model, "folder": str(folder), "window": window,
                 "first_new": _first_new(appended), "decision": None}
        _write_state(out, state)
        run, step = None, "training"
        try:
            run = _train_challenger(champion, shards, folder, cfg, list(overrides or []), window["start"])
            if run.model_dir is None:
                raise RefitError("its training produced no checkpoint")
            step = "being scored"
            from alchemetric_ray.artifacts.export import load_model

            version = getattr(run.log, "version", None)
            challenger = {"model_dir": str(run.model_dir), "version": str(version) if version else None}
            result = _judge(champion, load_model(run.model_dir), shards, window, cfg, folder)
        except Exception as exc:  # the champion stays; the state stays too: the next refit tries again
            raise _failed(exc, step, champion, cfg, state, run) from None
        _record(champion, challenger, result, folder, cfg, run.log)
        state.update(challenger=challenger, decision="promoted" if result.passed else "kept", reason=result.reason())
        _write_state(out, state)
        run.log.finalize()
        outcome.challenger = (f"models:/{champion.name}/{version}" if champion.name and version
                              else challenger["model_dir"])
        outcome.gate, outcome.folder = result, str(folder)
        return _complete(champion, state, out, cfg, started, outcome)


def _failed(exc: Exception, step: str, champion: _Champion, cfg: RunConfig, state: dict[str, Any],
            run: Any) -> RefitError:
    """A challenger that failed while ``step`` (a NaN loss, a backend's missing kernel, a crash): recorded in
    its folder's ``decision.json``, the state (the next refit tries again) and a tag on the champion's
    version (its own version tagged too, where it was registered); the one line to raise."""
    if not isinstance(exc, UserError):  # a crash: its type and first line (the rest is in the run's logs)
        exc = RefitError(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}")
    folder = Path(state["folder"])  # OUT/refits/STAMP
    atomic_write_json(folder / DECISION, {"champion": champion.id, "decision": "kept", "failure": str(exc),
                                          "while": step})
    _write_state(folder.parent.parent, {**state, "failure": str(exc)})
    _tag(champion, cfg, {"refit.challenger_failure": f"{folder.name}: while {step}: {exc}"})
    version = getattr(getattr(run, "log", None), "version", None)
    if version:
        _tag(champion, cfg, {"refit.decision": "failed", "refit.failure": f"while {step}: {exc}"}, version=version)
    if run is not None:  # trained without a checkpoint, or failed while being scored
        run.log.finalize("FAILED")
    return RefitError(f"the challenger failed while {step} ({exc}); {champion.id} stays champion (its run: {folder})")


def _new_folder(parent: Path) -> Path:
    """``parent/STAMP`` (UTC, to the second), created new: ``STAMP-2``, ``-3``... for a refit started in the
    same second as the one before it (a retry right after a fast failure)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RefitError(f"{parent}: no new folder for {stamp} after 999 tries")


def _moved_to_challenger(state: dict[str, Any], champion: _Champion) -> bool:
    """Whether ``champion`` already names the challenger of a promotion that was cut short (after the
    alias moved, before ``previous`` and the signals): the same refit, to be completed."""
    challenger = state.get("challenger") or {}
    return bool(state.get("decision") == "promoted" and champion.name and
                str(challenger.get("version")) == str(champion.version))


def _first_new(appended: Any) -> str | None:
    entries = getattr(appended.manifest, "appends", None) or []
    last = entries[-1] if entries else None
    return last["bars"]["first_date"] if isinstance(last, dict) and "bars" in last else None


def _complete(champion: _Champion, state: dict[str, Any], out: Path, cfg: RunConfig, started: float,
              outcome: RefitOutcome | None = None) -> RefitOutcome:
    """From a recorded decision on: the promotion (idempotent), the day's signals, the state cleared."""
    resumed = outcome is None
    challenger = state["challenger"]
    outcome = outcome or RefitOutcome(model=state["model"], decision="completed", reason="",
                                      champion=state["champion"],
                                      challenger=(f"models:/{champion.name}/{challenger['version']}"
                                                  if champion.name and challenger.get("version")
                                                  else challenger["model_dir"]),
                                      window=state.get("window"), folder=state["folder"])
    folder = Path(state["folder"])
    promoted = state["decision"] == "promoted"
    outcome.now_champion = _promote(champion, challenger, state["reason"], cfg) if promoted else champion.id
    if resumed:
        outcome.reason = (f"{outcome.challenger} promoted over {state['champion']}" if promoted else
                          f"{outcome.challenger} kept out, {state['champion']} stays") + f" ({state['reason']})"
    else:
        outcome.decision = "promoted" if promoted else "kept"
        outcome.reason = f"the gate {'passed' if promoted else 'failed'} ({state['reason']})"
    shards = _champion_shards(champion, out) if outcome.now_champion == champion.id else \
        Path(folder / "shards")
    outcome.signals = _signals(outcome.now_champion, champion, shards, state.get("first_new"), folder, cfg)
    _clear_state(out)
    return _done(outcome, started)


def _clear_state(out: Path) -> None:
    (out / STATE).unlink(missing_ok=True)


def _done(outcome: RefitOutcome, started: float) -> RefitOutcome:
    outcome.seconds = time.monotonic() - started
    if outcome.gate is not None and not math.isnan(outcome.gate.challenger_dsr):
        outcome.notes.append(f"deflated Sharpe: challenger {outcome.gate.challenger_dsr:.3f}, champion "
                             f"{outcome.gate.champion_dsr:.3f}")
    return outcome
