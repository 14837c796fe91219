"""The training losses, each ``(outputs, labels, dates) -> scalar`` in float32.

The loop calls a loss outside autocast, on the model's outputs cast to float32: a per-date
correlation in float16 would lose most of its digits.

* ``ce``: cross-entropy over the classes, optionally weighted against the train split's imbalance;
* ``mse``: mean squared error of a regression target's score (the model's single output);
* ``ic``: minus the mean, over the dates of the batch, of the Pearson correlation between the
  scores and the labels of that date's stocks.  A date with fewer than 2 rows, or with no spread in
  its scores or labels, has no correlation and is left out; a batch with no such date gives 0 (with
  a gradient of 0).  It needs whole dates in a batch: the loop's date batches (``train/loop.py``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_EPS = 1e-12


def make_loss(kind: str, class_counts: list[int] | None = None, device: torch.device | None = None) -> Loss:
    """The loss ``kind`` (ce, mse or ic); ``class_counts`` weights the cross-entropy when given."""
    if kind == "mse":
        return lambda out, y, date: nn.functional.mse_loss(out.float()[:, 0], y.float())
    if kind == "ic":
        return lambda out, y, date: -date_correlation(out.float()[:, 0], y.float(), date)
    weights = class_weights(class_counts).to(device) if class_counts else None
    cross_entropy = nn.CrossEntropyLoss(weight=weights)
    return lambda out, y, date: cross_entropy(out.float(), y)


def class_weights(counts: list[int]) -> torch.Tensor:
    c = torch.tensor(counts, dtype=torch.float32).clamp(min=1)
    return c.sum() / (len(c) * c)


def date_correlation(score: torch.Tensor, label: torch.Tensor, date: torch.Tensor) -> torch.Tensor:
    """Mean over the dates in ``date`` of the Pearson correlation of ``score`` and ``label`` among
    that date's rows (differentiable in ``score``); dates without a correlation are left out."""
    _, code = torch.unique(date, return_inverse=True)
    n_dates = int(code.max()) + 1 if len(code) else 0
    zeros = score.new_zeros(n_dates)
    count = torch.bincount(code, minlength=n_dates).to(score.dtype)
    safe = count.clamp(min=1)
    ds = score - (zeros.index_add(0, code, score) / safe)[code]
    dl = label - (zeros.index_add(0, code, label) / safe)[code]
    sxx = zeros.index_add(0, code, ds * ds)
    syy = zeros.index_add(0, code, dl * dl)
    sxy = zeros.index_add(0, code, ds * dl)
    valid = (count >= 2) & (sxx > _EPS) & (syy > _EPS)
    if not bool(valid.any()):
        return (score * 0).sum()  # no date to learn from: 0, with a gradient of 0
    return (sxy[valid] / torch.sqrt(sxx[valid] * syy[valid])).mean()
