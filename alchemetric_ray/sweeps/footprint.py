"""What one sweep trial's model needs of a GPU's memory, traced on the ``meta`` device (nothing is
computed or allocated), so that the planner can put several small trials on one GPU.

One trial's training memory, in float32 (an upper bound under bf16/fp16 autocast):

* the parameters, their gradients and AdamW's two moments: 16 bytes per parameter;
* the activations: every tensor one forward at the step's rows (``train.batch_size``, or
  ``train.micro_batch_rows``) creates, views left out (what autograd may keep for the backward),
  counted twice (the backward holds their gradients while it walks back through them); the batch
  itself included.

The CUDA context each trial process holds is the planner's to add (``placement/gpu_share.py``): it
is per process, not per model.  A sweep whose space varies the model's size, the model or the batch
is sized for the largest combination it can draw (:func:`sweep_footprint`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import UserError
from alchemetric_ray.models import build_model, is_cross_sectional, model_spec
from alchemetric_ray.training.backend_check import step_rows

STATE_BYTES_PER_PARAMETER = 16  # fp32 weight + gradient + AdamW's exp_avg and exp_avg_sq
SIZE_KEYS = ("model.", "train.batch_size", "train.micro_batch_rows", "features.window")  # what changes the footprint
MAX_COMBINATIONS = 256  # beyond this, each key's largest value is taken together


@dataclass(frozen=True)
class Footprint:
    """One trial's training memory, and what it was traced for."""

    model: str
    rows: int
    parameters: int
    state_bytes: int  # weights, gradients, AdamW state
    activation_bytes: int  # the forward's tensors and their gradients

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes

    def describe(self) -> str:
        return (f"{self.model} at {self.rows:,} rows: {self.parameters:,} parameters "
                f"({_mib(self.state_bytes)} with grads and AdamW state) + {_mib(self.activation_bytes)} activations")


class _Allocations(TorchDispatchMode):
    """Sums the bytes of every tensor an op creates (views share their input's memory: left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def training_footprint(cfg: RunConfig, n_features: int, outputs: int) -> Footprint:
    """The training memory of ``cfg``'s model at its step's rows (the module docstring's rule)."""
    rows, window = step_rows(cfg), cfg.features.window
    spec = model_spec(cfg.model)
    with torch.device("meta"):
        model = build_model(cfg.model, n_features, outputs, window=window)
    model.train()
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shape = (rows, window, n_features) if spec.inputs == "sequence" else (rows, n_features)
    x = torch.empty(shape, device="meta")
    extra = (torch.zeros(rows, dtype=torch.long, device="meta"),) if is_cross_sectional(spec) else ()
    with _Allocations() as made, torch.no_grad():  # the forward's tensors are the same with or without a graph
        model(x, *extra)
    activations = 2 * (made.bytes + x.numel() * x.element_size())
    return Footprint(spec.name, rows, parameters, STATE_BYTES_PER_PARAMETER * parameters, activations)


def sweep_footprint(cfg: RunConfig, n_features: int, outputs: int) -> Footprint:
    """The largest footprint a trial of the sweep can have: every combination of the values that
    ``tune.space`` gives the model's settings, the batch and the window (a range: its two ends), or,
    past :data:`MAX_COMBINATIONS`, each one's largest value together.  A combination the model
    refuses (hidden not divisible by heads) is left out: that trial fails on its own."""
    choices = {key: _candidates(spec) for key, spec in cfg.tune.space.items()
               if any(key == k or (k.endswith(".") and key.startswith(k)) for k in SIZE_KEYS)}
    keys = list(choices)
    combos: list[tuple[Any, ...]] = list(itertools.product(*(choices[k] for k in keys)))
    if len(combos) > MAX_COMBINATIONS:
        combos = [tuple(_largest(choices[k]) for k in keys)]
    best: Footprint | None = None
    for combo in combos:
        try:
            found = training_footprint(cfg.with_values(dict(zip(keys, combo))), n_features, outputs)
        except UserError:
            continue
        if best is None or found.total_bytes > best.total_bytes:
            best = found
    return best if best is not None else training_footprint(cfg, n_features, outputs)


def _candidates(spec: Any) -> list[Any]:
    """The values a space entry can give, as far as memory goes: a list's values, a range's ends."""
    if isinstance(spec, list):
        return list(spec)
    if isinstance(spec, dict) and len(spec) == 1:
        name, args = next(iter(spec.items()))
        if name in ("choice", "grid"):
            return list(args)
        lo, hi = args[0], args[1]
        return [lo, hi - 1] if name == "randint" else [lo, hi]  # randint's high is exclusive
    return [spec]


def _largest(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if len(numbers) == len(values) else values[-1]


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"
