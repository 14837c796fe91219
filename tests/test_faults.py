"""Faults on a real local Ray: a worker killed mid-epoch, a writer killed between write and rename (a node
lost during training: tests/test_cluster.py, on its multi-node cluster)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from alchemetric_ray.artifacts.checkpoint import load_state
from alchemetric_ray.artifacts.export import load_model
from alchemetric_ray.config import load_config
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.training.trainer import run_training

REPO = Path(__file__).resolve().parents[1]
WINDOW = 8


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    return stocknet_shards("AAPL,MSFT,XOM,JPM,GE,WMT", f"features.window={WINDOW}")


def _cfg(shards, tmp_path, *overrides):
    # An LSTM with small batches: epochs long enough (a few seconds here) to kill one in the middle.
    return load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}",
                              f"storage.models_dir={tmp_path / 'models'}", f"features.window={WINDOW}",
                              "model.name=lstm", "model.hidden=32", "train.batch_size=32", "train.epochs=3",
                              "train.deterministic=true", "train.patience=0", "device.name=cpu", *overrides])


def _train_worker_pids(class_name: str = "RayTrainWorker") -> list[int]:
    """The pids of the live processes of an actor class: Train's workers, or Tune's trials (``ImplicitFunc``).

    Read from the processes' titles (Ray names an actor's process ``ray::<Class>`` and ``ray::<Class>.<method>``
    while a method runs): a scan takes milliseconds, where the state API's round trip through the GCS can take
    longer on a busy machine than a small trial lives."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        title = (proc.info["cmdline"] or [""])[0]
        if (title == f"ray::{class_name}" or title.startswith(f"ray::{class_name}.")) \
                and proc.info["status"] != psutil.STATUS_ZOMBIE:
            pids.append(proc.info["pid"])
    return pids


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.02, runner: threading.Thread | None = None):
    """Polls until ``predicate`` holds; fails at once, not at the timeout, when ``runner`` (the run the test
    watches) has ended before it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if runner is not None and not runner.is_alive():
            raise AssertionError(f"the run ended before {what}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_worker_killed_mid_epoch_restarts_resumes_and_equals_an_uninterrupted_run(ray_session, shards, tmp_path,
                                                                                   capfd):
    clean = run_training(_cfg(shards, tmp_path, "storage.name=clean"), progress=False)
    epoch_s = Manifest.read(shards).rows["train"] / clean.summary.history[-1]["samples_per_s"]

    run_dir = tmp_path / "results" / "killed"
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(run_training(
        # worker mode: a Train worker group restarts on the failure (a local-mode run has no worker to kill)
        _cfg(shards, tmp_path, "storage.name=killed", "storage.run=killed", "scaling.max_failures=2",
             "train.local_mode=false"),
        progress=False)), daemon=True)
    before = set(_train_worker_pids())  # a process of the clean run's group may not have exited yet
    runner.start()
    pid = _wait_for(lambda: [p for p in _train_worker_pids() if p not in before], 600, "the training worker's process",
                    runner=runner)[0]
    _wait_for(lambda: (run_dir / "epoch-0000" / "meta.json").is_file(), 600, "the first epoch's checkpoint",
              runner=runner)
    # into the second epoch: the clean run's pace is only an estimate of this one's (a busy machine slows either),
    # so at most 1.5 s after the first checkpoint, well inside an epoch of several seconds
    time.sleep(min(0.4 * epoch_s, 1.5))
    os.kill(pid, signal.SIGKILL)
    killed_before_second_checkpoint = not (run_dir / "epoch-0001").exists()
    runner.join(900)
    assert not runner.is_alive() and outcome, "the run did not finish after its worker was killed"
    assert killed_before_second_checkpoint, "the kill landed after epoch 2 had finished; not mid-epoch"

    resumed = outcome[0]
    logs = "".join(capfd.readouterr())
    assert "resumed from the checkpoint of epoch" in logs  # a new worker group picked the checkpoint up
    assert pid not in _train_worker_pids()
    assert resumed.summary.epochs_run == 3
    with clean.latest_checkpoint.as_directory() as a, resumed.latest_checkpoint.as_directory() as b:
        want, got = load_state(a)["model"], load_state(b)["model"]
    for key in want:
        assert torch.equal(want[key], got[key]), key  # bit for bit, as if nothing had happened
    exported = load_model(resumed.model_dir)  # complete: weights, config, manifest, card
    for key, value in exported.model.state_dict().items():
        assert torch.equal(value, want[key]), key
    assert (resumed.model_dir / "model_card.md").is_file()


@pytest.mark.slow
def test_a_sweep_trial_killed_mid_epoch_is_retried_from_the_checkpoint_tune_kept(ray_session, shards, tmp_path,
                                                                                 capfd):
    """A one-worker trial runs the loop in its own process (no worker group to restart): killed in its
    second epoch, Tune starts it again (scaling.max_failures) from the checkpoint it kept, and the
    trial ends with every epoch reported once after the restart took over."""
    from alchemetric_ray.sweeps.sweep import run_sweep

    cfg = _cfg(shards, tmp_path, "storage.name=swkill", "storage.run=sweep-swkill", "scaling.max_failures=1",
               "tune.search=grid", "tune.space={train.lr: [0.001]}", "tune.scheduler=none", "train.batch_size=16",
               "train.metric=val_log_loss", "train.mode=min")
    sweep_dir = tmp_path / "results" / "sweep-swkill"
    # Tune's driver writes each result it takes in (and the checkpoint with it) to the trial's result.json
    # under the session's artifacts at once: killed before that, the trial would restart from nothing
    session = Path(ray_session._private.worker._global_node.get_session_dir_path())
    results = f"artifacts/*/{sweep_dir.name}/driver_artifacts/*/result.json"
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(run_sweep(cfg, export=False, progress=False)),
                              daemon=True)
    before = set(_train_worker_pids("ImplicitFunc"))
    runner.start()
    pid = _wait_for(lambda: [p for p in _train_worker_pids("ImplicitFunc") if p not in before], 600,
                    "the trial's process", runner=runner)[0]
    _wait_for(lambda: any(p.stat().st_size for p in session.glob(results)), 600, "Tune's first result of the trial",
              runner=runner)
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)  # in the second epoch (seconds long: an LSTM on batches of 16)
    killed_before_second_checkpoint = not list(sweep_dir.glob("*/checkpoint_000001"))
    runner.join(900)
    assert not runner.is_alive() and outcome, "the sweep did not finish after its trial was killed"
    assert killed_before_second_checkpoint, "the kill landed after epoch 2 had finished; not mid-epoch"

    trial = outcome[0].summary.trials[0]
    assert trial.status == "TERMINATED" and trial.epochs_run == 3
    assert [row["epoch"] for row in trial.history] == [1, 2, 3]  # epochs by their number, from 1
    said = "".join(capfd.readouterr())  # epochs count from 1; the folder is Tune's
    assert re.search(r"resumed from the checkpoint of epoch 1 \(\S+\): continuing at epoch 2 of 3", said), said[-2000:]
    assert pid not in _train_worker_pids("ImplicitFunc")


# ---- a writer killed between writing and renaming --------------------------------------------------

_KILL_AT_RENAME = """
import os, signal, sys
from pathlib import Path
import alchemetric_ray.fsutil as fsutil

