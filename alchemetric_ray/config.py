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
from typing import Any, Literal

from alchemetric_ray.errors import UserError

# --------------------------------------------------------------------------------------------
# The choices: each written once, as a type.  Validation (``_coerce``) and the CLI's help read
# the allowed values from these types with ``typing.get_args``; so does every other package.
# --------------------------------------------------------------------------------------------

DataSource = Literal["stocknet", "builtin", "synthetic", "files"]
# data.on_duplicate: what ingest does with two rows of one ticker and date whose values differ (an
# exact copy of a row is always dropped and counted): refuse = stop with both rows named; first /
# last = keep the ticker's first / last such row in file order; skip_ticker = leave the ticker out
DuplicatePolicy = Literal["refuse", "first", "last", "skip_ticker"]
LabelScheme = Literal["three_class", "binary", "triple_barrier", "cs_rank", "cs_zscore"]
CrossSectionNorm = Literal["none", "zscore", "rank"]
ThresholdMode = Literal["fixed", "vol"]
Normalization = Literal["zscore", "robust"]
Schedule = Literal["cosine", "onecycle", "constant"]
# train.loss: auto = cross-entropy for a class target, MSE for a regression target; ic = minus the
# Pearson correlation of score and label within each date (regression targets, whole dates a batch)
Loss = Literal["auto", "ce", "mse", "ic"]
SelectionMode = Literal["auto", "max", "min"]  # train.mode; "auto" = the metric's own direction
PrecisionMode = Literal["auto", "fp32", "fp16", "bf16"]
MpsFallback = Literal["error", "warn"]  # PYTORCH_ENABLE_MPS_FALLBACK = 0 | 1
Placement = Literal["PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"]  # Ray placement group strategy
SearchAlgorithm = Literal["random", "grid", "optuna"]
TuneScheduler = Literal["asha", "none"]
TrialLoop = Literal["auto", "trainer"]
# train.local_mode: auto = a one-worker train on a Ray this process started runs the loop in the
# driver's own process (Ray Train's local mode); true = insist (refused for several workers or on a
# joined cluster); false = always a Train worker group
LocalMode = Literal["auto", "true", "false"]
# train.shadow: auto = the in-run shadow check on MPS (a float32 CPU copy checks the gradients); true = on
# any device (CUDA, or the CPU checking its own precision); false = never
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
# Sections
# --------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    # Folder (or file) of daily OHLCV; None = the source below.
    path: str | None = None
    # "stocknet" (88 US stocks 2012-2017, shipped with the package) | "builtin" (4 US large caps
    # 2000-2013, from bokeh-sampledata; kept because saved models name it) | "synthetic" | "files"
    source: DataSource = "stocknet"
    tickers: list[str] | None = None  # restrict to these tickers
    # Default "last": public daily files get corrections appended after the bar they revise (the
    # 2017-10-30 pair of one S&P 500 name differed by 22 shares of volume), so the later row is the
    # vendor's revised bar; builtin.py already keeps the last of a date.  "refuse" is the strict choice.
    on_duplicate: DuplicatePolicy = "last"
    synthetic_tickers: int = 50
    synthetic_days: int = 1000
    synthetic_effect: float = 0.0  # strength of the planted momentum effect; 0 = null market
    synthetic_effect_window: int = 10  # the effect's trailing window (days)
    synthetic_effect_lag: int = 0  # the window ends this many days before t
    seed: int = 0


@dataclass
class FeaturesConfig:
    names: list[str] | None = None  # None = the default feature set
    horizon: int = 1  # label horizon in bars
    label: LabelScheme = "three_class"
    threshold: float = 0.0  # flat band for three_class (fixed return, or vol multiple)
    threshold_mode: ThresholdMode = "vol"
    vol_multiple: float = 0.25
    barrier_up: float = 2.0  # triple barrier: multiples of rolling vol
    barrier_down: float = 2.0
    barrier_bars: int = 10
    window: int = 20  # sequence length for sequence models
    normalization: Normalization = "zscore"
    train_frac: float = 0.7
    val_frac: float = 0.15
    train_end: str | None = None  # explicit split dates (YYYY-MM-DD) override fractions
    val_end: str | None = None
    train_start: str | None = None  # rows before this date take no part (a rolling window); None: from the first
    embargo: int | None = None  # bars between segments; None = the label's reach
    # each feature normalized across the stocks of its date (nothing fitted) before the train-fitted normalization
    cs_normalize: CrossSectionNorm = "none"
    # cross-sectional labels and features: dates with fewer stocks than this are dropped (and counted)
    min_cross_section: int = 10


