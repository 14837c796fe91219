"""One typed run config: YAML file + ``section.key=value`` overrides, validated up front.

The same object travels from the entry point to every Ray worker (as JSON) and into every
checkpoint, so a saved model always says how it was trained.

Precedence: defaults < YAML file < command-line overrides.  Every problem is reported as a
:class:`ConfigError` whose one-line message names the key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from alchemetric_ray.errors import UserError

# --------------------------------------------------------------------------------------------
# The choices: each written once, as a type.  Validation (``_coerce``), the reference and the CLI's
# help read the allowed values from these types with ``typing.get_args``; so does every other package.
# What each choice means is the help text of the field that uses it (``setting`` below).
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
    def split(text: str) -> tuple[str, int | None]:
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
    def index(self) -> int | None:
        return self.split(self)[1]


def metric_direction(metric: str) -> str:
    """The direction in which ``metric`` (with or without the ``val_`` prefix) improves: max or min."""
    name = metric.removeprefix("val_")
    if name in HIGHER_IS_BETTER:
        return "max"
    if name in LOWER_IS_BETTER:
        return "min"
    raise ValueError(f"metric {metric!r} is not one of {', '.join(SELECTION_METRICS)}")


def selection_metric(cfg: RunConfig) -> str:
    """The validation metric that picks the best epoch, checkpoint and trial: ``train.metric``, or
    for "auto" the target's own (val_rank_ic for a cross-sectional target, else val_balanced_accuracy)."""
    if cfg.train.metric != "auto":
        return cfg.train.metric
    return "val_rank_ic" if cfg.features.label in REGRESSION_LABELS else "val_balanced_accuracy"


def selection_mode(cfg: RunConfig) -> str:
    """The direction ("max" or "min") in which the selection metric improves, for a validated config.

    The one answer every reader of the selection uses: the loop's best epoch and early stopping,
    Ray Train's checkpoint ranking (which checkpoints ``num_to_keep`` keeps), the exported best
    checkpoint and Tune's sweep.  ``train.mode`` is "auto" (derived from the metric) or an explicit
    direction that config validation has already checked against the metric."""
    return metric_direction(selection_metric(cfg))


def loss_of(cfg: RunConfig) -> str:
    """The training loss: ``train.loss``, or for "auto" the target's own (mse for a regression
    target, ce for classes)."""
    if cfg.train.loss != "auto":
        return cfg.train.loss
    return "mse" if cfg.features.label in REGRESSION_LABELS else "ce"


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


class ConfigError(UserError, ValueError):
    """A config value, key or file that cannot be used. The message is one line."""


