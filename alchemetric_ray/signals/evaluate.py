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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import atomic_write_json, atomic_write_text, is_uri
from alchemetric_ray.signals import metrics as sm
from alchemetric_ray.signals.predict import (
    direction_score,
    inputs_frame,
    predict,
    signal_positions,
    stage_inputs,
    staged_frame,
)
from alchemetric_ray.storage import Location, locate
from alchemetric_ray.train.metrics import classification_metrics

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


def contender_stats(name: str, signals: pd.DataFrame, cfg: RunConfig, *, horizon: int = 1,
                    proba: np.ndarray | None = None, labels: np.ndarray | None = None) -> dict[str, Any]:
    """Every number of the side-by-side table for one contender (model or baseline)."""
    signal_cfg = cfg.signals
    valid = signals.dropna(subset=["fwd_ret"])
    n_tickers = valid["ticker"].nunique()
    row: dict[str, Any] = {"name": name, "rows": len(valid), "tickers": int(n_tickers)}
    ic_stats = sm.ic_stats(valid, rank=False, lag=horizon - 1)  # days whose forward returns overlap
    rank_ic_stats = sm.ic_stats(valid, rank=True, lag=horizon - 1)
    row["ic"] = _ic_dict(ic_stats)
    row["rank_ic"] = _ic_dict(rank_ic_stats)
    long_short_stats = sm.long_short(valid, quantile=signal_cfg.quantile, cost_bps=signal_cfg.cost_bps, horizon=horizon)
    row["long_short"] = _port_dict(long_short_stats)
    position_stats = sm.position_returns(valid, cost_bps=signal_cfg.cost_bps, horizon=horizon)
    row["positions"] = _port_dict(position_stats)
    row["hit_rate"] = sm.hit_rate(valid)
    net = long_short_stats.daily["net"].to_numpy() if len(long_short_stats.daily) else np.zeros(0)
    row["psr"] = sm.probabilistic_sharpe(net) if len(net) > 2 else float("nan")
    row["dsr"] = None  # the deep model's, when a sweep chose it: deflated_validation_sharpe
    if proba is not None and labels is not None:
        ok = labels >= 0
        row["classification"] = {k: v for k, v in classification_metrics(labels[ok], proba[ok], prefix="").items()}
    row["_ic"] = rank_ic_stats
    row["_equity"] = long_short_stats.daily[["date", "equity"]] if len(long_short_stats.daily) else None
    row["_pos_equity"] = position_stats.daily[["date", "equity"]] if len(position_stats.daily) else None
    return row


def _ic_dict(stats) -> dict:
    return {"mean": stats.mean, "std": stats.std, "icir": stats.icir, "t_stat": stats.t_stat, "n_days": stats.n_days,
            "ci_low": stats.ci_low, "ci_high": stats.ci_high}


def _port_dict(portfolio) -> dict:
    return {"annual_return": portfolio.annual_return, "annual_vol": portfolio.annual_vol, "sharpe": portfolio.sharpe,
            "max_drawdown": portfolio.max_drawdown, "turnover": portfolio.turnover, "hit_rate": portfolio.hit_rate,
            "n_days": portfolio.n_days}


def deflated_validation_sharpe(sweep: dict | None) -> float | None:
    """The deflated Sharpe ratio of a sweep's chosen trial (Bailey and Lopez de Prado, 2014): its
    *validation* long-short per-period Sharpe ratio, skewness, kurtosis and day count, against the
    expected maximum of ``num_trials`` unskilled trials whose Sharpe ratios vary as the sweep's
    trials did (``trial_sr_variance``).  None without a sweep of 2 or more trials that recorded them."""
    sweep = sweep or {}
    chosen, variance, n_trials = sweep.get("chosen_val_long_short"), sweep.get("trial_sr_variance"), \
        int(sweep.get("num_trials", 1))
    if n_trials < 2 or not chosen or variance is None:
        return None
    return sm.deflated_sharpe(chosen["sr"], chosen["skew"], chosen["kurt"], int(chosen["days"]), n_trials, variance)