@dataclass
class ModelConfig:
    name: str = "mlp"  # a registered model (models/registry.py; `alchemetric-ray train --help` lists them)
    module: str | None = None  # an importable module that registers more models (imported on driver and workers)
    hidden: int = 64
    layers: int = 2
    dropout: float = 0.1
    heads: int = 4  # transformer only
    kernel_size: int = 3  # tcn only


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 512
    lr: float = 1e-3
    weight_decay: float = 1e-4
    schedule: Schedule = "cosine"
    loss: Loss = "auto"  # auto: cross-entropy for classes, MSE for a regression target; or ce | mse | ic
    class_weights: bool = False
    grad_clip: float = 1.0  # max grad norm; 0 = no clipping
    seed: int = 0
    patience: int = 5  # epochs without improvement before early stop; 0 = never
    metric: SelectionMetric = "auto"  # the validation metric that picks the best epoch; auto: the target's own
    mode: SelectionMode = "auto"  # the metric's own direction, or max | min; a mode contradicting the metric is refused
    max_skipped_steps: int = 100  # consecutive skipped (non-finite) steps before failing
    # steps between two reads of the step's device-side verdicts (non-finite loss or gradient, skipped
    # steps): the only host syncs of training; also read at every epoch's end, before its report
    check_every: int = 25
    deterministic: bool = False  # ordered data and seeded shuffles for bitwise reproducibility
    cache_data: bool = True  # read a worker's shard into memory once and reuse it every epoch
    # CUDA + cache_data: keep the cached shard on the GPU when it needs at most this share of the GPU's
    # free memory (divided by the workers sharing the GPU); else pinned staging.  0 = always staging.
    device_cache_fraction: float = 0.5
    stop_after: int = 0  # stop after this many epochs in this session (resumable); 0 = run all epochs
    local_mode: LocalMode = "auto"  # the loop in the driver's process (one worker, a local Ray) or in a Train worker
    # forward each step's batch in micro-batches of at most this many rows (one loss and one backward over the
    # whole batch: the same gradient); 0 = whole batches, unless a known backend bug needs them
    # (hardware/known_bugs.yaml), which sets them itself and says so
    micro_batch_rows: int = 0
    shadow: ShadowSetting = "auto"  # the in-run shadow check against a float32 CPU copy: auto (MPS), true, false
    shadow_every: int = 0  # steps between shadow checks; 0 = adaptive (checks cost at most 5 % of the step time)


@dataclass
class PrecisionConfig:
    mode: PrecisionMode = "auto"
    tf32: bool = False  # allow TF32 matmuls when training fp32 on CUDA


@dataclass
class DeviceConfig:
    name: DeviceName = DeviceName("auto")
    mps_fallback: MpsFallback = "error"


@dataclass
class ScalingConfig:
    workers: int = 0  # 0 = automatic (one per GPU on CUDA, else one)
    cpus_per_worker: float = 0.0  # 0 = automatic
    gpus_per_worker: float = 1.0
    threads_per_worker: int = 0  # torch threads; 0 = from the CPUs a worker holds
    max_failures: int = 0  # worker-group restarts (a one-worker sweep trial: retries) before the run fails
    placement: Placement = "PACK"
    # The Ray launcher YAML of an autoscaling cluster (`ray up` writes it on the head, where job
    # drivers run): its available_node_types say what the cluster can grow to.  Read when the GCS
    # holds no cluster config; a missing file means a cluster that does not scale (plan from now).
    cluster_config: str = "~/ray_bootstrap_config.yaml"
    # Total wait for the workers' nodes and the worker group to start, scale-up included;
    # 0 = 120 s, or 1200 s where an autoscaler has to add nodes first.
    start_timeout_s: float = 0.0


@dataclass
class TuneConfig:
    num_samples: int = 4
    search: SearchAlgorithm = "random"
    space: dict[str, Any] = field(default_factory=dict)
    scheduler: TuneScheduler = "asha"
    grace_period: int = 1
    max_concurrent_trials: int = 0  # 0 = from the resource plan
    time_budget_s: float = 0.0  # 0 = no time limit
    # auto: a one-worker trial runs the loop in the trial's own process (several workers: a TorchTrainer);
    # trainer: every trial builds a TorchTrainer
    trial_loop: TrialLoop = "auto"


@dataclass
class SignalsConfig:
    long_threshold: float = 0.05  # position +1 when score = P(up) - P(down) is above this
    short_threshold: float = 0.05  # position -1 when the score is below minus this
    quantile: float = 0.2  # long-short portfolio: top and bottom quantile of scores each day
    cost_bps: float = 5.0  # transaction cost per unit of turnover, in basis points
    folds: int = 0  # walk-forward folds for `evaluate` (retrain per fold); 0 = the model's own test split only
    # `evaluate --walk-forward`: refit every this many trading days, pool the blocks
    refit_every: int = 126
    train_window: int = 0  # each refit's train + validation span in trading days; 0 = expanding (all before)
    actors: int = 0  # batch-inference actors; 0 = one per GPU, else one


