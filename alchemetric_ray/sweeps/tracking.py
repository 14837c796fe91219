"""A sweep in MLflow: the sweep as a parent run, each trial a nested run with its params and per-epoch
history (``tracking/mlflow_runs.py``), written in the driver from the sweep's summary."""

from __future__ import annotations

import json
from typing import Any, cast

from alchemetric_ray.errors import UserError
from alchemetric_ray.storage import Location
from alchemetric_ray.sweeps.job import SweepJob
from alchemetric_ray.sweeps.summary import SweepSummary
from alchemetric_ray.tracking.logger import RunLog


def track_sweep(job: SweepJob, summary: SweepSummary, model_dir: Location | None, report: Any):
    """Log the sweep (its report, where there is one, as the parent run's artifacts).  The exported
    model is a version of the exported trial's run, whose params are that trial's; that run's
    Tracker is returned (a later evaluation tags its version), else a log that logs nothing."""
    from alchemetric_ray.tracking.mlflow_runs import RUN_FILE, Tracker, environment_tags

    cfg, name, where = job.trial_cfg, job.name, job.where
    parent = Tracker(cfg)
    began = [t.started for t in summary.trials if t.started]
    best_id = cast(str, summary.best_trial_id)  # cast: a summary is made only with a best trial (else SweepError)
    parent.start(where / RUN_FILE, name, tags={"command": "tune", "best_trial_id": best_id,
                                               "metric": summary.metric, "mode": summary.mode},
                 start_time=min(began) if began else None)
    exported = None
    for trial in summary.trials:
        try:
            trial_cfg = cfg.with_values(trial.config)
        except UserError:
            trial_cfg = cfg
        child = Tracker(trial_cfg)
        child.start(where / f"mlflow_trial_{trial.trial_id}.json", f"{name}-{trial.trial_id}",
                    parent=parent.run_id, tags={"command": "tune trial", "status": trial.status,
                                                "trial_id": trial.trial_id}, start_time=trial.started)
        child.log_epochs(trial.history)
        child.log_tags({"best_value": trial.best_value, "error": trial.error})
        child.log_figures("best", {summary.metric: trial.best_value, "val_rank_ic": trial.val_rank_ic})
        if model_dir is not None and trial.trial_id == summary.best_trial_id:
            child.log_artifacts(model_dir / "model_card.md")
            child.register(model_dir)
            exported = child
        child.finalize("FAILED" if trial.error else "FINISHED", end_time=trial.ended)
    parent.log_tags({"best_value": summary.best_value, "best_config": json.dumps(summary.best_config),
                     **environment_tags(job.shards), "exported_run_id": exported.run_id if exported else None})
    if report is not None:
        parent.log_artifacts(report, "sweep_report")
    parent.finalize()
    return exported or RunLog()
