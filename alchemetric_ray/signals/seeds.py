"""The seeds' spread: how far a seed ensemble's members (``train.seeds``) differ on the scored segment.

An ensemble's evaluation scores its average; a reader also needs to know whether any one seed alone
would have said the same.  Each member scores the segment's rows alone (the same inputs, on the CPU
in float32), and its mean daily rank IC is computed as the model row's is (``signals/metrics.py``:
Spearman per date, Newey-West lag ``horizon - 1``).  A model of one seed has no spread (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from alchemetric_ray.scoring.metrics import direction_score
from alchemetric_ray.signals.metrics import ic_stats

if TYPE_CHECKING:
    from alchemetric_ray.artifacts.export import LoadedModel


@dataclass(frozen=True)
class SeedSpread:
    """Each seed's mean daily rank IC on the segment (``seeds[i]`` trained at ``train.seed`` + i)."""

    seeds: list[int]
    rank_ic: list[float]

    @property
    def low(self) -> float:
        return float(np.nanmin(self.rank_ic))

    @property
    def high(self) -> float:
        return float(np.nanmax(self.rank_ic))

    def line(self) -> str:
        """``3 seeds, rank IC per seed +0.011 to +0.034``: what the verdict line says of them."""
        return f"{len(self.seeds)} seeds, rank IC per seed {self.low:+.3f} to {self.high:+.3f}"

    def as_dict(self) -> dict:
        return {"seeds": list(self.seeds), "rank_ic": list(self.rank_ic), "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: dict | None) -> SeedSpread | None:
        return None if not data else cls(list(data["seeds"]), [float(v) for v in data["rank_ic"]])


def seed_spread(loaded: LoadedModel, inputs: pd.DataFrame, start: str, end: str) -> SeedSpread | None:
    """The members' rank ICs on the rows of ``inputs`` (the model's normalized features, with date,
    ticker, label and fwd_ret) dated ``start``..``end``; None for a model of one seed."""
    import torch

    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.scoring.predictions import model_inputs, predict_proba

    members = getattr(loaded.model, "members", None)
    if members is None:
        return None
    manifest, cfg = loaded.manifest, loaded.config
    x, rows = model_inputs(inputs, manifest.features, loaded.mode, cfg.features.window)
    dates = pd.to_datetime(rows["date"])
    keep = ((dates >= pd.Timestamp(start)) & (dates <= pd.Timestamp(end))).to_numpy()
    x, rows = x[keep], rows[keep].reset_index(drop=True)
    cpu = torch.device("cpu")
    fp32 = resolve_precision("fp32", cpu)
    lag = max(0, int(manifest.label.get("horizon", 1)) - 1)
    ics = []
    for member in members:
        proba = predict_proba(member, x, cpu, fp32, regression=manifest.regression, date=rows["date"].to_numpy())
        scored = pd.DataFrame({"date": rows["date"], "ticker": rows["ticker"], "fwd_ret": rows["fwd_ret"],
                               "score": direction_score(proba, manifest.classes)})
        ics.append(float(ic_stats(scored, rank=True, lag=lag).mean))
    return SeedSpread([cfg.train.seed + i for i in range(len(ics))], ics)
