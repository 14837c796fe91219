"""A call inside a Jupyter kernel: progress as one display updated in place, not a screen of lines.

The loop prints one line per epoch and a sweep one line per finished trial, on a terminal and into a
pipe alike.  In a notebook's cell those lines would pile up; while a call runs, :func:`live_progress`
puts a stream in front of ``sys.stdout`` that sends them to one ``IPython.display`` handle (the last
line and a count) and passes every other line through as it came.  Ray's forwarded lines reach the
same stream; they are printed plain (``RAY_COLOR_PREFIX=0``, no escape bytes in a cell).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from alchemetric_ray.console import in_notebook

PROGRESS = re.compile(r"^(epoch \d+/\d+|trial \S+ finished)")


class LiveLines:
    """``sys.stdout`` during a call in a kernel: progress lines update one display; others pass through."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.handle: Any = None
        self.count = 0
        self._partial = ""
        # re-entrant: IPython's display() flushes sys.stdout (this stream) before it publishes, from
        # inside write(); a plain Lock deadlocked the kernel at the first progress line
        self._lock = threading.RLock()
        self._writing = False

    def write(self, text: str) -> int:
        with self._lock:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
            self._writing = True
            try:
                for line in lines:
                    self._line(line)
            finally:
                self._writing = False
        return len(text)

    def _line(self, line: str) -> None:
        if not PROGRESS.match(line):
            self.stream.write(line + "\n")
            return
        from IPython.display import Pretty, display

        self.count += 1
        shown = Pretty(f"{line}\n({self.count} progress line{'s' if self.count > 1 else ''} so far)")
        if self.handle is None:
            self.stream.flush()
            self.handle = display(shown, display_id=True)
        else:
            self.handle.update(shown)

    def flush(self) -> None:
        with self._lock:
            if self._partial and not self._writing:  # a partial line stays whole while write() displays
                self.stream.write(self._partial)
                self._partial = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def live_progress() -> Iterator[None]:
    """In a kernel: progress lines into one display while the block runs (``sys.stdout`` put back
    after); elsewhere nothing changes."""
    if not in_notebook():
        yield
        return
    previous = sys.stdout
    live = LiveLines(previous)
    sys.stdout = live
    try:
        yield
    finally:
        live.flush()
        if sys.stdout is live:
            sys.stdout = previous
