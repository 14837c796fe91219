"""The selection behind a model and its deflated Sharpe ratio: the trials that stand behind it (the
model folder's trial ledger, or an older model's sweep record), and the deflated validation Sharpe
ratio beside the same book on the scored segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.signals import metrics as sm


@dataclass(frozen=True)
class SelectionFigures:
    """The trials behind the model and its deflated Sharpe ratio (:func:`selection_figures`): how many
    trials and selections, the chosen trial's gross per-date validation long-short Sharpe ratio and its
    deflation, and the same book on the scored segment with its day count."""

    n_trials: int
    selections: int
    val_ls_sr_gross_per_date: float
    dsr: float | None
    scored_ls_sr_gross_per_date: float
    scored_days: int

    def as_dict(self) -> dict:
        return {"n_trials": self.n_trials, "selections": self.selections,
                "val_ls_sr_gross_per_date": self.val_ls_sr_gross_per_date, "dsr": self.dsr,
                "scored_ls_sr_gross_per_date": self.scored_ls_sr_gross_per_date, "scored_days": self.scored_days}


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


def selection_figures(model_frame: pd.DataFrame, inputs: dict | None, cfg: RunConfig) -> SelectionFigures | None:
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
    return SelectionFigures(n_trials=int(inputs["n_trials"]), selections=int(inputs.get("selections", 1)),
                            val_ls_sr_gross_per_date=inputs["chosen"]["sr"], dsr=_deflated(inputs),
                            scored_ls_sr_gross_per_date=test["ls_sr"], scored_days=int(test["ls_days"]))
