"""The only package that branches on the kind of device: the kinds' table, resolver, precision policy, optimizer
step, inventory."""

from alchemetric_ray.errors import DeviceError, NonFiniteLossError, PrecisionError, TooManySkippedSteps
from alchemetric_ray.hardware.device import DeviceChoice, device_for_worker, resolve_device, train_accelerator
from alchemetric_ray.hardware.optimizer import OptimizerStep, StepOutcome, adamw, load_optimizer_state
from alchemetric_ray.hardware.precision import ModelTraits, Precision, resolve_precision

__all__ = [
    "DeviceChoice", "DeviceError", "device_for_worker", "resolve_device", "train_accelerator", "ModelTraits",
    "NonFiniteLossError", "OptimizerStep", "Precision", "PrecisionError", "StepOutcome", "TooManySkippedSteps",
    "adamw", "load_optimizer_state", "resolve_precision",
]
