"""A seed ensemble: the same model trained at several seeds (``train.seeds``), scored as their average.

Not a registered model: the export builds it when the config's ``train.seeds`` is more than 1, from one
member per seed (``members.<i>.``: member i's own weights).  Its output stands for the average of
what the members' outputs stand for (``scoring/predictions.outputs_of``): a regression target's
score (one column) is the members' mean score; for classes it returns the logarithm of the members'
mean probabilities, whose softmax is that mean.  A member can be scored alone (:attr:`members`), as
the evaluation does to report the seeds' spread.
"""

from __future__ import annotations

import torch
from torch import nn


class SeedEnsemble(nn.Module):
    """Members of one architecture (one per seed) -> their average output, as described above."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        if not members:
            raise ValueError("a seed ensemble needs at least one member")
        self.members = nn.ModuleList(members)
        self.cross_sectional = bool(getattr(members[0], "cross_sectional", False))

    def forward(self, x: torch.Tensor, date: torch.Tensor | None = None) -> torch.Tensor:
        outs = [m(x, date) if self.cross_sectional else m(x) for m in self.members]
        if outs[0].shape[-1] == 1:  # one score column: the mean score
            return torch.stack([o.float() for o in outs]).mean(0)
        probabilities = torch.stack([torch.softmax(o.float(), dim=-1) for o in outs]).mean(0)
        return torch.log(probabilities.clamp_min(1e-12))
