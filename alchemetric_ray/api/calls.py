"""The public calls: one function per command, each doing all that the command does around the
library call (the registry download, the scoring device, ``--evaluate`` and its MLflow logging, the
saved ``result.json``), so that a script and the command line leave the same files, runs and
versions.  The command line (``cli.py``) parses, calls one of these and prints the result's lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alchemetric_ray.api.guard import api_call
from alchemetric_ray.api.inputs import Overrides, data_path, override_strings
from alchemetric_ray.api.model import Model, as_model, evaluate_with, predict_with
from alchemetric_ray.api.results import RefitResult, Shards, SweepResult, TrainResult
from alchemetric_ray.api.saving import save_result
from alchemetric_ray.config import RunConfig
from alchemetric_ray.config import load_config as _load_config
from alchemetric_ray.errors import Interrupted, InterruptedBeforeDone

if TYPE_CHECKING:
    import pandas as pd

    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.tracking.registry import Promotion



def load_config(path: str | Path | None = None, *overrides: str | Mapping[str, Any]) -> RunConfig:
    """The run config: the defaults, then the YAML file ``path`` (if any), then the overrides, each a
    ``"section.key=value"`` string (as on the command line) or a dict (``{"train.lr": 1e-3}`` or
    ``{"train": {"lr": 1e-3}}``); validated, a wrong key or value raises :class:`ConfigError`."""
    strings: list[str] = []
    for item in overrides:
        strings += override_strings(item) if isinstance(item, Mapping) else [item]
    return _load_config(path, strings)


def _config(cfg: RunConfig | None, data: Any, scratch: contextlib.ExitStack, *extra: str) -> RunConfig:
    cfg = cfg or _load_config()
    flags = [*data_overrides(data, scratch), *extra]
    return cfg.replace(*flags) if flags else cfg


def data_overrides(data: Any, scratch: contextlib.ExitStack) -> list[str]:
    """``data``: None (the config's source), a path or URI (as ``--data``), or a pandas DataFrame of bars,
    written to a Parquet file that ingest validates as any file (removed after the call)."""
    path = data_path(data, scratch)
    return [f"data.path={path}", "data.source=files"] if path else []


@contextlib.contextmanager
def _call(name: str) -> Iterator[contextlib.ExitStack]:
    with api_call(name), contextlib.ExitStack() as scratch:
        yield scratch


def features(cfg: RunConfig | None = None, *, data: Any = None, out: str | Path, progress: bool | None = None,
             append: bool = False, rebuild: bool = False) -> Shards:
    """Market data -> labelled, normalized Parquet feature shards and their manifest in ``out``.
    ``append``: add ``data``'s bars after the last date of the shards already in ``out`` (a local folder),
    computing only the rows that change, with the shards' own settings; ``result.notes[0]`` says what
    was appended, and where there is nothing new nothing is written.  A new bar that revises a kept
    one is refused, unless ``rebuild`` (with ``append``): ``out`` is then rebuilt from its kept bars
    merged with the new ones."""
    with _call("features") as scratch:
        from alchemetric_ray import console
        from alchemetric_ray.errors import ShardError

        if rebuild and not append:
            raise ShardError("--rebuild goes with --append (it rebuilds a shard folder from its kept bars merged "
                             "with new ones); a build without --append always builds the folder whole")
        cfg = _config(cfg, data, scratch)
        show = console.is_tty() if progress is None else progress
        summary: Any  # a ShardSummary, or an AppendSummary (the same out, manifest and seconds, and its line)
        try:
            if append:
                from alchemetric_ray.data.append import append_bars

                summary = append_bars(cfg, out, rebuild=rebuild, progress=show)
            else:
                from alchemetric_ray.data.shards import build_shards

                summary = build_shards(cfg, out, progress=show)
        except Interrupted:
            raise
        except KeyboardInterrupt:  # a notebook's interrupt: the shards are written whole or not at all
            what = "the append to" if append else "the shards in"
            raise InterruptedBeforeDone(f"interrupted before {what} {out} were written (nothing "
                                        "half-written is left)") from None
        result = Shards.of(summary)
        if append:
            result.notes = [summary.line]
            if not summary.appended:  # nothing new: nothing written, result.json included
                return result
        save_result(summary.out, result)
        return result


@dataclass(frozen=True)
class _Fit:
    """What ``train`` and ``tune`` do differently around the same steps (:func:`_fitted`)."""

    call: str
    run: Callable[[RunConfig], Any]  # the config -> the run's outcome
    result: Any  # its result class: ``.of(outcome, cfg)``
    folder: Callable[[Any], Any]  # the outcome -> where its result.json goes
    scoring: Callable[[Any, Model, RunConfig], RunConfig]  # the config its exported model is evaluated with


def _run_training(cfg: RunConfig) -> Any:
    from alchemetric_ray.training.trainer import run_training

    return run_training(cfg)


def _run_sweep(cfg: RunConfig) -> Any:
    from alchemetric_ray.sweeps.sweep import run_sweep

    return run_sweep(cfg)


TRAIN = _Fit("train", _run_training, TrainResult, lambda outcome: outcome.run_path,
             lambda outcome, model, cfg: outcome.config or cfg)  # the run's config, with the shards' target
TUNE = _Fit("tune", _run_sweep, SweepResult, lambda outcome: outcome.path,
            lambda outcome, model, cfg: model.config.replace(f"device.name={cfg.device.name}"))  # the best trial's


def _fitted(fit: _Fit, cfg: RunConfig | None, data: Any, resume: bool, evaluate: bool) -> Any:
    """Run (an interruption says how to go on from Python), the typed result, the exported model scored on
    its test segment where asked (``evaluate``: loaded once, kept as ``result.model``), result.json last."""
    with _call(fit.call) as scratch:
        cfg = _config(cfg, data, scratch, *(["storage.resume=true"] if resume else []))
        try:
            outcome = fit.run(cfg)
        except Interrupted as exc:
            raise exc.continued_by(f"ar.{fit.call}(cfg, resume=True)") from None
        result = fit.result.of(outcome, cfg)
        if evaluate and outcome.model_dir:
            model = Model.load(str(outcome.model_dir))
            result._model = model
            result.evaluation = _evaluate_export(model, _bars(data, cfg, scratch), fit.scoring(outcome, model, cfg),
                                                 outcome.log)
        save_result(fit.folder(outcome), result)
        return result


def train(cfg: RunConfig | None = None, *, data: Any = None, resume: bool = False,
          evaluate: bool = False) -> TrainResult:
    """Train with Ray Train, export the best checkpoint and (``evaluate``) score the saved model on its
    test segment against the baselines; the run's ``result.json`` is written last."""
    return _fitted(TRAIN, cfg, data, resume, evaluate)


def tune(cfg: RunConfig | None = None, *, data: Any = None, resume: bool = False,
         evaluate: bool = False) -> SweepResult:
    """Sweep hyperparameters with Ray Tune, report, export the best trial and (``evaluate``) score it on
    its test segment; the sweep's ``result.json`` is written last."""
    return _fitted(TUNE, cfg, data, resume, evaluate)


def _bars(data: Any, cfg: RunConfig, scratch: contextlib.ExitStack) -> str | None:
    """What an evaluation after training scores: the bars given, or None (the model's own test segment)
    where the run trained on a feature-shard folder, which holds no bars to score."""
    from alchemetric_ray.training.trainer import given_shards

    return None if given_shards(cfg) is not None else data_path(data, scratch)


def _evaluate_export(model: Model, data: str | None, cfg: RunConfig, log) -> Evaluation:
    """``evaluate=True`` after an export: the model on its test segment against the baselines, the report
    in the model folder, the verdict printed and, with tracking on, logged into the model version's run."""
    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.signals.evaluate import evaluate as run_evaluation
    from alchemetric_ray.signals.report import verdict_table

    report_dir = Path(model.path) / "evaluation"
    print(f"evaluating {cfg.model.name} on the held-back test segment against the baselines ...", flush=True)
    try:
        record = run_evaluation(model.loaded, data, report_dir, cfg)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while evaluating; the model is saved in {model.path}", resumable=False,
                          remedy=f"evaluate it with: alchemetric-ray evaluate --model {model.path} "
                                 f"--out {report_dir}") from None
    print(verdict_table(record))
    print(f"report: {report_dir / 'report.md'} (equity curves: {report_dir / 'equity.png'})")
    log.log_evaluation(report_dir, record)
    log.finalize()
    return Evaluation.from_record(record.as_dict(), report_dir, live=record)


