"""TensorBoard event files for a ``train`` run: every epoch's scalars.

In a worker group's run a Ray Train ``UserCallback`` writes them in the controller process, after
all workers reported an epoch; in a local-mode run the driver's ``LocalRun`` does.  Rank 0's row
(loss, validation metrics, samples/s, learning rate) becomes one step per epoch in
``<storage.path>/<run>/tensorboard/``.  (A sweep's trials have Tune's own TensorBoard logs.)
On object storage the events are written to a local temporary folder and the file is uploaded
after every epoch (event files are small; TensorBoard reads ``s3://`` itself).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ray.train import UserCallback

from alchemetric_ray.storage import Location

SUBDIR = "tensorboard"


class ScalarWriter:
    """One step per epoch report: every finite number in the row but the epoch itself."""

    def __init__(self, logdir: str | Path | Location):
        self.remote = logdir if isinstance(logdir, Location) and not logdir.is_local else None
        self.logdir = None if self.remote else (logdir.path if isinstance(logdir, Location) else str(logdir))
        self._writer = None  # made on the first report, in the process that writes

    def write(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            import tempfile

            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.logdir or tempfile.mkdtemp(prefix="alchemetric-tb-"))
        step = int(row.get("epoch", 0))
        for key, value in row.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if key != "epoch" and number and math.isfinite(value):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()  # the run may end (or be killed) after any epoch
        if self.remote is not None:
            for path in Path(self._writer.log_dir).iterdir():
                (self.remote / path.name).write_bytes(path.read_bytes())

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class TensorBoardScalars(UserCallback):
    """The writer as a Ray Train callback (a worker group's runs: it runs in the controller)."""

    def __init__(self, logdir: str | Path | Location):
        self.scalars = ScalarWriter(logdir)

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if metrics:
            self.scalars.write(metrics[0])