calls, kill_at = [0], int(sys.argv[1])


def dies_before(rename):  # the writer dies just before its rename (or exchange) number `kill_at`
    def wrapped(*args):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(*args)
    return wrapped


os.replace = dies_before(os.replace)
fsutil._exchange = dies_before(fsutil._exchange)
if sys.argv[3] == "no-exchange":
    fsutil._RENAMEAT2 = False  # the portable path: old folder aside, new folder in
"""


def _run_killed(body: str, kill_at: int, target: Path, mode: str = "exchange") -> subprocess.CompletedProcess:
    script = _KILL_AT_RENAME + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script, str(kill_at), str(target), mode], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return proc


@pytest.mark.slow
def test_checkpoint_state_killed_before_rename_keeps_the_previous_one(tmp_path, capsys):
    from alchemetric_ray.artifacts.checkpoint import (
        checkpoint_problem,
        latest_complete_checkpoint,
        read_meta,
        save_checkpoint,
    )

    def epoch_of(folder):
        return {k: v for k, v in read_meta(folder).items() if k != "state_file"}

    ckpt = tmp_path / "epoch-0003"
    save_checkpoint(ckpt, {"model": {"w": torch.ones(3)}}, {"epoch": 3})
    _run_killed("""
        import torch
        from alchemetric_ray.artifacts.checkpoint import save_checkpoint
        save_checkpoint(sys.argv[2], {"model": {"w": torch.zeros(100000)}}, {"epoch": 4})
    """, kill_at=1, target=ckpt)
    assert torch.equal(load_state(ckpt)["model"]["w"], torch.ones(3)) and epoch_of(ckpt) == {"epoch": 3}
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["meta.json", "state.pt"]
    assert checkpoint_problem(ckpt) is None

    # killed after the state but before the metadata: the state is the new one, the metadata the old
    # one, and each file is whole (meta.json is written last and marks a checkpoint complete); the
    # old metadata's record of state.pt no longer matches, so the pair is not taken for a checkpoint
    _run_killed("""
        import torch
        from alchemetric_ray.artifacts.checkpoint import save_checkpoint
        save_checkpoint(sys.argv[2], {"model": {"w": torch.zeros(7)}}, {"epoch": 4})
    """, kill_at=2, target=ckpt)
    assert torch.equal(load_state(ckpt)["model"]["w"], torch.zeros(7)) and epoch_of(ckpt) == {"epoch": 3}
    assert checkpoint_problem(ckpt).startswith("state.pt's sha256 is ")  # zip pads both to one size
    assert latest_complete_checkpoint(tmp_path) is None
    assert "checkpoint epoch 4 (epoch-0003) is incomplete (state.pt's sha256 is " in capsys.readouterr().err


_REEXPORT = """
    import shutil, torch
    from alchemetric_ray.artifacts.export import load_model
    src = Path(sys.argv[2])
    # an export of different weights into the same folder: staged beside it, then swapped in
    loaded = load_model(src)
    staged = fsutil.staging_dir(src)
    shutil.copytree(src, staged, dirs_exist_ok=True)  # its looks/ folder too (evaluate records them)
    state = torch.load(src / "weights.pt", weights_only=True)
    state["model"] = {k: torch.full_like(v, 7.0) for k, v in state["model"].items()}
    torch.save(state, staged / "weights.pt")
    fsutil.replace_dir(staged, src)
"""


@pytest.mark.parametrize("mode, kill_at", [("exchange", 1), ("no-exchange", 1), ("no-exchange", 2)])
@pytest.mark.slow
def test_exported_model_killed_mid_replace_is_the_old_model_whole(stock_model, tmp_path, mode, kill_at):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(stock_model, target)
    before = {k: v.clone() for k, v in load_model(target).model.state_dict().items()}
    _run_killed(_REEXPORT, kill_at=kill_at, target=target, mode=mode)
    # "no-exchange", 2: killed between moving the old folder aside and moving the new one in; the
    # reader puts the old one back before it looks
    after = load_model(target).model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not list(tmp_path.glob(".model.old-*"))


def test_replace_dir_swaps_in_the_new_folder(tmp_path):
    from alchemetric_ray.fsutil import replace_dir, staging_dir

    target = tmp_path / "out"
    target.mkdir()
    (target / "a.txt").write_text("old")
    tmp = staging_dir(target)
    (tmp / "a.txt").write_text("new")
    replace_dir(tmp, target)
    assert (target / "a.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # neither the staging nor the old folder left
