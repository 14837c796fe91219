"""The base of every error that is the user's to fix: the CLI prints its one-line message and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input, config or environment. ``str(err)`` is one line naming the file, key or value."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT), SIGTERM or SIGHUP (a notebook's interrupt) after keeping what it
    finished.  A ``KeyboardInterrupt``, not an ``Exception``: a caller's ``except Exception`` does not
    swallow it.  ``message`` says what was kept; the command line prints it with the command that
    continues it (``resumable``) and exits as a shell reports that signal (130, 143, 129:
    ``interrupts.exit_code``); the API raises it with the call that continues it (:meth:`continued_by`)."""

    def __init__(self, message: str, *, resumable: bool = True, remedy: str = "run the same command again") -> None:
        super().__init__(message)
        self.message = message
        self.resumable = resumable
        self.remedy = remedy  # what to do where the run cannot be resumed

    def continued_by(self, call: str) -> Interrupted:
        """This interruption, its line ending with how to go on from Python (``call``, where resumable)."""
        self.args = (f"{self.message}; continue with: {call}" if self.resumable else f"{self.message}; {self.remedy}",)
        return self


class InterruptedBeforeDone(Interrupted):
    """Interrupted before a call that writes its output whole (``features``) finished: nothing half-written is
    left, and the same call (or command) again does it all."""

    def __init__(self, message: str) -> None:
        super().__init__(message, resumable=False, remedy="run the same call again")
        self.continued_by("")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read whole (a run folder's ``epoch-NNNN``)."""


class ModelDirError(UserError, ValueError):
    """A saved model folder that cannot be loaded: a missing or mismatched file, a wrong shape."""


class DataError(UserError, ValueError):
    """Market data that cannot be used. The message is one line naming the file, column, date or value."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", " ").replace("\n", " "))


class ConfigError(UserError, ValueError):
    """A config value, key or file that cannot be used. The message is one line."""


class CrossSectionError(UserError, ValueError):
    """A per-date (cross-sectional) feature or label that cannot be computed as configured."""


class FeatureError(UserError, ValueError):
    """An unknown or unusable feature name in ``features.names`` (with a did-you-mean)."""


class ShardError(UserError, ValueError):
    """A feature-shard folder (or its manifest) that cannot be used."""


class SplitError(UserError, ValueError):
    """Split dates that do not fit the data (train, validation and test segments, the embargo)."""


class UnsafeNameError(UserError, ValueError):
    """A name used as a file or folder name that is not a plain name (no separators, no '..')."""


class DiskFullError(UserError, OSError):
    """Not enough free space to write a file: one line naming it, the space needed and the space free."""


class DeviceError(UserError, RuntimeError):
    """A requested device that this machine does not have."""


class KnownBugError(UserError, RuntimeError):
    """The run would meet a known backend bug that no workaround covers (one line)."""


class NonFiniteLossError(UserError, FloatingPointError):
    """A NaN/inf loss (or gradient) where no GradScaler can skip the step.

    The user's to fix (learning rate, data), so a UserError: one line naming epoch and step."""


class TooManySkippedSteps(UserError, RuntimeError):
    """The GradScaler skipped too many steps in a row: training is not recovering (one line)."""


class PrecisionError(UserError, ValueError):
    """A precision that this device/model cannot train in. The message is one line."""


class DoctorRequired(UserError, RuntimeError):
    """A run that needs a passing ``doctor`` on this backend first (MPS mixed precision)."""


class UnknownModelError(UserError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ModelModuleError(UserError, ImportError):
    """``model.module`` names a module that cannot be imported."""


class OutputError(UserError):
    """An output path that holds something the product did not make: refused before any work."""


class StartTimeout(UserError, TimeoutError):
    """The workers' nodes never came within scaling.start_timeout_s."""


class GpuPreflightError(UserError, RuntimeError):
    """A GPU node whose torch cannot use the GPU Ray gave it."""


class CapacityError(UserError, ValueError):
    """A run that no node of the cluster (or of its node types) can hold."""


class PlanError(UserError, RuntimeError):
    """A resource plan that cannot be made from the config and the cluster."""


class RayAddressError(UserError):
    """A Ray address that cannot be joined (a dashboard URL, no head answering, a bad form)."""


class EvaluationError(UserError, ValueError):
    """An evaluation that cannot run as asked (its options, its data or the model's segments)."""


class SignalError(UserError, ValueError):
    """Data that cannot be scored by the model (its features, its window, its folder)."""


class StorageError(UserError, RuntimeError):
    """A folder or bucket that cannot be reached, read or written (local disk or object storage)."""


class TrackingError(UserError):
    """An MLflow store or registry that cannot be used as configured."""


class ShadowDivergence(UserError, RuntimeError):
    """The backend's gradients left the float32 CPU copy's (one line)."""


class TrainError(UserError, RuntimeError):
    """A training run that cannot start or did not finish (one line naming why)."""


class BusyError(UserError, RuntimeError):
    """A second API call while one runs in this process (another thread)."""


class ResultError(UserError, ValueError):
    """A saved result that cannot be read: one line naming the file and what is wrong."""


class JobError(UserError, RuntimeError):
    """A submitted job that cannot be followed, or a request Ray's job server refused (one line)."""


class JobFailed(JobError):
    """The job ended FAILED: the message names it and carries the job's last error line."""


class JobTimeout(JobError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out before the job ended (the message names the job)."""


class SweepError(UserError, RuntimeError):
    """A sweep that cannot run or resume (one line)."""


class RefitError(UserError, RuntimeError):
    """A refit that cannot start or finish (a lock held, the challenger failed): the champion stays."""
