"""`alchemetric-ray <command>`: parse -> config -> one library call. No logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
import typing
from pathlib import Path
from typing import Callable, Sequence

from alchemetric_ray import console, interrupts
from alchemetric_ray.config import (
    REFERENCE_DOC,
    DeviceName,
    PrecisionMode,
    RunConfig,
    load_config,
    sections,
)
from alchemetric_ray.errors import Interrupted, UserError
from alchemetric_ray.scoring.objective import selection_metric

MODEL_NAMES = "{model names}"  # in a help text: the registered models, looked up only when help is printed

AddArgs = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace, RunConfig], int]
COMMANDS: dict[str, tuple[str, AddArgs, Handler]] = {}


def command(name: str, help_text: str, add_args: AddArgs = lambda p: None):
    def register(fn: Handler):
        COMMANDS[name] = (help_text, add_args, fn)
        return fn

    return register


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config: YAML file, then the CLI's named flags, then ``key=value`` overrides."""
    flags = []
    if getattr(args, "data", None):
        flags += [f"data.path={args.data}", "data.source=files"]
    if getattr(args, "device", None):
        flags.append(f"device.name={args.device}")
    if getattr(args, "precision", None):
        flags.append(f"precision.mode={args.precision}")
    return load_config(args.config, [*flags, *args.overrides])


# ---- commands ------------------------------------------------------------------------------


def _env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


@command("env", "versions, devices, CPU flags, and the device/precision a run would choose", _env_args)
def _env(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.hardware.report import environment_report, format_report
    from alchemetric_ray.models import model_spec

    report = environment_report(cfg.device.name, cfg.precision.mode, model_spec(cfg.model), cfg.precision.tf32)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
    return 2 if report.refused else 0


def _features_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data",
                   help="folder (or file) of daily OHLCV; default: the packaged stocknet prices (data.source)")
    p.add_argument("--out", required=True, help="output folder for the Parquet shards and manifest.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


@command("features", "market data -> labelled, normalized Parquet feature shards + manifest", _features_args)
def _features(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.data.shards import build_shards

    summary = build_shards(cfg, args.out, progress=not args.quiet)
    manifest = summary.manifest
    print(f"wrote {args.out}: {len(manifest.tickers)} tickers, {len(manifest.features)} features, "
          f"rows train/val/test = {manifest.rows['train']}/{manifest.rows['val']}/{manifest.rows['test']} "
          f"in {summary.seconds:.1f}s")
    for line in manifest.notes():
        print(line)
    return 0


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="OHLCV folder/file, or a feature-shard folder; "
                                  "default: the packaged stocknet prices (data.source)")
    p.add_argument("--model", dest="model_name", help=f"{MODEL_NAMES} (overrides model.name)")
    p.add_argument("--workers", type=int, help="number of Ray Train workers (overrides scaling.workers)")
    p.add_argument("--resume", action="store_true", help="continue the latest run of this name from its checkpoint")
    p.add_argument("--evaluate", action="store_true",
                   help="then score the saved model on its test segment against the baselines "
                        "(report in the model folder)")


@command("train", "train a model with Ray Train and export the best checkpoint", _train_args)
def _train(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.training.trainer import run_training

    extra = []
    if args.model_name:
        extra.append(f"model.name={args.model_name}")
    if args.workers is not None:
        extra.append(f"scaling.workers={args.workers}")
    if args.resume:
        extra.append("storage.resume=true")
    if extra:
        cfg = cfg.replace(*extra)
    outcome = run_training(cfg)
    best = outcome.summary.best
    stopped = ", stopped early" if outcome.summary.stopped_early else ""
    config = typing.cast(RunConfig, outcome.config)  # cast: run_training always sets the run's config
    metric = selection_metric(config)
    print(f"run {outcome.run_name}: {outcome.summary.epochs_run} epoch(s), best {metric} "
          f"{best if best is None else round(best, 4)}{stopped} in {outcome.seconds:.0f}s")
    if outcome.model_dir:
        print(f"saved model: {outcome.model_dir} (model card: {outcome.model_dir / 'model_card.md'})")
    if args.evaluate and outcome.model_dir:
        _evaluate_export(outcome.model_dir, args.data, config, outcome.log)
    if outcome.tensorboard:
        print(f"TensorBoard: tensorboard --logdir {outcome.tensorboard}")
    if outcome.log.run_id:
        version = f", model version {cfg.storage.name}/{outcome.log.version}" if outcome.log.version else ""
        print(f"MLflow: run {outcome.log.run_id} in experiment {outcome.log.experiment}{version} "
              f"({cfg.tracking.mlflow_uri})")
    return 0


def _evaluate_export(model_dir, data: str | None, cfg: RunConfig, log) -> None:
    """``--evaluate`` after an export: the model on its test segment against the baselines, the report
    in the model folder, the verdict printed and, with tracking on, logged into the model version's
    run and tagged on the version."""
    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.signals.report import verdict_table

    report_dir = model_dir / "evaluation"
    print(f"evaluating {cfg.model.name} on the held-back test segment against the baselines ...", flush=True)
    try:
        result = evaluate(model_dir, data, report_dir, cfg)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while evaluating; the model is saved in {model_dir}", resumable=False,
                          remedy=f"evaluate it with: alchemetric-ray evaluate --model {model_dir} "
                                 f"--out {report_dir}") from None
    print(verdict_table(result))
    print(f"report: {report_dir / 'report.md'} (equity curves: {report_dir / 'equity.png'})")
    log.log_evaluation(report_dir, result)
    log.finalize()


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="OHLCV folder/file, or a feature-shard folder; "
                                  "default: the packaged stocknet prices (data.source)")
    p.add_argument("--resume", action="store_true",
                   help="resume the latest sweep of this name (finished trials are kept)")
    p.add_argument("--evaluate", action="store_true",
                   help="then score the exported best trial on its test segment against the baselines (report in "
                        "the model folder, the verdict tagged on its MLflow version; a look, recorded in the model "
                        "folder); without it the test segment stays sealed")


