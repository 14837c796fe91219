"""TensorBoard event files for a ``train`` run: every epoch's scalars.

In a worker group's run a Ray Train ``UserCallback`` writes them in the controller process, after
all workers reported an epoch; in a local-mode run the driver's ``LocalRun`` does.  Rank 0's row
(loss, validation metrics, samples/s, learning rate) becomes one step per epoch in
``<storage.path>/<run>/tensorboard/``; after the run the driver adds its hyperparameters and final
metrics (:func:`write_hparams`).  (A sweep's trials have Tune's own TensorBoard logs.)
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
        self._writer: Any = None  # a SummaryWriter, made on the first report, in the process that writes
        self._staging: Any = None  # on object storage: the local TemporaryDirectory written in, then uploaded

    def write(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            import tempfile

            from torch.utils.tensorboard import SummaryWriter

            if self.remote is not None:
                self._staging = tempfile.TemporaryDirectory(prefix="alchemetric-tb-")
            self._writer = SummaryWriter(self.logdir or self._staging.name)
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
        if self._staging is not None:
            self._staging.cleanup()


HPARAMS_RUN = "hparams"  # add_hparams' subfolder of the run's event files


def write_hparams(logdir: str | Path | Location, hparams: dict[str, Any], metrics: dict[str, Any]) -> None:
    """A ``train`` run's hyperparameters and final metrics in TensorBoard's HParams tab, as a sweep's
    trials have them: written once by the driver after the run, into ``<logdir>/hparams/`` (uploaded
    with it on object storage).  A value TensorBoard cannot show (a list, a dict, None) is shown as text;
    metrics are the finite numbers, prefixed ``hparam/`` so that they do not mix with the epoch scalars."""
    import tempfile

    from torch.utils.tensorboard import SummaryWriter

    remote = logdir if isinstance(logdir, Location) and not logdir.is_local else None
    shown = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
    finals = {f"hparam/{k}": float(v) for k, v in metrics.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if remote is None:
        with SummaryWriter(logdir.path if isinstance(logdir, Location) else str(logdir)) as writer:
            writer.add_hparams(shown, finals, run_name=HPARAMS_RUN)
        return
    with tempfile.TemporaryDirectory(prefix="alchemetric-tb-") as local:  # written here, then uploaded
        with SummaryWriter(local) as writer:
            writer.add_hparams(shown, finals, run_name=HPARAMS_RUN)
        for path in (Path(local) / HPARAMS_RUN).iterdir():
            (remote / HPARAMS_RUN / path.name).write_bytes(path.read_bytes())


class TensorBoardScalars(UserCallback):
    """The writer as a Ray Train callback (a worker group's runs: it runs in the controller)."""

    def __init__(self, logdir: str | Path | Location):
        self.scalars = ScalarWriter(logdir)

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if metrics:
            self.scalars.write(metrics[0])
