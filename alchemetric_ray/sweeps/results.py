"""Tune's result grid read into the sweep's summary: each trial's epochs, best value and moments at
its best epoch, and the best trial with its best checkpoint.  Trials are ranked on validation only.
"""

from __future__ import annotations

import json
from pathlib import Path

from alchemetric_ray.artifacts.checkpoint import META, read_meta
from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import SweepError
from alchemetric_ray.scoring.objective import selection_metric, selection_mode
from alchemetric_ray.storage import Location
from alchemetric_ray.sweeps.job import SweepJob
from alchemetric_ray.sweeps.summary import SweepSummary, TrialRow, plain, trial_sr_variance


def summarize(grid, job: SweepJob) -> tuple[SweepSummary, Location | None, RunConfig]:
    """Rank trials on validation only; find the best trial's best checkpoint (the path Tune
    reported, on the file system of the sweep's storage ``job.where``).  Returns the summary, that
    checkpoint (None where Tune reported none) and the best trial's config."""
    cfg = job.trial_cfg
    metric, mode = selection_metric(cfg), selection_mode(cfg)
    sign = 1 if mode == "max" else -1
    trials: list[TrialRow] = []
    best = None
    for result in grid:
        df = _reports(result)
        trial = _trial_row(result, df, cfg, metric, mode, fallback_id=str(len(trials)))
        trials.append(trial)
        if trial.best_value is not None and (best is None or sign * trial.best_value > sign * best[0]):
            best = (trial.best_value, trial.trial_id, _checkpoint_at(result, df, metric, trial.best_value),
                    trial.config)
    if best is None:
        errors = "; ".join(t.error for t in trials if t.error)[:500]
        raise SweepError(f"sweep {job.name}: no trial reported {metric}" + (f" ({errors})" if errors else ""))
    best_value, best_id, best_path, best_config = best
    best_cfg = cfg.with_values(best_config)
    manifest = job.targets[best_cfg.features.label][1]
    best_ckpt, confusion = _best_checkpoint(best_path, job.where)
    summary = SweepSummary(
        name=job.name, metric=metric, mode=mode, num_trials=len(trials), space=cfg.tune.space,
        scheduler=cfg.tune.scheduler, search=cfg.tune.search, trials=trials, best_trial_id=best_id,
        best_value=best_value, best_config=best_config, best_checkpoint=str(best_ckpt) if best_ckpt else None,
        classes=manifest.classes, best_confusion=confusion, test_metrics=None, model_dir=None,
        max_epochs=cfg.train.epochs, trial_sr_variance=trial_sr_variance(trials))
    return summary, best_ckpt, best_cfg


def _trial_row(result, df, cfg: RunConfig, metric: str, mode: str, fallback_id: str) -> TrialRow:
    """One trial's row, from Tune's result and its epoch reports ``df``."""
    history = _history(df)
    values = [] if df is None or metric not in df else [v for v in df[metric].tolist() if v == v]
    best_value = (max(values) if mode == "max" else min(values)) if values else None
    trial_id = (result.metrics or {}).get("trial_id") or (Path(result.path).name if result.path else fallback_id)
    epochs = len(history)
    started, ended = _times(df)
    return TrialRow(
        trial_id=trial_id, config={k: plain(v) for k, v in (result.config or {}).items()},
        status="ERROR" if result.error else "TERMINATED", best_value=best_value, epochs_run=epochs,
        started=started, ended=ended, val_long_short=_long_short_at(df, metric, best_value),
        val_rank_ic=_value_at(df, metric, best_value, "val_rank_ic"),
        stopped_early=(not result.error) and epochs < cfg.train.epochs and not _early_stopped_by_patience(df, cfg),
        history=history, error=str(result.error).splitlines()[0][:300] if result.error else None)


def _best_checkpoint(path: str | None, where: Location) -> tuple[Location | None, list | None]:
    """The best trial's checkpoint at ``path`` (on the file system of ``where``), and the validation
    confusion matrix its ``meta.json`` holds (None where it holds none)."""
    if not path:
        return None, None
    checkpoint = Location(path if where.is_local else f"{where.uri.split('://')[0]}://{path}", where.filesystem, path)
    confusion = None
    if (checkpoint / META).is_file():
        confusion = json.loads((checkpoint / META).read_text())["metrics"].get("val_confusion")
    return checkpoint, confusion


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


def _times(df) -> tuple[float | None, float | None]:
    """When a trial began and ended (Unix seconds): its first report's time less that epoch's, and its
    last report's (Tune stamps each report); None where it reported nothing."""
    if df is None or "timestamp" not in df or not len(df):
        return None, None
    first = float(df["timestamp"].min()) - float(df["time_this_iter_s"].iloc[0] if "time_this_iter_s" in df else 0)
    return first, float(df["timestamp"].max())


def _every_epoch(epochs: list) -> bool:
    """The reports hold every epoch from the first (numbered from 1)."""
    return sorted(int(e) for e in epochs) == list(range(1, len(epochs) + 1))


def _history(df) -> list[dict]:
    """A trial's epochs, in order."""
    if df is None:
        return []
    return [{k: plain(v) for k, v in row.items() if k == "epoch" or k == "train_loss" or k.startswith("val_")}
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
    return plain(df[df[metric] == best_value].iloc[0][key])


def _long_short_at(df, metric: str, best_value) -> dict | None:
    """A trial's validation long-short moments (per-period SR, skewness, kurtosis, days) at its best
    epoch: where an ASHA-stopped trial stood when it was stopped, by the same rule as the others."""
    if df is None or best_value is None or "val_ls_sr" not in df:
        return None
    return {k: _value_at(df, metric, best_value, f"val_ls_{k}") for k in ("sr", "skew", "kurt", "days")}


def _early_stopped_by_patience(df, cfg: RunConfig) -> bool:
    """True when the loop's own early stopping (patience) ended the trial, not the scheduler."""
    if df is None or not cfg.train.patience or "improved" not in df:
        return False
    improved = df["improved"].tolist()
    return len(improved) >= cfg.train.patience and not any(improved[-cfg.train.patience:])

