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

The rooms of a sweep: ``space.py`` (the search space), ``resources.py`` (what a trial holds, how many
at once, how many share a GPU: ``footprint.py`` sizes the model), ``trial.py`` (one trial),
``tuner.py`` (the Tuner, new or restored), ``results.py`` and ``summary.py`` (the typed summary),
``tracking.py`` (MLflow), ``report.py`` (the HTML report); this module runs them in order and exports
the best trial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from alchemetric_ray.config import REGRESSION_LABELS, RunConfig, metric_target_problem
from alchemetric_ray.data.manifest import Manifest, reconcile_features
from alchemetric_ray.errors import Interrupted, SweepError
from alchemetric_ray.interrupts import seen_during
from alchemetric_ray.models import load_model_module, model_spec
from alchemetric_ray.placement.autoscale import scale_up
from alchemetric_ray.placement.session import storage_location
from alchemetric_ray.scoring.objective import selection_metric
from alchemetric_ray.storage import Location
from alchemetric_ray.sweeps.job import SweepJob
from alchemetric_ray.sweeps.resources import plan_trials, share_trial_gpus, trial_config
from alchemetric_ray.sweeps.results import summarize
from alchemetric_ray.sweeps.space import build_space, trial_count, values_of
from alchemetric_ray.sweeps.summary import SweepSummary
from alchemetric_ray.sweeps.tracking import track_sweep
from alchemetric_ray.sweeps.tuner import fit_sweep
from alchemetric_ray.tracking.logger import RunLog
from alchemetric_ray.training.trainer import adopt_target, prepare_run, prepare_shards


@dataclass
class SweepOutcome:
    """A finished sweep: its name, its folder (a path, or a URI on object storage), its summary, the
    exported model (None without an export) and its report."""

    name: str
    path: str
    summary: SweepSummary
    model_dir: Location | None
    report: Path | Location | None
    log: RunLog = field(default_factory=RunLog)  # the exported trial's run (its model version), or no log


def run_sweep(cfg: RunConfig, *, export: bool = True, progress: bool = True) -> SweepOutcome:
    """Run the sweep ``cfg.tune`` describes (or resume it), summarise it, export the best trial (unless
    ``export`` is False), write ``sweep_summary.json`` and the report, and log it to MLflow where
    tracking.mlflow_uri is set."""
    import ray

    space = build_space(cfg)
    load_model_module(cfg.model)
    for name in values_of(cfg.tune.space.get("model.name"), cfg.model.name):
        model_spec(name)
    # the plan is shown once its GPU share is known (below)
    run = prepare_run(trial_config(cfg), sweep=True, export=export, progress=progress, show_plan=False)
    name, plan = run.name, run.plan
    cfg, trial_cfg = adopt_target(reconcile_features(cfg, run.manifest, run.shards), run.manifest), run.cfg
    targets: dict[str, tuple[Location, Manifest]] = {trial_cfg.features.label: (run.shards, run.manifest)}
    labels = values_of(cfg.tune.space.get("features.label"), trial_cfg.features.label)
    for label in labels:  # a label kind in the space: shards per label, each trial reads its own
        if label not in targets:
            targets[label] = _shards_for_label(trial_cfg, label, progress)
    cfg, trial_cfg = metric_for_labels(cfg, labels), metric_for_labels(trial_cfg, labels)
    cluster = ray.cluster_resources()
    manifests = [manifest for _, manifest in targets.values()]
    plan = share_trial_gpus(trial_cfg, plan, cluster, max(len(m.features) for m in manifests),
                            max(m.outputs for m in manifests))
    print("resource plan per trial:\n" + plan.describe(), flush=True)
    job = SweepJob(name, cfg, trial_cfg, plan, targets, storage_location(cfg) / name)
    limit, bundles = plan_trials(trial_cfg, plan, cluster)
    print(f"sweep {name}: up to {limit} trial(s) at once", flush=True)
    with scale_up(cfg, plan, bundles) as window:  # the autoscaler's request is cleared however the sweep ends
        # Ctrl-C: Tune's own handler stops the trials, saves the sweep's state (unfinished trials
        # stay unfinished, for `tune --resume`) and lets fit() return normally; the recorder in front
        # of it tells us, so that a partial sweep is neither summarised nor exported
        with seen_during() as interrupted:
            grid = fit_sweep(job, space, limit, window.attempt_timeout_s())
    if interrupted():
        finished = sum(1 for result in grid if result.metrics and result.metrics.get("done"))
        raise Interrupted(f"interrupted after {finished} of {trial_count(cfg)} trial(s) finished (sweep {name}, its "
                          "state saved)")
    summary, best_ckpt, best_cfg = summarize(grid, job)
    model_dir = _export(job, summary, best_ckpt, best_cfg) if export and best_ckpt else None
    from alchemetric_ray.sweeps.report import write_sweep_report

    where = job.where
    (where / "sweep_summary.json").write_json(summary.as_dict())
    report = write_sweep_report(where / "report", summary)
    log = track_sweep(job, summary, model_dir, report) if cfg.tracking.mlflow_uri else RunLog()
    return SweepOutcome(name, where.path if where.is_local else where.uri, summary, model_dir, report, log)


def _export(job: SweepJob, summary: SweepSummary, best_ckpt: Location, best_cfg: RunConfig) -> Location:
    """Export the best trial's best checkpoint as the same model folder `train` makes, with the
    sweep's figures (the trials' validation Sharpe ratios, for the deflated Sharpe ratio) beside it;
    the summary takes the model folder and, where the test segment was scored, its test metrics."""
    from ray.train import Checkpoint

    from alchemetric_ray.artifacts.export import export_model

    # Tune reports a trial's checkpoint as a path on the storage file system, without its scheme
    checkpoint = Checkpoint(best_ckpt.path, filesystem=best_ckpt.filesystem)
    best = summary.best_trial()
    chosen = best.val_long_short if best is not None else None
    srs = [(t.val_long_short or {}).get("sr") for t in summary.trials]
    model_dir = export_model(checkpoint, best_cfg, job.targets[best_cfg.features.label][0], extra={"sweep": {
        "name": job.name, "num_trials": summary.num_trials, "best_trial_id": summary.best_trial_id,
        "selection_metric": selection_metric(job.cfg), "trial_sr_variance": summary.trial_sr_variance,
        "chosen_val_long_short": chosen}}, command="tune", selection={"sweep": job.name, "srs": srs, "chosen": chosen})
    # the test segment stays sealed unless train.score_test (`tune --evaluate`) asked for its look
    summary.test_metrics = json.loads((model_dir / "metrics.json").read_text()).get("test")
    summary.model_dir = str(model_dir)
    return model_dir


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
