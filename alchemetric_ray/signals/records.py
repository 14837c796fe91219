"""The evaluation as one typed record: what :func:`~alchemetric_ray.signals.evaluate.evaluate`
returns, the report and the command line read, and whose :meth:`Evaluation.as_dict` is
``evaluation.json``.  The segment's own parts (contender rows, verdict, selection) are
``signals/contenders.py``'s, the walk-forward's ``signals/walk_forward.py``'s; this module adds what
an evaluation knows beyond its segment: the model scored, the new data it was scored on, the looks
at the test segment, and the tear sheet of the model's signal on the segment (``signals/tearsheet.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alchemetric_ray.signals.contenders import DataWindow, Segment, SegmentResult
from alchemetric_ray.signals.seeds import SeedSpread
from alchemetric_ray.signals.tearsheet import TearSheet
from alchemetric_ray.signals.walk_forward import FoldsWalkForward, PooledWalkForward


@dataclass(frozen=True)
class ModelInfo:
    """The model an evaluation scored: its folder, its id (:func:`~alchemetric_ray.signals.predict.model_id`;
    None where nothing was scored), its name, the device and precision it was trained with, its label
    scheme and whether its labels or features compare the stocks of each date."""

    dir: str
    id: str | None
    name: str
    device: dict[str, Any] | None  # meta.json's record: {"device": ..., "reason": ...}
    precision: dict[str, Any] | None  # meta.json's record: hardware.Precision.as_dict()
    label: str
    cross_sectional: bool

    def as_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "id": self.id, "name": self.name, "device": self.device,
                "precision": self.precision, "label": self.label, "cross_sectional": self.cross_sectional}


@dataclass(frozen=True)
class NewData:
    """``evaluate --data``: where the data came from, the window scored, and how its duplicated bars
    were treated (ingest's counts; None where nothing was read from files)."""

    path: str
    window: DataWindow
    duplicates: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "window": self.window.as_dict(), "duplicates": self.duplicates}


@dataclass(frozen=True)
class Looks:
    """The looks at the model's test segment, this evaluation's included: the segment, how many, the
    earlier ones (the ledger's entries, oldest first) and the dates this one scored."""

    test_start: str
    test_end: str
    count: int
    earlier: list[dict[str, Any]]
    this: Segment

    def as_dict(self) -> dict[str, Any]:
        return {"test_start": self.test_start, "test_end": self.test_end, "count": self.count,
                "earlier": self.earlier, "this": self.this.as_dict()}


@dataclass
class Evaluation(SegmentResult):
    """One evaluation: the scored segment (the fields of :class:`SegmentResult`: the model's test
    segment, or new data's window) and, where there are any, the new data it came from, the
    walk-forward, the model, the looks at the test segment and the model's tear sheet."""

    data: NewData | None = None
    walk_forward: FoldsWalkForward | PooledWalkForward | None = None
    model: ModelInfo | None = None
    looks: Looks | None = None
    tear_sheet: TearSheet | None = None
    seeds: SeedSpread | None = None  # a seed ensemble's members, each scored alone (``signals/seeds.py``)

    def as_dict(self) -> dict[str, Any]:
        """What ``evaluation.json`` holds, in its order: the segment's keys, then ``data`` and
        ``walk_forward`` where present, then ``model``, ``looks``, ``tear_sheet`` and ``seeds``."""
        parts = {"data": self.data, "walk_forward": self.walk_forward, "model": self.model, "looks": self.looks,
                 "tear_sheet": self.tear_sheet, "seeds": self.seeds}
        return {**super().as_dict(), **{key: part.as_dict() for key, part in parts.items() if part is not None}}