@command("tune", "sweep hyperparameters with Ray Tune (ASHA), report, and export the best trial", _tune_args)
def _tune(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.sweeps.sweep import run_sweep

    if args.resume:
        cfg = cfg.replace("storage.resume=true")
    out = run_sweep(cfg)
    summary = out.summary
    early = sum(1 for trial in summary.trials if trial.stopped_early)
    print(f"sweep {out.name}: {summary.num_trials} configurations tried, {early} stopped early; "
          f"best trial {summary.best_trial_id} (by its best epoch's {summary.metric}, {summary.mode}) "
          f"{summary.metric} {summary.best_value:.4f} with {summary.best_config}")
    test = summary.test_metrics or {}
    # the chosen trial's target decides what its test split reports (classes, or a cross-sectional score)
    scored = [(name, test[name]) for name in ("balanced_accuracy", "rank_ic", "ic") if name in test]
    if scored:
        print("best trial on the test split (a look, recorded in the model folder): "
              + ", ".join(f"{name.replace('_', ' ')} {value:.4f}" for name, value in scored))
    elif out.model_dir and not args.evaluate:
        print("test segment sealed: not scored (tune --evaluate, or alchemetric-ray evaluate, scores it; "
              "each look is recorded)")
    if out.model_dir:
        print(f"saved model: {out.model_dir}")
    if out.report:
        print(f"report: {out.report}")
    if args.evaluate and out.model_dir:
        saved = load_model_config(out.model_dir).replace(f"device.name={cfg.device.name}")
        _evaluate_export(out.model_dir, args.data, saved, out.log)
    print(f"TensorBoard: tensorboard --logdir {out.path}")
    if out.log.version:
        print(f"MLflow: model version {out.log.model_name}/{out.log.version} (run {out.log.run_id}, the "
              f"exported trial's) in experiment {out.log.experiment} ({cfg.tracking.mlflow_uri})")
    return 0


def load_model_config(model_dir) -> RunConfig:
    """A saved model's config, read from its folder's config file alone: the weights are loaded once,
    by the command that scores with them."""
    from alchemetric_ray.artifacts.export import CONFIG
    from alchemetric_ray.storage import locate

    return RunConfig.from_dict(json.loads((locate(model_dir) / CONFIG).read_text()))


def _predict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", required=True,
                   help="a saved model folder (models/<name>), or a registered MLflow model: models:/NAME/VERSION "
                        "or models:/NAME@alias (with tracking.mlflow_uri)")
    p.add_argument("--data", help="OHLCV folder/file to score; default: the packaged stocknet prices (data.source)")
    p.add_argument("--out", required=True, help="signals Parquet file to write")


def _model_config(args: argparse.Namespace, loaded) -> RunConfig:
    """The saved model's own config (``loaded``: the model this command loaded), with this command's
    overrides (signals, device) on top.  The device is this command's (``--device``, else auto), never
    the training run's request: a model trained with ``--device cpu`` on a laptop scores on the GPUs of
    the cluster it is submitted to."""
    from alchemetric_ray.data.manifest import reconcile_features, with_shard_features

    saved = with_shard_features(loaded.config, loaded.manifest)
    # a features.* override the model was not trained with is refused, naming both values
    return reconcile_features(saved.replace(f"device.name={args.device or 'auto'}", *args.overrides),
                              loaded.manifest, args.model_dir, model=True)


@command("predict", "score new OHLCV data with a saved model (Ray Data batch inference) -> signals.parquet",
         _predict_args)
