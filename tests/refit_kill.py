"""``python tests/refit_kill.py MODE WHERE MARKER refit ARGS...``: `alchemetric-ray refit ARGS` with a stop
planted at one step, for the tests of an interrupted refit (tests/test_refit.py).

WHERE: ``after:NAME`` or ``before:NAME`` (a function of ``alchemetric_ray.refits.run``), or ``alias``
(just after the registry moves ``champion``).  MODE: ``kill`` (the process SIGKILLs itself there) or
``pause`` (it writes its pid to MARKER and waits there to be killed).  Nothing else is changed: the
refit, its training, the registry and the files are the real ones.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray import cli
from alchemetric_ray.refits import run


def main() -> None:
    mode, where, marker, *argv = sys.argv[1:]

    def stop() -> None:
        Path(marker).write_text(str(os.getpid()))
        if mode == "pause":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "alias":
        from mlflow import MlflowClient

        moved = MlflowClient.set_registered_model_alias

        def set_alias(self, name, alias, version):
            moved(self, name, alias, version)
            if alias == "champion":
                stop()

        MlflowClient.set_registered_model_alias = set_alias  # type: ignore[method-assign]
    else:
        when, name = where.split(":")
        step = getattr(run, name)

        @functools.wraps(step)
        def stopped(*args, **kwargs):
            if when == "before":
                stop()
            value = step(*args, **kwargs)
            if when == "after":
                stop()
            return value

        setattr(run, name, stopped)
    cli.run(argv)


if __name__ == "__main__":
    main()
