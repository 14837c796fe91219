"""Model registry: each model file registers itself with :func:`register_model`; built from the config.

A model declares, where it is defined: its name, its inputs (``tabular``: (batch, features);
``sequence``: (batch, window, features)), the hyperparameters its constructor takes (names of
the config's model section, or ``window``: the sequence length, ``features.window``), and why
CPU autocast is wrong for it, if it is (the precision policy refuses bf16 on the CPU then).

Models outside this package register the same way: ``model.module=some.importable.module``
names a module that :func:`load_model_module` imports (on the driver and in every Ray worker,
through :func:`model_spec` and :func:`build_model`) before the name is looked up.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

from torch import nn

from alchemetric_ray.config import ModelConfig
from alchemetric_ray.errors import ModelModuleError, UnknownModelError

Inputs = Literal["tabular", "sequence"]
# What a constructor may ask for besides n_features and n_classes: the model section's settings
# (not its name or module) and the sequence length.
HYPERPARAMETERS = (*(f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("name", "module")), "window")

M = TypeVar("M", bound=type[nn.Module])


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: type[nn.Module]
    inputs: Inputs
    hyperparameters: tuple[str, ...]  # constructor keywords besides n_features and n_classes
    cpu_autocast_broken: str | None = None  # why bf16 autocast on the CPU is wrong for it; None = safe


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, inputs: Inputs, hyperparameters: tuple[str, ...] = (),
                   cpu_autocast_broken: str | None = None) -> Callable[[M], M]:
    """Class decorator: register the ``nn.Module`` below as model ``name`` (see the module docstring)."""
    if inputs not in typing.get_args(Inputs):
        raise ValueError(f"model {name!r}: inputs must be one of {', '.join(typing.get_args(Inputs))}, not {inputs!r}")
    unknown = [h for h in hyperparameters if h not in HYPERPARAMETERS]
    if unknown:
        raise ValueError(f"model {name!r}: unknown hyperparameter(s) {', '.join(unknown)} "
                         f"(a model takes some of {', '.join(HYPERPARAMETERS)})")

    def register(cls: M) -> M:
        known = MODELS.get(name)
        if known is not None and (known.cls.__module__, known.cls.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"model {name!r} is registered twice: {known.cls.__module__}.{known.cls.__qualname__} "
                             f"and {cls.__module__}.{cls.__qualname__}")
        MODELS[name] = ModelSpec(name, cls, inputs, tuple(hyperparameters), cpu_autocast_broken)
        return cls

    return register


def load_model_module(model_cfg: Any) -> None:
    """Import ``model.module`` (if set), where its models register themselves; a no-op once imported."""
    module = getattr(model_cfg, "module", None)
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ModelModuleError(f"config 'model.module': cannot import {module!r} ({why})") from None


def model_spec(model: str | Any) -> ModelSpec:
    """The registered model: by name, or from the config's model section (importing ``model.module`` first)."""
    if not isinstance(model, str):
        load_model_module(model)
        model = model.name
    if model not in MODELS:
        close = difflib.get_close_matches(model, list(MODELS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownModelError(f"unknown model '{model}' (known: {', '.join(sorted(MODELS))}){hint}")
    return MODELS[model]


def is_cross_sectional(model: nn.Module | ModelSpec) -> bool:
    """Whether the model (DDP-wrapped or not, or its spec) scores a date's stocks together: its forward
    takes each row's date code (``forward(x, date)``) and its callers hand it whole dates."""
    found = model.cls if isinstance(model, ModelSpec) else getattr(model, "module", model)  # DDP: its module
    return bool(getattr(found, "cross_sectional", False))


def build_model(model_cfg: Any, n_features: int, n_classes: int, window: int = 1) -> nn.Module:
    """Build the model named by ``model_cfg.name`` with the hyperparameters it declares."""
    spec = model_spec(model_cfg)
    settings = {"window": window}
    kwargs = {h: settings[h] if h in settings else getattr(model_cfg, h) for h in spec.hyperparameters}
    return spec.cls(n_features=n_features, n_classes=n_classes, **kwargs)
