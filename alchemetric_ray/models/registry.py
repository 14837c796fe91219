"""Model registry: name -> (class, input kind). Builds a model from the config's model section."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from torch import nn

from alchemetric_ray.errors import UserError


class UnknownModelError(UserError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: type[nn.Module]
    inputs: str  # "tabular": (batch, features); "sequence": (batch, window, features)


MODELS: dict[str, ModelSpec] = {}


def register(name: str, cls: type[nn.Module], inputs: str) -> None:
    assert inputs in ("tabular", "sequence")
    MODELS[name] = ModelSpec(name, cls, inputs)


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        close = difflib.get_close_matches(name, list(MODELS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownModelError(f"unknown model '{name}' (known: {', '.join(sorted(MODELS))}){hint}")
    return MODELS[name]


def build_model(model_cfg: Any, n_features: int, n_classes: int, window: int = 1) -> nn.Module:
    """Build the model named by ``model_cfg.name`` from the config's model section."""
    spec = model_spec(model_cfg.name)
    return spec.cls(
        n_features=n_features,
        n_classes=n_classes,
        hidden=model_cfg.hidden,
        layers=model_cfg.layers,
        dropout=model_cfg.dropout,
        heads=model_cfg.heads,
        kernel_size=model_cfg.kernel_size,
        window=window,
    )
