"""A cross-sectional model: the stocks of one date attend to each other over their feature vectors.

Every other model scores a stock from its own features.  This one first encodes each stock's feature
vector, then runs ``model.layers`` blocks of multi-head self-attention in which a row attends only to
the rows of its own date (a block-diagonal mask built from the batch's date codes), each block
followed by a feed-forward layer, both pre-norm and residual; a stock's score can therefore depend
on where its features stand among the same date's peers, not only on their level.

The model declares ``cross_sectional = True``: its callers pass each row's date code
(``forward(x, date)``; any integers, equal for the rows of one date) and hand it whole dates (the
loop's date batches, which the IC loss, the only loss it trains with, already needs;
``scoring/predictions.py`` batches by date).  Without ``date`` the whole batch is one date (the
meta-device trace of the known-bug table, the doctor's and the shadow check's fixed batches).

Attention costs the square of a batch's rows (the mask is rows x rows): ``train.batch_size`` bounds it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from alchemetric_ray.errors import UserError
from alchemetric_ray.models.registry import register_model


class _PeerBlock(nn.Module):
    """Pre-norm self-attention among a date's rows, then a pre-norm feed-forward layer; both residual."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(2 * hidden, hidden))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, same_date: torch.Tensor | None) -> torch.Tensor:
        rows, hidden = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(rows, 3, self.heads, hidden // self.heads).permute(1, 2, 0, 3)
        # (heads, rows, head width); same_date (rows, rows): True where two rows share a date
        peers = F.scaled_dot_product_attention(q, k, v, attn_mask=same_date,
                                               dropout_p=self.dropout if self.training else 0.0)
        h = h + self.drop(self.out(peers.transpose(0, 1).reshape(rows, hidden)))
        return h + self.drop(self.ff(self.norm2(h)))


@register_model("cs_attention", inputs="tabular", hyperparameters=("hidden", "layers", "dropout", "heads"))
class CrossSectionalAttention(nn.Module):
    """Tabular features (rows, n_features) and each row's date code (rows,) -> scores (rows, n_classes)."""

    cross_sectional = True

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2,
                 dropout: float = 0.1, heads: int = 4):
        super().__init__()
        if hidden % heads:
            raise UserError(f"model.hidden ({hidden}) must be divisible by model.heads ({heads}) for cs_attention")
        self.encode = nn.Sequential(nn.Linear(n_features, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(_PeerBlock(hidden, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor, date: torch.Tensor | None = None) -> torch.Tensor:
        same_date = None if date is None else date[:, None] == date[None, :]
        h = self.encode(x)
        for block in self.blocks:
            h = block(h, same_date)
        return self.head(self.norm(h))