def evaluate_signals(model_signals: pd.DataFrame, inputs: pd.DataFrame, manifest: Manifest, cfg: RunConfig,
                     *, sweep: dict | None = None, segment: tuple[str, str] | None = None) -> dict[str, Any]:
    """The model and every baseline on the test segment of ``inputs`` (rows with features and labels)."""
    contenders = contender_frames(model_signals, inputs, manifest, cfg, segment=segment)
    return score_contenders(contenders, manifest, cfg, sweep=sweep)


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
    from alchemetric_ray.train.baselines import (
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
                     sweep: dict | None = None) -> dict[str, Any]:
    """Every contender's row, the best baseline and the verdict, on what :func:`contender_frames` scored."""
    horizon = manifest.label["horizon"]
    rows = [contender_stats(name, frame, cfg, horizon=horizon, proba=contenders.proba[name],
                            labels=contenders.labels[name]) for name, frame in contenders.frames.items()]
    rows[0]["dsr"] = deflated_validation_sharpe(sweep)  # beside the test-period Sharpe, which is not deflated
    n_tickers = int(contenders.frames["deep model"]["ticker"].nunique())
    baselines_with_ic = [r for r in rows[1:] if r["name"] != BUY_AND_HOLD and r["_ic"].n_days > 0]
    best = max(baselines_with_ic, key=lambda r: r["_ic"].mean if not math.isnan(r["_ic"].mean) else -1, default=None)
    verdict = sm.edge_verdict(rows[0]["_ic"], best["_ic"] if best else None, n_tickers=n_tickers,
                              few_tickers=FEW_TICKERS, baseline_name=best["name"] if best else "best baseline")
    return {"segment": {"start": contenders.start, "end": contenders.end}, "tickers": n_tickers, "rows": rows,
            "best_baseline": best["name"] if best else None, "verdict": verdict,
            "n_trials": int((sweep or {}).get("num_trials", 1)), "baselines_note": contenders.baselines_note}


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
    ``pooled`` adds the pooled walk-forward evaluation (:func:`pooled_walk_forward`)."""
    from alchemetric_ray.train.export import load_model

    model_dir, out_dir = locate(model_dir), locate(out_dir)
    loaded = load_model(model_dir)
    cfg = cfg or loaded.config
    if pooled and cfg.signals.folds:
        raise EvaluationError(f"--walk-forward and signals.folds={cfg.signals.folds} are two walk-forward "
                              "evaluations; choose one (signals.refit_every sets the pooled one's refits)")
    metrics = json.loads((model_dir / "metrics.json").read_text()) if (model_dir / "metrics.json").is_file() else {}
    with out_dir.staged() as tmp:
        signals = predict(model_dir, data, tmp / "signals.parquet", cfg)
        inputs = inputs_frame(loaded, data, on_duplicate=cfg.data.on_duplicate if data else None)
        window = new_data_window(inputs, loaded.manifest) if data else None
        result = evaluate_signals(signals, inputs, loaded.manifest, cfg, sweep=metrics.get("sweep"),
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
        _plot_equity(result, tmp / "equity.png")
        atomic_write_text(tmp / "report.md", render_report(result))
        atomic_write_json(tmp / "evaluation.json", _public(result))
    return result


def _refits(cfg: RunConfig, data: str | None, loaded, folds: list, calendar: np.ndarray, work: Path):
    """Retrain the model's config on each fold (``features.train_end``/``val_end`` at the fold's
    boundaries, in this Ray session: local mode where one worker serves) and yield, per fold, its
    model and what every contender scored on the fold's test block; the learned baselines are fitted
    on the fold's train rows, in the fold's normalization (the main model's was fitted on a train
    split that can reach into the fold's block)."""
    from alchemetric_ray.data.splits import boundaries
    from alchemetric_ray.train.export import load_model as load
    from alchemetric_ray.train.trainer import run_training

    base = loaded.config
    storage = cfg.storage.path if is_uri(cfg.storage.path) else str(Path(cfg.storage.path).resolve())
    for k, fold in enumerate(folds):
        train_end, val_end = boundaries(calendar, fold)  # the embargo once: plan_splits takes it off these
        fold_cfg = base.replace(f"features.train_end={train_end}", f"features.val_end={val_end}",
                                f"features.train_start={fold.train_start}",
                                f"storage.name={base.storage.name}-fold{k}", f"storage.models_dir={work / 'folds'}",
                                f"storage.path={storage}", "storage.run=null",
                                "storage.resume=false")
        if data:
            fold_cfg = fold_cfg.replace(f"data.path={data}", "data.source=files")
        clock = time.monotonic()
        outcome = run_training(fold_cfg, progress=False)
        if outcome.model_dir is None:
            raise EvaluationError(f"walk-forward fold {k}: training produced no checkpoint")
        fold_model = load(outcome.model_dir)
        seconds = {"train": time.monotonic() - clock}  # features -> shards -> the fit -> its export
        clock = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="alchemetric-refit-") as tmp:  # the fold's inputs, staged once
            staging = Path(tmp)
            staged = stage_inputs(fold_model, data, staging, on_duplicate=fold_cfg.data.on_duplicate)
            seconds["stage"] = time.monotonic() - clock
            clock = time.monotonic()
            sig = predict(outcome.model_dir, data, work / "folds" / f"signals-{k}.parquet", fold_cfg, staged=staging)
            inputs = staged_frame(staging, staged)
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
            "days": model["rank_ic"]["n_days"], "rank_ic": model["rank_ic"]["mean"],
            "sharpe": model["long_short"]["sharpe"],
            "best_baseline_rank_ic": max((r["rank_ic"]["mean"] for r in res["rows"][1:]
                                          if not math.isnan(r["rank_ic"]["mean"])), default=float("nan"))}


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
    model = result["rows"][0]["_ic"]
    best = next((r["_ic"] for r in result["rows"] if r["name"] == result["best_baseline"]), None)
    years = []
    for year, daily in model.daily.groupby(pd.DatetimeIndex(model.daily.index).year):
        v = daily.to_numpy(dtype=np.float64)
        _, lo, hi = sm.mean_interval(v, lag=model.lag, confidence=model.confidence)
        other = best.daily[pd.DatetimeIndex(best.daily.index).year == year] if best is not None else None
        years.append({"year": int(year), "days": int(v.size), "rank_ic": float(v.mean()), "ci_low": lo, "ci_high": hi,
                      "best_baseline_rank_ic": float(other.mean()) if other is not None and len(other) else None})
    return years


