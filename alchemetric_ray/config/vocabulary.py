"""The config's vocabulary: every name a config value may take, written once.

Each fixed set of values is a ``Literal`` type, which validation, the reference and the CLI's help
read with ``typing.get_args``; ``DeviceName`` is the one type of ``device.name``.  The validation
metrics are named here with what each scores and which way each improves, and the functions of
names that config validation needs: a metric's direction, the metric "auto" stands for with a
target, and why a metric cannot score a target.  Which metric a run selects by, and how, is
``scoring.objective``'s.
"""

from __future__ import annotations

import typing
from typing import Literal

# --------------------------------------------------------------------------------------------
# The choices: each written once, as a type.  Validation (``coercion._coerce``), the reference and the CLI's
# help read the allowed values from these types with ``typing.get_args``; so does every other package.
# What each choice means is the help text of the field that uses it (``settings.setting``, in ``schema``).
# --------------------------------------------------------------------------------------------

DataSource = Literal["stocknet", "builtin", "synthetic", "files"]
DuplicatePolicy = Literal["refuse", "first", "last", "skip_ticker"]
LabelScheme = Literal["three_class", "binary", "triple_barrier", "cs_rank", "cs_zscore"]
CrossSectionNorm = Literal["none", "zscore", "rank"]
ThresholdMode = Literal["fixed", "vol"]
Normalization = Literal["zscore", "robust"]
Schedule = Literal["cosine", "onecycle", "constant"]
Loss = Literal["auto", "ce", "mse", "ic"]
SelectionMode = Literal["auto", "max", "min"]
PrecisionMode = Literal["auto", "fp32", "fp16", "bf16"]
MpsFallback = Literal["error", "warn"]  # PYTORCH_ENABLE_MPS_FALLBACK = 0 | 1
Placement = Literal["PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"]  # Ray placement group strategy
SearchAlgorithm = Literal["random", "grid", "optuna"]
TuneScheduler = Literal["asha", "none"]
TrialLoop = Literal["auto", "trainer"]
LocalMode = Literal["auto", "true", "false"]
ShadowSetting = Literal["auto", "true", "false"]
# The device kinds a user may name; hardware/ owns what each one means (its probes and rules).
DeviceKind = Literal["cpu", "mps", "cuda", "xpu"]
IndexedDeviceKind = Literal["cuda", "xpu"]  # kinds with several devices on a machine: cuda:N


# What each validation metric scores: class targets only, regression targets only, or any target
# (the signal metrics compare the model's score with the realised forward return across each date's stocks).
CLASSIFICATION_METRICS = {"accuracy", "balanced_accuracy", "macro_f1", "roc_auc", "mcc", "log_loss"}
REGRESSION_METRICS = {"mse"}
SIGNAL_METRICS = {"ic", "rank_ic", "icir", "rank_icir"}
# The direction in which each metric improves: larger is better, or smaller is better.
HIGHER_IS_BETTER = {"accuracy", "balanced_accuracy", "macro_f1", "roc_auc", "mcc", *SIGNAL_METRICS}
LOWER_IS_BETTER = {"log_loss", "mse"}
# What train.metric may name: a validation metric of the loop's report (built from the sets above),
# or "auto": val_balanced_accuracy for a class target, val_rank_ic for a cross-sectional one.
SELECTION_METRICS = tuple(f"val_{name}" for name in sorted(HIGHER_IS_BETTER | LOWER_IS_BETTER))
SelectionMetric = Literal[(*SELECTION_METRICS, "auto")]  # type: ignore[valid-type]
REGRESSION_LABELS = ("cs_rank", "cs_zscore")  # the LabelScheme values that are regression targets


class DeviceName(str):
    """What ``device.name`` may hold: ``auto``, a device kind, or ``kind:N`` for a kind with several
    devices (``cuda:1``).  A ``Literal`` cannot say ``cuda:N``; this type can.  Building one validates
    it (``ValueError`` otherwise): the config and the device resolver parse names here and nowhere else.
    """

    AUTO = "auto"

    def __new__(cls, text: str) -> "DeviceName":
        kind, index = cls.split(text)
        if text != cls.AUTO and (kind not in typing.get_args(DeviceKind)
                                 or (index is not None and kind not in typing.get_args(IndexedDeviceKind))):
            raise ValueError(f"{text!r} is not a device name; expected {cls.expected()}")
        return super().__new__(cls, text)

    @staticmethod
    def split(text: str) -> tuple[str, int | None]:  # type: ignore[override]  # a name's parts, not str.split (device.py)
        """``"cuda:1"`` -> ``("cuda", 1)``, ``"mps"`` -> ``("mps", None)``; ValueError if the index is not a number."""
        kind, colon, index = str(text).partition(":")
        if colon and not index.isdigit():
            raise ValueError(f"{text!r} is not a device name: the part after ':' must be a device index")
        return kind, (int(index) if colon else None)

    @classmethod
    def expected(cls) -> str:
        """The names a user may write, for messages: auto, cpu, mps, cuda, cuda:N or xpu."""
        indexed = typing.get_args(IndexedDeviceKind)
        names = [cls.AUTO]
        for kind in typing.get_args(DeviceKind):
            names += [kind, f"{kind}:N"] if kind in indexed else [kind]
        return f"{', '.join(names[:-1])} or {names[-1]}"

    @property
    def kind(self) -> str:
        """The device kind, or ``auto``."""
        return self.split(self)[0]

    @property
    def index(self) -> int | None:  # type: ignore[override]  # the device index, not str.index (tests read it)
        return self.split(self)[1]



def metric_direction(metric: str) -> str:
    """The direction in which ``metric`` (with or without the ``val_`` prefix) improves: max or min."""
    name = metric.removeprefix("val_")
    if name in HIGHER_IS_BETTER:
        return "max"
    if name in LOWER_IS_BETTER:
        return "min"
    raise ValueError(f"metric {metric!r} is not one of {', '.join(SELECTION_METRICS)}")


def resolve_metric(metric: str, label: str) -> str:
    """The validation metric that ``train.metric`` = ``metric`` names for the target ``label`` (features.label):
    the metric itself, or for "auto" the target's own (val_rank_ic for a cross-sectional target, else
    val_balanced_accuracy)."""
    if metric != "auto":
        return metric
    return "val_rank_ic" if label in REGRESSION_LABELS else "val_balanced_accuracy"


def metric_target_problem(metric: str, label: str) -> str | None:
    """Why ``metric`` cannot score the target ``label`` (features.label), or None."""
    name = metric.removeprefix("val_")
    regression = label in REGRESSION_LABELS
    if regression and name in CLASSIFICATION_METRICS:
        return (f"{metric} is a classification metric but features.label={label} is a regression target; use "
                "val_rank_ic, val_ic, val_icir, val_rank_icir or val_mse")
    if not regression and name in REGRESSION_METRICS:
        return (f"{metric} is a regression metric but features.label={label} is a class target; use a "
                "classification metric or val_rank_ic, val_ic, val_icir, val_rank_icir")
    return None
