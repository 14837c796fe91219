"""`alchemetric-ray evaluate`: does the deep model beat simple baselines on this data, honestly?

On the model's test segment (its own split dates, never seen in training or selection):
classification metrics (class targets), daily IC and rank IC of the score vs the realised forward
return (mean, ICIR, t interval with a Newey-West standard error), a top-minus-bottom quantile long-short portfolio with
costs, the positions' returns (thresholded P(up) - P(down), or per-date quantiles of a regression
target's score) and hit rate, the probabilistic Sharpe ratio and, for a model chosen by a sweep,
the Sharpe ratio deflated for the number of configurations tried.  The same numbers for the
learned baselines on the same features and target (logistic regression, HistGradientBoosting and
LightGBM for classes; ridge regression, HistGradientBoosting and LightGBM regressors for a
cross-sectional target; LightGBM stopped early on the validation segment), a 20-day momentum rule
and buy-and-hold.  Returns are earned only from the bar after the signal (``fwd_ret`` starts
at the next open).  Optional walk-forward folds retrain the model per fold.

Its parts: what is scored and each contender's row (``signals/contenders.py``), the trials behind the
model and its deflated Sharpe ratio (``signals/selection.py``), the walk-forward refits
(``signals/walk_forward.py``), the tear sheet of the model's signal (``signals/tearsheet.py``), the
report (``signals/report.py``) and the record an evaluation returns (``signals/records.py``).  This
module runs them in order, with the one model the command loaded, and keeps the ledger of looks at the
test segment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pandas as pd

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.config import DataConfig, DuplicatePolicy, RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import EvaluationError
from alchemetric_ray.fsutil import atomic_write_json, atomic_write_text, is_uri
from alchemetric_ray.outputs import claim, staged_output
from alchemetric_ray.signals.contenders import (
    DataWindow,
    Segment,
    SegmentResult,
    contender_frames,
    new_data_window,
    score_contenders,
)
from alchemetric_ray.signals.predict import inputs_frame, loaded_model, model_location, predict
from alchemetric_ray.signals.records import Evaluation, Looks, ModelInfo, NewData
from alchemetric_ray.signals.report import plot_equity, render_report
from alchemetric_ray.signals.seeds import seed_spread
from alchemetric_ray.signals.selection import selection_inputs
from alchemetric_ray.signals.tearsheet import TearSheet, bar_opens, tear_sheet, write_pngs
from alchemetric_ray.signals.walk_forward import PooledWalkForward, pooled_walk_forward, walk_forward
from alchemetric_ray.storage import Location, local_copy, locate

if TYPE_CHECKING:
    from alchemetric_ray.artifacts.export import LoadedModel


def evaluate_signals(model_signals: pd.DataFrame, inputs: pd.DataFrame, manifest: Manifest, cfg: RunConfig,
                     *, selection: dict | None = None, segment: tuple[str, str] | None = None) -> SegmentResult:
    """The model and every baseline on the test segment of ``inputs`` (rows with features and labels);
    ``selection``: the trials behind the model (:func:`selection_inputs`), for its deflated Sharpe."""
    contenders = contender_frames(model_signals, inputs, manifest, cfg, segment=segment)
    return score_contenders(contenders, manifest, cfg, selection=selection)


def segment_tear_sheet(signals: pd.DataFrame, loaded: LoadedModel, data: str | None, segment: Segment,
                       on_duplicate: DuplicatePolicy | None = None) -> TearSheet:
    """The tear sheet (``signals/tearsheet.py``) of the model's ``signals`` on the scored ``segment``,
    its returns from the opens of the bars the signals were computed from (``data``, else the model's
    own data, read again as :func:`~alchemetric_ray.signals.predict.inputs_frame` reads them), at the
    model's label horizon."""
    from alchemetric_ray.bars.sources import open_source

    dates = pd.to_datetime(signals["date"])
    rows = signals[(dates >= pd.Timestamp(segment.start)) & (dates <= pd.Timestamp(segment.end))]
    own = loaded.config.data
    path = data or own.path
    # bars on object storage: read from a temporary local copy, as the inputs were (signals/predict.py)
    with local_copy(path) if path and is_uri(path) else contextlib.nullcontext(path) as local:
        where = None if local is None else str(local)
        source_cfg = (DataConfig(path=where, source="files", on_duplicate=on_duplicate or own.on_duplicate) if data
                      else dataclasses.replace(own, path=where, on_duplicate=on_duplicate or own.on_duplicate))
        opens = bar_opens(open_source(source_cfg).bars, rows["ticker"].unique(), segment.start)
    return tear_sheet(rows[["date", "ticker", "score"]], opens, horizon=int(loaded.manifest.label["horizon"]))


