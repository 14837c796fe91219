"""The rules across config keys, in the order validation checks them.

Each is a ``@rule`` naming every key it reads (the first is the key its message names) with the rule
in words, which the reference prints under "Rules across keys"; its function returns the message's
text for a config that breaks it, or None.
"""

from __future__ import annotations

from typing import Literal

from alchemetric_ray.config.schema import RunConfig
from alchemetric_ray.config.settings import rule
from alchemetric_ray.config.vocabulary import (
    REGRESSION_LABELS,
    metric_direction,
    metric_target_problem,
    resolve_metric,
)


@rule("features.val_frac", "features.train_frac", says="train_frac + val_frac < 1: the test segment keeps a share")
def _fractions(cfg: RunConfig) -> str | None:
    f = cfg.features
    if f.train_frac + f.val_frac < 1:
        return None
    return f"{f.val_frac!r} is invalid, expected train_frac + val_frac < 1 (train_frac is {f.train_frac})"


def _date_order(key: str, relation: Literal["after", "before"], other: str = "train_end") -> None:
    """The rule that ``features.<key>``, when set with ``features.<other>``, lies ``relation`` it."""

    def problem(cfg: RunConfig) -> str | None:
        value, bound = getattr(cfg.features, key), getattr(cfg.features, other)
        if not (value and bound) or (bound < value if relation == "after" else value < bound):
            return None
        return f"{value!r} is invalid, expected a date {relation} {other} ({bound})"

    rule(f"features.{key}", f"features.{other}", says=f"{key}, when set with {other}, is {relation} {other}")(problem)


_date_order("val_end", "after")
_date_order("train_start", "before")


@rule("train.loss", "features.label",
      says="loss ce needs a class target (three_class, binary, triple_barrier); mse and ic need a regression target "
           "(cs_rank, cs_zscore)")
def _loss_target(cfg: RunConfig) -> str | None:
    loss, label = cfg.train.loss, cfg.features.label
    regression = label in REGRESSION_LABELS
    if loss == "ce" and regression:
        return (f"ce (cross-entropy) needs class labels but features.label={label} is a regression target; "
                "use mse or ic")
    if loss in ("mse", "ic") and not regression:
        return (f"{loss} needs a regression target but features.label={label} is a class target; "
                "use features.label=cs_rank or cs_zscore")
    return None


@rule("train.loss", "train.cache_data", says="loss ic needs cache_data=true (whole dates in every batch)")
def _ic_cached(cfg: RunConfig) -> str | None:
    if cfg.train.loss != "ic" or cfg.train.cache_data:
        return None
    return ("ic needs whole dates in every batch, which only the cached data path gives (the shards are ticker by "
            "ticker and streaming scatters a date across batches and ranks); set train.cache_data=true")


@rule("train.metric", "features.label",
      says="a classification metric needs a class target, val_mse a regression target; the signal metrics "
           "(val_ic, val_rank_ic, val_icir, val_rank_icir) score any target")
def _metric_target(cfg: RunConfig) -> str | None:
    return metric_target_problem(resolve_metric(cfg.train.metric, cfg.features.label), cfg.features.label)


@rule("train.mode", "train.metric", "features.label",
      says="mode, unless auto, is the direction in which the (auto or named) metric improves")
def _mode_metric(cfg: RunConfig) -> str | None:
    metric = resolve_metric(cfg.train.metric, cfg.features.label)
    direction = metric_direction(metric)
    if cfg.train.mode in ("auto", direction):
        return None
    better = "larger" if direction == "max" else "smaller"
    return (f"{cfg.train.mode!r} contradicts train.metric={metric!r}, where {better} is better; "
            f"set train.mode={direction} or train.mode=auto")
