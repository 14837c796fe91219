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


class CheckpointError(UserError, RuntimeError):
    pass


class ModelDirError(UserError, ValueError):
    pass


class DataError(UserError, ValueError):
    """Market data that cannot be used. The message is one line naming the file, column, date or value."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", " ").replace("\n", " "))


class ConfigError(UserError, ValueError):
    """A config value, key or file that cannot be used. The message is one line."""


class CrossSectionError(UserError, ValueError):
    pass


class FeatureError(UserError, ValueError):
    pass


class ShardError(UserError, ValueError):
    """A feature-shard folder (or its manifest) that cannot be used."""


class SplitError(UserError, ValueError):
    pass


class UnsafeNameError(UserError, ValueError):
    pass


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
    pass


class UnknownModelError(UserError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ModelModuleError(UserError, ImportError):
    """``model.module`` names a module that cannot be imported."""


class OutputError(UserError):
    pass


class StartTimeout(UserError, TimeoutError):
    """The workers' nodes never came within scaling.start_timeout_s."""


class GpuPreflightError(UserError, RuntimeError):
    """A GPU node whose torch cannot use the GPU Ray gave it."""


class CapacityError(UserError, ValueError):
    pass


class PlanError(UserError, RuntimeError):
    pass


class RayAddressError(UserError):
    pass


class EvaluationError(UserError, ValueError):
    pass


class SignalError(UserError, ValueError):
    pass


class StorageError(UserError, RuntimeError):
    pass


class TrackingError(UserError):
    pass


class ShadowDivergence(UserError, RuntimeError):
    """The backend's gradients left the float32 CPU copy's (one line)."""


class TrainError(UserError, RuntimeError):
    pass


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
