"""The training losses, each ``(outputs, labels, dates) -> scalar`` in float32.

The loop calls a loss outside autocast, on the model's outputs cast to float32: a per-date
correlation in float16 would lose most of its digits.

* ``ce``: cross-entropy over the classes, optionally weighted against the train split's imbalance;
* ``mse``: mean squared error of a regression target's score (the model's single output);
* ``ic``: minus the mean, over the dates of the batch, of the Pearson correlation between the
  scores and the labels of that date's stocks.  A date with fewer than 2 rows, or with no spread in
  its scores or labels, has no correlation and is left out; a batch with no such date gives 0 (with
  a gradient of 0).  It needs whole dates in a batch: the loop's date batches (``train/loop.py``),
  which also hand it each batch's dates already numbered (:class:`DateGroups`, made on the host), so
  that the loss never reads the device: it masks the dates without a correlation instead of
  selecting them (no ``unique``, ``bincount``, boolean indexing or ``int``/``bool`` of a tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np
import torch
from torch import nn

_EPS = 1e-12


@dataclass(frozen=True)
class DateGroups:
    """A batch's dates, numbered: ``code`` (each row's date, 0..n-1, a long tensor on the loss's
    device), ``n`` (how many dates, a Python int) and ``count`` (rows per date, float, on the device)."""

    code: torch.Tensor
    n: int
    count: torch.Tensor

    @classmethod
    def of(cls, date: torch.Tensor) -> DateGroups:
        """Number raw dates where they are (``unique`` and ``bincount``: host syncs on a GPU).  For
        callers with a plain date column; the loop numbers its batches on the host
        (:meth:`from_sizes`)."""
        _, code = torch.unique(date, return_inverse=True)
        n = int(code.max()) + 1 if len(code) else 0
        return cls(code, n, torch.bincount(code, minlength=n).float())

    @classmethod
    def from_sizes(cls, sizes: list[int], device: torch.device | None = None) -> DateGroups:
        """The dates of a batch whose rows come date by date, ``sizes[i]`` rows of date i (host
        numbers, copied to ``device`` without a sync)."""
        code = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))  # numpy: no tensor is read to size it
        count = torch.tensor(sizes, dtype=torch.float32)
        if device is not None:
            code, count = code.to(device, non_blocking=True), count.to(device, non_blocking=True)
        return cls(code, len(sizes), count)


Dates = Union[torch.Tensor, DateGroups]
Loss = Callable[[torch.Tensor, torch.Tensor, Dates], torch.Tensor]


def _cross_entropy(class_counts: list[int] | None, device: torch.device | None) -> Loss:
    weights = class_weights(class_counts).to(device) if class_counts else None
    cross_entropy = nn.CrossEntropyLoss(weight=weights)
    return lambda out, y, date: cross_entropy(out.float(), y)


def _mse(class_counts: list[int] | None, device: torch.device | None) -> Loss:
    return lambda out, y, date: nn.functional.mse_loss(out.float()[:, 0], y.float())


def _ic(class_counts: list[int] | None, device: torch.device | None) -> Loss:
    return lambda out, y, date: -date_correlation(out.float()[:, 0], y.float(), date)


@dataclass(frozen=True)
class LossKind:
    """One training loss: how it is made, and what its labels and batches must be."""

    name: str
    make: Callable[[list[int] | None, torch.device | None], Loss]  # (class counts, device) -> the loss
    float_labels: bool  # a regression target's float labels (else int64 class ids)
    per_date: bool  # it needs each batch's dates (whole dates in a batch)


LOSSES: dict[str, LossKind] = {loss.name: loss for loss in (
    LossKind("ce", _cross_entropy, float_labels=False, per_date=False),
    LossKind("mse", _mse, float_labels=True, per_date=False),
    LossKind("ic", _ic, float_labels=True, per_date=True),
)}


def loss_kind(name: str) -> LossKind:
    """The loss ``name`` (ce, mse or ic); any other name is the cross-entropy, as :func:`make_loss` makes it."""
    return LOSSES.get(name, LOSSES["ce"])


def make_loss(kind: str, class_counts: list[int] | None = None, device: torch.device | None = None) -> Loss:
    """The loss ``kind`` (ce, mse or ic); ``class_counts`` weights the cross-entropy when given."""
    return loss_kind(kind).make(class_counts, device)


def class_weights(counts: list[int]) -> torch.Tensor:
    c = torch.tensor(counts, dtype=torch.float32).clamp(min=1)
    return c.sum() / (len(c) * c)


def date_correlation(score: torch.Tensor, label: torch.Tensor, date: Dates) -> torch.Tensor:
    """Mean over the dates in ``date`` (raw dates, or :class:`DateGroups`) of the Pearson correlation
    of ``score`` and ``label`` among that date's rows (differentiable in ``score``); dates without a
    correlation are left out, and with none left the result is 0 with a gradient of 0.

    With :class:`DateGroups` nothing here waits on the device: a date without a correlation is
    masked out of the sum (its denominator replaced by 1 first, so that neither it nor its gradient
    is ever NaN), not indexed away."""
    groups = date if isinstance(date, DateGroups) else DateGroups.of(date)
    code = groups.code
    zeros = score.new_zeros(groups.n)
    count = groups.count.to(score.dtype)
    safe = count.clamp(min=1)
    ds = score - (zeros.index_add(0, code, score) / safe).index_select(0, code)
    dl = label - (zeros.index_add(0, code, label) / safe).index_select(0, code)
    sxx = zeros.index_add(0, code, ds * ds)
    syy = zeros.index_add(0, code, dl * dl)
    sxy = zeros.index_add(0, code, ds * dl)
    valid = (count >= 2) & (sxx > _EPS) & (syy > _EPS)
    corr = sxy / torch.sqrt(torch.where(valid, sxx * syy, torch.ones_like(sxx)))
    return torch.where(valid, corr, torch.zeros_like(corr)).sum() / valid.sum().clamp(min=1).to(score.dtype)
