"""A sweep's summary as typed records: one ``TrialRow`` per trial inside one ``SweepSummary``.

``SweepSummary.as_dict()`` is what ``sweep_summary.json`` holds (``TrialRow.as_dict()`` each row of
its ``trials``); ``from_dict`` reads that form back, a missing key taking its field's default.  A
trial's per-epoch history rows, its config and the chosen trial's test metrics stay plain dicts:
their keys are the run's own metric and config names.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TrialRow:
    """One trial: its id and config, how it ended, its best value of the selection metric, when it
    ran (Unix seconds), its validation rank IC and long-short moments (``sr``, ``skew``, ``kurt``,
    ``days``) at its best epoch, and its epochs."""

    trial_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    status: str = ""  # TERMINATED or ERROR
    best_value: float | None = None
    epochs_run: int | None = None
    started: float | None = None
    ended: float | None = None
    val_long_short: dict[str, Any] | None = None
    val_rank_ic: float | None = None
    stopped_early: bool = False  # stopped by the scheduler, not by the loop's own patience
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # the first line of the trial's error

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrialRow:
        return cls(**_known(cls, values))


@dataclass
class SweepSummary:
    """The sweep ranked on validation only: its trials, the best one (its id, value, config and
    checkpoint, its validation confusion matrix where the target has classes), the variance of the
    trials' validation long-short Sharpe ratios, and, once the best trial is exported, its model
    folder and (where its test segment was scored) its test metrics."""

    name: str = ""
    metric: str = ""
    mode: str = ""
    num_trials: int | None = None
    space: dict[str, Any] | None = None
    scheduler: str | None = None
    search: str | None = None
    trials: list[TrialRow] = field(default_factory=list)
    best_trial_id: str | None = None
    best_value: float | None = None
    best_config: dict[str, Any] | None = None
    best_checkpoint: str | None = None
    classes: list | None = None
    best_confusion: list | None = None
    test_metrics: dict[str, Any] | None = None
    model_dir: str | None = None
    max_epochs: int | None = None
    trial_sr_variance: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The summary as ``sweep_summary.json`` holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SweepSummary:
        """A summary from its ``as_dict`` form; trials that are not mappings are left out."""
        known = _known(cls, values)
        known["trials"] = trial_rows(t for t in values.get("trials") or [] if isinstance(t, Mapping))
        return cls(**known)

    def best_trial(self) -> TrialRow | None:
        """The chosen trial's row, or None where no trial is chosen."""
        return next((t for t in self.trials if self.best_trial_id is not None and t.trial_id == self.best_trial_id),
                    None)


def trial_rows(trials: Iterable[TrialRow | Mapping[str, Any]]) -> list[TrialRow]:
    """Trials as records, whether given as records or as the rows of ``sweep_summary.json``."""
    return [t if isinstance(t, TrialRow) else TrialRow.from_dict(t) for t in trials]


def trial_sr_variance(trials: Iterable[TrialRow | Mapping[str, Any]]) -> float | None:
    """The variance (ddof 1) of the trials' per-period validation long-short Sharpe ratios: the
    V[SR_n] of Bailey and Lopez de Prado's deflated Sharpe ratio; None for fewer than 2 trials."""
    srs = [t.val_long_short["sr"] for t in trial_rows(trials) if t.val_long_short]
    srs = [v for v in srs if v is not None and math.isfinite(v)]
    return statistics.variance(srs) if len(srs) >= 2 else None


def plain(value: Any) -> Any:
    """A value as the summary holds it: a numpy scalar as the Python number, NaN as None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``cls``."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}
