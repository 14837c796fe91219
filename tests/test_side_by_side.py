"""Two commands at once on one machine (issue 30, item 5): each starts a local Ray of its own, and
neither prints a Ray traceback.

Ray's helpers inside a run's actors (Train's ``PlacementGroupCleaner`` asks the State API whether
the controller lives) look their Ray up by ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS``, else
by scanning the machine, which fails with "Found multiple active Ray instances" wherever several
Rays run.  Here three do: the test session's own (``ray_session``) and one per command.

The two commands are also the two-worker run and the sweep whose output, in a pipe, keeps our
lines plain (test_console.py, issue 40: one pair of real runs carries both tests' checks).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from fake_cluster import processes_naming
from test_console import _only_our_lines
from test_tune_lines import assert_no_ray_tune_lines

from alchemetric_ray import console

REPO = Path(__file__).resolve().parents[1]
# The worker mode: a run through a Ray Train worker group, whose controller starts the
# PlacementGroupCleaner (a one-worker local-mode run, in the driver, starts no cleaner).
WORKER_MODE_ARGS: list[str] = ["train.local_mode=false"]
# A one-worker trial runs the loop in the trial's own process by default (no Train controller, no
# cleaner); trainer makes every trial build a TorchTrainer, the path that printed the traceback.
TUNE_WORKER_MODE_ARGS: list[str] = [*WORKER_MODE_ARGS, "tune.trial_loop=trainer"]
SMALL = ["--device", "cpu", "data.tickers=AAPL,MSFT", "model.hidden=8", "train.batch_size=1024"]
NOISE = ("Traceback", "ConnectionError", "Found multiple active Ray instances")


def _env(temp_dir: str) -> dict[str, str]:
    """This machine's environment without any Ray address (each command starts its own local Ray),
    the worktree's package first, and a Ray temp folder of the command's own (short: Ray's socket
    paths must stay under 108 bytes), by which its processes are found afterwards."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")) and k != console.VERBOSE_ENV}
    env.update(PYTHONPATH=str(REPO), RAY_TMPDIR=temp_dir)
    return env


class Done(NamedTuple):
    """One command's end: its exit code, what it wrote to stdout and to stderr (two pipes), its models folder."""

    returncode: int
    stdout: str
    stderr: str
    model_dir: Path