def _public(result: dict) -> dict:
    """``result`` without the rows' private keys (their ICStats and equity frames), for JSON."""
    out = dict(result)
    out["rows"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in result["rows"]]
    if "pooled" in (result.get("walk_forward") or {}):
        out["walk_forward"] = {**result["walk_forward"], "pooled": _public(result["walk_forward"]["pooled"])}
    return out


def equity_curves(result: dict) -> dict[str, pd.DataFrame]:
    """The curve the equity plot draws per contender: the long-short portfolio on a cross-section
    (FEW_TICKERS or more names), else the thresholded positions.  Buy-and-hold is always its
    positions, the equal-weight long-only book: a constant score ranks no stock above another, so
    its long-short curve is a flat 1.0 that stands for nothing."""
    cross = result["tickers"] >= FEW_TICKERS
    curves = {}
    for row in result["rows"]:
        eq = row.get("_equity" if cross and row["name"] != BUY_AND_HOLD else "_pos_equity")
        if eq is not None and len(eq):
            curves[row["name"]] = eq
    return curves


def _plot_equity(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    cross = result["tickers"] >= FEW_TICKERS
    for name, eq in equity_curves(result).items():
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
    if result["n_trials"] > 1:
        lines += [f"The model was chosen among {result['n_trials']} configurations. Its DSR is the deflated Sharpe "
                  "ratio of its *validation* long-short returns, against the best of that many unskilled trials "
                  "whose Sharpe ratios vary as the sweep's did (Bailey and López de Prado, 2014); the L/S Sharpe "
                  "beside it is the test period's, not deflated: the out-of-sample check.", ""]
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


