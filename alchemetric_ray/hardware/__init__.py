"""The only package that branches on the kind of device: the kinds' table, resolver, precision policy, optimizer
step, inventory."""

from alchemetric_ray.hardware.device import (
    DeviceChoice,
    DeviceError,
    device_for_worker,
    resolve_device,
    train_accelerator,
)
from alchemetric_ray.hardware.optimizer import (
    NonFiniteLossError,
    OptimizerStep,
    StepOutcome,
    TooManySkippedSteps,
    adamw,
    load_optimizer_state,
)
from alchemetric_ray.hardware.precision import ModelTraits, Precision, PrecisionError, resolve_precision

__all__ = [
    "DeviceChoice", "DeviceError", "device_for_worker", "resolve_device", "train_accelerator", "ModelTraits",
    "NonFiniteLossError", "OptimizerStep", "Precision", "PrecisionError", "StepOutcome", "TooManySkippedSteps",
    "adamw", "load_optimizer_state", "resolve_precision",
]