# --------------------------------------------------------------------------------------------
# Settings: each field carries its help text and, where one value alone can be wrong, its check.
# The reference (docs/configuration.md, ``config_reference``), validation and the CLI's help read
# these; a choice's allowed values are its Literal type.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A single-field check: ``ok(value)`` must hold; ``expected`` says what is wanted (in the error
    message and the reference).  A None value of an optional field is never checked."""

    ok: Callable[[Any], bool]
    expected: str


def at_least(low: float, zero: str = "") -> Check:
    """``value >= low``; ``zero`` says what the lowest value means (``0 = automatic``)."""
    return Check(lambda value: value >= low, f">= {low}" + (f" ({zero})" if zero else ""))


def above(low: float) -> Check:
    return Check(lambda value: value > low, f"> {low}")


def setting(default: Any = None, help: str = "", *, check: Check | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A config field: its default (or ``factory`` for a mutable one), help text and optional check."""
    metadata = {"help": help, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


A_DATE = Check(lambda value: _is_date(value), "a date YYYY-MM-DD")
A_PLAIN_NAME = Check(lambda value: _safe_name(value), "a plain name of letters, digits, '.', '_' or '-' "
                                                      "(no path separators or '..')")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    """Where the daily bars come from: your files, the packaged prices or a synthetic market."""

    path: str | None = setting(
        None, "A folder or file of daily OHLCV bars (CSV or Parquet, local or object storage), or a folder of "
              "feature shards written by `alchemetric-ray features`. When set, the bars are read from here whatever "
              "`data.source` says; null = use `data.source`. `--data` sets it.")
    source: DataSource = setting(
        "stocknet", "The bars to use when `data.path` is null: `stocknet` = 88 US stocks 2012-2017, shipped with the "
                    "package; `builtin` = 4 US large caps 2000-2013 (from bokeh-sampledata; kept because saved models "
                    "name it); `synthetic` = a generated market (the `synthetic_*` keys); `files` = `data.path`, "
                    "which must then be set.")
    tickers: list[str] | None = setting(
        None, "Use only these tickers (a YAML list, or comma-separated on the command line); null = every ticker.")
    on_duplicate: DuplicatePolicy = setting(
        "last", "What ingest does with two rows of one ticker and date whose values differ (an exact copy of a row "
                "is always dropped and counted): `refuse` = stop and name both rows (the strict choice); `first` / "
                "`last` = keep the ticker's first / last such row in file order; `skip_ticker` = leave the ticker "
                "out. The default `last` keeps the vendor's revised bar: public daily files append corrections "
                "after the bar they revise.")
    synthetic_tickers: int = setting(50, "Synthetic market: the number of tickers.", check=at_least(1))
    synthetic_days: int = setting(1000, "Synthetic market: the number of trading days.", check=at_least(10))
    synthetic_effect: float = setting(
        0.0, "Synthetic market: the strength of the planted momentum effect (a signal a model can learn); "
             "0 = a null market with nothing to learn.")
    synthetic_effect_window: int = setting(
        10, "Synthetic market: the trailing window of the momentum effect, in days.")
    synthetic_effect_lag: int = setting(
        0, "Synthetic market: the effect's window ends this many days before the bar it predicts (0 = the last "
           "days up to the day before).")
    seed: int = setting(
        0, "Seed of the synthetic market and of the row sample that `features.normalization=robust` fits on.")


@dataclass
class FeaturesConfig:
    """Features, labels and the time split into train / validation / test segments."""

    names: list[str] | None = setting(
        None, "The features to compute (names from the feature registry, e.g. `ret_1`, `rsi_14`); null = the "
              "default set of 16 return, volatility, momentum, volume and range features.")
    horizon: int = setting(
        1, "Label horizon in bars: the label of bar t is the return from the open of t+1 to the open of t+1+horizon.",
        check=at_least(1))
    label: LabelScheme = setting(
        "three_class", "The target: `three_class` = down / flat / up around a flat band (`threshold_mode`); "
                       "`binary` = down / up; `triple_barrier` = which of two volatility barriers the price touches "
                       "first (`barrier_*`); `cs_rank` / `cs_zscore` = a regression target: the forward return's "
                       "percentile rank (centred on 0) / z-score among the stocks of the same date.")
    threshold: float = setting(
        0.0, "`three_class` with `threshold_mode=fixed`: the half-width of the flat band, as a log return.",
        check=at_least(0))
    threshold_mode: ThresholdMode = setting(
        "vol", "`three_class`: the flat band is `threshold` (`fixed`), or `vol_multiple` times the trailing 20-bar "
               "volatility times sqrt(horizon) (`vol`).")
    vol_multiple: float = setting(
        0.25, "`three_class` with `threshold_mode=vol`: the band's multiple of the trailing volatility.",
        check=at_least(0))
    barrier_up: float = setting(
        2.0, "`triple_barrier`: the upper barrier, in multiples of the trailing 20-bar volatility.", check=above(0))
    barrier_down: float = setting(
        2.0, "`triple_barrier`: the lower barrier, in multiples of the trailing 20-bar volatility.", check=above(0))
    barrier_bars: int = setting(
        10, "`triple_barrier`: the bars the price has to touch a barrier; neither touched = flat.", check=at_least(1))
    window: int = setting(
        20, "Sequence models (every model but mlp): the number of past bars each sample holds.", check=at_least(1))
    normalization: Normalization = setting(
        "zscore", "How features are scaled, fitted on the train segment only: `zscore` = mean and standard "
                  "deviation; `robust` = median and interquartile range (less moved by outliers). Scaled values are "
                  "clipped to +-10.")
    train_frac: float = setting(
        0.7, "The share of the dates in the train segment (the earliest), when `train_end` is not set.",
        check=Check(lambda value: 0 < value < 1, "between 0 and 1"))
    val_frac: float = setting(
        0.15, "The share of dates in the validation segment, when `val_end` is not set; the rest is the test "
              "segment.", check=Check(lambda value: 0 < value < 1, "between 0 and 1"))
    train_end: str | None = setting(
        None, "The last date (YYYY-MM-DD) of the train segment; overrides `train_frac`. null = by `train_frac`.",
        check=A_DATE)
    val_end: str | None = setting(
        None, "The last date (YYYY-MM-DD) of the validation segment; later dates are the test segment. Overrides "
              "`val_frac`; null = by `val_frac`.", check=A_DATE)
    train_start: str | None = setting(
        None, "Rows before this date (YYYY-MM-DD) take no part (a rolling window); null = from the first date.",
        check=A_DATE)
    embargo: int | None = setting(
        None, "Bars left out between two segments, so that no label reaches into the next segment; null = the "
              "label's reach (horizon + 1, or barrier_bars + 1).", check=at_least(0))
    cs_normalize: CrossSectionNorm = setting(
        "none", "Normalize each feature across the stocks of its date (nothing fitted) before the train-fitted "
                "normalization: `zscore`, `rank`, or `none`.")
    min_cross_section: int = setting(
        10, "Cross-sectional labels and features: dates with fewer stocks than this are dropped (and counted).",
        check=at_least(2))


@dataclass
class ModelConfig:
    """The network: which registered model and its size."""

    name: str = setting(
        "mlp", "A registered model (`alchemetric-ray train --help` lists them; `model.module` can add more).")
    module: str | None = setting(
        None, "An importable Python module that registers more models; imported on the driver and on every worker. "
              "null = the built-in models only.")
    hidden: int = setting(64, "Hidden width of each layer.", check=at_least(1))
    layers: int = setting(2, "Number of hidden layers (or recurrent / convolutional / attention blocks).",
                          check=at_least(1))
    dropout: float = setting(0.1, "Dropout probability; 0 = none.",
                             check=Check(lambda value: 0 <= value < 1, "in [0, 1)"))
    heads: int = setting(4, "Attention heads (transformer only).", check=at_least(1))
    kernel_size: int = setting(3, "Convolution kernel size in bars (tcn only).", check=at_least(1))


@dataclass
class TrainConfig:
    """The training loop: epochs, optimizer, loss, selection of the best epoch, early stopping."""

    epochs: int = setting(10, "Number of passes over the train segment.", check=at_least(1))
    batch_size: int = setting(512, "Rows per batch on each worker (with `loss=ic`: whole dates, as many as fit).",
                              check=at_least(1))
    lr: float = setting(1e-3, "Peak learning rate of AdamW.", check=above(0))
    weight_decay: float = setting(1e-4, "AdamW weight decay; 0 = none.", check=at_least(0))
    schedule: Schedule = setting(
        "cosine", "Learning-rate schedule over all steps: `cosine` = cosine decay from `lr`; `onecycle` = warm-up "
                  "over the first 30 % of steps, then cosine decay; `constant` = `lr` throughout.")
    loss: Loss = setting(
        "auto", "The training loss: `auto` = cross-entropy for a class target, MSE for a regression target; `ce` = "
                "cross-entropy (class targets); `mse` (regression targets); `ic` = minus the Pearson correlation of "
                "score and label within each date (regression targets, whole dates a batch; needs "
                "`train.cache_data=true`).")
    class_weights: bool = setting(
        False, "Weight the cross-entropy by inverse class frequency in the train segment.")
    grad_clip: float = setting(1.0, "Maximum gradient norm; 0 = no clipping.", check=at_least(0))
    seed: int = setting(0, "Seed of the weights, the shuffles and the baselines.")
    patience: int = setting(
        5, "Epochs without improvement of the selection metric before training stops early; 0 = never stop early.",
        check=at_least(0))
    metric: SelectionMetric = setting(
        "auto", "The validation metric that picks the best epoch, checkpoint and sweep trial; `auto` = "
                "`val_balanced_accuracy` for a class target, `val_rank_ic` for a cross-sectional one.")
    mode: SelectionMode = setting(
        "auto", "The direction in which `train.metric` improves: `auto` = the metric's own; `max` / `min` must "
                "agree with the metric (a contradicting mode is refused).")
    max_skipped_steps: int = setting(
        100, "Consecutive skipped steps (a non-finite loss or gradient) before the run fails.", check=at_least(1))
    check_every: int = setting(
        25, "Steps between two reads of the steps' device-side verdicts (non-finite loss or gradient, skipped "
            "steps): the only host syncs of training; they are also read at every epoch's end.", check=at_least(1))
    deterministic: bool = setting(
        False, "Ordered data and seeded shuffles, for bitwise-reproducible runs (slower).")
    cache_data: bool = setting(
        True, "Read each worker's shard into memory once and reuse it every epoch; false = stream it every epoch.")
    device_cache_fraction: float = setting(
        0.5, "On CUDA with `cache_data`: keep the cached shard on the GPU when it needs at most this share of the "
             "GPU's free memory (divided among the workers sharing the GPU); else stage batches through pinned "
             "memory. 0 = always stage.", check=Check(lambda value: 0 <= value <= 1, "in [0, 1]"))
    stop_after: int = setting(
        0, "Stop after this many epochs in this session; the run can be resumed (`--resume`). 0 = run all epochs.",
        check=at_least(0, "0 = run all epochs"))
    local_mode: LocalMode = setting(
        "auto", "Where the loop runs: `auto` = a one-worker run on a Ray this process started runs the loop in the "
                "driver's own process (Ray Train's local mode); `true` = insist (refused for several workers or on "
                "a joined cluster); `false` = always a Ray Train worker group.")
    micro_batch_rows: int = setting(
        0, "Forward each batch in micro-batches of at most this many rows (one loss and one backward over the whole "
           "batch: the same gradient, less memory). 0 = whole batches, unless a known backend bug needs micro-batches "
           "(hardware/known_bugs.yaml), which then sets them itself and says so.",
        check=at_least(0, "0 = whole batches"))
    shadow: ShadowSetting = setting(
        "auto", "The in-run shadow check, which compares gradients with a float32 CPU copy of the model: `auto` = "
                "on MPS only; `true` = on any device; `false` = never.")
    shadow_every: int = setting(
        0, "Steps between two shadow checks; 0 = adaptive (the checks cost at most 5 % of the step time).",
        check=at_least(0, "0 = adaptive"))
    score_test: bool = setting(
        False, "Score the exported model (and the baselines) on the sealed test segment at export, recorded in the "
               "model folder as a look at the test segment; `train --evaluate` and `alchemetric-ray evaluate` are "
               "the other ways.")


@dataclass
class PrecisionConfig:
    """Numeric precision of training and inference."""

    mode: PrecisionMode = setting(
        "auto", "`auto` = bf16 autocast on CUDA GPUs with native bf16, fp16 with a gradient scaler on older CUDA "
                "GPUs, float32 elsewhere; `fp32`, `fp16`, `bf16` = insist (refused with the reason where the device "
                "cannot). `--precision` sets it.")
    tf32: bool = setting(False, "Allow TF32 matrix multiplications when training in fp32 on CUDA.")


@dataclass
class DeviceConfig:
    """Which accelerator to use."""

    name: DeviceName = setting(
        DeviceName("auto"), "The device: `auto` = the best one available (CUDA, then MPS, then XPU, then the CPU), or "
                            "a device kind, with an index for one of several GPUs (`cuda:1`). `--device` sets it.")
    mps_fallback: MpsFallback = setting(
        "error", "On MPS, an operation MPS lacks: `error` = fail; `warn` = run it on the CPU with a warning "
                 "(PYTORCH_ENABLE_MPS_FALLBACK=1).")


@dataclass
class ScalingConfig:
    """Ray resources: workers, CPUs and GPUs per worker, placement, cluster start-up."""

    workers: int = setting(
        0, "Ray Train workers (data-parallel); 0 = automatic: one per GPU on CUDA, else one. `--workers` sets it.",
        check=at_least(0, "0 = automatic"))
    cpus_per_worker: float = setting(
        0.0, "CPUs each worker reserves; 0 = automatic (the free CPUs shared among the workers, 0.25 to 4 each).",
        check=at_least(0, "0 = automatic"))
    gpus_per_worker: float = setting(
        1.0, "GPUs each worker reserves on a GPU node; a fraction lets workers or trials share a GPU.",
        check=above(0))
    threads_per_worker: int = setting(
        0, "torch threads in each worker; 0 = the node's cores divided by the workers on that node.",
        check=at_least(0))
    max_failures: int = setting(
        0, "Worker-group restarts (for a one-worker sweep trial: retries) before the run fails; -1 = retry forever.",
        check=at_least(-1, "-1 = retry forever"))
    placement: Placement = setting(
        "PACK", "Ray placement-group strategy for the workers: `PACK` = as few nodes as possible; `SPREAD` = across "
                "nodes where possible; `STRICT_PACK` = all on one node; `STRICT_SPREAD` = each on a different node.")
    cluster_config: str = setting(
        "~/ray_bootstrap_config.yaml",
        "The Ray launcher YAML of an autoscaling cluster (`ray up` writes it on the head node, where job drivers "
        "run): its node types say what the cluster can grow to. Read when Ray holds no cluster config; a missing "
        "file means a cluster that does not scale (the plan uses the nodes there now).",
        check=Check(lambda value: bool(str(value).strip()), "a path to the cluster's launcher YAML"))
    start_timeout_s: float = setting(
        0.0, "Total wait, in seconds, for the workers' nodes and the worker group to start, scale-up included; "
             "0 = 120 s, or 1200 s where an autoscaler has to add nodes first.", check=at_least(0, "0 = automatic"))


@dataclass
class TuneConfig:
    """Hyperparameter sweeps (`alchemetric-ray tune`)."""

    num_samples: int = setting(
        4, "Configurations to try; with `search=grid` every grid point is tried once and this is not used.",
        check=at_least(1))
    search: SearchAlgorithm = setting(
        "random", "How configurations are picked from `tune.space`: `random`, `grid` (every combination) or `optuna` "
                  "(needs the optuna extra).")
    space: dict[str, Any] = setting(
        help="The search space: config keys mapped to a distribution, e.g. "
             "`{train.lr: {loguniform: [0.0001, 0.01]}, model.hidden: [32, 64]}`; kinds: loguniform, uniform, "
             "quniform, randint ([low, high]), choice, grid (a non-empty list); a plain list is a choice (a grid with "
             "`search=grid`); a plain value is fixed. Empty = nothing to sweep (refused by `tune`).", factory=dict)
    scheduler: TuneScheduler = setting(
        "asha", "Trial scheduler: `asha` = stop poorly performing trials early; `none` = run every trial to the end.")
    grace_period: int = setting(
        1, "ASHA: epochs every trial runs before it can be stopped early.", check=at_least(1))
    max_concurrent_trials: int = setting(
        0, "Trials running at once; 0 = as many as the resource plan fits.", check=at_least(0))
    time_budget_s: float = setting(
        0.0, "Wall-clock budget of the whole sweep, in seconds; 0 = no time limit.", check=at_least(0))
    trial_loop: TrialLoop = setting(
        "auto", "`auto` = a one-worker trial runs the loop in the trial's own process (several workers: a "
                "TorchTrainer); `trainer` = every trial builds a TorchTrainer.")


@dataclass
class SignalsConfig:
    """Trading signals, portfolios and evaluation (`predict`, `evaluate`)."""

    long_threshold: float = setting(
        0.05, "Class targets: position +1 when the score P(up) - P(down) is above this.", check=at_least(0))
    short_threshold: float = setting(
        0.05, "Class targets: position -1 when the score is below minus this.", check=at_least(0))
    quantile: float = setting(
        0.2, "The top and bottom share of each day's scores held long and short: the long-short portfolio, and the "
              "positions of a regression target.",
        check=Check(lambda value: 0 < value <= 0.5, "in (0, 0.5]"))
    cost_bps: float = setting(
        5.0, "Transaction cost per unit of turnover, in basis points.", check=at_least(0))
    folds: int = setting(
        0, "`evaluate`: walk-forward folds, a model retrained per fold; 0 = the model's own test segment only.",
        check=at_least(0))
    refit_every: int = setting(
        126, "`evaluate --walk-forward`: refit every this many trading days and pool the out-of-sample blocks.",
        check=at_least(2))
    train_window: int = setting(
        0, "`evaluate --walk-forward`: each refit's train + validation span in trading days; 0 = expanding (all "
           "dates before).", check=at_least(0, "0 = expanding"))
    actors: int = setting(
        0, "Ray Data batch-inference actors that score a saved model; 0 = one per GPU, else one.", check=at_least(0))


@dataclass
class StorageConfig:
    """Where runs, checkpoints and exported models are kept."""

    path: str = setting(
        "results", "Ray Train / Tune storage for runs and checkpoints: a local folder or a URI (s3://..., gs://...).",
        check=Check(lambda value: bool(value), "a folder or URI"))
    models_dir: str = setting(
        "models", "Where exported models go (a folder per model name): a local folder or a URI.")
    name: str = setting(
        "alchemetric", "The model name: the exported model's folder, the prefix of run names and the registered "
                       "MLflow model.", check=A_PLAIN_NAME)
    run: str | None = setting(
        None, "The Ray Train run name; null = `<name>-<timestamp>` (a fresh run).", check=A_PLAIN_NAME)
    resume: bool = setting(
        False, "Continue the latest run of this name (or `storage.run`) from its checkpoint. `--resume` sets it.")
    num_to_keep: int = setting(
        2, "Checkpoints kept per run, the best by the selection metric.", check=at_least(1))
    shared: bool = setting(
        False, "A local `storage.path` that every node mounts (NFS, EFS); needed for a local path on a multi-node "
               "cluster.")


@dataclass
class TrackingConfig:
    """Experiment tracking and the model registry (MLflow)."""

    mlflow_uri: str = setting(
        "", "The MLflow tracking store: `sqlite:///path/to/mlflow.db` (an embedded store) or `http(s)://host:port` "
            "(a team's MLflow server); empty = tracking off.",
        check=Check(lambda value: not value or value.startswith(("sqlite:///", "http://", "https://")),
                    "empty (off), sqlite:///path/to/mlflow.db or http(s)://host:port"))
    experiment: str = setting("", "The MLflow experiment; empty = `storage.name`.")
    live_every_s: float = setting(
        10.0, "How often (seconds) the driver logs a `train` run's newly finished epochs to MLflow while it trains "
              "(read from the run folder's latest checkpoint); 0 = only when the run ends.", check=at_least(0))


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    signals: SignalsConfig = field(default_factory=SignalsConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    # ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "RunConfig":
        cfg = _build(cls, raw, "")
        validate(cfg)
        return cfg

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(json.loads(text))

    def with_values(self, values: dict[str, Any]) -> "RunConfig":
        """A copy with ``{"section.key": value}`` set (values already typed, e.g. from a search space)."""
        raw = self.to_dict()
        for dotted, value in values.items():
            section, _, key = dotted.partition(".")
            if section not in raw or key not in raw[section]:
                raise ConfigError(_unknown_key(dotted, [f"{s}.{k}" for s in raw for k in raw[s]], "", "search space"))
            raw[section][key] = value
        return RunConfig.from_dict(raw)

    def flat(self) -> dict[str, Any]:
        """Every setting as ``{"section.key": value}`` (what MLflow params and TensorBoard HParams show)."""
        return {f"{section}.{key}": value
                for section, values in self.to_dict().items() for key, value in values.items()}

    def replace(self, *overrides: str) -> "RunConfig":
        """A copy with ``section.key=value`` overrides applied and validated."""
        raw = self.to_dict()
        apply_overrides(raw, overrides)
        return RunConfig.from_dict(raw)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> RunConfig:
    """Defaults, then the YAML file (if any), then ``key=value`` overrides; validated."""
    raw: dict[str, Any] = RunConfig().to_dict()
    if path is not None:
        _merge(raw, _read_yaml(Path(path)), "", str(path))
    apply_overrides(raw, overrides)
    return RunConfig.from_dict(raw)


# A config file is input: bounded in size, and in what its YAML aliases may expand to (a few hundred
# bytes of nested aliases can stand for billions of values, the "billion laughs").
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: {path.stat().st_size} bytes, more than a config can be "
                          f"({MAX_CONFIG_BYTES} bytes)")
    try:
        text = path.read_text()
        _check_expansion(yaml.compose(text, Loader=yaml.SafeLoader), path)
        loaded = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config file {path}: not valid YAML ({first})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
    return loaded


def _check_expansion(root, path: Path) -> None:
    """Count the values the composed YAML stands for, every alias expanded, and refuse the file once
    they pass :data:`MAX_CONFIG_VALUES` (a cycle of aliases passes it too) before anything is built."""
    import yaml

    count, stack = 0, [root] if root is not None else []
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"config file {path}: its YAML aliases expand to more than {MAX_CONFIG_VALUES} values; "
                              "refusing it (write the values out, or use fewer nested aliases)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))


def _merge(base: dict[str, Any], update: dict[str, Any], prefix: str, origin: str) -> None:
    for key, value in update.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise ConfigError(_unknown_key(dotted, list(base), prefix, origin))
        if isinstance(base[key], dict) and isinstance(value, dict) and prefix == "":
            _merge(base[key], value, f"{dotted}.", origin)
        else:
            base[key] = value


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> None:
    """Apply ``section.key=value`` strings; values are parsed as YAML scalars/lists."""
    import yaml

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) != 2:
            raise ConfigError(f"override {item!r}: expected section.key=value (e.g. train.lr=0.001)")
        section, key = parts
        if section not in raw:
            raise ConfigError(_unknown_key(section, list(raw), "", "override"))
        if key not in raw[section]:
            raise ConfigError(_unknown_key(dotted, list(raw[section]), f"{section}.", "override"))
        try:
            raw[section][key] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raw[section][key] = text