def _run_together(commands: list[tuple[str, list[str]]], tmp_path: Path) -> list[Done]:
    """Start the commands at the same time, each with its own storage and models folders and its own
    local Ray, its stdout and stderr into pipes (not a TTY); wait for all.
    Whatever happens, nothing any left behind (process groups, Ray processes) survives."""
    runs = []
    try:
        for i, (command, args) in enumerate(commands):
            home = tmp_path / f"{command}-{i}"
            home.mkdir()
            temp_dir = tempfile.mkdtemp(prefix="ar-sbs-", dir="/tmp")
            cli = [sys.executable, "-m", "alchemetric_ray.cli", command, *SMALL, *args,
                   f"storage.path={home / 'results'}", f"storage.models_dir={home / 'models'}",
                   f"storage.name=side{i}"]
            proc = subprocess.Popen(cli, cwd=home, env=_env(temp_dir), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            runs.append((proc, home, temp_dir))
        results = []
        for proc, home, temp_dir in runs:
            out, err = proc.communicate(timeout=600)
            results.append(Done(proc.returncode, out, err, home / "models" / f"side{len(results)}"))
        # each command shut its own Ray down as it exited (Ray's atexit hook): give the last
        # processes a moment to go, then nothing of either Ray is left
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(processes_naming(t) for _, _, t in runs):
            time.sleep(0.5)
        left = {t: processes_naming(t) for _, _, t in runs}
        assert not any(left.values()), f"Ray processes left behind: {left}"
        return results
    finally:
        for proc, _, temp_dir in runs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            for pid in processes_naming(temp_dir):  # a Ray process outside the group (a reaper, a raylet)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(temp_dir, ignore_errors=True)


def _check(results: list[Done]) -> None:
    for done in results:
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert (done.model_dir / "weights.pt").is_file() and (done.model_dir / "config.json").is_file(), out[-4000:]
        for noise in NOISE:
            assert noise not in out, f"{noise!r} in the output:\n{out[-6000:]}"


@pytest.mark.slow
def test_a_two_worker_train_and_a_sweep_at_once_each_on_its_own_ray_print_our_lines_plain_into_a_pipe(
        ray_session, stocknet_shards, tmp_path):
    """Both through a Train worker group, whose controller starts the PlacementGroupCleaner: a
    worker-mode train (a group of two, DDP over gloo), and a 2-trial sweep whose trials each build
    a TorchTrainer.  ray_session: a third Ray on the machine whatever else runs, so that a lookup by
    scanning fails.  Their lines reach each driver from Ray workers and trial processes: still no
    ESC byte and no Ray prefix on our lines.

    The sweep is also the test of ``tune.trial_loop=trainer`` (it was test_sweep.py's own sweep): each
    trial's TorchTrainer run, named after the trial, keeps the checkpoints beside the sweep, and the export
    takes the best epoch's checkpoint from there."""
    start = time.monotonic()
    # six stocks' shards, as test_sweep.py's sweeps read (a validation long-short book of 5 or more a date)
    shards = stocknet_shards("AAPL,MSFT,XOM,JPM,GE,WMT")
    two, sweep = _run_together([
        ("train", [*WORKER_MODE_ARGS, "scaling.workers=2", "train.epochs=2", "train.patience=0"]),
        ("tune", [*TUNE_WORKER_MODE_ARGS, f"data.path={shards}", "model.hidden=16", "train.batch_size=512",
                  "train.epochs=2", "train.patience=0", "train.metric=val_log_loss", "train.mode=min",
                  "tune.search=grid", "tune.scheduler=none", "tune.max_concurrent_trials=1",
                  "tune.space={train.lr: [0.01, 1.0e-9]}"]),
    ], tmp_path)
    print(f"a train and a tune command at once: {time.monotonic() - start:.0f} s")
    _check([two, sweep])
    _only_our_lines(two.stdout + two.stderr)
    assert re.search(r"^workers\s+2\b", two.stdout, re.M), two.stdout[-3000:]  # a group of two, as asked
    _only_our_lines(sweep.stdout + sweep.stderr, epochs=False)  # a sweep prints a line per trial, not per epoch
    assert_no_ray_tune_lines(sweep.stdout + sweep.stderr)  # Tune's own lines, in a pipe (issue 48 item 5)
    assert re.search(r"^trial \w+ finished: ", sweep.stdout, re.M), sweep.stdout[-3000:]
    _each_trial_had_its_torch_trainer_run(sweep)


def _each_trial_had_its_torch_trainer_run(sweep: Done) -> None:
    """tune.trial_loop=trainer: a Train run per trial beside the sweep, named after the trial, and the
    export from the best trial's best epoch there; the test segment left sealed (no --evaluate)."""
    from alchemetric_ray.artifacts import ledger
    from alchemetric_ray.sweeps.summary import SweepSummary

    results = sweep.model_dir.parents[1] / "results"
    where = next(results.rglob("sweep_summary.json")).parent
    s = SweepSummary.from_dict(json.loads((where / "sweep_summary.json").read_text()))
    assert s.num_trials == 2 and all(t.epochs_run == 2 for t in s.trials), s
    runs = sorted(p.name for p in results.glob(f"{s.name}-*"))
    assert runs == sorted(f"{s.name}-{t.trial_id}" for t in s.trials)
    best = min(s.trials, key=lambda t: t.best_value)
    assert best.config["train.lr"] == 0.01 and s.best_trial_id == best.trial_id
    assert Path(s.best_checkpoint).parent.name == f"{s.name}-{best.trial_id}"
    meta = json.loads((Path(s.best_checkpoint) / "meta.json").read_text())
    assert meta["metrics"]["val_log_loss"] == pytest.approx(s.best_value)
    metrics = json.loads((sweep.model_dir / "metrics.json").read_text())
    assert metrics["val"]["log_loss"] == pytest.approx(s.best_value)
    # not asked: the test segment stays sealed, nothing scored it and no look is recorded
    assert "test" not in metrics and s.test_metrics is None and ledger.looks(sweep.model_dir) == []
    assert all("test" not in b for b in metrics["baselines"].values())


# What Train's controller logged on this machine when two train commands ran at once beside the
# session's Ray (load average 10 on 2 cores): its first request to Ray's autoscaling coordinator,
# a helper actor still starting, timed out after 5 s.
COORDINATOR_WARNING = [
    "Failed to send resource request for train-4b7212b010f84d429a8d6dc91398a92d. If this only happens transiently "
    "during network partition or CPU being overloaded, it's safe to ignore this error. If this error persists, "
    "file a GitHub issue.",
    "Traceback (most recent call last):",
    '  File ".../ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py", line 58, '
    "in send_resource_request",
    "    ray.get(",
    '  File ".../ray/_private/worker.py", line 1007, in get_objects',
    "    ] = self.core_worker.get_objects(",
    "        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status',
    "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]


def test_a_transient_ray_warning_keeps_its_line_not_its_traceback():
    printed = []
    filtered = console._filtered(printed.append)
    warning = COORDINATOR_WARNING
    filtered({"pid": 7, "is_err": True, "lines": warning[:4]})  # a traceback may span two batches
    filtered({"pid": 8, "is_err": True, "lines": ["Traceback (most recent call last):", "  File \"x.py\"",
                                                  "ValueError: another process's own error"]})
    filtered({"pid": 7, "is_err": True, "lines": [*warning[4:], "epoch 1/2  train_loss 1.0"]})
    # a chained traceback after the warning goes too; a later real error of the same process stays
    filtered({"pid": 9, "is_err": True, "lines": [
        *warning[:-1], "ray.exceptions.GetTimeoutError", "", "During handling of the above exception, another "
        "exception occurred:", "", "Traceback (most recent call last):", '  File "y.py"', "RuntimeError: chained",
        "Traceback (most recent call last):", '  File "z.py"', "ValueError: a real error"]})
    assert [line for batch in printed for line in batch["lines"]] == [
        warning[0], "Traceback (most recent call last):", '  File "x.py"', "ValueError: another process's own error",
        "epoch 1/2  train_loss 1.0",
        warning[0], "Traceback (most recent call last):", '  File "z.py"', "ValueError: a real error"]
    # a warning of this text without a traceback: the lines after it are the process's own
    printed.clear()
    filtered({"pid": 10, "is_err": True, "lines": [warning[0], "KeyError: printed by the worker"]})
    assert printed[0]["lines"] == [warning[0], "KeyError: printed by the worker"]
