"""A pytest plugin of bench/suite_cpu.py: each test's share of the machine's CPU (``-p _per_test_cpu``).

For each test (its setup, call and teardown together) it records the wall time, the machine's busy
time over it (``/proc/stat``: every process, the test's children and servers and Ray's daemons
included, and anything else the machine ran meanwhile) and the pytest process's own CPU time, and
appends it to the file named by ``SUITE_CPU_PER_TEST`` (JSON lines, one per test) as each test ends,
so that an interrupted run keeps what it measured.
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest
from suite_cpu import TICK, busy_ticks  # bench/ is on the path suite_cpu.py gives pytest


def busy_s() -> float:
    """Every core's busy time since boot, in seconds."""
    return busy_ticks() / TICK


def own_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    target = os.environ.get("SUITE_CPU_PER_TEST")
    busy, own, started = busy_s(), own_s(), time.monotonic()
    yield
    if target:
        row = {"test": item.nodeid, "wall_s": round(time.monotonic() - started, 2),
               "busy_core_s": round(busy_s() - busy, 2), "pytest_core_s": round(own_s() - own, 2)}
        with open(target, "a") as out:
            out.write(json.dumps(row) + "\n")
