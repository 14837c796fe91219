"""The one interface a run logs through: its epochs, tags and figures, its files, the model version it
registers, an evaluation of it, and its end (``finalize``).

:class:`RunLog` itself logs nothing: it is the logger of a run with tracking off, so no caller asks
whether there is one.  :class:`~alchemetric_ray.tracking.mlflow_runs.Tracker` is the MLflow one;
:func:`~alchemetric_ray.tracking.mlflow_runs.run_log` gives whichever the config asks for, started.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from alchemetric_ray.storage import Location

RUN_FILE = "mlflow_run.json"  # in the run folder: which MLflow run a --resume continues


class RunLog:
    """A run's log with tracking off: every call does nothing, and it names no run."""

    run_id: str | None = None
    version: str | None = None  # the registered model version, once registered
    experiment: str | None = None
    model_name: str | None = None

    def live(self, where: Location, every_s: float) -> contextlib.AbstractContextManager:
        """While the run trains: its finished epochs logged as they land in ``where`` (the run folder)."""
        return contextlib.nullcontext()

    def log_epochs(self, history: list[dict]) -> None:
        """The per-epoch rows (one step per epoch number) not logged yet."""

    def log_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_outcome(self, outcome: Any) -> None:
        """A finished ``train`` run (``TrainOutcome``): its history, its plan's and workers' decisions and the
        versions and data behind it as tags, its best epoch's figures."""

    def log_figures(self, prefix: str, figures: dict[str, Any], *, step: int = 0) -> None:
        """Numbers the runs sort by (the best epoch's, the test segment's, the verdict's)."""

    def log_artifacts(self, folder: Location | Path, artifact_path: str | None = None) -> None:
        pass

    def register(self, model_dir: Location, *, verdict: str | None = None) -> str | None:
        """The exported model as a new version; its number (None: not registered)."""
        return None

    def log_evaluation(self, report_dir: Location | Path, result: Any) -> None:
        """An evaluation's report and its verdict (``result``: the ``signals.records.Evaluation``)."""

    def finalize(self, status: str = "FINISHED", *, end_time: float | None = None) -> str | None:
        """End the run with ``status`` (FINISHED, FAILED, KILLED); the line printed about what was not
        logged, if anything."""
        return None

