"""The walk-forward evaluations: the model's config retrained on each fold (in this Ray session, the
features computed once for every fold), each fold's test block scored against baselines fitted on
the fold's train rows, and either the per-fold mean and spread (``signals.folds``) or every
out-of-sample prediction pooled and scored once (``evaluate --walk-forward``), with a per-year table;
their results as typed records (:class:`FoldsWalkForward`, :class:`PooledWalkForward`), whose
``as_dict`` is the ``walk_forward`` section of ``evaluation.json``.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import EvaluationError
from alchemetric_ray.fsutil import is_uri
from alchemetric_ray.signals import metrics as sm
from alchemetric_ray.signals.contenders import Contenders, SegmentResult, contender_frames, score_contenders
from alchemetric_ray.signals.predict import inputs_frame, normalized_copy, predict, stage_inputs, staged_frame

if TYPE_CHECKING:
    from alchemetric_ray.artifacts.export import LoadedModel
    from alchemetric_ray.data.splits import SplitPlan


@dataclass(frozen=True)
class Refit:
    """One fold of a walk-forward, refitted: the fold's number (from 0) and dates, the model trained
    on it with the config it was trained with, and what every contender scored on its test block."""

    index: int
    fold: SplitPlan
    model: LoadedModel
    cfg: RunConfig
    contenders: Contenders


@dataclass(frozen=True)
class FoldRow:
    """One refit's row: its number and dates (the test block; the train span of its model and
    baselines, whose normalization reaches as far), the model's days, mean rank IC and long-short
    Sharpe ratio on the block (None where its book never traded), the best baseline's mean rank IC,
    and, in a pooled walk-forward, the seconds of its phases (train, stage, predict, baselines)."""

    fold: int
    test_start: str
    test_end: str
    train_start: str
    train_end: str
    normalized_through: str
    days: int
    rank_ic: float
    sharpe: float | None
    best_baseline_rank_ic: float
    seconds: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        row = {"fold": self.fold, "test_start": self.test_start, "test_end": self.test_end,
               "train_start": self.train_start, "train_end": self.train_end,
               "normalized_through": self.normalized_through, "days": self.days, "rank_ic": self.rank_ic,
               "sharpe": self.sharpe, "best_baseline_rank_ic": self.best_baseline_rank_ic}
        return row if self.seconds is None else {**row, "seconds": self.seconds}


@dataclass(frozen=True)
class YearRow:
    """One calendar year of a pooled walk-forward: its days, the model's mean daily rank IC with its
    interval, and the best baseline's (None where it has no day that year)."""

    year: int
    days: int
    rank_ic: float
    ci_low: float
    ci_high: float
    best_baseline_rank_ic: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"year": self.year, "days": self.days, "rank_ic": self.rank_ic, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "best_baseline_rank_ic": self.best_baseline_rank_ic}


@dataclass(frozen=True)
class FoldsWalkForward:
    """``signals.folds``: one row per fold, and the mean and spread of the model's rank IC and Sharpe
    ratio over the folds."""

    folds: list[FoldRow]
    rank_ic_mean: float
    rank_ic_std: float
    sharpe_mean: float
    sharpe_std: float

    def as_dict(self) -> dict[str, Any]:
        return {"folds": [f.as_dict() for f in self.folds], "rank_ic_mean": self.rank_ic_mean,
                "rank_ic_std": self.rank_ic_std, "sharpe_mean": self.sharpe_mean, "sharpe_std": self.sharpe_std}


@dataclass(frozen=True)
class PooledWalkForward:
    """``evaluate --walk-forward``: how often it refitted and on what window, how many refits and how
    long they took, the pool of every out-of-sample block scored once (``pooled``), the per-year
    table and one row per refit."""

    refit_every: int
    window: str
    refits: int
    seconds: float
    refits_per_minute: float
    pooled: SegmentResult
    years: list[YearRow]
    folds: list[FoldRow]

    def as_dict(self) -> dict[str, Any]:
        return {"refit_every": self.refit_every, "window": self.window, "refits": self.refits,
                "seconds": self.seconds, "refits_per_minute": self.refits_per_minute, "pooled": self.pooled.as_dict(),
                "years": [y.as_dict() for y in self.years], "folds": [f.as_dict() for f in self.folds]}