def predict(model: Any, data: Any = None, *, out: str | Path | None = None, overrides: Overrides = (),
            cfg: RunConfig | None = None) -> pd.DataFrame:
    """Score bars with a saved model (``model``: a :class:`Model` or anything :func:`load_model` takes):
    a DataFrame of signals, also written to ``out`` (a Parquet file) when given.  ``overrides``: the
    scoring settings (``signals.*``, ``device.name``) over the model's own; ``cfg``: where the registry is
    (``tracking.mlflow_uri``) for a ``models:/`` URI."""
    with api_call("predict"):
        return predict_with(as_model(model, cfg), data, out=out, overrides=overrides)


def evaluate(model: Any, data: Any = None, *, out: str | Path | None = None, walk_forward: bool = False,
             overrides: Overrides = (), cfg: RunConfig | None = None) -> Evaluation:
    """The model against the baselines on its test segment (or on ``data``'s window): rank IC with its
    interval, the long-short book, the verdict; ``walk_forward`` adds the pooled walk-forward.  The
    report goes to ``out`` (default: the model folder's ``evaluation/``); a registered model's version
    gets the verdict as tags (the registry: ``cfg.tracking.mlflow_uri``)."""
    with api_call("evaluate"):
        return evaluate_with(as_model(model, cfg), data, out=out, walk_forward=walk_forward, overrides=overrides,
                             cfg=cfg)


