"""A run's objective, read from its config: the loss it trains with (``train.loss``), the validation
metric that picks its best epoch, checkpoint and sweep trial (``train.metric``), the direction in which
that metric improves (``train.mode``), and whether a value improves on the best so far.

The names these rules choose from (the metrics, which way each improves, the regression targets) are
the config's vocabulary, which config validation reads too.
"""

from __future__ import annotations

from alchemetric_ray.config import REGRESSION_LABELS, RunConfig, metric_direction, resolve_metric


def selection_metric(cfg: RunConfig) -> str:
    """The validation metric that picks the best epoch, checkpoint and trial: ``train.metric``, or
    for "auto" the target's own (val_rank_ic for a cross-sectional target, else val_balanced_accuracy)."""
    return resolve_metric(cfg.train.metric, cfg.features.label)


def selection_mode(cfg: RunConfig) -> str:
    """The direction ("max" or "min") in which the selection metric improves, for a validated config.

    The one answer every reader of the selection uses: the loop's best epoch and early stopping,
    Ray Train's checkpoint ranking (which checkpoints ``num_to_keep`` keeps), the exported best
    checkpoint and Tune's sweep.  ``train.mode`` is "auto" (derived from the metric) or an explicit
    direction that config validation has already checked against the metric."""
    return metric_direction(selection_metric(cfg))


def loss_of(cfg: RunConfig) -> str:
    """The training loss: ``train.loss``, or for "auto" the target's own (mse for a regression
    target, ce for classes; the IC loss for a cross-sectional model, which learns a date's ranking)."""
    if cfg.train.loss != "auto":
        return cfg.train.loss
    if cfg.features.label not in REGRESSION_LABELS:
        return "ce"
    from alchemetric_ray.errors import UserError
    from alchemetric_ray.models import is_cross_sectional, model_spec

    try:
        return "ic" if is_cross_sectional(model_spec(cfg.model)) else "mse"
    except UserError:  # an unknown model: refused in one line where the run builds it
        return "mse"


def is_better(value: float, best: float | None, mode: str) -> bool:
    if value != value:  # nan never improves
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best