def _refits(cfg: RunConfig, data: str | None, loaded, folds: list, calendar: np.ndarray,
            work: Path) -> Iterator[Refit]:
    """Retrain the model's config on each fold (``features.train_end``/``val_end`` at the fold's
    boundaries, in this Ray session: local mode where one worker serves) and yield, per fold, a
    :class:`Refit`: its model and what every contender scored on the fold's test block; the learned
    baselines are fitted on the fold's train rows, in the fold's normalization (the main model's was
    fitted on a train split that can reach into the fold's block).  The features are computed once for every fold:
    the training features (each fold's shards are their split and normalization) and the inputs
    the folds' models score (each fold normalizes them with its own statistics)."""
    from alchemetric_ray.artifacts.export import load_model as load
    from alchemetric_ray.data.shards import build_shards
    from alchemetric_ray.data.splits import boundaries
    from alchemetric_ray.data.staging import stage_features
    from alchemetric_ray.training.trainer import run_training

    base = loaded.config
    if data:
        base = base.replace(f"data.path={data}", "data.source=files")
    on_duplicate = cfg.data.on_duplicate if data else None
    storage = cfg.storage.path if is_uri(cfg.storage.path) else str(Path(cfg.storage.path).resolve())
    with tempfile.TemporaryDirectory(prefix="alchemetric-walk-forward-") as tmp:
        shared = Path(tmp)
        clock = time.monotonic()
        # raw bars on object storage: each fold's training reads them itself, as `train` does
        features = None if data and is_uri(data) else stage_features(base, shared / "features")
        raw_inputs = shared / "inputs"
        raw_inputs.mkdir()
        staged = stage_inputs(loaded, data, raw_inputs, on_duplicate=on_duplicate, normalize=False)
        once = time.monotonic() - clock  # both stagings, shared by every fold
        for k, fold in enumerate(folds):
            train_end, val_end = boundaries(calendar, fold)  # the embargo once: plan_splits takes it off these
            fold_cfg = base.replace(f"features.train_end={train_end}", f"features.val_end={val_end}",
                                    f"features.train_start={fold.train_start}",
                                    f"storage.name={base.storage.name}-fold{k}",
                                    f"storage.models_dir={work / 'folds'}", f"storage.path={storage}",
                                    "storage.run=null", "storage.resume=false")
            clock = time.monotonic()
            if features is not None:  # the fold's split and normalization of the shared features
                shards = shared / f"shards-{k}"
                build_shards(fold_cfg, shards, staged=features)
                fold_cfg = fold_cfg.replace(f"data.path={shards}", "data.source=files")
            outcome = run_training(fold_cfg, progress=False)
            if outcome.model_dir is None:
                raise EvaluationError(f"walk-forward fold {k}: training produced no checkpoint")
            fold_model = load(outcome.model_dir)
            seconds = {"train": time.monotonic() - clock}  # shards -> the fit -> its export
            clock = time.monotonic()
            staging = shared / f"inputs-{k}"
            staging.mkdir()
            normalized_copy(fold_model, raw_inputs, staging)
            seconds["stage"] = time.monotonic() - clock + (once if k == 0 else 0.0)
            clock = time.monotonic()
            sig = predict(fold_model, data, work / "folds" / f"signals-{k}.parquet", fold_cfg, staged=staging)
            inputs = staged_frame(staging, staged)
            shutil.rmtree(staging)
            seconds["predict"] = time.monotonic() - clock
            clock = time.monotonic()
            contenders = contender_frames(sig, inputs, fold_model.manifest, fold_cfg,
                                          segment=(fold.test_start, fold.test_end))
            seconds["baselines"] = time.monotonic() - clock  # their fits and scores on the block
            contenders.seconds = {phase: round(v, 2) for phase, v in seconds.items()}
            yield Refit(index=k, fold=fold, model=fold_model, cfg=fold_cfg, contenders=contenders)


def _fold_row(refit: Refit, scored: SegmentResult, seconds: dict[str, float] | None = None) -> FoldRow:
    model, fold, splits = scored.deep_model, refit.fold, refit.model.manifest.splits
    baseline_ics = [r.rank_ic.mean for r in scored.rows[1:] if not math.isnan(r.rank_ic.mean)]
    return FoldRow(fold=refit.index, test_start=fold.test_start, test_end=fold.test_end,
                   train_start=splits["train_start"],
                   train_end=splits["train_end"],  # the model's and the baselines' last train date
                   normalized_through=splits["train_end"],
                   days=model.rank_ic.n_days, rank_ic=model.rank_ic.mean,
                   sharpe=model.long_short.sharpe if model.trades else None,
                   best_baseline_rank_ic=max(baseline_ics, default=float("nan")),
                   seconds=seconds)


