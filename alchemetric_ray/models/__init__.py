"""Plain nn.Modules that return class logits, chosen by name. No Ray and no device logic here.

Adding a model is one file in this folder: an ``nn.Module`` under ``@register_model(...)``
(see ``registry.py``).  Every module here is imported below, so its models register themselves.
A model outside the package: ``model.module=your.module`` (``registry.load_model_module``).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from alchemetric_ray.models.registry import (
    MODELS,
    ModelSpec,
    build_model,
    is_cross_sectional,
    load_model_module,
    model_spec,
    register_model,
)

for _module in _pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["MODELS", "ModelSpec", "build_model", "is_cross_sectional", "load_model_module", "model_spec",
           "register_model"]
