"""What a run prints: our own lines (the plan, one line per epoch, the summary, errors), not Ray's chatter.

Quiet is the default; ``--verbose`` or ``ALCHEMETRIC_VERBOSE=1`` brings everything back.  Each knob
below is Ray's own, set where Ray reads it:

- Ray Train's internal INFO lines: ``ray.train.RunConfig(logging_config=LoggingConfig("WARNING"))``
  (:func:`train_logging_config`);
- Ray Data's progress bars and its "Starting execution" lines: the ``DataContext`` of the driver
  and of every worker that runs a dataset (:func:`quiet_ray_data`);
- Ray's driver-side INFO lines (``ray.init``'s banner): the ``ray`` logger's level;
- a Ray warning that says nothing a user can act on is dropped by its exact message, in Python
  (:data:`RAY_WARNINGS`) or in the log lines Ray forwards from its processes (:data:`RAY_LOG_LINES`);
- a forwarded Ray warning that calls itself transient and safe to ignore keeps its one line, not
  the traceback Ray logs with it (:data:`RAY_TRACEBACK_AFTER`);
- Ray Tune's start-of-sweep box, its results and TensorBoard hints and its snapshot-frequency
  warning: Tune's own environment switches, set only while the Tuner runs (:func:`tune_switches`).

Never ``ray.init(logging_config=...)``: it configures the root logger of every worker.  Never
``log_to_driver=False``: it would hide worker errors and the autoscaler's messages.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator

VERBOSE_ENV = "ALCHEMETRIC_VERBOSE"

# Python warnings raised inside Ray that a user cannot act on, by their exact message (a regex
# anchored at the start, as `warnings.filterwarnings` takes it).
RAY_WARNINGS = (
    # Ray Train's own default ingest options use a deprecated field.
    r"`ExecutionOptions\.exclude_resources` is deprecated",
    # map_batches(..., max_restarts=0) in predict: Ray Data has no named parameter for it yet.
    r"`ray_remote_args` is deprecated",
)
# Lines Ray's own processes print and the driver forwards, dropped when their text contains one
# of these exact messages.
RAY_LOG_LINES = (
    # core_worker.cc, for Train's PreemptionWatcher actor: an internal note, not a fault.
    "has constructor arguments in the object store and max_restarts > 0",
    # Train's per-report INFO line: its logger is named after its file, so LoggingConfig misses it.
    "Reporting training result ",
    # Ray Data's adverts for its progress bars, printed even with the bars off, and its
    # per-execution timing lines.
    "A new progress UI is available",
    "Progress bars disabled. To enable, set",
    "execution finished in",
    # The raylet's note that a burst of actors started many worker processes at once.
    "PYTHON worker processes have been started on node",
)

# Ray warnings that say themselves they are transient and safe to ignore, yet come with a
# traceback: the warning's line is kept, the traceback Ray logs after it is dropped.
RAY_TRACEBACK_AFTER = (
    # Train's controller, when Ray's autoscaling coordinator (a helper actor) does not answer its
    # resource request within 5 s: a cold start on a loaded machine, several runs side by side.
    "Failed to send resource request for ",
    "Failed to cancel resource request for ",
)
# The lines of a Python traceback after its header: frames and code (indented), the exception
# ("module.Name: message" or "module.Name"), and the lines that chain one traceback to the next.
_TRACEBACK_HEAD = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(:\s|:?$)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


# Messages of Ray's own logger on the driver, dropped by their exact text.
RAY_LOG_MESSAGES = (
    # ray.init on a local cluster: token authentication is Ray's default and what we want.
    "Token authentication is enabled for this Ray cluster.",
    # Ray Data's advert for its progress bars, once they are off (as we asked).
    "Progress bars disabled. To enable, set",
    # Tune on a Ctrl-C, SIGTERM or SIGHUP: our one line says what was kept and which command resumes
    # (Tune's names its own Python API, and a trial stopped before its first report as missing files)
    "Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run",
    "Experiment has been interrupted, but the most recent state was saved",
    "Failed to fetch metrics for",
)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def set_verbose(on: bool) -> None:
    """``--verbose``: for this process and (through the environment) every process it starts."""
    if on:
        os.environ[VERBOSE_ENV] = "1"


def plain_output() -> None:
    """Before the driver first imports ray: where stdout or stderr is not a terminal, no colour codes
    in the lines Ray forwards (``RAY_COLOR_PREFIX=0``, read by Ray for every line; the green
    ``[repeated Nx across cluster]`` suffix: :func:`quiet_driver`).  A value the user set is kept.
    (Our own lines from a Ray worker lose Ray's ``(RayTrainWorker pid=...)`` prefix in the driver's
    filter, terminal or not: :func:`say` marks them; Ray's own lines keep it, naming their process.)"""
    if not _terminal():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _terminal() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


def _plain_repeat_suffix() -> None:
    """Ray colours the suffix of a deduplicated line green whatever the stream; not into a pipe or file."""
    if _terminal():
        return
    try:
        from ray._private import ray_logging
    except ImportError:
        return
    if hasattr(ray_logging, "_color"):
        ray_logging._color = str  # type: ignore[assignment]  # a monkeypatch of Ray's function


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell that talks to a front end over ZMQ)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython() if hasattr(ipython, "get_ipython") else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def is_tty() -> bool:
    """Live progress (a line rewritten in place) only where a person watches a terminal."""
    return sys.stderr.isatty()


