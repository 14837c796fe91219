"""`alchemetric-ray <command>`: parse -> config -> one call of the Python API (`alchemetric_ray.api`) -> its lines."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import re
import shlex
import signal
import sys
import typing
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
from alchemetric_ray.errors import Interrupted, InterruptedBeforeDone, UserError

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
    from alchemetric_ray import api
    from alchemetric_ray.hardware.report import format_report

    report = api.env(cfg)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
    return 2 if report.refused else 0


def _features_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data",
                   help="folder (or file) of daily OHLCV; default: the packaged stocknet prices (data.source)")
    p.add_argument("--out", required=True, help="output folder for the Parquet shards and manifest.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--append", action="store_true",
                   help="add the bars of --data after the last date of the shards in --out (a local folder built "
                        "by this command), computing only the rows that change; nothing new: nothing written")
    p.add_argument("--rebuild", action="store_true",
                   help="with --append: rebuild --out from its kept bars merged with the new ones (a new bar "
                        "replaces the kept one of its date) instead of appending; what an append that finds "
                        "revised bars asks for")


@command("features", "market data -> labelled, normalized Parquet feature shards + manifest", _features_args)
def _features(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray import api

    shards = api.features(cfg, out=args.out, progress=not args.quiet, append=args.append, rebuild=args.rebuild)
    if args.append:  # one line: what was appended (or that nothing was)
        print(shards.notes[0].replace(shards.where, args.out))
        return 0
    print(shards.line().replace(shards.where, args.out, 1))
    for line in shards.notes:
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
    from alchemetric_ray import api

    extra = []
    if args.model_name:
        extra.append(f"model.name={args.model_name}")
    if args.workers is not None:
        extra.append(f"scaling.workers={args.workers}")
    if extra:
        cfg = cfg.replace(*extra)
    result = api.train(cfg, data=args.data, resume=args.resume, evaluate=args.evaluate)
    for line in result.lines():
        print(line)
    board = result.tensorboard_command()
    if board:
        print(f"TensorBoard: {board}")
    if result.mlflow and result.mlflow.run_id:
        version = f", model version {cfg.storage.name}/{result.mlflow.version}" if result.mlflow.version else ""
        print(f"MLflow: run {result.mlflow.run_id} in experiment {result.mlflow.experiment}{version} "
              f"({cfg.tracking.mlflow_uri})")
    return 0


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
    from alchemetric_ray import api

    result = api.tune(cfg, data=args.data, resume=args.resume, evaluate=args.evaluate)
    trials = result.trials
    early = int(trials["stopped_early"].sum()) if len(trials) else 0
    best = result.best
    print(f"sweep {result.name}: {len(trials)} configurations tried, {early} stopped early; "
          f"best trial {best['trial_id']} (by its best epoch's {result.metric}, {result.mode}) "
          f"{result.metric} {best['value']:.4f} with {best['config']}")
    test = result.test_metrics or {}
    # the chosen trial's target decides what its test split reports (classes, or a cross-sectional score)
    scored = [(name, test[name]) for name in ("balanced_accuracy", "rank_ic", "ic") if name in test]
    if scored:
        print("best trial on the test split (a look, recorded in the model folder): "
              + ", ".join(f"{name.replace('_', ' ')} {value:.4f}" for name, value in scored))
    elif result.model_dir and not args.evaluate:
        print("test segment sealed: not scored (tune --evaluate, or alchemetric-ray evaluate, scores it; "
              "each look is recorded)")
    if result.model_dir:
        print(f"saved model: {result.model_dir}")
    if result.report:
        print(f"report: {result.report}")
    print(f"TensorBoard: tensorboard --logdir {result.path}")
    if result.mlflow and result.mlflow.version:
        print(f"MLflow: model version {result.mlflow.model_name}/{result.mlflow.version} (run "
              f"{result.mlflow.run_id}, the exported trial's) in experiment {result.mlflow.experiment} "
              f"({cfg.tracking.mlflow_uri})")
    return 0


def _predict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", required=True,
                   help="a saved model folder (models/<name>), or a registered MLflow model: models:/NAME/VERSION "
                        "or models:/NAME@alias (with tracking.mlflow_uri)")
    p.add_argument("--data", help="OHLCV folder/file to score; default: the packaged stocknet prices (data.source)")
    p.add_argument("--out", required=True, help="signals Parquet file to write")


@command("predict", "score new OHLCV data with a saved model (Ray Data batch inference) -> signals.parquet",
         _predict_args)
def _predict(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray import api

    with _model(args, cfg) as model:  # the command's one load: predict scores with it
        frame = api.predict(model, args.data, out=args.out, overrides=_scoring_overrides(args))
    longs, shorts = int((frame["position"] > 0).sum()), int((frame["position"] < 0).sum())
    print(f"wrote {args.out}: {len(frame)} signals for {frame['ticker'].nunique()} tickers, "
          f"{frame['date'].min().date()}..{frame['date'].max().date()}; {longs} long, {shorts} short; "
          f"model {frame['model_id'].iloc[0]} on {frame['device'].iloc[0]} {frame['precision'].iloc[0]}")
    return 0


def _model(args: argparse.Namespace, cfg: RunConfig):
    """``--model``: a folder, ``s3://...`` or ``models:/...`` (downloaded for this command only), loaded once."""
    from alchemetric_ray import api

    return api.load_model(args.model_dir, cfg)


