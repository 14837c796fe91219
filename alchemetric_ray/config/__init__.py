"""One typed run config: YAML file + ``section.key=value`` overrides, validated up front.

The same object travels from the entry point to every Ray worker (as JSON) and into every
checkpoint, so a saved model always says how it was trained.

Precedence: defaults < YAML file < command-line overrides.  Every problem is reported as a
:class:`ConfigError` whose one-line message names the key, the value and what was expected.

This package is the config's public surface; its modules each own one part:

- ``vocabulary``: the names a value may take (``Literal`` types, the metric names, ``DeviceName``);
- ``settings``: how a field (``setting``, ``Check``) and a rule across fields (``rule``) are declared,
  and ``validate``;
- ``schema``: the sections and ``RunConfig``;
- ``coercion``: raw values and overrides into typed sections;
- ``loading``: ``load_config``, the YAML file read safely;
- ``rules``: the rules across keys;
- ``keys``: the reference of every key, which ``config_reference`` renders as docs/configuration.md.
"""

from __future__ import annotations

from alchemetric_ray.config import rules  # noqa: F401  (registers the rules across keys with ``validate``)
from alchemetric_ray.config.coercion import RETIRED_KEYS, apply_overrides
from alchemetric_ray.config.keys import REFERENCE_DOC, Setting, reference, sections
from alchemetric_ray.config.loading import MAX_CONFIG_BYTES, MAX_CONFIG_VALUES, load_config
from alchemetric_ray.config.schema import (
    DataConfig,
    DeviceConfig,
    FeaturesConfig,
    ModelConfig,
    PrecisionConfig,
    RefitConfig,
    RunConfig,
    ScalingConfig,
    SignalsConfig,
    StorageConfig,
    TrackingConfig,
    TrainConfig,
    TuneConfig,
)
from alchemetric_ray.config.settings import (
    A_DATE,
    A_PLAIN_NAME,
    RULES,
    Check,
    Rule,
    above,
    at_least,
    rule,
    setting,
    validate,
)
from alchemetric_ray.config.vocabulary import (
    CLASSIFICATION_METRICS,
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    REGRESSION_LABELS,
    REGRESSION_METRICS,
    SELECTION_METRICS,
    SIGNAL_METRICS,
    CrossSectionNorm,
    DataSource,
    DeviceKind,
    DeviceName,
    DuplicatePolicy,
    IndexedDeviceKind,
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
    metric_direction,
    metric_target_problem,
    resolve_metric,
)
from alchemetric_ray.errors import ConfigError

__all__ = [
    # vocabulary
    "DataSource", "DuplicatePolicy", "LabelScheme", "CrossSectionNorm", "ThresholdMode", "Normalization", "Schedule",
    "Loss", "SelectionMode", "PrecisionMode", "MpsFallback", "Placement", "SearchAlgorithm", "TuneScheduler",
    "TrialLoop", "LocalMode", "ShadowSetting", "DeviceKind", "IndexedDeviceKind", "DeviceName",
    "CLASSIFICATION_METRICS", "REGRESSION_METRICS", "SIGNAL_METRICS", "HIGHER_IS_BETTER", "LOWER_IS_BETTER",
    "SELECTION_METRICS", "SelectionMetric", "REGRESSION_LABELS", "metric_direction", "resolve_metric",
    "metric_target_problem",
    # settings
    "ConfigError", "Check", "at_least", "above", "setting", "A_DATE", "A_PLAIN_NAME", "Rule", "RULES", "rule",
    "validate",
    # schema
    "DataConfig", "FeaturesConfig", "ModelConfig", "TrainConfig", "PrecisionConfig", "DeviceConfig", "ScalingConfig",
    "TuneConfig", "SignalsConfig", "StorageConfig", "TrackingConfig", "RefitConfig", "RunConfig",
    # coercion and loading
    "apply_overrides", "RETIRED_KEYS", "load_config", "MAX_CONFIG_BYTES", "MAX_CONFIG_VALUES",
    # reference
    "REFERENCE_DOC", "Setting", "sections", "reference",
]
