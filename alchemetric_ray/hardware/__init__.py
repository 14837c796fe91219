"""The only package that branches on the kind of device: resolver, precision policy, inventory."""

from alchemetric_ray.hardware.device import DeviceChoice, DeviceError, resolve_device
from alchemetric_ray.hardware.precision import (
    NonFiniteLossError,
    OptimizerStep,
    Precision,
    PrecisionError,
    StepOutcome,
    TooManySkippedSteps,
    resolve_precision,
)

__all__ = [
    "DeviceChoice", "DeviceError", "resolve_device", "NonFiniteLossError", "OptimizerStep", "Precision",
    "PrecisionError", "StepOutcome", "TooManySkippedSteps", "resolve_precision",
]