def _predict(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.predict import predict

    _download_registered(args, cfg)
    loaded = load_model(args.model_dir)  # the command's one load: predict scores with it
    frame = predict(loaded, args.data, args.out, _model_config(args, loaded))
    longs, shorts = int((frame["position"] > 0).sum()), int((frame["position"] < 0).sum())
    print(f"wrote {args.out}: {len(frame)} signals for {frame['ticker'].nunique()} tickers, "
          f"{frame['date'].min().date()}..{frame['date'].max().date()}; {longs} long, {shorts} short; "
          f"model {frame['model_id'].iloc[0]} on {frame['device'].iloc[0]} {frame['precision'].iloc[0]}")
    return 0


def _download_registered(args: argparse.Namespace, cfg: RunConfig) -> str | None:
    """A ``--model models:/...`` downloaded from the registry, then loaded as any model folder; the URI, or None."""
    uri = args.model_dir
    if not uri.startswith("models:/"):
        return None
    from alchemetric_ray.tracking.mlflow_runs import download_model

    # a copy for this command only, removed when it ends (_run)
    scratch = args.scratch.enter_context(tempfile.TemporaryDirectory(prefix="alchemetric-registry-"))
    args.model_dir = str(download_model(uri, cfg, scratch))
    return uri


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", required=True,
                   help="a saved model folder (models/<name>), or a registered MLflow model: models:/NAME/VERSION "
                        "or models:/NAME@alias (with tracking.mlflow_uri; the report is logged into the version's run "
                        "and the version tagged with the verdict)")
    p.add_argument("--data", help="OHLCV folder/file; default: the packaged stocknet prices (data.source)")
    p.add_argument("--out", required=True,
                   help="report folder (report.md, equity.png, evaluation.json, signals.parquet)")
    p.add_argument("--walk-forward", action="store_true",
                   help="also refit every signals.refit_every trading days and score the pooled out-of-sample "
                        "predictions of the whole history")