def promote(model: str, *, reason: str | None = None, cfg: RunConfig | None = None) -> Promotion:
    """Make the registered version ``model`` (``models:/NAME/VERSION``) the ``champion`` of its model,
    the version it replaces ``previous``, the reason recorded as tags on both (the registry:
    ``cfg.tracking.mlflow_uri``); a roll back is the promotion of an older version.  ``predict`` and
    ``evaluate`` of ``models:/NAME@champion`` then use it."""
    with api_call("promote"):
        from alchemetric_ray.tracking.registry import promote as run_promotion

        return run_promotion(str(model), cfg or _load_config(), reason=reason)


def refit(model: str | Path, data: Any = None, *, out: str | Path, overrides: Overrides = (),
          cfg: RunConfig | None = None) -> RefitResult:
    """The nightly refit of ``model`` (``models:/NAME@champion``, or a model folder): ``data``'s new bars
    appended to its shards, a challenger trained with its config (``overrides`` over it), both scored on
    the same days after its test segment, the challenger promoted only where the gate (``refit.*``)
    passes, the day's signals from the champion; ``out``: the refit's folder, kept from night to night
    (its lock, its state, each refit's runs).  ``cfg``: the registry, ``refit.*``, the device."""
    with _call("refit") as scratch:
        from alchemetric_ray.errors import RefitError
        from alchemetric_ray.refits.run import run_refit

        cfg = cfg or _load_config()
        bars = data_path(data, scratch) or cfg.data.path
        if not bars:
            raise RefitError("--data: the new bars (a file, a folder or an s3:// URI) are needed")
        outcome = run_refit(str(model), str(bars), out, cfg, overrides=override_strings(overrides))
        result = RefitResult.of(outcome)
        save_result(outcome.folder or out, result)
        return result


def load_model(where: str | Path | Model, cfg: RunConfig | None = None) -> Model:
    """A saved model: a folder, ``s3://...``, ``models:/NAME/VERSION`` or ``models:/NAME@alias`` (from
    the registry at ``cfg.tracking.mlflow_uri``)."""
    if isinstance(where, Model):
        return where
    with api_call("load_model"):
        return Model.load(where, cfg)


def doctor(cfg: RunConfig | None = None, *, device: str | None = None, model: str | Path | None = None,
           quick: bool = False):
    """Verify the model on each device and precision here (operator coverage, CPU parity, mixed
    precision, speed) and recommend one: a ``DoctorReport`` (``.verdict.exit_code`` 0 when it passes)."""
    with api_call("doctor"):
        from alchemetric_ray.checks.run import run_doctor

        return run_doctor(cfg or _load_config(), device=device, model_dir=None if model is None else str(model),
                          quick=quick)


def env(cfg: RunConfig | None = None):
    """Versions, devices, CPU flags, and the device and precision a run would choose here."""
    with api_call("env"):
        from alchemetric_ray.hardware.report import environment_report
        from alchemetric_ray.models import model_spec

        cfg = cfg or _load_config()
        return environment_report(cfg.device.name, cfg.precision.mode, model_spec(cfg.model), cfg.precision.tf32)