@dataclass
class StorageConfig:
    path: str = "results"  # Ray Train/Tune storage (local folder or URI like s3://...)
    models_dir: str = "models"
    name: str = "alchemetric"  # model name: the exported model's folder, and the prefix of run names
    run: str | None = None  # Ray Train run name; None = "<name>-<timestamp>" (a fresh run)
    resume: bool = False  # continue the latest run of this name (or storage.run) from its checkpoint
    num_to_keep: int = 2
    shared: bool = False  # a local storage.path that every node mounts (NFS/EFS); needed on multi-node clusters


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


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    try:
        loaded = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config file {path}: not valid YAML ({first})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
    return loaded


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
# Validation (ranges; a choice is a Literal type, checked as it is built); every message names
# the key and the value
# --------------------------------------------------------------------------------------------


def _choice(key: str, value: Any, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config '{key}': {value!r} is not one of {', '.join(allowed)}{hint}")


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config '{key}': {value!r} is invalid, expected {expected}")


def validate(cfg: RunConfig) -> None:
    data, features, model, train = cfg.data, cfg.features, cfg.model, cfg.train
    _check(data.synthetic_tickers >= 1, "data.synthetic_tickers", data.synthetic_tickers, ">= 1")
    _check(data.synthetic_days >= 10, "data.synthetic_days", data.synthetic_days, ">= 10")

    _check(features.horizon >= 1, "features.horizon", features.horizon, ">= 1")
    _check(features.threshold >= 0, "features.threshold", features.threshold, ">= 0")
    _check(features.vol_multiple >= 0, "features.vol_multiple", features.vol_multiple, ">= 0")
    _check(features.barrier_up > 0, "features.barrier_up", features.barrier_up, "> 0")
    _check(features.barrier_down > 0, "features.barrier_down", features.barrier_down, "> 0")
    _check(features.barrier_bars >= 1, "features.barrier_bars", features.barrier_bars, ">= 1")
    _check(features.window >= 1, "features.window", features.window, ">= 1")
    _check(0 < features.train_frac < 1, "features.train_frac", features.train_frac, "between 0 and 1")
    _check(0 < features.val_frac < 1, "features.val_frac", features.val_frac, "between 0 and 1")
    _check(features.train_frac + features.val_frac < 1, "features.val_frac", features.val_frac,
           f"train_frac + val_frac < 1 (train_frac is {features.train_frac})")
    _check(features.embargo is None or features.embargo >= 0, "features.embargo", features.embargo, ">= 0")
    _check(features.min_cross_section >= 2, "features.min_cross_section", features.min_cross_section, ">= 2")
    for key in ("train_end", "val_end", "train_start"):
        value = getattr(features, key)
        if value is not None:
            _check(_is_date(value), f"features.{key}", value, "a date YYYY-MM-DD")
    if features.train_end and features.val_end:
        _check(features.train_end < features.val_end, "features.val_end", features.val_end,
               f"a date after train_end ({features.train_end})")
    if features.train_start and features.train_end:
        _check(features.train_start < features.train_end, "features.train_start", features.train_start,
               f"a date before train_end ({features.train_end})")

    _check(train.micro_batch_rows >= 0, "train.micro_batch_rows", train.micro_batch_rows, ">= 0 (0 = whole batches)")
    _check(train.shadow_every >= 0, "train.shadow_every", train.shadow_every, ">= 0 (0 = adaptive)")
    _check(model.hidden >= 1, "model.hidden", model.hidden, ">= 1")
    _check(model.layers >= 1, "model.layers", model.layers, ">= 1")
    _check(0 <= model.dropout < 1, "model.dropout", model.dropout, "in [0, 1)")
    _check(model.heads >= 1, "model.heads", model.heads, ">= 1")
    _check(model.kernel_size >= 1, "model.kernel_size", model.kernel_size, ">= 1")

    _check(train.epochs >= 1, "train.epochs", train.epochs, ">= 1")
    _check(train.batch_size >= 1, "train.batch_size", train.batch_size, ">= 1")
    _check(train.lr > 0, "train.lr", train.lr, "> 0")
    _check(train.weight_decay >= 0, "train.weight_decay", train.weight_decay, ">= 0")
    _check(train.grad_clip >= 0, "train.grad_clip", train.grad_clip, ">= 0")
    _check(train.patience >= 0, "train.patience", train.patience, ">= 0")
    _check(0 <= train.device_cache_fraction <= 1, "train.device_cache_fraction", train.device_cache_fraction,
           "in [0, 1]")
    regression = features.label in REGRESSION_LABELS
    if train.loss == "ce" and regression:
        raise ConfigError(f"config 'train.loss': ce (cross-entropy) needs class labels but features.label="
                          f"{features.label} is a regression target; use mse or ic")
    if train.loss in ("mse", "ic") and not regression:
        raise ConfigError(f"config 'train.loss': {train.loss} needs a regression target but features.label="
                          f"{features.label} is a class target; use features.label=cs_rank or cs_zscore")
    if train.loss == "ic" and not train.cache_data:
        raise ConfigError("config 'train.loss': ic needs whole dates in every batch, which only the cached data path "
                          "gives (the shards are ticker by ticker and streaming scatters a date across batches and "
                          "ranks); set train.cache_data=true")
    metric = selection_metric(cfg)
    problem = metric_target_problem(metric, features.label)
    if problem:
        raise ConfigError(f"config 'train.metric': {problem}")
    direction = metric_direction(metric)
    if train.mode not in ("auto", direction):
        better = "larger" if direction == "max" else "smaller"
        raise ConfigError(f"config 'train.mode': {train.mode!r} contradicts train.metric={metric!r}, "
                          f"where {better} is better; set train.mode={direction} or train.mode=auto")
    _check(train.stop_after >= 0, "train.stop_after", train.stop_after, ">= 0 (0 = run all epochs)")
    _check(train.max_skipped_steps >= 1, "train.max_skipped_steps", train.max_skipped_steps, ">= 1")
    _check(train.check_every >= 1, "train.check_every", train.check_every, ">= 1")

    scaling = cfg.scaling
    _check(scaling.workers >= 0, "scaling.workers", scaling.workers, ">= 0 (0 = automatic)")
    _check(scaling.cpus_per_worker >= 0, "scaling.cpus_per_worker", scaling.cpus_per_worker, ">= 0 (0 = automatic)")
    _check(scaling.gpus_per_worker > 0, "scaling.gpus_per_worker", scaling.gpus_per_worker, "> 0")
    _check(scaling.threads_per_worker >= 0, "scaling.threads_per_worker", scaling.threads_per_worker, ">= 0")
    _check(scaling.max_failures >= -1, "scaling.max_failures", scaling.max_failures, ">= -1 (-1 = retry forever)")
    _check(bool(str(scaling.cluster_config).strip()), "scaling.cluster_config", scaling.cluster_config,
           "a path to the cluster's launcher YAML")
    _check(scaling.start_timeout_s >= 0, "scaling.start_timeout_s", scaling.start_timeout_s, ">= 0 (0 = automatic)")

    tune = cfg.tune
    _check(tune.num_samples >= 1, "tune.num_samples", tune.num_samples, ">= 1")
    _check(tune.grace_period >= 1, "tune.grace_period", tune.grace_period, ">= 1")
    _check(tune.max_concurrent_trials >= 0, "tune.max_concurrent_trials", tune.max_concurrent_trials, ">= 0")
    _check(tune.time_budget_s >= 0, "tune.time_budget_s", tune.time_budget_s, ">= 0")

    signals = cfg.signals
    _check(signals.long_threshold >= 0, "signals.long_threshold", signals.long_threshold, ">= 0")
    _check(signals.short_threshold >= 0, "signals.short_threshold", signals.short_threshold, ">= 0")
    _check(0 < signals.quantile <= 0.5, "signals.quantile", signals.quantile, "in (0, 0.5]")
    _check(signals.cost_bps >= 0, "signals.cost_bps", signals.cost_bps, ">= 0")
    _check(signals.folds >= 0, "signals.folds", signals.folds, ">= 0")
    _check(signals.refit_every >= 2, "signals.refit_every", signals.refit_every, ">= 2")
    _check(signals.train_window >= 0, "signals.train_window", signals.train_window, ">= 0 (0 = expanding)")
    _check(signals.actors >= 0, "signals.actors", signals.actors, ">= 0")

    storage = cfg.storage
    _check(bool(storage.path), "storage.path", storage.path, "a folder or URI")
    _check(_safe_name(storage.name), "storage.name", storage.name,
           "a plain name of letters, digits, '.', '_' or '-' (no path separators or '..')")
    _check(storage.run is None or _safe_name(storage.run), "storage.run", storage.run,
           "a plain name of letters, digits, '.', '_' or '-' (no path separators or '..')")
    _check(storage.num_to_keep >= 1, "storage.num_to_keep", storage.num_to_keep, ">= 1")


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