# Keys a saved model's config may still hold: read and dropped there, refused in one line as input.
RETIRED_KEYS = {
    "signals.n_boot": "the rank-IC intervals are t intervals with a Newey-West standard error, no bootstrap",
}


def _unknown_key(dotted: str, known: list[str], prefix: str, origin: str) -> str:
    if dotted in RETIRED_KEYS:
        return f"{origin + ': ' if origin else ''}config key '{dotted}' was retired: {RETIRED_KEYS[dotted]}"
    name = dotted[len(prefix):]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"
    where = f"{origin}: " if origin else ""
    return f"{where}unknown config key '{dotted}'{hint}"


# --------------------------------------------------------------------------------------------
# Typed construction
# --------------------------------------------------------------------------------------------


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config '{prefix.rstrip('.') or 'root'}': expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names and f"{prefix}{key}" not in RETIRED_KEYS:
            raise ConfigError(_unknown_key(f"{prefix}{key}", names, prefix, ""))
    kwargs = {}
    for name in names:
        if name not in raw:
            continue
        kwargs[name] = _coerce(hints[name], raw[name], f"{prefix}{name}")
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{key}.")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
    if tp is Any:
        return value
    if origin is Literal:
        if isinstance(value, bool) and {"true", "false"} <= set(args):  # YAML reads true/false as booleans
            value = "true" if value else "false"
        text = _coerce(str, value, key)
        _choice(key, text, args)
        return text
    if tp is DeviceName:
        text = _coerce(str, value, key)
        try:
            return DeviceName(text)
        except ValueError:
            raise ConfigError(f"config '{key}': {text!r} is invalid, expected {DeviceName.expected()}") from None
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config '{key}': expected a list, got {value!r}")
        return [_coerce(args[0], v, key) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config '{key}': expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config '{key}': expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"config '{key}': expected an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(f"config '{key}': expected a number, got {value!r}")
        return float(value)
    if tp is str:
        import datetime

        if isinstance(value, datetime.date):  # YAML reads 2011-01-20 as a date
            return value.isoformat()
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config '{key}': expected a string, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# Validation: a choice is a Literal type, checked as it is built; a single-field check lives on
# its field (``setting(..., check=...)``); the rules across fields are below, each naming its
# fields.  Every message is one line naming the key and the value.
# --------------------------------------------------------------------------------------------


def _choice(key: str, value: Any, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config '{key}': {value!r} is not one of {', '.join(allowed)}{hint}")


@dataclass(frozen=True)
class Rule:
    """A rule across fields: ``keys`` are the fields it reads (the first is the one its message names),
    ``says`` is the rule in words (for the reference), ``problem(cfg)`` the message's text, or None."""

    keys: tuple[str, ...]
    says: str
    problem: Callable[[RunConfig], str | None]


RULES: list[Rule] = []


def rule(*keys: str, says: str) -> Callable[[Callable[[RunConfig], str | None]], Callable[[RunConfig], str | None]]:
    def register(fn: Callable[[RunConfig], str | None]) -> Callable[[RunConfig], str | None]:
        RULES.append(Rule(keys, says, fn))
        return fn

    return register


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
    return metric_target_problem(selection_metric(cfg), cfg.features.label)


@rule("train.mode", "train.metric", "features.label",
      says="mode, unless auto, is the direction in which the (auto or named) metric improves")
def _mode_metric(cfg: RunConfig) -> str | None:
    metric = selection_metric(cfg)
    direction = metric_direction(metric)
    if cfg.train.mode in ("auto", direction):
        return None
    better = "larger" if direction == "max" else "smaller"
    return (f"{cfg.train.mode!r} contradicts train.metric={metric!r}, where {better} is better; "
            f"set train.mode={direction} or train.mode=auto")


def validate(cfg: RunConfig) -> None:
    """Every field's own check (section by section, in field order), then every rule across fields."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        for f in dataclasses.fields(values):
            check, value = f.metadata.get("check"), getattr(values, f.name)
            if check is not None and value is not None and not check.ok(value):
                raise ConfigError(f"config '{section.name}.{f.name}': {value!r} is invalid, expected {check.expected}")
    for each in RULES:
        problem = each.problem(cfg)
        if problem:
            raise ConfigError(f"config '{each.keys[0]}': {problem}")


# --------------------------------------------------------------------------------------------
# The reference: one row per key, read from the fields (docs/configuration.md is made from it)
# --------------------------------------------------------------------------------------------

REFERENCE_DOC = "docs/configuration.md"  # in the repository; `python -m alchemetric_ray.config_reference` prints it


@dataclass(frozen=True)
class Setting:
    """One key of the reference: what `docs/configuration.md` and the checks on it read."""

    section: str
    key: str
    type: str
    default: str
    allowed: str
    help: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


def sections() -> list[tuple[str, str]]:
    """(section name, what it configures) for every section of :class:`RunConfig`, in order."""
    out = []
    for section in dataclasses.fields(RunConfig):
        cls = section.default_factory  # type: ignore[misc]
        out.append((section.name, " ".join((cls.__doc__ or "").split())))
    return out


def reference() -> list[Setting]:
    """Every key of every section: its type, default, allowed values and help, in field order."""
    rows = []
    for section in dataclasses.fields(RunConfig):
        cls = section.default_factory  # type: ignore[misc]
        hints = typing.get_type_hints(cls)
        defaults = cls()
        for f in dataclasses.fields(cls):
            check = f.metadata.get("check")
            rows.append(Setting(section.name, f.name, _type_name(hints[f.name]), _value_text(getattr(defaults, f.name)),
                                _allowed(hints[f.name], check), f.metadata.get("help", "")))
    return rows


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if typing.get_origin(tp) is Literal:
        return "choice"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(args[0])}s"
    names = {DeviceName: "device name", bool: "boolean", int: "integer", float: "number", str: "string",
             dict: "mapping"}
    return names.get(typing.get_origin(tp) or tp, str(tp))


def _allowed(tp: Any, check: Check | None) -> str:
    if typing.get_origin(tp) is Literal:
        return ", ".join(typing.get_args(tp))
    if tp is DeviceName:
        return DeviceName.expected()
    return check.expected if check else ""


def _value_text(value: Any) -> str:
    """A default as a user writes it in YAML or an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _is_date(value: str) -> bool:
    import datetime

    try:
        datetime.date.fromisoformat(str(value))
        return True
    except ValueError:
        return False


def _safe_name(name: str) -> bool:
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9_.-]+", name or "")) and name not in (".", "..")