def quiet_python_warnings() -> None:
    if verbose():
        return
    for message in RAY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def quiet_ray_data() -> None:
    """Ray Data's bars and per-execution INFO lines off in this process (driver or worker)."""
    if verbose():
        return
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-read INFO lines (file sampling, batch sizes)
    quiet_python_warnings()


def quiet_worker() -> None:
    """In a Ray worker (Train worker, prediction actor): Ray Data quiet, our loggers' INFO lines off."""
    quiet_ray_data()
    quiet_stop_in_finalizer()
    if not verbose():
        logging.getLogger("alchemetric_ray").setLevel(logging.WARNING)


def quiet_stop_in_finalizer() -> None:
    """In a Ray worker: no traceback for a SIGTERM that lands while Python runs a finalizer.

    Ray's SIGTERM handler stops a worker by raising ``SystemExit`` (a worker told to go as its job
    ends, e.g. a sweep's trial process at shutdown).  When the signal arrives while Python runs a
    weakref callback or a ``__del__``, Python cannot raise there and prints "Exception ignored in ..."
    with the traceback of Ray's handler; the worker stops as asked either way.  Only that case is
    silenced (a ``SystemExit`` raised from Ray's handler); every other unraisable exception is printed
    as before.  Not with ``--verbose``, and not in a driver."""
    if verbose() or not _in_ray_worker() or getattr(sys.unraisablehook, "_alchemetric", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not (isinstance(unraisable.exc_value, SystemExit) and _raised_by_ray_sigterm(unraisable.exc_traceback)):
            previous(unraisable)

    hook._alchemetric = True  # type: ignore[attr-defined]  # a dynamic marker, read by getattr above
    sys.unraisablehook = hook


def _raised_by_ray_sigterm(tb) -> bool:
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename.replace(os.sep, "/")
        if code.co_name == "sigterm_handler" and path.endswith("ray/_private/worker.py"):
            return True
        tb = tb.tb_next
    return False


# Marks a line of ours printed in a Ray worker, for the driver to print it without Ray's
# "(RayTrainWorker pid=...)" prefix (:func:`_filtered`); an invisible separator, should one ever
# reach a screen unfiltered.
OURS = "\u2063"


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (its stdout is forwarded to the driver), not a driver."""
    worker = sys.modules.get("ray._private.worker")
    return worker is not None and getattr(worker.global_worker, "mode", None) == getattr(worker, "WORKER_MODE", 1)


def say(message: str) -> None:
    """One line to stdout, exactly once, also in a Ray Train worker (and there without Ray's prefix).

    Train patches ``print`` in its workers to log through the root logger *and* echo, which prints
    every line twice; writing to the stream itself sidesteps that."""
    mark = OURS if _in_ray_worker() else ""
    sys.stdout.write("".join(mark + line + "\n" for line in message.split("\n")))
    sys.stdout.flush()


def tune_switches(*, local_storage: bool) -> dict[str, str]:
    """Tune's own switches, for the duration of ``Tuner.fit`` (:func:`environment`); none with --verbose.

    - ``RAY_AIR_NEW_OUTPUT=0``: Tune's newer output engine prints its boxed "Configuration for
      experiment" table, "View detailed results here" and a TensorBoard hint into Ray's session
      folder (under ``/tmp/ray``, gone after a reboot; our own TensorBoard line names the sweep's
      folder) whatever ``RunConfig(verbose=0)`` says (Ray 2.60, ``tune.run`` calls its
      ``experiment_started`` at every verbosity).  The classic engine honours ``verbose=0`` and prints
      nothing; it is also the one Tune uses in a notebook.  Our trial lines and summary are callbacks
      and prints of ours, under either engine.
    - ``TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S=0`` (the switch the warning itself
      names), on a local ``storage.path`` only: Tune snapshots the sweep's state each time a trial has
      saved ``storage.num_to_keep`` checkpoints (one per epoch here), and warns when two such snapshots
      fall within 5 s, as they do with short epochs.  Locally a snapshot copies a few small files
      from Ray's staging folder; the only setting that removes the cause, a larger num_to_keep, costs
      disk for nothing.  Tune's warning for a snapshot that is actually slow (over 30 s) stays, and
      on a URI (``s3://...``), where each snapshot is an upload, this one stays too.
    """
    if verbose():
        return {}
    switches = {"RAY_AIR_NEW_OUTPUT": "0"}
    if local_storage:
        switches["TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S"] = "0"
    return switches


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set these environment variables for the block, then put back what was there; a value the user
    set is kept (theirs wins, as with ``RAY_COLOR_PREFIX``)."""
    added = [name for name in values if name not in os.environ]
    for name in added:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def train_logging_config():
    """Ray Train's ``LoggingConfig``: its internal INFO lines only with --verbose."""
    from ray.train import LoggingConfig

    return LoggingConfig(log_level="INFO" if verbose() else "WARNING")


class _DropMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(m in text for m in RAY_LOG_MESSAGES)


def quiet_ray_logger() -> None:
    """Before ``ray.init``: Ray's own logger drops the messages in :data:`RAY_LOG_MESSAGES`."""
    if verbose():
        return
    for name in ("ray", "ray.data"):  # Ray Data's logger has handlers of its own
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _DropMessages) for f in handler.filters):
                handler.addFilter(_DropMessages())


def quiet_driver() -> None:
    """After ``ray.init`` on the driver: Ray's own INFO lines off, and forwarded noise filtered."""
    quiet_python_warnings()
    _plain_repeat_suffix()
    filter_forwarded_lines()  # with --verbose it drops nothing, and still prints our lines plain
    if verbose():
        return
    logging.getLogger("ray").setLevel(logging.WARNING)


def quiet_without_ray() -> None:
    """A run that starts no Ray: Ray's libraries it still uses in this process (Train's local mode)
    log as they would after ``ray.init``, so the same quieting."""
    quiet_ray_logger()
    quiet_driver()


def filter_forwarded_lines() -> None:
    """Wrap the handler through which the driver prints its workers' output (Ray's log monitor), once;
    also where this process joined a Ray it did not start (our lines then still lose their mark)."""
    try:
        from ray._private.ray_logging import (
            global_worker_stdstream_dispatcher as dispatcher,
        )
    except ImportError:  # another Ray layout: print everything rather than fail
        return
    with dispatcher._lock:
        handlers = []
        for name, handle in dispatcher.handlers:
            if name == "ray_print_logs" and not getattr(handle, "_alchemetric_filter", False):
                handle = _filtered(handle)
            handlers.append((name, handle))
        dispatcher.handlers = handlers


def _filtered(handle):
    tracebacks: dict = {}  # pid -> where in a dropped traceback its next line is: head, frames, end

    def dropped(pid, line: str) -> bool:
        state = tracebacks.pop(pid, None)
        if state == "head" and (line.startswith(_TRACEBACK_HEAD) or not line.strip()):
            tracebacks[pid] = "frames" if line.strip() else "head"
            return True
        if state == "frames" and (line[:1].isspace() or not line.strip()):
            tracebacks[pid] = "frames"
            return True
        if state == "frames" and _EXCEPTION_LINE.match(line):
            tracebacks[pid] = "end"
            return True
        if state == "end" and (not line.strip() or line.startswith(_CHAINED)):
            tracebacks[pid] = "end" if not line.strip() else "head"
            return True
        if any(m in line for m in RAY_TRACEBACK_AFTER):
            tracebacks[pid] = "head"
        return any(m in line for m in RAY_LOG_LINES)

    # Ray's handler is functools.partial(print_to_stdstream, ignore_prefix=...): our lines go through
    # the same function (its deduplication and sink), without the prefix
    plain = functools.partial(handle.func, ignore_prefix=True) if isinstance(handle, functools.partial) else handle
    def filtered(data):
        keep_all = verbose()
        lines = [line for line in data.get("lines", []) if keep_all or not dropped(data.get("pid"), line)]
        for ours, run in itertools.groupby(lines, key=lambda line: line.startswith(OURS)):  # in their order
            run = [line[len(OURS):] for line in run] if ours else list(run)
            (plain if ours else handle)({**data, "lines": run})

    filtered._alchemetric_filter = True
    return filtered


def session_logs() -> str | None:
    """The folder of this Ray session's logs (on the head node), printed once per run."""
    try:
        import ray

        node = ray._private.worker.global_worker.node
        return node.get_logs_dir_path() if node is not None else None
    except Exception:  # a path to print, never a reason to fail
        return None