def evaluate(model: str | Path | Location | LoadedModel, data: str | None, out_dir: str | Path | Location,
             cfg: RunConfig | None = None, *, pooled: bool = False) -> Evaluation:
    """Predict, score the test segment against the baselines, and write the report to ``out_dir``;
    ``pooled`` adds the pooled walk-forward evaluation (:func:`pooled_walk_forward`).  ``model``: a
    saved model folder, or the model already loaded from one (every step uses that one load).  Returns
    the evaluation's record; ``evaluation.json`` is its ``as_dict()``."""
    model_dir, out_dir = model_location(model), locate(out_dir)
    claim(out_dir, "evaluation", what="report folder")  # before any work: only our own report is replaced
    loaded = loaded_model(model)
    cfg = cfg or loaded.config
    if pooled and cfg.signals.folds:
        raise EvaluationError(f"--walk-forward and signals.folds={cfg.signals.folds} are two walk-forward "
                              "evaluations; choose one (signals.refit_every sets the pooled one's refits)")
    metrics = json.loads((model_dir / "metrics.json").read_text()) if (model_dir / "metrics.json").is_file() else {}
    splits = loaded.manifest.splits
    with staged_output(out_dir, "evaluation") as tmp:
        signals = predict(loaded, data, tmp / "signals.parquet", cfg)
        inputs = inputs_frame(loaded, data, on_duplicate=cfg.data.on_duplicate if data else None)
        window = new_data_window(inputs, loaded.manifest) if data else None
        scored = evaluate_signals(signals, inputs, loaded.manifest, cfg,
                                  selection=selection_inputs(model_dir, loaded.manifest, metrics),
                                  segment=(window.start, window.end) if window else None)
        result = Evaluation(**vars(scored))
        if data:  # new data: where it came from, the window scored, how its duplicated bars were treated
            result.data = NewData(path=str(data), window=cast(DataWindow, window),  # cast: set where data is
                                  duplicates=inputs.attrs.get("duplicates"))
        if pooled:
            result.walk_forward = pooled_walk_forward(cfg, data, loaded, tmp)
        elif cfg.signals.folds:
            result.walk_forward = walk_forward(cfg, data, loaded, cfg.signals.folds, tmp)
        result.model = ModelInfo(dir=str(model_dir), id=signals["model_id"].iloc[0] if len(signals) else None,
                                 name=loaded.config.model.name, device=loaded.meta.device,
                                 precision=loaded.meta.precision, label=loaded.manifest.label["scheme"],
                                 cross_sectional=bool(loaded.manifest.cross_section))
        # this command is a look at the test segment: the earlier looks at it, and this one
        # cast: where pooled, the walk-forward is the pooled one set above
        seen = cast(PooledWalkForward, result.walk_forward).pooled.segment if pooled else result.segment
        look = Segment(start=min(seen.start, result.segment.start), end=max(seen.end, result.segment.end))
        earlier = ledger.looks_at(model_dir, splits["test_start"], splits["test_end"])
        result.looks = Looks(test_start=splits["test_start"], test_end=splits["test_end"], count=len(earlier) + 1,
                             earlier=earlier, this=look)
        result.tear_sheet = segment_tear_sheet(signals, loaded, data, result.segment,
                                               on_duplicate=cfg.data.on_duplicate if data else None)
        result.seeds = seed_spread(loaded, inputs, result.segment.start, result.segment.end)
        if result.seeds is not None:  # a seed ensemble: the verdict line names how far its seeds lie apart
            result.verdict = dataclasses.replace(result.verdict, line=f"{result.verdict.line} ({result.seeds.line()})")
        plot_equity(result, tmp / "equity.png")
        write_pngs(result.tear_sheet, tmp)
        atomic_write_text(tmp / "report.md", render_report(result))
        atomic_write_json(tmp / "evaluation.json", result.as_dict())
    what = ("pooled walk-forward and test segment" if pooled else "new data" if data else "test segment") + \
        f" scored against the baselines, report {out_dir}"
    ledger.record_look(model_dir, "evaluate", look.start, look.end, what)
    return result

