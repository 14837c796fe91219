"""One API call at a time, and nothing process-wide outlives it.

A call may install signal handlers (Ray's, Tune's, issue 45's stop signals), change logger levels and
filters, set environment variables for the processes it starts.  In a notebook's kernel those belong
to the user: :func:`api_call` notes them before the call and puts them back after it, whatever way it
ends.  A Ray this process started is kept for the next call (no second start); the environment that
Ray's own processes were started with is applied again around each later call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from alchemetric_ray import console
from alchemetric_ray.api.notebook import live_progress
from alchemetric_ray.errors import BusyError

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, name))

_lock = threading.Lock()
_running: list[str] = []
# environment variables a Ray started by an earlier call needs in this process while it lives
# (its dashboard's address for the State API, Train's start timeout): set around each call, never left
_session_env: dict[str, str] = {}


@dataclass
class _LoggerState:
    level: int
    disabled: bool
    propagate: bool
    filters: list
    handlers: list
    handler_filters: list[list] = field(default_factory=list)

    @classmethod
    def of(cls, logger: logging.Logger) -> _LoggerState:
        return cls(logger.level, logger.disabled, logger.propagate, list(logger.filters), list(logger.handlers),
                   [list(h.filters) for h in logger.handlers])

    def restore(self, logger: logging.Logger) -> None:
        logger.setLevel(self.level)
        logger.disabled, logger.propagate = self.disabled, self.propagate
        logger.filters[:] = self.filters
        logger.handlers[:] = self.handlers
        for handler, filters in zip(self.handlers, self.handler_filters):
            handler.filters[:] = filters


@dataclass
class ProcessState:
    """What a call may change for the whole process: signal handlers (main thread only), loggers,
    environment variables, Python's warning filters and the unraisable hook."""

    handlers: dict[int, Any]
    loggers: dict[str, _LoggerState]
    environ: dict[str, str]
    warnings_filters: list
    unraisablehook: Any

    @classmethod
    def capture(cls) -> ProcessState:
        import warnings

        main = threading.current_thread() is threading.main_thread()
        names = [""] + [name for name, obj in logging.root.manager.loggerDict.items()
                        if isinstance(obj, logging.Logger)]
        return cls(handlers={s: signal.getsignal(s) for s in SIGNALS} if main else {},
                   loggers={name: _LoggerState.of(logging.getLogger(name)) for name in names},
                   environ=dict(os.environ), warnings_filters=list(warnings.filters),
                   unraisablehook=sys.unraisablehook)

    def restore(self) -> None:
        import warnings

        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        for name, state in self.loggers.items():
            state.restore(logging.getLogger(name))
        for key in [k for k in os.environ if k not in self.environ]:
            del os.environ[key]
        for key, value in self.environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        warnings.filters[:] = self.warnings_filters  # type: ignore[index]  # a list at run time
        sys.unraisablehook = self.unraisablehook

    def differences(self) -> list[str]:
        """What differs now from this state (for tests): one line per signal, logger or variable."""
        now = ProcessState.capture()
        lines = [f"signal {signal.Signals(s).name}" for s, h in self.handlers.items() if now.handlers.get(s) is not h]
        lines += [f"logger {name or 'root'}" for name, state in self.loggers.items() if now.loggers[name] != state]
        keys = set(self.environ) | set(now.environ)
        lines += [f"environment {k}" for k in sorted(keys) if self.environ.get(k) != now.environ.get(k)]
        if now.warnings_filters != self.warnings_filters:
            lines.append("warnings filters")
        if now.unraisablehook is not self.unraisablehook:
            lines.append("sys.unraisablehook")
        return lines


@contextlib.contextmanager
def api_call(name: str) -> Iterator[None]:
    """Around every public call: refuse a second one at once, note the process's state, apply the
    environment of a Ray an earlier call started, and put everything back afterwards."""
    if not _lock.acquire(blocking=False):
        raise BusyError(f"ar.{name}: ar.{_running[0] if _running else 'another call'} is still running in this "
                        "process; one call at a time (wait for it, or use another process)")
    _running.append(name)
    for logger in NOTEBOOK_NOISE_LOGGERS:  # noted (so put back) before the call first imports Ray's libraries
        logging.getLogger(logger)
    state = ProcessState.capture()
    try:
        os.environ.update(_session_env)
        console.plain_output()  # into a pipe or a notebook's cell: Ray's forwarded lines without colour codes
        _quiet_notebook_noise()
        with live_progress():
            yield
    finally:
        _keep_session_env(state.environ)
        state.restore()
        _running.clear()
        _lock.release()


# Ray's note, on its first import in a kernel, that ipywidgets is missing (its own rich displays only),
# and tqdm's warning about the same: nothing of ours needs ipywidgets (progress: api/notebook.py)
NOTEBOOK_NOISE_LOGGERS = ("ray.widgets.util",)


def _quiet_notebook_noise() -> None:
    import warnings

    if console.verbose():
        return
    for logger in NOTEBOOK_NOISE_LOGGERS:
        logging.getLogger(logger).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="IProgress not found")


def _keep_session_env(before: dict[str, str]) -> None:
    """What a local Ray started in this call set for itself, kept for the calls that reuse it."""
    from alchemetric_ray.placement.session import SESSION_ENV

    if not _ray_up():
        _session_env.clear()
        return
    for key in SESSION_ENV:
        if key in os.environ and before.get(key) != os.environ[key]:
            _session_env[key] = os.environ[key]


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized())
