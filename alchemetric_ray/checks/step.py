"""The run's step as the doctor's checks run it: :class:`RunShape`, its seeded batches and model, and the
loop's forward, loss and optimizer step; each check (``coverage``, ``bug_probes``, ``parity``, ``amp``,
``speed``) is a module of its own and returns a plain JSON-able dict.

Every check runs the run's own step, not a toy: the configured model (``model.module`` included), as
many features as the run would have, its outputs (one score for a regression target, else one logit
per class), ``features.window``, the run's loss (cross-entropy, MSE, or the per-date IC loss on
batches of whole dates) and ``train.batch_size`` rows (:class:`RunShape`).  A bug that shows only at
the run's shapes (a reduction dimension K of tens of thousands, an operator only the IC loss uses) is
then met by the doctor before training meets it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from alchemetric_ray.config import ModelConfig, RunConfig
from alchemetric_ray.data.features import resolve_feature_names
from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.hardware import Precision
from alchemetric_ray.models import build_model, is_cross_sectional, model_spec
from alchemetric_ray.scoring.objective import loss_of
from alchemetric_ray.training.losses import DateGroups

NAMES_PER_DATE = 50  # the IC loss correlates within a date: the doctor's batches hold dates of this many names


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line (its type where it has no text): what a report or blocker shows."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__



@dataclass(frozen=True)
class RunShape:
    """What one training step of the run looks like: model, features, outputs, window, loss, rows.

    Taken from the config the way the run takes it (the feature list ``features.names`` resolves to,
    the label's classes, :func:`~alchemetric_ray.scoring.objective.loss_of`), or from a saved model's manifest,
    which records what the model was actually trained on."""

    model: ModelConfig
    n_features: int
    outputs: int  # one logit per class; 1 for a regression target
    window: int
    loss: str  # ce | mse | ic
    batch: int  # train.batch_size: the rows of one step

    @classmethod
    def of(cls, cfg: RunConfig, manifest: Any = None) -> RunShape:
        if manifest is not None:
            n_features, outputs = len(manifest.features), manifest.outputs
        else:
            n_features = len(resolve_feature_names(cfg.features.names, cfg.features.set))
            outputs = len(LabelSpec.from_config(cfg.features).classes) or 1  # as Manifest.outputs counts them
        return cls(cfg.model, n_features, outputs, cfg.features.window, loss_of(cfg), cfg.train.batch_size)

    @property
    def sequence(self) -> bool:
        return model_spec(self.model).inputs == "sequence"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunShape:
        return cls(**{**raw, "model": ModelConfig(**raw["model"])})

    def describe(self) -> str:
        inputs = f"{self.window} x {self.n_features}" if self.sequence else f"{self.n_features}"
        return (f"{self.model.name}: {inputs} features -> {self.outputs} output(s), {self.loss} loss, "
                f"{self.batch:,} rows a step")


def date_sizes(rows: int) -> list[int]:
    """Rows per date of a batch of ``rows`` rows made of whole dates (the last one may hold fewer names)."""
    full, rest = divmod(rows, NAMES_PER_DATE)
    return [NAMES_PER_DATE] * full + ([rest] if rest else [])


def make_batch(shape: RunShape, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Inputs, labels and the batch's date sizes: labels the inputs predict (so that a short run
    learns), class indices for cross-entropy, real values for MSE and the IC loss."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, shape.window, shape.n_features) if shape.sequence else (batch, shape.n_features),
                    generator=g)
    signal = (x[:, -1] if shape.sequence else x)[:, :4].sum(dim=-1)
    if shape.loss == "ce":
        y = torch.zeros(batch, dtype=torch.long)
        for threshold in range(shape.outputs - 1):  # 3 classes: down below 0, flat to 1, up above
            y += (signal > threshold).long()
    else:
        y = signal + 0.5 * torch.randn(batch, generator=g)
    return x, y, date_sizes(batch)


def _on(device: torch.device, shape: RunShape, batch) -> tuple[torch.Tensor, torch.Tensor, DateGroups | None]:
    """A batch on ``device``, with its dates numbered as the loop numbers them (the IC loss only)."""
    x, y, sizes = batch
    dates = DateGroups.from_sizes(sizes, device) if shape.loss == "ic" else None
    return x.to(device), y.to(device), dates


def make_model(shape: RunShape, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(shape.model, shape.n_features, shape.outputs, window=shape.window)


def _forward_loss(model, batch, precision: Precision, loss_fn):
    """The loop's forward: the model under autocast, the loss in float32 outside it."""
    x, y, dates = batch
    with precision.autocast():
        out = model(x, dates.code) if is_cross_sectional(model) and dates is not None else model(x)
    return out, loss_fn(out, y, dates)


def _step(model, batch, precision: Precision, step_fn, loss_fn):
    out, loss = _forward_loss(model, batch, precision, loss_fn)
    step_fn(loss, epoch=0, step=0)
    return out, loss

