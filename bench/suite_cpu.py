"""Where the test suite's CPU goes, and the shortest wall time that CPU allows on this machine.

    python bench/suite_cpu.py                       # the whole suite (what `make test` runs, without the lint)
    python bench/suite_cpu.py tests/test_sweep.py   # any pytest arguments
    python bench/suite_cpu.py -- tests -m "not slow"   # after --, options for pytest too

Runs pytest in a child process and, beside it, reads the machine's CPU time twice (``/proc/stat``:
every core's busy time, the kernel's own included) and every process's CPU time every half second
(``/proc/<pid>/stat``), filed by what the process is: pytest itself, our command-line runs, Ray's
daemons (GCS, raylet, dashboard and its modules, agents, monitors), Ray's worker processes by actor
or task name, servers the tests start (MLflow, S3, Jupyter kernels, Chromium), and the rest of the
machine.  A process that lives under half a second can be missed by the sampling; the machine's
busy time counts it all.

Prints the wall time, the cores' busy time and the bound it sets: a suite whose processes need C
core-seconds cannot finish in under C / cores seconds on this machine, however its tests are
ordered or spread over pytest workers.  And, test by test (a plugin, ``bench/_per_test_cpu.py``),
the machine's busy time over each test's setup, call and teardown and the pytest process's own share
of it: the tests that cost the most CPU, whichever processes spent it.  Linux only (it reads
``/proc``).  Writes bench/results/suite-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# the first match names the kind: (a substring of the command line, the kind)
KINDS = [
    ("default_worker.py", "ray: worker (idle)"), ("gcs_server", "ray: GCS"), ("/raylet ", "ray: raylet"),
    ("dashboard/agent.py", "ray: dashboard agent"),
    ("dashboard/dashboard.py", "ray: dashboard"), ("log_monitor.py", "ray: log monitor"),
    ("autoscaler/_private/monitor.py", "ray: autoscaler monitor"), ("runtime_env/agent", "ray: runtime env agent"),
    ("alchemetric_ray.cli", "our CLI runs"),
    ("bin/alchemetric-ray", "our CLI runs"), ("jobs/", "our CLI runs"), ("ipykernel", "Jupyter kernels"),
    ("mlflow", "MLflow servers"), ("moto", "S3 server (moto)"), ("chrom", "Chromium"),
]


def busy_ticks() -> int:
    """Every core's busy time, kernel included (idle and iowait left out; steal left out: not this machine's)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return user + nice + system + irq + softirq


def kind_of(pid: str, pytest_pid: int) -> str | None:
    """What the process is, from its command line (Ray retitles a worker ``ray::<actor or task>``)."""
    try:
        argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return None
    if int(pid) == pytest_pid:
        return "pytest (in-process tests)"
    if not argv:
        return "kernel threads"
    line = " ".join(argv)
    if line.startswith("ray::"):
        name = line.split()[0][5:]
        return "ray: worker (idle)" if name == "IDLE" else f"ray worker: {name.split('.')[0][:40]}"
    if line.startswith("ray-dashboard-"):
        return "ray: dashboard modules"
    for needle, kind in KINDS:
        if needle in line:
            return kind
    if "python" in os.path.basename(argv[0]):
        return "other Python processes"
    return f"other: {os.path.basename(argv[0])[:30]}"


def sample(seen: dict, pytest_pid: int) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()
        ticks, key = int(rest[11]) + int(rest[12]), (pid, rest[19])  # utime + stime; the pid and its start time
        entry = seen.get(key)
        if entry is None or entry[0] in ("ray: worker (idle)", "other Python processes"):  # titles change later
            kind = kind_of(pid, pytest_pid)
            if kind is None:
                continue
            seen[key] = [kind, ticks]
        else:
            entry[1] = ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("pytest_args", nargs="*", default=["tests"], help="arguments for pytest (default: tests)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--top", type=int, default=30, help="the tests of most CPU to print and keep (default 30)")
    args = parser.parse_args()
    if not Path("/proc/stat").is_file():
        print("bench/suite_cpu.py: error: it reads /proc (Linux only)", file=sys.stderr)
        return 2
    seen: dict = {}
    sample(seen, -1)
    existing = {key: entry[1] for key, entry in seen.items()}  # CPU the processes alive before had used already
    seen.clear()
    per_test = Path(args.out) / "suite-cpu-per-test.jsonl"
    per_test.parent.mkdir(parents=True, exist_ok=True)
    per_test.unlink(missing_ok=True)
    env = {**os.environ, "SUITE_CPU_PER_TEST": str(per_test),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))}
    start_busy, started = busy_ticks(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_per_test_cpu",
                             *args.pytest_args], cwd=REPO, env=env)
    try:
        while proc.poll() is None:
            sample(seen, proc.pid)
            time.sleep(0.5)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 130
    wall, busy = time.monotonic() - started, (busy_ticks() - start_busy) / TICK
    by_kind: dict[str, float] = {}
    counts: dict[str, int] = {}
    for key, (kind, ticks) in seen.items():
        used = (ticks - existing.get(key, 0)) / TICK
        by_kind[kind] = by_kind.get(kind, 0.0) + used
        counts[kind] = counts.get(kind, 0) + 1
    cores = os.cpu_count() or 1
    print(f"\npytest {' '.join(args.pytest_args)}: exit {proc.returncode}, wall {wall:.0f} s")
    print(f"the cores' busy time: {busy:.0f} core-s over {wall:.0f} s on {cores} cores ({busy / (wall * cores):.0%} "
          f"busy); this much CPU needs at least {busy / cores:.0f} s ({busy / cores / 60:.1f} min) on {cores} cores")
    print(f"{'core-s':>8} {'share':>6} {'processes':>9}  kind")
    for kind, used in sorted(by_kind.items(), key=lambda item: -item[1]):
        if used >= 0.5:
            print(f"{used:8.0f} {used / busy:6.1%} {counts[kind]:9d}  {kind}")
    tests = _per_test(per_test, args.top)
    write_result(args.out, "suite-cpu", {
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "pytest_args": args.pytest_args,
        "exit_code": proc.returncode, "wall_s": round(wall, 1), "busy_core_s": round(busy, 1),
        "bound_s": round(busy / cores, 1),
        "by_kind": {k: {"core_s": round(v, 1), "processes": counts[k]} for k, v in sorted(by_kind.items())},
        "tests": tests})
    return proc.returncode


def _per_test(path: Path, top: int) -> dict:
    """Prints the ``top`` tests of most busy time (and how much of the total they hold); returns them."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    path.unlink(missing_ok=True)
    total = sum(r["busy_core_s"] for r in rows) or 1.0
    rows.sort(key=lambda r: -r["busy_core_s"])
    held = sum(r["busy_core_s"] for r in rows[:top])
    print(f"\nthe {min(top, len(rows))} tests of most CPU (of {len(rows)}) hold {held:.0f} of the {total:.0f} core-s "
          f"busy over the tests ({held / total:.0%}); pytest's own share of each in the second column")
    print(f"{'core-s':>8} {'pytest':>7} {'wall s':>7}  test")
    for r in rows[:top]:
        print(f"{r['busy_core_s']:8.1f} {r['pytest_core_s']:7.1f} {r['wall_s']:7.1f}  {r['test']}")
    return {"count": len(rows), "busy_core_s": round(total, 1), "top": rows[:top]}


if __name__ == "__main__":
    sys.exit(main())
