"""What one sweep runs with, handed whole to the Tuner, the summary and the MLflow log."""

from __future__ import annotations

from dataclasses import dataclass

from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.placement.plan import ResourcePlan
from alchemetric_ray.storage import Location


@dataclass(frozen=True)
class SweepJob:
    """A sweep's name; its config (``cfg``) and the one each trial's plan is made from (``trial_cfg``:
    one CPU per worker unless the config says); one trial's resource plan; the shards and manifest of
    every label the trials train on (``targets``); and the folder that keeps its state (``where``)."""

    name: str
    cfg: RunConfig
    trial_cfg: RunConfig
    plan: ResourcePlan
    targets: dict[str, tuple[Location, Manifest]]
    where: Location

    @property
    def shards(self) -> Location:
        """The shards of the sweep's own label (its config's, before any label of the space)."""
        return self.targets[self.trial_cfg.features.label][0]
