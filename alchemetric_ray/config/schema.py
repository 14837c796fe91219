"""The run config's shape: one dataclass per section, and ``RunConfig``, which holds the eleven.

Each field is a ``setting``: its type (a fixed set of values is a ``Literal``), its default, its help
text and, where one value alone can be wrong, its check.  ``RunConfig`` goes to and from a dict and
JSON (the form that travels to every Ray worker and into every checkpoint), and builds itself
validated.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from alchemetric_ray.config.coercion import _build, _unknown_key, apply_overrides
from alchemetric_ray.config.settings import A_DATE, A_PLAIN_NAME, Check, above, at_least, setting, validate
from alchemetric_ray.config.vocabulary import (
    CrossSectionNorm,
    DataSource,
    DeviceName,
    DuplicatePolicy,
    LabelScheme,
    LocalMode,
    Loss,
    MpsFallback,
    Normalization,
    Placement,
    PrecisionMode,
    Schedule,
    SearchAlgorithm,
    SelectionMetric,
    SelectionMode,
    ShadowSetting,
    ThresholdMode,
    TrialLoop,
    TuneScheduler,
)
from alchemetric_ray.errors import ConfigError


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
        None, "The features to compute, from `set` (e.g. `ret_1`, `rsi_14` in `basic`); null = the whole of "
              "`set` (`basic`: 16 return, volatility, momentum, volume and range features).")
    set: Literal["basic", "alpha158", "alpha360"] = setting(
        "basic", "The feature set: `basic` = the 16 default features (returns, volatility, momentum, volume, "
                 "range); `alpha158` = the 158 features of the Alpha158 families Qlib publishes (k-line shape, the "
                 "bar's prices over its close, and 29 rolling measures over 5/10/20/30/60 bars), warm-up 60 bars; "
                 "`alpha360` = the last 60 bars of open, high, low, close, VWAP proxy ((high + low + close) / 3) and "
                 "volume, each over the current close (volume: over the current volume), 360 columns for sequence "
                 "models, warm-up 59 bars. Every formula: docs/pipeline.md (Feature sets). With `features.names` "
                 "null the whole set is built; `features.names` given selects from the set's own features (for "
                 "`basic`, from every basic feature), and a name of another set is refused. A build setting: the "
                 "shards' manifest records it. Why `basic` is the default: docs/evaluation.md (Which contender, "
                 "which features).")
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
    distributed: Literal["auto", "true", "false"] = setting(
        "auto", "Where the features are computed: `true` = as Ray tasks over groups of tickers (and the per-date "
                "pass by buckets of dates), in the Ray this process runs in, else a local one it starts; `false` = "
                "in this process; `auto` = Ray tasks in a Ray already running in this process, or on the cluster "
                "RAY_ADDRESS names (`ray job submit`) for more than one group, or a local Ray it starts for a folder "
                "of per-ticker files of 80 groups or more (16M bars at the default `group_rows`, judged by the files' "
                "size: below that, on a 2-core machine, a local Ray's start cost more than its cores saved); "
                "else in this process. The shards are the same either way.")
    group_rows: int = setting(
        200_000, "The bars in one group of tickers, the unit of work of the feature build (bars read in this "
                 "process: a group ends at the ticker that reaches this many rows; a folder of per-ticker files "
                 "read by Ray tasks: even groups of about this many at most, a multiple of the CPUs in number "
                 "where they take more than one round): smaller groups spread more tasks over a cluster, larger "
                 "ones cost less per row.", check=at_least(1))


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
    heads: int = setting(4, "Attention heads (transformer and cs_attention).", check=at_least(1))
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
        "auto", "The training loss: `auto` = cross-entropy for a class target, MSE for a regression target (`ic` "
                "for a cross-sectional model such as `cs_attention`); `ce` = "
                "cross-entropy (class targets); `mse` (regression targets); `ic` = minus the Pearson correlation of "
                "score and label within each date (regression targets, whole dates a batch; needs "
                "`train.cache_data=true`).")
    class_weights: bool = setting(
        False, "Weight the cross-entropy by inverse class frequency in the train segment.")
    grad_clip: float = setting(1.0, "Maximum gradient norm; 0 = no clipping.", check=at_least(0))
    seed: int = setting(0, "Seed of the weights, the shuffles and the baselines.")
    seeds: int = setting(
        1, "Models trained, one Ray Train run each at seeds `seed`, `seed`+1, ...; more than 1 = a seed ensemble: the "
           "exported model scores their average, and the evaluation reports each seed's rank IC beside it.",
        check=at_least(1))
    init_weights: str | None = setting(
        None, "A saved model folder whose weights start the training (a warm start: its model settings and features "
              "must match this run's); null = a fresh initialization. `refit.warm_start` sets it to the champion.")
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
    trials_per_gpu: int = setting(
        0, "One-worker trials that share one GPU on a GPU node (each reserves 1/N of it); 0 = automatic: from the "
           "model's memory footprint (the meta-device trace), at most 4; 1 = a whole GPU per trial.",
        check=at_least(0, "0 = automatic"))
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
class RefitConfig:
    """Scheduled refits with a gated promotion (`alchemetric-ray refit`)."""

    warm_start: bool = setting(
        False, "Start the challenger from the champion's weights (its model settings must match) instead of a fresh "
               "initialization.")
    walk_forward: bool = setting(
        False, "Also score champion and challenger on the pooled walk-forward (`signals.refit_every`) and gate on it "
               "as well.")
    margin: float = setting(
        0.02, "The gate: the lower bound of the paired (challenger - champion) daily rank-IC difference must be at "
              "least minus this (0 = the challenger must be better beyond doubt).", check=at_least(0))
    max_dsr_drop: float = setting(
        0.25, "The gate: the challenger's deflated Sharpe ratio (its probabilistic Sharpe ratio where one trial "
              "stands behind it) may fall at most this far below the champion's.", check=at_least(0))
    min_days: int = setting(
        20, "Labelled trading days after the champion's test segment needed to judge a challenger; with fewer the "
            "champion stays and nothing is trained.", check=at_least(2))
    sweep: bool = setting(
        False, "Find the challenger with a sweep (`tune.*`: its space, trials and scheduler) instead of one run.")


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
    refit: RefitConfig = field(default_factory=RefitConfig)

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