def _scoring_overrides(args: argparse.Namespace) -> list[str]:
    """What this command sets over the saved model's own config: the device (``--device``, else auto,
    never the training run's request) and the command's overrides."""
    return [f"device.name={args.device or 'auto'}", *args.overrides]


def _evaluation_lines(record: dict) -> list[str]:
    """``evaluate``'s summary from its record (evaluation.json): the window of new data, the baselines'
    note, the verdict and the pooled walk-forward's."""
    lines = []
    if record.get("data"):
        window = record["data"]["window"]
        lines.append(f"scored window {window['start']}..{window['end']}: {window['days']} days, {window['names']} "
                     f"names (from the model's test-segment start {window['model_test_start']} to the data's last "
                     "labelled date)")
    if record.get("baselines_note"):
        lines.append(f"baselines: {record['baselines_note']}")
    lines.append(record["verdict"]["line"])
    wf = record.get("walk_forward") or {}
    if "pooled" in wf:
        pooled = wf["pooled"]
        seg, days = pooled["segment"], pooled["rows"][0]["rank_ic"]["n_days"]
        lines.append(f"walk-forward, pooled out of sample {seg['start']}..{seg['end']} ({days} days, "
                     f"{wf['refits']} refits every {wf['refit_every']} days, {wf['seconds']:.0f} s): "
                     f"{pooled['verdict']['line']}")
    return lines


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
    from alchemetric_ray import api

    with _model(args, cfg) as model:  # the command's one load: every step of the evaluation uses it
        result = api.evaluate(model, args.data, out=args.out, walk_forward=args.walk_forward,
                              overrides=_scoring_overrides(args), cfg=cfg)
    for line in _evaluation_lines(result.as_dict()):
        print(line)
    print(f"report: {args.out}/report.md")
    if result.mlflow:
        print(f"MLflow: evaluation logged into run {result.mlflow.run_id}; model version "
              f"{result.mlflow.model_name}/{result.mlflow.version} tagged with its verdict")
    return 0


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", help="a saved model folder: also certify its decisions per backend")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="shorter speed ladder and mixed-precision run")


@command("doctor", "verify a model on each device/precision here and recommend one (exit 0 if it passes)",
         _doctor_args)
def _doctor(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray import api
    from alchemetric_ray.checks.report import format_report

    report = api.doctor(cfg, device=args.device, model=args.model_dir, quick=args.quick)
    print(json.dumps(report.as_dict(), indent=2, default=str) if args.json else format_report(report))
    return report.verdict.exit_code


def _promote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", required=True, metavar="MODELS_URI",
                   help="the registered version to make champion: models:/NAME/VERSION (the registry: "
                        "tracking.mlflow_uri or MLFLOW_TRACKING_URI)")
    p.add_argument("--reason", default=None, help="why, recorded as a tag on the versions (default: promoted by hand)")


@command("promote", "make a registered version the champion (the one it replaces becomes previous): promote or roll "
                    "back", _promote_args)
def _promote(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray import api

    print(api.promote(args.model_dir, reason=args.reason, cfg=cfg).line())
    return 0


def _refit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model_dir", required=True,
                   help="the champion: models:/NAME@champion (the registry: tracking.mlflow_uri or "
                        "MLFLOW_TRACKING_URI), or a saved model folder")
    p.add_argument("--data", help="the new OHLCV bars (a file, a folder or an s3:// URI); default: data.path")
    p.add_argument("--out", required=True,
                   help="the refit's folder, kept from night to night: its lock, its state, each refit's shards, runs, "
                        "decision.json and signals.parquet (a local folder)")


@command("refit", "append new bars, train a challenger, promote it only if the gate passes on the same unseen days, "
                  "write the day's signals", _refit_args)
def _refit(args: argparse.Namespace, cfg: RunConfig) -> int:
    from alchemetric_ray import api

    result = api.refit(args.model_dir, args.data, out=args.out, overrides=args.overrides, cfg=cfg)
    for note in result.notes:
        print(f"refit: {note}")
    if result.signals:
        print(f"signals: {result.signals}")
    print(result.line)
    return 0


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
        cfg = config_from_args(args)
        return fn(args, cfg)
    except InterruptedBeforeDone:  # a command that writes its output whole: nothing of it was written
        return _interrupted(args.command)
    except Interrupted as exc:  # Ctrl-C (or SIGTERM, SIGHUP), after the run kept what it finished
        hint = f"; continue with: alchemetric-ray {shlex.join([*argv, *([] if '--resume' in argv else ['--resume'])])}"
        print(f"{_by_signal(exc.message)}{hint if exc.resumable else '; ' + exc.remedy}", file=sys.stderr, flush=True)
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