@command("evaluate", "the model vs baselines on its test segment: IC, long-short, Sharpe, verdict", _evaluate_args)
def _evaluate(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.signals.walk_forward import PooledWalkForward

    registered = _download_registered(args, cfg)
    loaded = load_model(args.model_dir)  # the command's one load: every step of the evaluation uses it
    result = evaluate(loaded, args.data, args.out, _model_config(args, loaded), pooled=args.walk_forward)
    if result.data:
        window = result.data.window
        print(f"scored window {window.start}..{window.end}: {window.days} days, {window.names} names "
              f"(from the model's test-segment start {window.model_test_start} to the data's last labelled date)")
    if result.baselines_note:
        print(f"baselines: {result.baselines_note}")
    print(result.verdict.line)
    wf = result.walk_forward
    if isinstance(wf, PooledWalkForward):
        seg, days = wf.pooled.segment, wf.pooled.deep_model.rank_ic.n_days
        print(f"walk-forward, pooled out of sample {seg.start}..{seg.end} ({days} days, "
              f"{wf.refits} refits every {wf.refit_every} days, {wf.seconds:.0f} s): "
              f"{wf.pooled.verdict.line}")
    print(f"report: {args.out}/report.md")
    if registered:
        from alchemetric_ray.storage import locate
        from alchemetric_ray.tracking.mlflow_runs import registered_version

        tracker = registered_version(registered, cfg)
        tracker.log_evaluation(locate(args.out), result)
        # this look at the test segment goes back beside the version's model: the next download counts it
        tracker.log_artifacts(Path(args.model_dir) / "looks", "model/looks")
        if tracker.finalize() is None:
            print(f"MLflow: evaluation logged into run {tracker.run_id}; model version "
                  f"{tracker.model_name}/{tracker.version} tagged with its verdict")
    return 0


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", help="a saved model folder: also certify its decisions per backend")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="shorter speed ladder and mixed-precision run")


@command("doctor", "verify a model on each device/precision here and recommend one (exit 0 if it passes)",
         _doctor_args)
def _doctor(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray.checks.report import format_report
    from alchemetric_ray.checks.run import run_doctor

    report = run_doctor(cfg, device=args.device, model_dir=args.model_dir, quick=args.quick)
    print(json.dumps(report.as_dict(), indent=2, default=str) if args.json else format_report(report))
    return report.verdict.exit_code


# ---- entry point ---------------------------------------------------------------------------


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Fills in the registered model names when help is printed, so parsing never imports torch; the
    description and epilog keep their line breaks (the list of config sections)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and MODEL_NAMES in text:
            from alchemetric_ray.models import MODELS

            text = text.replace(MODEL_NAMES, " | ".join(MODELS))
        return text


def config_epilog() -> str:
    """The config's sections, one a line, and where every key is described: the epilog of every --help."""
    listed = sections()
    width = max(len(name) for name, _ in listed)
    lines = ["config: --config FILE (YAML: section -> key -> value), then section.key=value overrides. Sections:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in listed]
    lines.append(f"Every key with its type, default, allowed values and meaning: {REFERENCE_DOC}")
    lines.append("(or print it: python -m alchemetric_ray.config_reference)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    epilog = config_epilog()
    parser = argparse.ArgumentParser(prog="alchemetric-ray", description="Train financial deep-learning models on Ray.",
                                     epilog=epilog, formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_args, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog, formatter_class=_HelpFormatter)
        p.add_argument("--config", help="YAML run config")
        p.add_argument("--device", help=f"{DeviceName.expected()} (overrides device.name)")
        p.add_argument("--precision", help=f"{' | '.join(typing.get_args(PrecisionMode))} (overrides precision.mode)")
        p.add_argument("--verbose", action="store_true",
                       help=f"print Ray's own logs and progress bars too (or set {console.VERBOSE_ENV}=1)")
        add_args(p)
        p.add_argument("overrides", nargs="*", metavar="section.key=value",
                       help=f"config overrides, e.g. train.lr=0.001 (the keys: {REFERENCE_DOC})")
    return parser


OVERRIDE = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_][\w.]*=")  # section.key=value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with ``section.key=value`` overrides anywhere in it: argparse takes the
    positionals in one run, so an override after an option that follows another override is handed
    back as unknown; each such ``key=value`` joins the overrides, in order, and anything else is the
    usual "unrecognized arguments" error."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    stray = [arg for arg in rest if not OVERRIDE.match(arg)]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = [*args.overrides, *rest]
    return args


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """The command line; ``exiting``: the process exits next (:func:`run`), so SIGINT and the stop
    signals stay ignored after it rather than handed back to the caller's handlers."""
    args = parse_args(argv)
    console.set_verbose(args.verbose)
    console.plain_output()
    logging.basicConfig(level=logging.INFO if console.verbose() else logging.WARNING, format="%(message)s")
    ray_before = _ray_running()
    # No C++ signal handler of Ray's in this process: it turns a SIGTERM into a crash dump, and
    # ray.shutdown() resets SIGTERM to the default action (a SIGTERM then kills the process mid-way).
    # Python's faulthandler prints a crash's traceback instead.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    if not faulthandler.is_enabled():
        faulthandler.enable()
    # SIGTERM and SIGHUP end a command as Ctrl-C does; once its work is over, a signal changes nothing
    with interrupts.stop_signals_as_ctrl_c(then_ignore=exiting):
        try:
            return _run(args, list(sys.argv[1:] if argv is None else argv))
        finally:
            interrupts.work_done()
            if _ray_running() and not ray_before:  # the Ray this command started: every process of it ended now
                import ray

                ray.shutdown()


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    _, _, fn = COMMANDS[args.command]
    try:
        with contextlib.ExitStack() as args.scratch:  # what a command makes for itself only (a registry download)
            cfg = config_from_args(args)
            return fn(args, cfg)
    except Interrupted as exc:  # Ctrl-C (or SIGTERM, SIGHUP), after the run kept what it finished
        hint = f"; continue with: alchemetric-ray {shlex.join([*argv, *([] if '--resume' in argv else ['--resume'])])}"
        print(f"{_by_signal(str(exc))}{hint if exc.resumable else '; ' + exc.remedy}", file=sys.stderr, flush=True)
        return interrupts.exit_code()
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        # a SIGTERM while ray.init runs: Ray's own handler (in place until init returns) calls sys.exit(15)
        interrupts.received(signal.SIGTERM)
        return _interrupted(args.command)
    except UserError as exc:
        print(f"alchemetric-ray {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _interrupted(command: str) -> int:
    print(f"alchemetric-ray {command}: {_by_signal('interrupted')} before it finished (nothing half-written is left); "
          "run the same command again", file=sys.stderr, flush=True)
    return interrupts.exit_code()


def _by_signal(message: str) -> str:
    """``interrupted ...`` as ``interrupted by SIGTERM ...`` where a stop signal, not a Ctrl-C, ended the run."""
    received = interrupts.stop_signal()
    return message.replace("interrupted", f"interrupted by {received.name}", 1) if received else message


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized())


def run(argv: Sequence[str] | None = None) -> typing.NoReturn:
    """The process's entry point (the console script, ``python -m alchemetric_ray.cli``, ``jobs/*.py``):
    :func:`main`, then exit with its code.  A stop signal that arrives once the command is done (its
    outputs written, its Ray shut down) changes nothing: the exit code stays the command's."""
    sys.exit(main(argv, exiting=True))


if __name__ == "__main__":
    run()
