"""Hyperparameter sweeps with Ray Tune: every trial runs the same per-worker loop as `train`.

A trial with several workers is a small driver function that builds a ``TorchTrainer`` and calls
``fit()`` (Ray 2.60, Train V2), with Tune's ``TuneReportCallback`` in the Train run config
forwarding each epoch's report to Tune; the Train run is named after the trial id, so a restored
trial resumes from its own checkpoint, and the Train workers get their own placement group outside
the trial's, so the trial itself holds only a sliver of a CPU.

A one-worker trial (the laptop default; ``tune.trial_loop=auto``) runs the loop in the trial's own
process, which holds the worker's CPU (and GPU): no worker group to start for one worker, and Tune
itself keeps, ranks and restores the trial's checkpoints (``train/runtime.py``: ``TrialProcess``).
``tune.trial_loop=trainer`` gives every trial a ``TorchTrainer``.

Trials see the train and val splits only; the test split is scored once, for the chosen trial,
when it is exported.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alchemetric_ray import console
from alchemetric_ray.artifacts.checkpoint import META, read_meta
from alchemetric_ray.config import REGRESSION_LABELS, ConfigError, RunConfig, metric_target_problem
from alchemetric_ray.data.loaders import build_datasets
from alchemetric_ray.data.manifest import Manifest, reconcile_features
from alchemetric_ray.errors import Interrupted, UserError
from alchemetric_ray.interrupts import seen_during
from alchemetric_ray.models import load_model_module, model_spec
from alchemetric_ray.placement.autoscale import run_bundles, scale_up
from alchemetric_ray.placement.plan import DATA_CPU_RESERVE, PlanError, ResourcePlan, nodes_needed
from alchemetric_ray.placement.session import storage_location, train_storage
from alchemetric_ray.scoring.objective import selection_metric, selection_mode
from alchemetric_ray.storage import Location
from alchemetric_ray.tracking.logger import RunLog
from alchemetric_ray.train.trainer import (
    Execution,
    adopt_target,
    build_trainer,
    check_compatible,
    data_config,
    loop_config,
    prepare_run,
    prepare_shards,
)

TRIAL_DRIVER_CPU = 0.1  # a trial function that only waits on its TorchTrainer
SPEC_KINDS = ("loguniform", "uniform", "choice", "grid", "randint", "quniform")


class SweepError(UserError, RuntimeError):
    pass


@dataclass
class SweepOutcome:
    name: str
    path: str
    summary: dict[str, Any]
    model_dir: Location | None
    report: Path | Location | None
    log: RunLog = field(default_factory=RunLog)  # the exported trial's run (its model version), or no log


# ---- the search space ----------------------------------------------------------------------


def build_space(cfg: RunConfig) -> dict[str, Any]:
    """Turn ``tune.space`` ({"train.lr": {"loguniform": [1e-4, 1e-2]}, ...}) into Tune's param space."""
    from ray import tune

    space = cfg.tune.space
    if not space:
        raise ConfigError("config 'tune.space' is empty: name at least one hyperparameter, "
                          "e.g. tune.space={train.lr: {loguniform: [0.0001, 0.01]}}")
    out: dict[str, Any] = {}
    for key, spec in space.items():
        _known_key(cfg, key)
        if isinstance(spec, list):
            spec = {"grid" if cfg.tune.search == "grid" else "choice": spec}
        if not isinstance(spec, dict):
            cfg.with_values({key: spec})
            out[key] = spec  # a fixed value
            continue
        if len(spec) != 1 or next(iter(spec)) not in SPEC_KINDS:
            raise ConfigError(f"config 'tune.space.{key}': {spec!r} must be one of "
                              + ", ".join(f"{{{k}: ...}}" for k in SPEC_KINDS))
        kind, args = next(iter(spec.items()))
        if cfg.tune.search == "grid" and kind not in ("grid", "choice"):
            raise ConfigError(f"config 'tune.space.{key}': tune.search=grid needs a list of values, got {kind}")
        if kind in ("grid", "choice"):
            if not isinstance(args, list) or not args:
                raise ConfigError(f"config 'tune.space.{key}': {kind} needs a non-empty list")
            for value in args:
                cfg.with_values({key: value})
            out[key] = tune.grid_search(args) if kind == "grid" or cfg.tune.search == "grid" else tune.choice(args)
            continue
        if not (isinstance(args, list) and len(args) in (2, 3) and all(isinstance(a, (int, float)) for a in args)):
            raise ConfigError(f"config 'tune.space.{key}': {kind} needs [low, high], got {args!r}")
        lo, hi = args[0], args[1]
        need, ok = ("0 < low < high", 0 < lo < hi) if kind == "loguniform" else ("low < high", lo < hi)
        if not ok:
            raise ConfigError(f"config 'tune.space.{key}': {kind} [{lo}, {hi}] needs {need}")
        cfg.with_values({key: lo})
        cfg.with_values({key: hi})
        out[key] = {"loguniform": tune.loguniform, "uniform": tune.uniform, "randint": tune.randint,
                    "quniform": lambda a, b, q=args[2] if len(args) == 3 else 1: tune.quniform(a, b, q)}[kind](lo, hi)
    return out


