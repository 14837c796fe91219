"""What an evaluation scores and each contender's row: the model's signals and every baseline's on
one segment (logistic or ridge regression and HistGradientBoosting, fitted on the model's training
rows or, for new data without them, on its own earlier rows; LightGBM, fitted on the same rows and
stopped early on the validation segment (:func:`_validation_rows`); a 20-day momentum rule;
buy-and-hold),
the window new data is scored on (:class:`DataWindow`), and one typed :class:`ContenderRow` per
contender with the best baseline and the verdict (:class:`SegmentResult`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import EvaluationError
from alchemetric_ray.scoring.metrics import classification_metrics
from alchemetric_ray.signals import metrics as sm
from alchemetric_ray.signals import portfolio as sp
from alchemetric_ray.signals.predict import direction_score, signal_positions
from alchemetric_ray.signals.selection import SelectionFigures, selection_figures

FEW_TICKERS = 10
BUY_AND_HOLD = "buy and hold"
LIGHTGBM = "lightgbm"
VAL_SHARE = 0.15  # of the fitting rows' dates held out for LightGBM's early stopping where no validation segment is


def _segment(frame: pd.DataFrame, start: str, end: str) -> pd.DataFrame:
    d = frame["date"]
    return frame[(d >= pd.Timestamp(start)) & (d <= pd.Timestamp(end))].reset_index(drop=True)


def _scored(frame: pd.DataFrame, score: np.ndarray, pos: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"date": frame["date"].to_numpy(), "ticker": frame["ticker"].to_numpy(), "score": score,
                         "position": pos, "fwd_ret": frame["fwd_ret"].to_numpy(dtype=np.float64)})


@dataclass(frozen=True)
class Segment:
    """The first and last date (``YYYY-MM-DD``) of a scored segment."""

    start: str
    end: str

    def as_dict(self) -> dict[str, str]:
        return {"start": self.start, "end": self.end}


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
    long_short: sp.PortfolioStats
    positions: sp.PortfolioStats
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
    def _curve(book: sp.PortfolioStats) -> pd.DataFrame | None:
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
    long_short = sp.long_short(valid, quantile=signal_cfg.quantile, cost_bps=signal_cfg.cost_bps, horizon=horizon)
    net = long_short.daily["net"].to_numpy() if len(long_short.daily) else np.zeros(0)
    classification = None
    if proba is not None and labels is not None:
        ok = labels >= 0
        classification = classification_metrics(labels[ok], proba[ok], prefix="")
    return ContenderRow(name=name, rows=len(valid), tickers=int(valid["ticker"].nunique()),
                        ic=sm.ic_stats(valid, rank=False, lag=horizon - 1),  # days whose forward returns overlap
                        rank_ic=sm.ic_stats(valid, rank=True, lag=horizon - 1), long_short=long_short,
                        positions=sp.position_returns(valid, cost_bps=signal_cfg.cost_bps, horizon=horizon),
                        hit_rate=sp.hit_rate(valid),
                        psr=sm.probabilistic_sharpe(net) if len(net) > 2 else float("nan"),
                        classification=classification)


def _ic_dict(stats: sm.ICStats) -> dict:
    return {"mean": stats.mean, "std": stats.std, "icir": stats.icir, "t_stat": stats.t_stat, "n_days": stats.n_days,
            "ci_low": stats.ci_low, "ci_high": stats.ci_high}


def _port_dict(portfolio: sp.PortfolioStats, *, defined: bool = True) -> dict:
    """A book's figures; every one None (its day count kept) for a book that never held a position."""
    if not defined:
        return {"annual_return": None, "annual_vol": None, "sharpe": None, "max_drawdown": None, "turnover": None,
                "hit_rate": None, "n_days": portfolio.n_days}
    return {"annual_return": portfolio.annual_return, "annual_vol": portfolio.annual_vol, "sharpe": portfolio.sharpe,
            "max_drawdown": portfolio.max_drawdown, "turnover": portfolio.turnover, "hit_rate": portfolio.hit_rate,
            "n_days": portfolio.n_days}


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
    # per early-stopped baseline (LightGBM), what each of its fits chose (one per segment; a pool: one per block)
    fits: dict[str, list[dict]] | None = None

    @staticmethod
    def pooled(parts: list[Contenders]) -> Contenders:
        """Blocks of consecutive segments as one: each contender's rows of every block, in order (a
        contender missing from a block, a learned baseline with nothing to fit on, is left out)."""
        names = [n for n in parts[0].frames if all(n in p.frames for p in parts)]

        def joined(field: str, name: str):
            values = [getattr(p, field)[name] for p in parts]
            return None if any(v is None for v in values) else np.concatenate(values)

        fits = {n: [f for p in parts for f in (p.fits or {}).get(n, [])] for n in names
                if all(n in (p.fits or {}) for p in parts)}
        return Contenders(parts[0].start, parts[-1].end,
                          {n: pd.concat([p.frames[n] for p in parts], ignore_index=True) for n in names},
                          {n: joined("proba", n) for n in names}, {n: joined("labels", n) for n in names},
                          "; ".join(dict.fromkeys(p.baselines_note for p in parts if p.baselines_note)) or None,
                          fits=fits or None)


