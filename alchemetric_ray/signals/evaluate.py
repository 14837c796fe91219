"""`alchemetric-ray evaluate`: does the deep model beat simple baselines on this data, honestly?

On the model's test segment (its own split dates, never seen in training or selection):
classification metrics (class targets), daily IC and rank IC of the score vs the realised forward
return (mean, ICIR, t interval with a Newey-West standard error), a top-minus-bottom quantile long-short portfolio with
costs, the positions' returns (thresholded P(up) - P(down), or per-date quantiles of a regression
target's score) and hit rate, the probabilistic Sharpe ratio and, for a model chosen by a sweep,
the Sharpe ratio deflated for the number of configurations tried.  The same numbers for the
learned baselines on the same features and target (logistic regression and HistGradientBoosting
for classes; ridge regression and HistGradientBoosting regressor for a cross-sectional target), a
20-day momentum rule and buy-and-hold.  Returns are earned only from the bar after the signal (``fwd_ret`` starts
at the next open).  Optional walk-forward folds retrain the model per fold.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import atomic_write_json, atomic_write_text, is_uri
from alchemetric_ray.outputs import claim, staged_output
from alchemetric_ray.scoring.metrics import classification_metrics
from alchemetric_ray.signals import metrics as sm
from alchemetric_ray.signals.predict import (
    direction_score,
    inputs_frame,
    normalized_copy,
    predict,
    signal_positions,
    stage_inputs,
    staged_frame,
)
from alchemetric_ray.storage import Location, locate

FEW_TICKERS = 10
BUY_AND_HOLD = "buy and hold"


class EvaluationError(UserError, ValueError):
    pass


def _segment(frame: pd.DataFrame, start: str, end: str) -> pd.DataFrame:
    d = frame["date"]
    return frame[(d >= pd.Timestamp(start)) & (d <= pd.Timestamp(end))].reset_index(drop=True)


def _scored(frame: pd.DataFrame, score: np.ndarray, pos: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"date": frame["date"].to_numpy(), "ticker": frame["ticker"].to_numpy(), "score": score,
                         "position": pos, "fwd_ret": frame["fwd_ret"].to_numpy(dtype=np.float64)})


@dataclass
class ContenderRow:
    """One contender's (model's or baseline's) figures on one segment: the statistics objects
    themselves (their daily series and equity curves feed the plot, the per-year table and the
    verdict); :meth:`as_dict` is the row of ``evaluation.json``."""

    name: str
    rows: int
    tickers: int
    ic: sm.ICStats
    rank_ic: sm.ICStats
    long_short: sm.PortfolioStats
    positions: sm.PortfolioStats
    hit_rate: float
    psr: float
    dsr: float | None = None  # the deep model's, when trials stand behind it (selection_figures)
    classification: dict | None = None

    @property
    def trades(self) -> bool:
        """Whether its long-short book ever held a position.  A score that ranks every name alike
        (buy-and-hold's constant) has no book: its long-short figures are undefined, not zero, and
        are left out (None in ``evaluation.json``, n/a in the tables; the plot draws its positions)."""
        return not math.isnan(self.long_short.hit_rate)  # NaN exactly when no period was active

    def as_dict(self) -> dict[str, Any]:
        row = {"name": self.name, "rows": self.rows, "tickers": self.tickers, "ic": _ic_dict(self.ic),
               "rank_ic": _ic_dict(self.rank_ic), "long_short": _port_dict(self.long_short, defined=self.trades),
               "positions": _port_dict(self.positions), "hit_rate": self.hit_rate,
               "psr": self.psr if self.trades else None, "dsr": self.dsr}
        return row if self.classification is None else {**row, "classification": self.classification}

    @staticmethod
    def _curve(book: sm.PortfolioStats) -> pd.DataFrame | None:
        return book.daily[["date", "equity"]] if len(book.daily) else None

    @property
    def long_short_equity(self) -> pd.DataFrame | None:
        return self._curve(self.long_short)

    @property
    def positions_equity(self) -> pd.DataFrame | None:
        return self._curve(self.positions)


def contender_stats(name: str, signals: pd.DataFrame, cfg: RunConfig, *, horizon: int = 1,
                    proba: np.ndarray | None = None, labels: np.ndarray | None = None) -> ContenderRow:
    """Every number of the side-by-side table for one contender (model or baseline)."""
    signal_cfg = cfg.signals
    valid = signals.dropna(subset=["fwd_ret"])
    long_short = sm.long_short(valid, quantile=signal_cfg.quantile, cost_bps=signal_cfg.cost_bps, horizon=horizon)
    net = long_short.daily["net"].to_numpy() if len(long_short.daily) else np.zeros(0)
    classification = None
    if proba is not None and labels is not None:
        ok = labels >= 0
        classification = classification_metrics(labels[ok], proba[ok], prefix="")
    return ContenderRow(name=name, rows=len(valid), tickers=int(valid["ticker"].nunique()),
                        ic=sm.ic_stats(valid, rank=False, lag=horizon - 1),  # days whose forward returns overlap
                        rank_ic=sm.ic_stats(valid, rank=True, lag=horizon - 1), long_short=long_short,
                        positions=sm.position_returns(valid, cost_bps=signal_cfg.cost_bps, horizon=horizon),
                        hit_rate=sm.hit_rate(valid),
                        psr=sm.probabilistic_sharpe(net) if len(net) > 2 else float("nan"),
                        classification=classification)


def _ic_dict(stats: sm.ICStats) -> dict:
    return {"mean": stats.mean, "std": stats.std, "icir": stats.icir, "t_stat": stats.t_stat, "n_days": stats.n_days,
            "ci_low": stats.ci_low, "ci_high": stats.ci_high}


def _port_dict(portfolio: sm.PortfolioStats, *, defined: bool = True) -> dict:
    """A book's figures; every one None (its day count kept) for a book that never held a position."""
    if not defined:
        return {"annual_return": None, "annual_vol": None, "sharpe": None, "max_drawdown": None, "turnover": None,
                "hit_rate": None, "n_days": portfolio.n_days}
    return {"annual_return": portfolio.annual_return, "annual_vol": portfolio.annual_vol, "sharpe": portfolio.sharpe,
            "max_drawdown": portfolio.max_drawdown, "turnover": portfolio.turnover, "hit_rate": portfolio.hit_rate,
            "n_days": portfolio.n_days}


def deflated_validation_sharpe(sweep: dict | None) -> float | None:
    """The deflated Sharpe ratio of a sweep's chosen trial (Bailey and Lopez de Prado, 2014): its
    *validation* long-short per-period Sharpe ratio, skewness, kurtosis and day count, against the
    expected maximum of ``num_trials`` unskilled trials whose Sharpe ratios vary as the sweep's
    trials did (``trial_sr_variance``).  None without a sweep of 2 or more trials that recorded them.
    (An older model's ``metrics.json["sweep"]``; a model with a trial ledger: :func:`selection_inputs`.)"""
    return _deflated(_sweep_inputs(sweep))


def _sweep_inputs(sweep: dict | None) -> dict | None:
    sweep = sweep or {}
    chosen, variance, n_trials = sweep.get("chosen_val_long_short"), sweep.get("trial_sr_variance"), \
        int(sweep.get("num_trials", 1))
    if n_trials < 2 or not chosen or variance is None:
        return None
    return {"n_trials": n_trials, "variance": variance, "chosen": chosen, "selections": 1}


def _deflated(inputs: dict | None) -> float | None:
    if not inputs:
        return None
    chosen = inputs["chosen"]
    return sm.deflated_sharpe(chosen["sr"], chosen["skew"], chosen["kurt"], int(chosen["days"]), inputs["n_trials"],
                              inputs["variance"])


def selection_inputs(model_dir, manifest: Manifest, metrics: dict) -> dict | None:
    """Every trial behind the model, for its deflated Sharpe ratio: the model folder's trial ledger
    (every sweep and training run exported under its name for this test segment), else an older
    model's own sweep record; None where fewer than 2 trials stand behind it."""
    splits = manifest.splits
    entries = ledger.trials_at(ledger.read_trials(model_dir), splits["test_start"], splits["test_end"])
    return ledger.deflation_inputs(entries) if entries else _sweep_inputs(metrics.get("sweep"))


def selection_figures(model_frame: pd.DataFrame, inputs: dict | None, cfg: RunConfig) -> dict | None:
    """The deflated Sharpe ratio beside its like: the figure it deflates is the chosen trial's gross
    per-date validation long-short Sharpe ratio (the book the trials were compared on,
    ``scoring.metrics.signal_metrics``); the same book, gross and per date, on the scored segment
    stands beside it (the table's L/S Sharpe is net of costs and annualised: another figure)."""
    from alchemetric_ray.scoring.metrics import signal_metrics

    if not inputs:
        return None
    frame = model_frame.dropna(subset=["fwd_ret"])
    test = signal_metrics(frame["score"].to_numpy(np.float64), frame["fwd_ret"].to_numpy(np.float64),
                          frame["date"].to_numpy(), prefix="", quantile=cfg.signals.quantile)
    return {"n_trials": int(inputs["n_trials"]), "selections": int(inputs.get("selections", 1)),
            "val_ls_sr_gross_per_date": inputs["chosen"]["sr"], "dsr": _deflated(inputs),
            "scored_ls_sr_gross_per_date": test["ls_sr"], "scored_days": int(test["ls_days"])}


def evaluate_signals(model_signals: pd.DataFrame, inputs: pd.DataFrame, manifest: Manifest, cfg: RunConfig,
                     *, selection: dict | None = None, segment: tuple[str, str] | None = None) -> dict[str, Any]:
    """The model and every baseline on the test segment of ``inputs`` (rows with features and labels);
    ``selection``: the trials behind the model (:func:`selection_inputs`), for its deflated Sharpe."""
    contenders = contender_frames(model_signals, inputs, manifest, cfg, segment=segment)
    return score_contenders(contenders, manifest, cfg, selection=selection)


@dataclass
class Contenders:
    """What each contender scored on one segment, before any statistic: its (date, ticker, score,
    position, fwd_ret) frame, with class probabilities and labels where it has them."""

    start: str
    end: str
    frames: dict[str, pd.DataFrame]
    proba: dict[str, np.ndarray | None]
    labels: dict[str, np.ndarray | None]
    baselines_note: str | None
    seconds: dict[str, float] | None = None  # a walk-forward refit's phases, where they were timed

    @staticmethod
    def pooled(parts: list[Contenders]) -> Contenders:
        """Blocks of consecutive segments as one: each contender's rows of every block, in order (a
        contender missing from a block, a learned baseline with nothing to fit on, is left out)."""
        names = [n for n in parts[0].frames if all(n in p.frames for p in parts)]

        def joined(field: str, name: str):
            values = [getattr(p, field)[name] for p in parts]
            return None if any(v is None for v in values) else np.concatenate(values)

        return Contenders(parts[0].start, parts[-1].end,
                          {n: pd.concat([p.frames[n] for p in parts], ignore_index=True) for n in names},
                          {n: joined("proba", n) for n in names}, {n: joined("labels", n) for n in names},
                          "; ".join(dict.fromkeys(p.baselines_note for p in parts if p.baselines_note)) or None)


def contender_frames(model_signals: pd.DataFrame, inputs: pd.DataFrame, manifest: Manifest, cfg: RunConfig,
                     *, segment: tuple[str, str] | None = None) -> Contenders:
    """The model's signals and every baseline's on the segment (default: the manifest's test
    segment); the learned baselines are fitted on the rows :func:`_baseline_rows` gives."""
    from alchemetric_ray.scoring.baselines import (
        baseline_models,
        fit_baseline,
        predict_baseline,
    )

    splits = manifest.splits
    start, end = segment or (splits["test_start"], splits["test_end"])
    names, classes = manifest.features, manifest.classes
    test = _segment(inputs, start, end)
    if test.empty:
        raise EvaluationError(f"no rows of the data fall in the test segment {start}..{end}")
    model_signals = model_signals.assign(date=np.asarray(model_signals["date"], dtype="datetime64[ns]"))
    model_rows = model_signals.merge(test[["date", "ticker", "label"]], on=["date", "ticker"], how="inner")
    proba_cols = [f"p_{c}" for c in classes]  # none for a regression target: its score is the model's output
    frames = {"deep model": model_rows[["date", "ticker", "score", "position", "fwd_ret"]].reset_index(drop=True)}
    proba = {"deep model": model_rows[proba_cols].to_numpy() if classes else None}
    labels = {"deep model": model_rows["label"].to_numpy()}

    train, baselines_note = _baseline_rows(inputs, manifest, start)
    if len(train) > 200_000:
        train = train.sample(200_000, random_state=cfg.train.seed)
    learned = baseline_models(cfg.train.seed, manifest.regression) if len(train) else {}
    for name, model in learned.items():
        fit_baseline(model, train[names].to_numpy(), train["label"].to_numpy())
        p = predict_baseline(model, test[names].to_numpy(), len(classes))
        name = name.replace("_", " ")
        score = direction_score(p, classes)
        pos = signal_positions(score, test["date"].to_numpy(), classes, cfg)
        frames[name], proba[name], labels[name] = _scored(test, score, pos), p if classes else None, \
            test["label"].to_numpy()
    mom = test["mom_20"].to_numpy()
    frames["momentum 20d"] = _scored(test, mom, np.sign(mom).astype(np.int8))
    frames[BUY_AND_HOLD] = _scored(test, np.ones(len(test)), np.ones(len(test), np.int8))
    for name in ("momentum 20d", BUY_AND_HOLD):
        proba[name] = labels[name] = None
    return Contenders(start, end, frames, proba, labels, baselines_note)


def score_contenders(contenders: Contenders, manifest: Manifest, cfg: RunConfig, *,
                     selection: dict | None = None) -> dict[str, Any]:
    """Every contender's row, the best baseline and the verdict, on what :func:`contender_frames` scored."""
    horizon = manifest.label["horizon"]
    rows = [contender_stats(name, frame, cfg, horizon=horizon, proba=contenders.proba[name],
                            labels=contenders.labels[name]) for name, frame in contenders.frames.items()]
    figures = selection_figures(contenders.frames["deep model"], selection, cfg)
    rows[0].dsr = figures["dsr"] if figures else None  # of the validation book: see result["selection"]
    n_tickers = int(contenders.frames["deep model"]["ticker"].nunique())
    baselines_with_ic = [r for r in rows[1:] if r.name != BUY_AND_HOLD and r.rank_ic.n_days > 0]
    best = max(baselines_with_ic, key=lambda r: r.rank_ic.mean if not math.isnan(r.rank_ic.mean) else -1,
               default=None)
    verdict = sm.edge_verdict(rows[0].rank_ic, best.rank_ic if best else None, n_tickers=n_tickers,
                              few_tickers=FEW_TICKERS, baseline_name=best.name if best else "best baseline")
    return {"segment": {"start": contenders.start, "end": contenders.end}, "tickers": n_tickers, "rows": rows,
            "best_baseline": best.name if best else None, "verdict": verdict,
            "n_trials": figures["n_trials"] if figures else 1, "selection": figures,
            "baselines_note": contenders.baselines_note}


def _baseline_rows(inputs: pd.DataFrame, manifest: Manifest, start: str) -> tuple[pd.DataFrame, str | None]:
    """The labelled rows the learned baselines are fitted on, and a line where they are not the
    model's own training period: the rows up to the model's ``train_end``; where the data has none
    (new data that begins later), its own rows before the scored window whose labels end before it
    (``reach`` bars of embargo); where it has neither, none, and the line says why."""
    known = np.isfinite(inputs["label"]) if manifest.regression else inputs["label"] >= 0
    train_end = manifest.splits["train_end"]
    train = inputs[(inputs["date"] <= pd.Timestamp(train_end)) & known]
    if len(train):
        return train, None
    days = np.unique(inputs["date"].to_numpy())
    before = days[days < np.datetime64(pd.Timestamp(start))]
    reach = int(manifest.label.get("reach") or manifest.label.get("horizon") or 1)
    if len(before) > reach:
        last = before[-reach - 1]
        early = inputs[(inputs["date"] <= last) & known]
        if len(early):
            return early, (f"the learned baselines were fitted on the data's own rows {_day(before[0])}..{_day(last)} "
                           f"(before the scored window, {reach} bar(s) of embargo): it has none up to the model's "
                           f"training end {train_end}")
    return inputs.iloc[:0], (f"no learned baselines: the data has no labelled rows up to the model's training end "
                             f"{train_end}, nor before the scored window ({start}), to fit them on")


def _day(value) -> str:
    return str(np.datetime64(value, "D"))


def new_data_window(inputs: pd.DataFrame, manifest: Manifest) -> dict[str, Any]:
    """The dates ``evaluate --data`` scores: from the model's test-segment start (earlier dates'
    labels took part in training or model selection) or the data's first date, whichever is later,
    to the data's last date with a realised forward return; with its days and names."""
    test_start = manifest.splits["test_start"]
    labelled = inputs[np.isfinite(inputs["fwd_ret"].to_numpy(dtype=np.float64))]
    first = max(pd.Timestamp(test_start), labelled["date"].min()) if len(labelled) else pd.Timestamp(test_start)
    if not len(labelled) or labelled["date"].max() < first:
        raise EvaluationError(f"the data has no labelled rows from the model's test-segment start {test_start} on "
                              f"(its last date with a forward return: "
                              f"{_day(labelled['date'].max()) if len(labelled) else 'none'})")
    scored = labelled[labelled["date"] >= first]
    return {"start": _day(first), "end": _day(scored["date"].max()), "days": int(scored["date"].nunique()),
            "names": int(scored["ticker"].nunique()), "model_test_start": test_start,
            "model_test_end": manifest.splits["test_end"]}


def evaluate(model_dir: str | Path | Location, data: str | None, out_dir: str | Path | Location,
             cfg: RunConfig | None = None, *, pooled: bool = False) -> dict:
    """Predict, score the test segment against the baselines, and write the report to ``out_dir``;
    ``pooled`` adds the pooled walk-forward evaluation (:func:`pooled_walk_forward`).  Returns what
    ``evaluation.json`` holds (:func:`public`)."""
    from alchemetric_ray.artifacts.export import load_model

    model_dir, out_dir = locate(model_dir), locate(out_dir)
    claim(out_dir, "evaluation", what="report folder")  # before any work: only our own report is replaced
    loaded = load_model(model_dir)
    cfg = cfg or loaded.config
    if pooled and cfg.signals.folds:
        raise EvaluationError(f"--walk-forward and signals.folds={cfg.signals.folds} are two walk-forward "
                              "evaluations; choose one (signals.refit_every sets the pooled one's refits)")
    metrics = json.loads((model_dir / "metrics.json").read_text()) if (model_dir / "metrics.json").is_file() else {}
    splits = loaded.manifest.splits
    with staged_output(out_dir, "evaluation") as tmp:
        signals = predict(model_dir, data, tmp / "signals.parquet", cfg)
        inputs = inputs_frame(loaded, data, on_duplicate=cfg.data.on_duplicate if data else None)
        window = new_data_window(inputs, loaded.manifest) if data else None
        result = evaluate_signals(signals, inputs, loaded.manifest, cfg,
                                  selection=selection_inputs(model_dir, loaded.manifest, metrics),
                                  segment=(window["start"], window["end"]) if window else None)
        if data:  # new data: where it came from, the window scored, how its duplicated bars were treated
            result["data"] = {"path": str(data), "window": window, "duplicates": inputs.attrs.get("duplicates")}
        if pooled:
            result["walk_forward"] = pooled_walk_forward(cfg, data, loaded, tmp)
        elif cfg.signals.folds:
            result["walk_forward"] = walk_forward(cfg, data, loaded, cfg.signals.folds, tmp)
        result["model"] = {"dir": str(model_dir), "id": signals["model_id"].iloc[0] if len(signals) else None,
                           "name": loaded.config.model.name, "device": loaded.meta.get("device"),
                           "precision": loaded.meta.get("precision"), "label": loaded.manifest.label["scheme"],
                           "cross_sectional": bool(loaded.manifest.cross_section)}
        # this command is a look at the test segment: the earlier looks at it, and this one
        scored = (result["walk_forward"]["pooled"]["segment"] if pooled else result["segment"])
        look = {"start": min(scored["start"], result["segment"]["start"]),
                "end": max(scored["end"], result["segment"]["end"])}
        earlier = ledger.looks_at(model_dir, splits["test_start"], splits["test_end"])
        result["looks"] = {"test_start": splits["test_start"], "test_end": splits["test_end"],
                           "count": len(earlier) + 1, "earlier": earlier, "this": look}
        _plot_equity(result, tmp / "equity.png")
        result = public(result)
        atomic_write_text(tmp / "report.md", render_report(result))
        atomic_write_json(tmp / "evaluation.json", result)
    what = ("pooled walk-forward and test segment" if pooled else "new data" if data else "test segment") + \
        f" scored against the baselines, report {out_dir}"
    ledger.record_look(model_dir, "evaluate", look["start"], look["end"], what)
    return result


def _refits(cfg: RunConfig, data: str | None, loaded, folds: list, calendar: np.ndarray, work: Path):
    """Retrain the model's config on each fold (``features.train_end``/``val_end`` at the fold's
    boundaries, in this Ray session: local mode where one worker serves) and yield, per fold, its
    model and what every contender scored on the fold's test block; the learned baselines are fitted
    on the fold's train rows, in the fold's normalization (the main model's was fitted on a train
    split that can reach into the fold's block).  The features are computed once for every fold:
    the training features (each fold's shards are their split and normalization) and the inputs
    the folds' models score (each fold normalizes them with its own statistics)."""
    from alchemetric_ray.artifacts.export import load_model as load
    from alchemetric_ray.data.shards import build_shards, stage_features
    from alchemetric_ray.data.splits import boundaries
    from alchemetric_ray.train.trainer import run_training

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
            sig = predict(outcome.model_dir, data, work / "folds" / f"signals-{k}.parquet", fold_cfg, staged=staging)
            inputs = staged_frame(staging, staged)
            shutil.rmtree(staging)
            seconds["predict"] = time.monotonic() - clock
            clock = time.monotonic()
            contenders = contender_frames(sig, inputs, fold_model.manifest, fold_cfg,
                                          segment=(fold.test_start, fold.test_end))
            seconds["baselines"] = time.monotonic() - clock  # their fits and scores on the block
            contenders.seconds = {phase: round(v, 2) for phase, v in seconds.items()}
            yield k, fold, fold_model, fold_cfg, contenders


def _fold_row(k: int, fold, fold_model, res: dict) -> dict:
    model = res["rows"][0]
    return {"fold": k, "test_start": fold.test_start, "test_end": fold.test_end,
            "train_start": fold_model.manifest.splits["train_start"],
            "train_end": fold_model.manifest.splits["train_end"],  # the model's and the baselines' last train date
            "normalized_through": fold_model.manifest.splits["train_end"],
            "days": model.rank_ic.n_days, "rank_ic": model.rank_ic.mean,
            "sharpe": model.long_short.sharpe if model.trades else None,
            "best_baseline_rank_ic": max((r.rank_ic.mean for r in res["rows"][1:] if not math.isnan(r.rank_ic.mean)),
                                         default=float("nan"))}


def walk_forward(cfg: RunConfig, data: str | None, loaded, n_folds: int, work: Path) -> dict:
    """``signals.folds``: retrain per fold (expanding window) and score each fold's test block
    against baselines fitted on the fold's train rows, in the fold's normalization; mean and spread."""
    from alchemetric_ray.data.labels import LabelSpec
    from alchemetric_ray.data.splits import walk_forward_folds

    reach = LabelSpec.from_config(loaded.config.features).reach
    calendar = inputs_frame(loaded, data)["date"].to_numpy()
    folds = walk_forward_folds(calendar, n_folds, embargo=reach)
    results = []
    for k, fold, fold_model, fold_cfg, contenders in _refits(cfg, data, loaded, folds, calendar, work):
        results.append(_fold_row(k, fold, fold_model, score_contenders(contenders, fold_model.manifest, fold_cfg)))
    ics = np.array([r["rank_ic"] for r in results], dtype=float)
    sharpes = np.array([r["sharpe"] for r in results], dtype=float)
    return {"folds": results, "rank_ic_mean": float(np.nanmean(ics)), "rank_ic_std": float(np.nanstd(ics)),
            "sharpe_mean": float(np.nanmean(sharpes)), "sharpe_std": float(np.nanstd(sharpes))}


def pooled_walk_forward(cfg: RunConfig, data: str | None, loaded, work: Path) -> dict:
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
    for k, fold, fold_model, fold_cfg, contenders in _refits(cfg, data, loaded, folds, calendar, work):
        rows.append({**_fold_row(k, fold, fold_model, score_contenders(contenders, fold_model.manifest, fold_cfg)),
                     "seconds": contenders.seconds})
        parts.append(contenders)
        print(f"walk-forward refit {k + 1}/{len(folds)}: trained through {rows[-1]['train_end']}, scored "
              f"{fold.test_start}..{fold.test_end}: rank IC {rows[-1]['rank_ic']:+.4f}", flush=True)
    pooled = score_contenders(Contenders.pooled(parts), loaded.manifest, cfg)
    seconds = time.monotonic() - started
    window = f"rolling {cfg.signals.train_window}-day" if cfg.signals.train_window else "expanding"
    return {"refit_every": cfg.signals.refit_every, "window": window, "refits": len(folds),
            "seconds": round(seconds, 1), "refits_per_minute": round(60 * len(folds) / seconds, 2),
            "pooled": pooled, "years": _per_year(pooled), "folds": rows}


def _per_year(result: dict) -> list[dict]:
    """The model's and the best baseline's mean daily rank IC per calendar year of the pool, with
    the model's interval (:func:`~alchemetric_ray.signals.metrics.mean_interval`) and its days."""
    model = result["rows"][0].rank_ic
    best = next((r.rank_ic for r in result["rows"] if r.name == result["best_baseline"]), None)
    years = []
    for year, daily in model.daily.groupby(pd.DatetimeIndex(model.daily.index).year):
        v = daily.to_numpy(dtype=np.float64)
        _, lo, hi = sm.mean_interval(v, lag=model.lag, confidence=model.confidence)
        other = best.daily[pd.DatetimeIndex(best.daily.index).year == year] if best is not None else None
        years.append({"year": int(year), "days": int(v.size), "rank_ic": float(v.mean()), "ci_low": lo, "ci_high": hi,
                      "best_baseline_rank_ic": float(other.mean()) if other is not None and len(other) else None})
    return years


def public(result: dict) -> dict:
    """``result`` as ``evaluation.json`` holds it (and :func:`evaluate` returns it): every
    contender row (:class:`ContenderRow`, the pooled walk-forward's too) as its dict."""
    out = {**result, "rows": [r.as_dict() for r in result["rows"]]}
    if "pooled" in (result.get("walk_forward") or {}):
        out["walk_forward"] = {**result["walk_forward"], "pooled": public(result["walk_forward"]["pooled"])}
    return out


def equity_curves(tickers: int, rows: list[ContenderRow]) -> dict[str, pd.DataFrame]:
    """The curve the equity plot draws per contender: the long-short portfolio on a cross-section
    (FEW_TICKERS or more names), else the thresholded positions.  Buy-and-hold is always its
    positions, the equal-weight long-only book: a constant score ranks no stock above another, so
    it has no long-short book (:attr:`ContenderRow.trades`), nor has any contender whose book never traded."""
    cross = tickers >= FEW_TICKERS
    curves = {}
    for row in rows:
        eq = row.long_short_equity if cross and row.trades else row.positions_equity
        if eq is not None and len(eq):
            curves[row.name] = eq
    return curves


def _plot_equity(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    cross = result["tickers"] >= FEW_TICKERS
    for name, eq in equity_curves(result["tickers"], result["rows"]).items():
        ax.plot(pd.to_datetime(eq["date"]), eq["equity"], label=name, linewidth=2.2 if name == "deep model" else 1.2)
    ax.set_title(("long-short top/bottom quantile" if cross else "thresholded positions") + ", net of costs")
    ax.set_ylabel("equity (start = 1)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def _f(value, fmt="{:.4f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return fmt.format(value)


def verdict_table(result: dict) -> str:
    """The verdict and the side-by-side table for a terminal: one row per contender."""
    seg = result["segment"]
    scored = "new " if result.get("data") else "test "
    header = (f"{scored + seg['start'] + '..' + seg['end']:<26s} {'rank IC [95% CI]':>26s} {'L/S Sharpe':>10s} "
              f"{'L/S return':>10s} {'bal. acc':>8s}")
    lines = [header]
    for r in result["rows"]:
        rank_ic, long_short = r["rank_ic"], r["long_short"]
        bal = r.get("classification", {}).get("balanced_accuracy")
        interval = (f"{_f(rank_ic['mean'], '{:+.4f}')} "
                    f"[{_f(rank_ic['ci_low'], '{:+.4f}')}, {_f(rank_ic['ci_high'], '{:+.4f}')}]")
        lines.append(f"{r['name']:<26s} {interval:>26s} {_f(long_short['sharpe'], '{:.2f}'):>10s} "
                     f"{_f(long_short['annual_return'], '{:.1%}'):>10s} {_f(bal):>8s}")
    return "\n".join([*lines, result["verdict"]["line"]])


def _contender_table(rows: list[dict]) -> list[str]:
    lines = ["| contender | rank IC [CI] | IC | ICIR | L/S Sharpe | L/S ann. return | max DD | turnover | "
             "positions Sharpe | hit rate | PSR | DSR | bal. acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        rank_ic, long_short = row["rank_ic"], row["long_short"]
        cells = [row["name"], f"{_f(rank_ic['mean'])} [{_f(rank_ic['ci_low'])}, {_f(rank_ic['ci_high'])}]",
                 _f(row["ic"]["mean"]), _f(rank_ic["icir"], "{:.2f}"),
                 _f(long_short["sharpe"], "{:.2f}"), _f(long_short["annual_return"], "{:.2%}"),
                 _f(long_short["max_drawdown"], "{:.2%}"), _f(long_short["turnover"], "{:.2f}"),
                 _f(row["positions"]["sharpe"], "{:.2f}"), _f(row["hit_rate"], "{:.3f}"), _f(row["psr"], "{:.3f}"),
                 _f(row["dsr"], "{:.3f}"), _f(row.get("classification", {}).get("balanced_accuracy"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pooled_section(wf: dict) -> list[str]:
    pooled, seg = wf["pooled"], wf["pooled"]["segment"]
    days = pooled["rows"][0]["rank_ic"]["n_days"]
    lines = [f"## Walk-forward, pooled out of sample ({wf['refits']} refits every {wf['refit_every']} trading days, "
             f"{wf['window']} window)", "",
             f"Every out-of-sample prediction of {seg['start']}..{seg['end']} ({days} days, {pooled['tickers']} "
             f"tickers), scored once; each block was predicted by a model (and baselines) fitted only on the dates "
             f"before it. {wf['refits']} refits took {wf['seconds']:.0f} s ({wf['refits_per_minute']:.2f} a minute).",
             "", f"**{pooled['verdict']['line']}**", ""]
    if pooled.get("baselines_note"):
        lines += [f"> Baselines: {pooled['baselines_note']}.", ""]
    lines += _contender_table(pooled["rows"])
    lines += ["", "| year | days | rank IC [CI] | best baseline rank IC |", "|---|---|---|---|"]
    for year in wf["years"]:
        lines.append(f"| {year['year']} | {year['days']} | {_f(year['rank_ic'])} [{_f(year['ci_low'])}, "
                     f"{_f(year['ci_high'])}] | {_f(year['best_baseline_rank_ic'])} |")
    lines += ["", "| fold | trained through | scored | days | rank IC | Sharpe | best baseline rank IC |",
              "|---|---|---|---|---|---|---|"]
    for fold in wf["folds"]:
        lines.append(f"| {fold['fold']} | {fold['train_end']} | {fold['test_start']}..{fold['test_end']} | "
                     f"{fold['days']} | {_f(fold['rank_ic'])} | {_f(fold['sharpe'], '{:.2f}')} | "
                     f"{_f(fold['best_baseline_rank_ic'])} |")
    return [*lines, ""]


def _looks_lines(looks: dict | None) -> list[str]:
    """How often the test segment has been scored: a look is a command that scored it (its labels
    against a model's scores): `evaluate`, `train`/`tune` with train.score_test, `doctor --model`."""
    if not looks:
        return []
    earlier = looks["earlier"]
    line = (f"Looks at the test segment {looks['test_start']}..{looks['test_end']}: {looks['count']}, this one "
            "included (a look: a command that scored the segment's labels; recorded in the model folder's looks/)")
    if earlier:
        line += f"; the earlier: {ledger.look_summary(earlier)}"
    tail = (" Any look after the first may have steered the model (a retrain, another configuration): read these "
            "figures as less than out of sample; new data (`evaluate --data`) is fresh evidence."
            if looks["count"] > 1 else "")
    return [f"{line}.{tail}", ""]


def render_report(result: dict) -> str:
    seg = result["segment"]
    v = result["verdict"]
    lines = [f"# Evaluation: {result['model']['name']} ({result['model']['id']})", "",
             f"**{v['line']}**", "",
             f"signal: {'yes' if v.get('signal') else 'no'} (the model's rank-IC interval "
             f"{'excludes' if v.get('signal') else 'does not exclude'} 0); an edge over the best baseline also needs "
             "the paired daily difference to be above 0.", "",
             f"{'Scored window' if result.get('data') else 'Test segment'} {seg['start']}..{seg['end']}, "
             f"{result['tickers']} tickers; returns are earned from the "
             "open after each signal; costs are included in the portfolio figures.", ""]
    window = (result.get("data") or {}).get("window")
    if window:
        lines += [f"Scored window {window['start']}..{window['end']}: {window['days']} days, "
                  f"{window['names']} names of the new data, from the model's test-segment start "
                  f"{window['model_test_start']} (earlier dates' labels took part in training and model selection) "
                  "to the data's last date with a realised return (the model's own test segment ended "
                  f"{window['model_test_end']}).", ""]
    if result.get("baselines_note"):
        lines += [f"> Baselines: {result['baselines_note']}.", ""]
    dup = (result.get("data") or {}).get("duplicates")
    if dup:
        lines += [f"Data {result['data']['path']}: {dup['exact_rows_dropped']} exact duplicate row(s) dropped; "
                  f"{dup['conflicting_dates']} date(s) with differing rows, resolved by data.on_duplicate="
                  f"{dup['resolved_by']}" + (f" (tickers skipped: {', '.join(dup['tickers_skipped'])})"
                                             if dup["tickers_skipped"] else "") + ".", ""]
    if not v.get("cross_section_meaningful", True):
        lines += [f"> With only {result['tickers']} tickers the cross-sectional numbers (IC, rank IC, long-short) are "
                  "not meaningful; read the position returns instead.", ""]
    if result.get("model", {}).get("cross_sectional"):
        lines += [f"> Cross-sectional model ({result['model']['label']}): its labels or features compare the stocks "
                  "of each date. Survivorship: those stocks are the tickers in the data, i.e. listed at its end date; "
                  "stocks delisted earlier are missing from every date, which flatters long-short results.", ""]
    lines += _looks_lines(result.get("looks"))
    sel = result.get("selection")
    if sel:
        lines += [f"The model was chosen among {sel['n_trials']} trials ({sel['selections']} selection(s) exported "
                  "under its name for this test segment: sweeps and training runs, from the model folder's "
                  "trials.json). Its DSR deflates the chosen trial's *validation* long-short Sharpe ratio, gross "
                  f"and per date as the trials were compared ({_f(sel['val_ls_sr_gross_per_date'])}), against the "
                  "best of that many unskilled trials whose Sharpe ratios vary as these did (Bailey and López de "
                  "Prado, 2014): DSR " + _f(sel["dsr"], "{:.3f}") + ". Like with like, the same book on the scored "
                  f"dates, gross and per date: {_f(sel['scored_ls_sr_gross_per_date'])} over {sel['scored_days']} "
                  "days. The table's L/S Sharpe is net of costs and annualised, not deflated.", ""]
    lines += _contender_table(result["rows"])
    lines += ["", "![equity curves](equity.png)", ""]
    wf = result.get("walk_forward")
    if wf and "pooled" in wf:
        lines += _pooled_section(wf)
    elif wf:
        lines += [f"## Walk-forward ({len(wf['folds'])} folds, retrained per fold)", "",
                  f"rank IC {wf['rank_ic_mean']:.4f} ± {wf['rank_ic_std']:.4f}; long-short Sharpe "
                  f"{wf['sharpe_mean']:.2f} ± {wf['sharpe_std']:.2f}", "",
                  "| fold | test | rank IC | Sharpe | best baseline rank IC |", "|---|---|---|---|---|"]
        for fold in wf["folds"]:
            lines.append(f"| {fold['fold']} | {fold['test_start']}..{fold['test_end']} | {_f(fold['rank_ic'])} | "
                         f"{_f(fold['sharpe'], '{:.2f}')} | {_f(fold['best_baseline_rank_ic'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