def walk_forward(cfg: RunConfig, data: str | None, loaded, n_folds: int, work: Path) -> FoldsWalkForward:
    """``signals.folds``: retrain per fold (expanding window) and score each fold's test block
    against baselines fitted on the fold's train rows, in the fold's normalization; mean and spread."""
    from alchemetric_ray.data.labels import LabelSpec
    from alchemetric_ray.data.splits import walk_forward_folds

    reach = LabelSpec.from_config(loaded.config.features).reach
    calendar = inputs_frame(loaded, data)["date"].to_numpy()
    folds = walk_forward_folds(calendar, n_folds, embargo=reach)
    results = []
    for refit in _refits(cfg, data, loaded, folds, calendar, work):
        results.append(_fold_row(refit, score_contenders(refit.contenders, refit.model.manifest, refit.cfg)))
    ics = np.array([f.rank_ic for f in results], dtype=float)
    sharpes = np.array([f.sharpe for f in results], dtype=float)
    return FoldsWalkForward(folds=results, rank_ic_mean=float(np.nanmean(ics)), rank_ic_std=float(np.nanstd(ics)),
                            sharpe_mean=float(np.nanmean(sharpes)), sharpe_std=float(np.nanstd(sharpes)))


def pooled_walk_forward(cfg: RunConfig, data: str | None, loaded, work: Path) -> PooledWalkForward:
    """``evaluate --walk-forward``: refit every ``signals.refit_every`` trading days (expanding window,
    the splits' embargo and purge), predict each next block, pool every out-of-sample prediction
    (the model's and each baseline's, refit per block) and score the pool once: the rank IC with its
    interval over all out-of-sample days, the baselines, the paired difference, long-short, a
    per-year table; and per-fold rows.  Also the time the refits took."""
    from alchemetric_ray.data.labels import LabelSpec
    from alchemetric_ray.data.splits import refit_folds

    started = time.monotonic()
    reach = LabelSpec.from_config(loaded.config.features).reach
    calendar = inputs_frame(loaded, data)["date"].to_numpy()
    folds = refit_folds(calendar, cfg.signals.refit_every, embargo=reach, train_window=cfg.signals.train_window)
    parts, rows = [], []
    for refit in _refits(cfg, data, loaded, folds, calendar, work):
        scored = score_contenders(refit.contenders, refit.model.manifest, refit.cfg)
        rows.append(_fold_row(refit, scored, refit.contenders.seconds))
        parts.append(refit.contenders)
        print(f"walk-forward refit {refit.index + 1}/{len(folds)}: trained through {rows[-1].train_end}, scored "
              f"{refit.fold.test_start}..{refit.fold.test_end}: rank IC {rows[-1].rank_ic:+.4f}", flush=True)
    pooled = score_contenders(Contenders.pooled(parts), loaded.manifest, cfg)
    seconds = time.monotonic() - started
    window = f"rolling {cfg.signals.train_window}-day" if cfg.signals.train_window else "expanding"
    return PooledWalkForward(refit_every=cfg.signals.refit_every, window=window, refits=len(folds),
                             seconds=round(seconds, 1), refits_per_minute=round(60 * len(folds) / seconds, 2),
                             pooled=pooled, years=_per_year(pooled), folds=rows)


def _per_year(pool: SegmentResult) -> list[YearRow]:
    """The model's and the best baseline's mean daily rank IC per calendar year of the pool, with
    the model's interval (:func:`~alchemetric_ray.signals.metrics.mean_interval`) and its days."""
    model = pool.deep_model.rank_ic
    best = next((r.rank_ic for r in pool.rows if r.name == pool.best_baseline), None)
    years = []
    for year, daily in model.daily.groupby(pd.DatetimeIndex(model.daily.index).year):
        v = daily.to_numpy(dtype=np.float64)
        _, lo, hi = sm.mean_interval(v, lag=model.lag, confidence=model.confidence)
        other = best.daily[pd.DatetimeIndex(best.daily.index).year == year] if best is not None else None
        years.append(YearRow(year=int(year), days=int(v.size), rank_ic=float(v.mean()), ci_low=lo, ci_high=hi,
                             best_baseline_rank_ic=float(other.mean()) if other is not None and len(other) else None))
    return years