def contender_frames(model_signals: pd.DataFrame, inputs: pd.DataFrame, manifest: Manifest, cfg: RunConfig,
                     *, segment: tuple[str, str] | None = None) -> Contenders:
    """The model's signals and every baseline's on the segment (default: the manifest's test
    segment); the learned baselines are fitted on the rows :func:`_baseline_rows` gives."""
    from alchemetric_ray.scoring.baselines import (
        baseline_models,
        fit_baseline,
        fit_lightgbm,
        lightgbm_model,
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
    fits: dict[str, list[dict]] = {}
    fitting, val = _validation_rows(inputs, manifest, start, train, own=baselines_note is None)
    if len(fitting) and len(val):  # LightGBM: the same rows, less those it holds out to stop on
        booster = lightgbm_model(cfg.train.seed, manifest.regression, len(fitting))
        fit = fit_lightgbm(booster, fitting[names].to_numpy(), fitting["label"].to_numpy(), val[names].to_numpy(),
                           val["label"].to_numpy())
        fits[LIGHTGBM] = [{**fit, "fit_end": _day(fitting["date"].max()), "val_start": _day(val["date"].min()),
                           "val_end": _day(val["date"].max())}]
        learned = {**learned, LIGHTGBM: booster}
    for name, model in learned.items():
        if name != LIGHTGBM:
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
    return Contenders(start, end, frames, proba, labels, baselines_note, fits=fits or None)


@dataclass
class SegmentResult:
    """Every contender's row on one segment (the deep model's first), the best baseline by mean rank
    IC, the verdict on the model's edge over it, and the trials behind the model with its deflated
    Sharpe ratio (``selection``: None where fewer than 2 trials stand behind it), and what each
    early-stopped baseline's fits chose (``baseline_fits``: LightGBM's best round, rounds trained,
    its fitting rows' last date and validation dates, one per fit); :meth:`as_dict` is the part of
    ``evaluation.json`` that describes the segment."""

    segment: Segment
    tickers: int
    rows: list[ContenderRow]
    best_baseline: str | None
    verdict: sm.Verdict
    n_trials: int
    selection: SelectionFigures | None
    baselines_note: str | None
    baseline_fits: dict[str, list[dict]] | None = None

    @property
    def deep_model(self) -> ContenderRow:
        """The deep model's row."""
        return self.rows[0]

    def as_dict(self) -> dict[str, Any]:
        return {"segment": self.segment.as_dict(), "tickers": self.tickers, "rows": [r.as_dict() for r in self.rows],
                "best_baseline": self.best_baseline, "verdict": self.verdict.as_dict(), "n_trials": self.n_trials,
                "selection": self.selection.as_dict() if self.selection else None,
                "baselines_note": self.baselines_note, "baseline_fits": self.baseline_fits}


def score_contenders(contenders: Contenders, manifest: Manifest, cfg: RunConfig, *,
                     selection: dict | None = None) -> SegmentResult:
    """Every contender's row, the best baseline and the verdict, on what :func:`contender_frames` scored."""
    horizon = manifest.label["horizon"]
    rows = [contender_stats(name, frame, cfg, horizon=horizon, proba=contenders.proba[name],
                            labels=contenders.labels[name]) for name, frame in contenders.frames.items()]
    figures = selection_figures(contenders.frames["deep model"], selection, cfg)
    rows[0].dsr = figures.dsr if figures else None  # of the validation book: see the result's selection
    n_tickers = int(contenders.frames["deep model"]["ticker"].nunique())
    baselines_with_ic = [r for r in rows[1:] if r.name != BUY_AND_HOLD and r.rank_ic.n_days > 0]
    best = max(baselines_with_ic, key=lambda r: r.rank_ic.mean if not math.isnan(r.rank_ic.mean) else -1,
               default=None)
    verdict = sm.edge_verdict(rows[0].rank_ic, best.rank_ic if best else None, n_tickers=n_tickers,
                              few_tickers=FEW_TICKERS, baseline_name=best.name if best else "best baseline")
    return SegmentResult(segment=Segment(contenders.start, contenders.end), tickers=n_tickers, rows=rows,
                         best_baseline=best.name if best else None, verdict=verdict,
                         n_trials=figures.n_trials if figures else 1, selection=figures,
                         baselines_note=contenders.baselines_note, baseline_fits=contenders.fits)


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


def _validation_rows(inputs: pd.DataFrame, manifest: Manifest, start: str, train: pd.DataFrame, *,
                     own: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows LightGBM is fitted on and the rows it stops early on, never the scored segment's.
    Where the baselines fit the model's own training rows (``own``): those rows, and the labelled
    rows of the manifest's validation segment whose labels end before the scored window (the last
    ``reach`` days before it left out: for the test segment that is the split's own embargo).
    Otherwise (no such rows: new data fitted on its own earlier rows) the last ``VAL_SHARE`` of the
    fitting rows' dates, after ``reach`` days of embargo, with the rows before them.  Neither: no rows."""
    reach = int(manifest.label.get("reach") or manifest.label.get("horizon") or 1)
    if own and len(train):
        known = np.isfinite(inputs["label"]) if manifest.regression else inputs["label"] >= 0
        days = np.unique(inputs["date"].to_numpy())
        before = days[days < np.datetime64(pd.Timestamp(start))]
        if len(before) > reach:
            splits, d = manifest.splits, inputs["date"]
            val = inputs[(d >= pd.Timestamp(splits["val_start"])) & (d <= pd.Timestamp(splits["val_end"]))
                         & (d <= before[-reach - 1]) & (d > train["date"].max()) & known]
            if len(val):
                return train, val
    days = np.unique(train["date"].to_numpy())
    n_val = max(1, round(VAL_SHARE * len(days)))
    if len(days) <= n_val + reach:
        return train.iloc[:0], train.iloc[:0]
    return train[train["date"] <= days[-n_val - reach - 1]], train[train["date"] >= days[-n_val]]


def _day(value) -> str:
    return str(np.datetime64(value, "D"))


@dataclass(frozen=True)
class DataWindow:
    """The dates ``evaluate --data`` scores (:func:`new_data_window`): first and last date, how many
    days and names of the new data fall in it, and the model's own test segment beside it."""

    start: str
    end: str
    days: int
    names: int
    model_test_start: str
    model_test_end: str

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "days": self.days, "names": self.names,
                "model_test_start": self.model_test_start, "model_test_end": self.model_test_end}


def new_data_window(inputs: pd.DataFrame, manifest: Manifest) -> DataWindow:
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
    return DataWindow(start=_day(first), end=_day(scored["date"].max()), days=int(scored["date"].nunique()),
                      names=int(scored["ticker"].nunique()), model_test_start=test_start,
                      model_test_end=manifest.splits["test_end"])
