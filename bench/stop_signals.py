"""A scheduler's SIGTERM at random moments of a real `train --evaluate`: how each run ends.

    python bench/stop_signals.py                 # 12 runs, SIGTERM 2-40 s after the start
    python bench/stop_signals.py --runs 20 --signal SIGHUP --tickers AAPL,MSFT,XOM

Each run is a fresh `alchemetric-ray train --evaluate` on a few packaged tickers, started in a
session of its own and sent the signal after a delay drawn uniformly (seeded) from ``--within``, so
that the signal lands anywhere: during imports, Ray's start, an epoch, the export, the evaluation's
baselines, or Ray's shutdown.  For each run it prints the delay, the exit code, the last line on
stderr, whether stderr held a traceback or Ray's crash dump, and how many processes of the run's
session were still alive 10 s after it exited.  A clean end is exit 143 (129 for SIGHUP) with one
line, or the command's own exit code where the signal came after its work was done; never a
traceback, a crash dump or a process left behind.  Writes bench/results/stop_signals.json.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

REPO = Path(__file__).resolve().parents[1]


def _alive_in_session(sid: int) -> int:
    out = subprocess.run(["ps", "-A", "-o", "pid=,stat="], capture_output=True, text=True).stdout
    alive = 0
    for row in out.splitlines():
        pid, stat = row.split(None, 1)
        try:
            alive += os.getsid(int(pid)) == sid and not stat.startswith("Z")
        except (ProcessLookupError, PermissionError):
            pass
    return alive


def one_run(delay: float, sig: int, tickers: str, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "alchemetric_ray.cli", "train", "--evaluate", "--device", "cpu",
            f"data.tickers={tickers}", "train.epochs=3", f"storage.path={work / 'results'}",
            f"storage.models_dir={work / 'models'}"]
    proc = subprocess.Popen(args, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(delay)
    sent = proc.poll() is None
    if sent:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=600)
    time.sleep(10)
    lines = err.strip().splitlines()
    return {"delay_s": round(delay, 1), "signal_sent": sent, "exit": proc.returncode,
            "last_stdout": (out.strip().splitlines() or [""])[-1][:80], "stderr_last": (lines or [""])[-1][:160],
            "traceback": "Traceback" in err, "crash_dump": "logging.cc" in err or "SIGTERM received" in err,
            "left_alive": _alive_in_session(proc.pid)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--within", type=float, nargs=2, default=(2.0, 40.0), metavar=("FROM_S", "TO_S"))
    parser.add_argument("--signal", default="SIGTERM", choices=["SIGTERM", "SIGHUP", "SIGINT"])
    parser.add_argument("--tickers", default="AAPL,MSFT,XOM")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sig = getattr(signal, args.signal)
    draw = random.Random(args.seed)
    rows = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="stop-signals-") as tmp:
            row = one_run(draw.uniform(*args.within), sig, args.tickers, Path(tmp))
        rows.append(row)
        print(f"{row['delay_s']:5.1f} s  exit {row['exit']:4}  traceback {row['traceback']!s:5}  crash dump "
              f"{row['crash_dump']!s:5}  left {row['left_alive']}  | {row['stderr_last'] or row['last_stdout']}",
              flush=True)
    clean = sum(1 for r in rows if not r["traceback"] and not r["crash_dump"] and r["left_alive"] == 0
                and r["exit"] in (0, 128 + sig))
    print(f"{clean} of {len(rows)} runs ended clean ({args.signal} at {args.within[0]:.0f}-{args.within[1]:.0f} s)")
    write_result(REPO / "bench" / "results", "stop_signals",
                 {"machine": machine(), "signal": args.signal, "runs": rows, "clean": clean})


if __name__ == "__main__":
    main()