def _known_key(cfg: RunConfig, key: str) -> None:
    section, _, name = key.partition(".")
    current = cfg.to_dict().get(section, {}).get(name, None) if section in cfg.to_dict() else None
    cfg.with_values({key: current})  # raises the did-you-mean error for an unknown key


def runs_in_trial(cfg: RunConfig, plan: ResourcePlan) -> bool:
    """Whether each trial runs the loop in its own process (one worker) instead of a ``TorchTrainer``."""
    return cfg.tune.trial_loop == "auto" and plan.num_workers == 1


def trial_resources(cfg: RunConfig, plan: ResourcePlan) -> dict[str, float]:
    """What the trial itself holds: the worker's bundle when it runs the loop, else a driver's sliver."""
    return plan.worker_bundle() if runs_in_trial(cfg, plan) else {"CPU": TRIAL_DRIVER_CPU}


def sweep_bundles(cfg: RunConfig, plan: ResourcePlan, trials: int) -> list[dict]:
    """What a sweep asks the autoscaler for: the concurrent trials' workers and their drivers' shares
    (a trial that runs the loop itself is its worker, with no driver beside it)."""
    return run_bundles(plan, trials, None if runs_in_trial(cfg, plan) else {"CPU": TRIAL_DRIVER_CPU})


def concurrency(cfg: RunConfig, plan: ResourcePlan, cluster: dict[str, float]) -> int:
    """Trials at once, at most as many as the sweep has (:func:`trial_count`).

    On an autoscaling cluster's node types: the most trials whose bundles (:func:`sweep_bundles`:
    their GPUs and CPUs, a trainer trial's driver share, Ray Data's CPU) fit on the nodes the node type
    scales to.  Elsewhere, what is up (``cluster``, ``ray.cluster_resources()``): each trial needs its
    workers' CPUs plus a sliver for the trial's own process (a driver waiting on its TorchTrainer, or a
    one-worker trial's Ray Data iterator and reports), Ray Data keeps ``DATA_CPU_RESERVE`` CPUs (so a
    2-CPU laptop neither deadlocks nor idles), and a GPU trial needs its workers' GPUs.  Unknown node
    types: what the plan asks the autoscaler for (one trial's workers)."""
    if cfg.tune.max_concurrent_trials:
        return cfg.tune.max_concurrent_trials
    most = trial_count(cfg)
    if plan.autoscale and plan.node_type:
        fits = 1
        while fits < most and nodes_needed(plan, sweep_bundles(cfg, plan, fits + 1)) <= plan.max_nodes:
            fits += 1
        return fits
    cpus = plan.cluster_cpus if plan.autoscale else float(cluster.get("CPU", 0))
    per_trial = plan.num_workers * plan.cpus_per_worker + TRIAL_DRIVER_CPU
    fits = int((cpus - DATA_CPU_RESERVE) // per_trial)
    if plan.use_gpu and not plan.autoscale:
        fits = min(fits, int(float(cluster.get("GPU", 0)) // (plan.num_workers * plan.gpus_per_worker)))
    return max(1, min(most, fits))


def trial_count(cfg: RunConfig) -> int:
    """How many trials the sweep runs: tune.num_samples times the grid's points (with tune.search=grid
    every list in the space is a grid; otherwise only ``{grid: [...]}`` entries are)."""
    points = 1
    for spec in cfg.tune.space.values():
        if isinstance(spec, list) and cfg.tune.search == "grid":
            points *= len(spec)
        elif isinstance(spec, dict) and len(spec) == 1:
            kind, args = next(iter(spec.items()))
            if (kind == "grid" or (kind == "choice" and cfg.tune.search == "grid")) and isinstance(args, list):
                points *= len(args)
    return max(1, points * (1 if cfg.tune.search == "grid" else cfg.tune.num_samples))


# ---- one trial -----------------------------------------------------------------------------


def _trial(config: dict[str, Any], *, base: dict, targets: dict[str, tuple[Location, Manifest]], plan: ResourcePlan,
           sweep: str, start_timeout: str | None = None) -> None:
    import ray.tune

    console.quiet_ray_data()  # this trial builds its own datasets
    console.quiet_stop_in_finalizer()
    cfg = RunConfig.from_dict(base).with_values(config)
    shards, manifest = targets[cfg.features.label]  # the shards built for this trial's label
    check_compatible(cfg, manifest)
    datasets, _ = build_datasets(shards, model_spec(cfg.model.name).inputs, cfg.features.window, check=False)
    if runs_in_trial(cfg, plan):
        from alchemetric_ray.train.loop import run_loop
        from alchemetric_ray.train.runtime import TrialProcess

        run_loop(loop_config(cfg, manifest, plan, epoch_lines=False), TrialProcess(datasets, data_config(cfg)))
        return
    from ray.tune.integration.ray_train import TuneReportCallback

    from alchemetric_ray.placement.session import set_worker_group_start_timeout

    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(cfg, datasets, manifest, plan, name=f"{sweep}-{trial_id}",
                            execution=Execution(callbacks=[TuneReportCallback()], epoch_lines=False))
    if start_timeout:  # the sweep's per-attempt worker-group start timeout (placement/autoscale.py)
        set_worker_group_start_timeout(start_timeout)
    trainer.fit()


def _trial_lines(metric: str, mode: str):
    """A Tune callback (it runs in the sweep's driver) that prints one line per finished trial."""
    from ray import tune

    class TrialLines(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trial, "finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed")

        def _line(self, trial, what: str) -> None:
            result = trial.last_result or {}
            best = (trial.metric_analysis.get(metric) or {}).get(mode)
            shown = "n/a" if best is None else f"{best:.4f}"
            config = ", ".join(f"{k}={_plain(v)}" for k, v in (trial.config or {}).items())
            print(f"trial {trial.trial_id} {what}: {result.get('training_iteration', 0)} epoch(s), "
                  f"best {metric} {shown}; {config}", flush=True)

    return TrialLines()


# ---- the sweep -----------------------------------------------------------------------------


def run_sweep(cfg: RunConfig, *, export: bool = True, progress: bool = True) -> SweepOutcome:
    import ray

    space = build_space(cfg)
    load_model_module(cfg.model)
    for name in _values_of(cfg.tune.space.get("model.name"), cfg.model.name):
        model_spec(name)
    run = prepare_run(trial_config(cfg), sweep=True, export=export, progress=progress)
    name, plan = run.name, run.plan
    cfg, trial_cfg = adopt_target(reconcile_features(cfg, run.manifest, run.shards), run.manifest), run.cfg
    targets = {trial_cfg.features.label: (run.shards, run.manifest)}
    labels = _values_of(cfg.tune.space.get("features.label"), trial_cfg.features.label)
    for label in labels:  # a label kind in the space: shards per label, each trial reads its own
        if label not in targets:
            targets[label] = _shards_for_label(trial_cfg, label, progress)
    cfg, trial_cfg = metric_for_labels(cfg, labels), metric_for_labels(trial_cfg, labels)
    where = storage_location(cfg) / name
    limit, bundles = plan_trials(trial_cfg, plan, ray.cluster_resources())
    print(f"sweep {name}: up to {limit} trial(s) at once", flush=True)
    with scale_up(cfg, plan, bundles) as window:  # the autoscaler's request is cleared however the sweep ends
        # Ctrl-C: Tune's own handler stops the trials, saves the sweep's state (unfinished trials
        # stay unfinished, for `tune --resume`) and lets fit() return normally; the recorder in front
        # of it tells us, so that a partial sweep is neither summarised nor exported
        with seen_during() as interrupted:
            grid = _fit(cfg, trial_cfg, name, plan, targets, where, space, limit, window.attempt_timeout_s())
    if interrupted():
        finished = sum(1 for result in grid if result.metrics and result.metrics.get("done"))
        raise Interrupted(f"interrupted after {finished} of {trial_count(cfg)} trial(s) finished (sweep {name}, its "
                          "state saved)")
    summary, best_ckpt, best_cfg = summarize(grid, trial_cfg, targets, name, where)
    model_dir = None
    if export and best_ckpt:
        from ray.train import Checkpoint

        from alchemetric_ray.artifacts.export import export_model

        # Tune reports a trial's checkpoint as a path on the storage file system, without its scheme
        checkpoint = Checkpoint(best_ckpt.path, filesystem=best_ckpt.filesystem)
        chosen = next((t["val_long_short"] for t in summary["trials"] if t["trial_id"] == summary["best_trial_id"]),
                      None)
        srs = [(t.get("val_long_short") or {}).get("sr") for t in summary["trials"]]
        model_dir = export_model(checkpoint, best_cfg, targets[best_cfg.features.label][0], extra={"sweep": {
            "name": name, "num_trials": summary["num_trials"], "best_trial_id": summary["best_trial_id"],
            "selection_metric": selection_metric(cfg), "trial_sr_variance": summary["trial_sr_variance"],
            "chosen_val_long_short": chosen}}, command="tune", selection={"sweep": name, "srs": srs, "chosen": chosen})
        # the test segment stays sealed unless train.score_test (`tune --evaluate`) asked for its look
        summary["test_metrics"] = json.loads((model_dir / "metrics.json").read_text()).get("test")
        summary["model_dir"] = str(model_dir)
    from alchemetric_ray.tune.report import write_sweep_report

    (where / "sweep_summary.json").write_json(summary)
    report = write_sweep_report(where / "report", summary)
    log = _track(trial_cfg, name, where, summary, model_dir, report, run.shards) if cfg.tracking.mlflow_uri \
        else RunLog()
    return SweepOutcome(name, where.path if where.is_local else where.uri, summary, model_dir, report, log)


def _track(cfg: RunConfig, name: str, where: Location, summary: dict, model_dir: Location | None,
           report: Any, shards: Location | None):
    """The sweep as an MLflow parent run, each trial a nested run with its params and per-epoch
    history (tracking/mlflow_runs.py), written here in the driver from the sweep's summary.  The exported
    model is a version of the exported trial's run, whose params are that trial's; that run's
    Tracker is returned (a later evaluation tags its version), else a log that logs nothing."""
    from alchemetric_ray.tracking.mlflow_runs import RUN_FILE, Tracker, environment_tags

    parent = Tracker(cfg)
    began = [t["started"] for t in summary["trials"] if t.get("started")]
    parent.start(where / RUN_FILE, name, tags={"command": "tune", "best_trial_id": summary["best_trial_id"],
                                               "metric": summary["metric"], "mode": summary["mode"]},
                 start_time=min(began) if began else None)
    exported = None
    for trial in summary["trials"]:
        try:
            trial_cfg = cfg.with_values(trial["config"])
        except UserError:
            trial_cfg = cfg
        child = Tracker(trial_cfg)
        child.start(where / f"mlflow_trial_{trial['trial_id']}.json", f"{name}-{trial['trial_id']}",
                    parent=parent.run_id, tags={"command": "tune trial", "status": trial["status"],
                                                "trial_id": trial["trial_id"]}, start_time=trial.get("started"))
        child.log_epochs(trial["history"])
        child.log_tags({"best_value": trial["best_value"], "error": trial["error"]})
        child.log_figures("best", {summary["metric"]: trial["best_value"], "val_rank_ic": trial.get("val_rank_ic")})
        if model_dir is not None and trial["trial_id"] == summary["best_trial_id"]:
            child.log_artifacts(model_dir / "model_card.md")
            child.register(model_dir)
            exported = child
        child.finalize("FAILED" if trial["error"] else "FINISHED", end_time=trial.get("ended"))
    parent.log_tags({"best_value": summary["best_value"], "best_config": json.dumps(summary["best_config"]),
                     **environment_tags(shards), "exported_run_id": exported.run_id if exported else None})
    if report is not None:
        parent.log_artifacts(report, "sweep_report")
    parent.finalize()
    return exported or RunLog()


def trial_config(cfg: RunConfig) -> RunConfig:
    """The config each trial's plan is made from: one CPU per worker unless scaling.cpus_per_worker says."""
    return cfg if cfg.scaling.cpus_per_worker else cfg.replace("scaling.cpus_per_worker=1")


def plan_trials(trial_cfg: RunConfig, plan: ResourcePlan, cluster: dict[str, float]) -> tuple[int, list[dict]]:
    """Trials at once and what the sweep asks the autoscaler for, for one trial's ``plan`` (made with
    ``trial=True``) on a cluster with ``cluster`` up; an explicit tune.max_concurrent_trials that the
    node types cannot hold is refused in one line.  An autoscaling plan counts on the nodes its node
    types scale to, not on what is up now."""
    limit = concurrency(trial_cfg, plan, cluster)
    bundles = sweep_bundles(trial_cfg, plan, limit)
    _check_trials_fit(plan, bundles, limit)
    return limit, bundles


def _check_trials_fit(plan: ResourcePlan, bundles: list[dict], limit: int) -> None:
    """On known node types, the concurrent trials must fit in what the node type scales to."""
    if not (plan.autoscale and plan.node_type):
        return
    nodes = nodes_needed(plan, bundles)
    if nodes > plan.max_nodes:
        raise PlanError(f"config 'tune.max_concurrent_trials': {limit} trial(s) at once need {nodes} {plan.node_type} "
                        f"node(s); it scales to at most {plan.max_nodes} ({plan.capacity}); lower "
                        "tune.max_concurrent_trials or scaling.workers")


def _fit(cfg: RunConfig, trial_cfg: RunConfig, name: str, plan: ResourcePlan,
         targets: dict[str, tuple[Location, Manifest]], where: Location, space: dict, limit: int,
         start_timeout_s: float):
    """Build (or restore) the Tuner and run it; each trial's ``fit()`` gets ``start_timeout_s`` per
    worker-group start attempt (what the sweep's own wait left of scaling.start_timeout_s)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=trial_cfg.to_dict(), targets=targets,
                             plan=plan, sweep=name, start_timeout=f"{start_timeout_s:g}"),
        trial_resources(trial_cfg, plan))
    storage = train_storage(cfg)
    path, filesystem = where.path, storage["storage_filesystem"]  # filesystem None: a local folder
    if cfg.storage.resume or (cfg.storage.run and tune.Tuner.can_restore(path, storage_filesystem=filesystem)):
        if not tune.Tuner.can_restore(path, storage_filesystem=filesystem):
            raise SweepError(f"--resume: {where} holds no sweep state to restore")
        print(f"resuming sweep {name}: finished trials are kept, unfinished ones continue", flush=True)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                   storage_filesystem=filesystem)
    else:
        scheduler = None
        if cfg.tune.scheduler == "asha":
            scheduler = ASHAScheduler(time_attr="training_iteration", max_t=cfg.train.epochs,
                                      grace_period=min(cfg.tune.grace_period, cfg.train.epochs), reduction_factor=2)
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=selection_metric(cfg), mode=selection_mode(cfg), scheduler=scheduler,
                search_alg=_searcher(cfg),
                num_samples=1 if cfg.tune.search == "grid" else cfg.tune.num_samples,
                max_concurrent_trials=limit,
                time_budget_s=cfg.tune.time_budget_s or None,
            ),
            # Tune's status table off (it ranks trials by their last value, not ours); one line per
            # finished trial instead, and the summary names the best trial by its best epoch.
            run_config=tune.RunConfig(name=name, **storage,
                                      verbose=0 if not console.verbose() else 1,
                                      callbacks=[_trial_lines(selection_metric(cfg), selection_mode(cfg))],
                                      **_trial_checkpoints(trial_cfg, plan)),
        )
    return tuner.fit()


def _trial_checkpoints(cfg: RunConfig, plan: ResourcePlan) -> dict:
    """A trial that runs the loop itself gives Tune its checkpoints: Tune keeps them as a Train run
    would (storage.num_to_keep, ranked by the selection metric) and retries a failed trial from the
    latest (scaling.max_failures).  A TorchTrainer's trial leaves both to Ray Train."""
    if not runs_in_trial(cfg, plan):
        return {}
    from ray import tune

    return {"checkpoint_config": tune.CheckpointConfig(num_to_keep=cfg.storage.num_to_keep,
                                                       checkpoint_score_attribute=selection_metric(cfg),
                                                       checkpoint_score_order=selection_mode(cfg)),
            "failure_config": tune.FailureConfig(max_failures=cfg.scaling.max_failures)}


def _shards_for_label(cfg: RunConfig, label: str, progress: bool) -> tuple[Location, Manifest]:
    """The shards of one label kind of the space, built from the same bars beside the sweep's own
    (``features/<storage.name>-<label>``)."""
    from alchemetric_ray.data.manifest import MANIFEST
    from alchemetric_ray.storage import locate

    if cfg.data.path and (locate(cfg.data.path) / MANIFEST).is_file():
        raise SweepError(f"tune.space varies features.label, but data.path {cfg.data.path} holds shards built for "
                         "one label; pass the raw bars (a CSV/Parquet folder, or data.source) so that each label's "
                         "shards can be built")
    shards = prepare_shards(cfg.replace(f"features.label={label}", f"storage.name={cfg.storage.name}-{label}"),
                            progress=progress)
    return shards, Manifest.read(shards)


def metric_for_labels(cfg: RunConfig, labels: list[str]) -> RunConfig:
    """One selection metric for every label the trials train on: ``train.metric=auto`` is
    val_rank_ic as soon as one of them is a cross-sectional target (it is valid for class targets
    too), else the config's own; a metric one of them cannot report is refused."""
    if cfg.train.metric == "auto":
        if any(label in REGRESSION_LABELS for label in labels):
            return cfg.replace("train.metric=val_rank_ic")
        return cfg
    for label in labels:
        problem = metric_target_problem(selection_metric(cfg), label)
        if problem:
            raise SweepError(f"config 'train.metric': {problem} (features.label={label} is in tune.space)")
    return cfg


def _values_of(spec: Any, default: str) -> list[str]:
    if spec is None:
        return [default]
    if isinstance(spec, list):
        return [str(v) for v in spec]
    if isinstance(spec, dict):
        return [str(v) for v in next(iter(spec.values()))]
    return [str(spec)]


def _searcher(cfg: RunConfig):
    if cfg.tune.search != "optuna":
        return None
    try:
        from ray.tune.search.optuna import OptunaSearch
    except ImportError as exc:
        raise SweepError(f"tune.search=optuna needs the optuna package ({exc}); pip install optuna") from None
    return OptunaSearch(seed=cfg.train.seed)


def summarize(grid, cfg: RunConfig, targets: dict[str, tuple[Location, Manifest]], name: str,
              where: Location) -> tuple[dict, Location | None, RunConfig | None]:
    """Rank trials on validation only; find the best trial's best checkpoint (the path Tune
    reported, on the file system of the sweep's storage ``where``)."""
    metric, mode = selection_metric(cfg), selection_mode(cfg)
    sign = 1 if mode == "max" else -1
    trials, best = [], None
    for result in grid:
        df = _reports(result)
        history = _history(df)
        values = [] if df is None or metric not in df else [v for v in df[metric].tolist() if v == v]
        best_value = (max(values) if mode == "max" else min(values)) if values else None
        trial_id = ((result.metrics or {}).get("trial_id")
                    or (Path(result.path).name if result.path else str(len(trials))))
        config = {k: _plain(v) for k, v in (result.config or {}).items()}
        epochs = len(history)
        trial = {"trial_id": trial_id, "config": config, "status": "ERROR" if result.error else "TERMINATED",
                 "best_value": best_value, "epochs_run": epochs, **_times(df),
                 "val_long_short": _long_short_at(df, metric, best_value),
                 "val_rank_ic": _value_at(df, metric, best_value, "val_rank_ic"),
                 "stopped_early": (not result.error) and epochs < cfg.train.epochs
                                  and not _early_stopped_by_patience(df, cfg),
                 "history": history, "error": str(result.error).splitlines()[0][:300] if result.error else None}
        trials.append(trial)
        if best_value is not None and (best is None or sign * best_value > sign * best[0]):
            best = (best_value, trial_id, _checkpoint_at(result, df, metric, best_value), config)
    if best is None:
        errors = "; ".join(t["error"] for t in trials if t["error"])[:500]
        raise SweepError(f"sweep {name}: no trial reported {metric}" + (f" ({errors})" if errors else ""))
    _, best_id, best_path, best_config = best
    best_cfg = cfg.with_values(best_config)
    manifest = targets[best_cfg.features.label][1]
    best_ckpt = confusion = None
    if best_path:
        best_ckpt = Location(best_path if where.is_local else f"{where.uri.split('://')[0]}://{best_path}",
                             where.filesystem, best_path)
        if (best_ckpt / META).is_file():
            confusion = json.loads((best_ckpt / META).read_text())["metrics"].get("val_confusion")
    summary = {
        "name": name, "metric": metric, "mode": mode, "num_trials": len(trials), "space": cfg.tune.space,
        "scheduler": cfg.tune.scheduler, "search": cfg.tune.search, "trials": trials, "best_trial_id": best_id,
        "best_value": best[0], "best_config": best_config, "best_checkpoint": best_ckpt and str(best_ckpt),
        "classes": manifest.classes, "best_confusion": confusion, "test_metrics": None,
        "model_dir": None, "max_epochs": cfg.train.epochs,
        "trial_sr_variance": trial_sr_variance(trials),
    }
    return summary, best_ckpt, best_cfg


def _reports(result):
    """A trial's epoch reports as a data frame: Tune's, or for a trial Tune restarted from its own
    checkpoint (a one-worker trial retried after a failure), whose frame keeps only the reports after
    the restart, the loop's history in that trial's latest checkpoint (every epoch, as reported)."""
    df = result.metrics_dataframe
    checkpoint = getattr(result, "checkpoint", None)
    if df is None or "epoch" not in df or checkpoint is None or _every_epoch(df["epoch"].dropna().tolist()):
        return df
    import pandas as pd

    with checkpoint.as_directory() as directory:
        history = read_meta(directory)["loop"]["history"]
    return pd.DataFrame(history) if _every_epoch([row["epoch"] for row in history]) else df


def _times(df) -> dict[str, float | None]:
    """When a trial began and ended (Unix seconds): its first report's time less that epoch's, and its
    last report's (Tune stamps each report); None where it reported nothing."""
    if df is None or "timestamp" not in df or not len(df):
        return {"started": None, "ended": None}
    first = float(df["timestamp"].min()) - float(df["time_this_iter_s"].iloc[0] if "time_this_iter_s" in df else 0)
    return {"started": first, "ended": float(df["timestamp"].max())}


def _every_epoch(epochs: list) -> bool:
    """The reports hold every epoch from the first (numbered from 1)."""
    return sorted(int(e) for e in epochs) == list(range(1, len(epochs) + 1))


def _history(df) -> list[dict]:
    """A trial's epochs, in order."""
    if df is None:
        return []
    return [{k: _plain(v) for k, v in row.items() if k == "epoch" or k == "train_loss" or k.startswith("val_")}
            for row in df.to_dict("records")]


def _checkpoint_at(result, df, metric: str, best_value) -> str | None:
    """The path of a trial's checkpoint at its best epoch: the one its Train run wrote (the
    ``checkpoint_path`` Tune's report callback adds) or, for a trial that ran the loop itself, the one
    Tune kept."""
    if df is not None and "checkpoint_path" in df:
        paths = df[df[metric] == best_value]["checkpoint_path"].dropna()
        return paths.iloc[0] if len(paths) else None
    kept = [(m.get("epoch", 0), c.path) for c, m in (getattr(result, "best_checkpoints", None) or [])
            if m.get(metric) == best_value]
    return min(kept)[1] if kept else None


def _value_at(df, metric: str, best_value, key: str):
    """``key`` at a trial's best epoch (the first epoch with its best ``metric``), or None."""
    if df is None or best_value is None or key not in df:
        return None
    return _plain(df[df[metric] == best_value].iloc[0][key])


def _long_short_at(df, metric: str, best_value) -> dict | None:
    """A trial's validation long-short moments (per-period SR, skewness, kurtosis, days) at its best
    epoch: where an ASHA-stopped trial stood when it was stopped, by the same rule as the others."""
    if df is None or best_value is None or "val_ls_sr" not in df:
        return None
    return {k: _value_at(df, metric, best_value, f"val_ls_{k}") for k in ("sr", "skew", "kurt", "days")}


def trial_sr_variance(trials: list[dict]) -> float | None:
    """The variance (ddof 1) of the trials' per-period validation long-short Sharpe ratios: the
    V[SR_n] of Bailey and Lopez de Prado's deflated Sharpe ratio; None for fewer than 2 trials."""
    srs = [t["val_long_short"]["sr"] for t in trials if t.get("val_long_short")]
    srs = [v for v in srs if v is not None and math.isfinite(v)]
    return statistics.variance(srs) if len(srs) >= 2 else None


def _early_stopped_by_patience(df, cfg: RunConfig) -> bool:
    """True when the loop's own early stopping (patience) ended the trial, not the scheduler."""
    if df is None or not cfg.train.patience or "improved" not in df:
        return False
    improved = df["improved"].tolist()
    return len(improved) >= cfg.train.patience and not any(improved[-cfg.train.patience:])


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
