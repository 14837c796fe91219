"""The small parts of the API's results: where a run was logged, where it went and why, its best epoch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tracking:
    """Where a run was logged in MLflow: the tracking URI, experiment, run and model version."""

    uri: str
    experiment: str | None
    run_id: str | None
    model_name: str | None = None
    version: str | None = None

    @classmethod
    def of(cls, log, uri: str) -> Tracking | None:
        if not getattr(log, "run_id", None) and not getattr(log, "version", None):
            return None
        return cls(uri=uri, experiment=getattr(log, "experiment", None), run_id=log.run_id,
                   model_name=getattr(log, "model_name", None), version=getattr(log, "version", None))

    def line(self) -> str:
        version = f", model version {self.model_name}/{self.version}" if self.version else ""
        return f"run {self.run_id} in experiment {self.experiment}{version} ({self.uri})"


@dataclass(frozen=True)
class Plan:
    """Where a run went and why: the plan's fields and its printed lines."""

    fields: dict[str, Any]
    text: str

    @property
    def workers(self) -> int:
        return int(self.fields.get("num_workers", 1))

    @property
    def use_gpu(self) -> bool:
        return bool(self.fields.get("use_gpu", False))

    @property
    def reasons(self) -> dict[str, Any]:
        return dict(self.fields.get("reasons") or {})

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class BestEpoch:
    """The epoch a run kept as its best (by the selection metric) and its metrics."""

    epoch: int | None
    metric: str
    value: float | None
    metrics: dict[str, Any] = field(default_factory=dict)
