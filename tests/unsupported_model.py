"""A model whose forward calls an operator the CPU has no bfloat16 kernel for (torch 2.13):
``model.module=unsupported_model model.name=eigh``.

The doctor's catch path is tested with it on a real gap, not a patched one: ``torch.linalg.eigh``
(aten ``_linalg_eigh``) raises ``NotImplementedError`` for BFloat16 on the CPU, so the doctor's probe
must list it, finish the call in float32 and carry the step on to the optimizer.
"""

import torch
from torch import nn

from alchemetric_ray.models import register_model


@register_model("eigh", inputs="tabular", hyperparameters=("hidden",))
class Eigh(nn.Module):
    """A hidden layer scaled by the top eigenvalue of its bfloat16 Gram matrix (hidden x hidden: full
    rank for any batch larger than ``hidden``, so the eigenvalue, and its gradient, are well defined)."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 8):
        super().__init__()
        self.body = nn.Linear(n_features, hidden)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        low = h.to(torch.bfloat16)
        top = torch.linalg.eigh(low.T @ low).eigenvalues[-1].float()
        return self.head(h / (1 + top / len(x)))
