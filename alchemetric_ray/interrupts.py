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
import signal
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
