"""Ctrl-C (SIGINT) as the product handles it: noticed where Ray handles it itself, held where a
write must finish.

Ray Train's ``fit()`` and Tune's ``Tuner.fit()`` each install a SIGINT handler of their own while
they run (Train: abort the controller, then exit; Tune: stop the trials, save the experiment's
state, return normally).  :func:`seen_during` chains a recorder in front of whatever handler is
installed while its block runs, so that the caller can tell that a run ended because of a Ctrl-C
(and say so in one line, with the command that continues it) instead of summarising a partial
result.  :func:`held_during` keeps a Ctrl-C waiting until a block (a checkpoint being put in place)
is done, then raises it.  Both work in the main thread only, where Python delivers signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def seen_during() -> Iterator[Callable[[], bool]]:
    """``with seen_during() as seen:`` ... ``seen()`` is True once a SIGINT arrived in the block; the
    handler in place, and any installed meanwhile (by Ray), still runs."""
    presses: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    install = signal.signal
    before = signal.getsignal(signal.SIGINT)

    def recording(handler):
        def recorder(sig, frame):
            presses.append(sig)
            if callable(handler):
                return handler(sig, frame)
            if handler == signal.SIG_DFL:
                raise KeyboardInterrupt
            return None  # SIG_IGN
        return recorder

    def chained(signum, handler):
        if signum != signal.SIGINT:
            return install(signum, handler)
        return install(signum, recording(handler))

    install(signal.SIGINT, recording(before))
    signal.signal = chained
    try:
        yield lambda: bool(presses)
    finally:
        signal.signal = install
        install(signal.SIGINT, before)


@contextlib.contextmanager
def held_during() -> Iterator[None]:
    """Hold a SIGINT until the block is done, then raise it as ``KeyboardInterrupt``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = signal.signal(signal.SIGINT, lambda sig, frame: held.append(sig))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def spared_by_kernel_interrupts() -> Iterator[None]:
    """In a Jupyter kernel: SIGINT ignored while the block starts a Ray, so that every process it starts
    inherits "ignore SIGINT".  Jupyter's interrupt signals the kernel's whole process group: Ray's own
    binaries block SIGINT, but the dashboard's module processes (forked by a multiprocessing forkserver
    that restores Python's default handler) died of it, and with them the State API and job API of the
    user's Ray.  A Ctrl-C during the start itself (seconds) is not seen; elsewhere (the command line,
    which ends its Ray itself) nothing changes."""
    from alchemetric_ray.console import in_notebook

    if threading.current_thread() is not threading.main_thread() or not in_notebook():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


# ---- the signals a scheduler or a closed terminal sends ----------------------------------------

STOP_SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[int] = []
_routing = False


@contextlib.contextmanager
def stop_signals_as_ctrl_c(*, then_ignore: bool = False) -> Iterator[None]:
    """While the block runs, SIGTERM (Kubernetes' eviction, ``ray job stop``, ``kill``) and SIGHUP (a
    closed terminal) are handled as a Ctrl-C: whatever SIGINT handler is in place at that moment runs
    (ours, Ray Train's, Tune's, Python's ``KeyboardInterrupt``), so the finished work is kept the
    same way; :func:`stop_signal` says which signal it was.  For the command line (a notebook's
    kernel keeps its own handlers).  ``ray.init`` installs its own SIGTERM handler (``sys.exit``) and
    a C++ one that aborts with a crash dump: :func:`reroute_after_ray` puts ours back once Ray is up.
    :func:`work_done` ends the routing early.  The handlers from before the block are put back after
    it, or, with ``then_ignore`` (the process exits next), SIGINT and the stop signals are ignored."""
    global _routing
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [getattr(signal, name) for name in ("SIGINT", *STOP_SIGNALS) if hasattr(signal, name)]
    before = {sig: signal.getsignal(sig) for sig in sigs}
    _received.clear()
    _routing = True
    _route()
    hook = sys.unraisablehook
    sys.unraisablehook = _stop_again(hook)
    try:
        yield
    finally:
        _routing = False
        sys.unraisablehook = hook
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_IGN if then_ignore else handler if handler is not None else signal.SIG_DFL)


def _stop_again(hook):
    """``sys.unraisablehook`` for the block: a :class:`StopSignal` raised where Python cannot raise it
    (a finalizer, a weakref callback: Python prints it and goes on) is not printed; the signal is
    sent again a moment later (from a timer thread: sent from here, Python would handle it at once,
    still inside the hook), to be handled where the run can stop."""
    def handle(unraisable) -> None:
        if isinstance(unraisable.exc_value, StopSignal) and _routing:
            again = threading.Timer(0.05, os.kill, (os.getpid(), signal.Signals[str(unraisable.exc_value)]))
            again.daemon = True
            again.start()
            return
        hook(unraisable)
    return handle


def work_done() -> None:
    """Inside :func:`stop_signals_as_ctrl_c`, once the command's work is over (what is left: Ray's
    shutdown): from here SIGINT and the stop signals are recorded, never raised, so that neither the
    shutdown nor a finalizer running meanwhile is cut short by one."""
    global _routing
    if threading.current_thread() is not threading.main_thread():
        return
    _routing = False
    for name in ("SIGINT", *STOP_SIGNALS):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda signum, frame: _received.append(signum))


def _route() -> None:
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _as_ctrl_c)


def reroute_after_ray() -> None:
    """After ``ray.init``: the stop signals handled as Ctrl-C again, inside :func:`stop_signals_as_ctrl_c`."""
    if _routing and threading.current_thread() is threading.main_thread():
        _route()


def received(signum: int) -> None:
    """Record a stop signal that reached the process another way (Ray's own handler during ``ray.init``)."""
    _received.append(signum)


class StopSignal(KeyboardInterrupt):
    """A SIGTERM or SIGHUP handled as a Ctrl-C where Python's own SIGINT handler is in place.  A
    subclass rather than ``KeyboardInterrupt`` itself: CPython remembers an exact ``KeyboardInterrupt``
    that passed through code it ran with ``PyRun_*`` and, at exit, ends the process with SIGINT
    whatever exit code the program chose (seen here once in 30 stopped ``features`` runs: -2, not 143)."""


def _as_ctrl_c(signum, frame) -> None:
    received(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signal.SIGINT, frame)  # Ray Train's, Tune's, a held write's: they stop the run their way
        return
    raise StopSignal(signal.Signals(signum).name)  # Python's default, or SIGINT ignored: stop all the same


def stop_signal() -> signal.Signals | None:
    """The first stop signal (SIGTERM, SIGHUP) this process received, or None."""
    return signal.Signals(_received[0]) if _received else None


def exit_code() -> int:
    """What a shell reports for a process the signal ended: 128 + its number (130 for Ctrl-C)."""
    received = stop_signal()
    return 128 + int(received if received is not None else signal.SIGINT)
