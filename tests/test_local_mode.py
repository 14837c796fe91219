"""A one-worker `train` in the driver's own process (Ray Train's local mode, `train.local_mode`),
Ctrl-C that keeps the work, and `--resume` from what is on disk; worker mode beside it.

The Ctrl-C tests send a real SIGINT (and SIGTERM, SIGHUP) to a real `alchemetric-ray train` (and `tune`)
process, and to its process group as a terminal does; each command starts its own local Ray, as a
user's would.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from alchemetric_ray.config import load_config
from alchemetric_ray.errors import ConfigError
from alchemetric_ray.placement.plan import plan_resources
from alchemetric_ray.training.trainer import run_training, runs_locally, uses_ray

REPO = Path(__file__).resolve().parents[1]
# An LSTM on small batches: epochs of a second or two here, long enough to be interrupted in one
EPOCH_LINE = r"(?:^|\)\S* )epoch {n}/{m} "  # an epoch line, the driver's or a worker's (forwarded plain)
TRAIN = ["model.name=lstm", "model.hidden=16", "features.window=8", "train.batch_size=16",
         "train.patience=0", "storage.name=ctrlc"]


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    return stocknet_shards("AAPL,MSFT,XOM", "features.window=8")


def _cfg(shards, tmp_path, *overrides):
    return load_config(None, [f"data.path={shards}", f"storage.path={tmp_path / 'results'}",
                              f"storage.models_dir={tmp_path / 'models'}", "model.hidden=16", "train.patience=0",
                              "device.name=cpu", *overrides])


# ---- the decision ---------------------------------------------------------------------------------


def test_local_mode_is_chosen_for_one_worker_on_a_local_ray_and_refused_in_one_line_elsewhere(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    one = load_config(None, ["device.name=cpu"])
    plan = plan_resources(one, {"CPU": 4.0})
    local, why = runs_locally(one, plan)
    assert local and "one worker on this machine" in why
    two_cfg = one.replace("scaling.workers=2")
    two = plan_resources(two_cfg, {"CPU": 4.0})
    assert runs_locally(two_cfg, two) == (False, "2 workers (local mode runs one)")
    assert runs_locally(one, plan, nodes=3)[0] is False  # a multi-node Ray: the worker may run elsewhere
    assert runs_locally(one.replace("train.local_mode=false"), plan) == (False, "train.local_mode=false")
    with pytest.raises(ConfigError) as err:
        runs_locally(two_cfg.replace("train.local_mode=true"), two)
    assert str(err.value) == ("config 'train.local_mode': true is refused here: 2 workers (local mode runs one); "
                              "use train.local_mode=auto or false")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a job on a cluster this process joined
    assert "RAY_ADDRESS" in runs_locally(one, plan)[1] and not runs_locally(one, plan)[0]
    with pytest.raises(ConfigError, match="a cluster this process joined"):
        runs_locally(one.replace("train.local_mode=true"), plan)
    monkeypatch.delenv("RAY_ADDRESS")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)  # under torchrun, Ray's local mode would join a process group
    assert not runs_locally(one, plan)[0]


def test_ray_is_used_only_for_what_needs_it():
    """The plan's `ray` line: a sweep (Tune), a worker group (Train) or streamed shards (Ray Data)
    need Ray; a one-worker run in this process that caches its shards reads them with pyarrow."""
    cfg = load_config(None, ["device.name=cpu"])
    assert uses_ray(cfg, True, sweep=True, up=False) == (True, "Ray Tune runs the sweep's trials")
    assert uses_ray(cfg, False, sweep=False, up=False) == (True, "a Ray Train worker group runs the loop")
    assert uses_ray(cfg.replace("train.cache_data=false"), True, sweep=False, up=False) == \
        (True, "Ray Data streams the shards every epoch (train.cache_data=false)")
    needed, why = uses_ray(cfg, True, sweep=False, up=False)
    assert not needed and why.startswith("not started: one worker in this process reads its cached shards with pyarrow")
    needed, why = uses_ray(cfg, True, sweep=False, up=True)  # a notebook's ray.init(): left unused
    assert not needed and why.startswith("up, unused: ")


def test_a_run_planned_without_ray_asks_for_what_ray_would_give(monkeypatch):
    """Planned before any Ray starts: the CPUs a local Ray of ours would advertise, this machine's
    CUDA GPUs (none here, and a probe patched to two: a two-worker DDP plan, which then needs Ray)."""
    from alchemetric_ray.hardware import device
    from alchemetric_ray.placement.session import local_ray_cpus, machine_resources

    assert machine_resources() == {"CPU": float(local_ray_cpus()), "GPU": 0.0}
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(device.torch.cuda, "device_count", lambda: 2)
    cfg = load_config(None, [])
    plan = plan_resources(cfg, machine_resources())
    assert (plan.num_workers, plan.use_gpu) == (2, True)
    local, _ = runs_locally(cfg, plan)
    assert uses_ray(cfg, local, sweep=False, up=False) == (True, "a Ray Train worker group runs the loop")


# ---- a run in the driver ----------------------------------------------------------------------------


def test_a_local_run_keeps_checkpoints_scalars_and_the_export_as_a_worker_run_does(ray_session, shards, tmp_path,
                                                                                    capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ours = logging.getLogger("alchemetric_ray")
    threads, level = torch.get_num_threads(), ours.level
    out = run_training(_cfg(shards, tmp_path, "train.epochs=4", "storage.num_to_keep=2", "storage.name=local",
                            "train.metric=val_log_loss"))
    said = capsys.readouterr().out
    assert "train loop       in this process (Ray Train local mode) (one worker on this machine" in said
    assert [h["epoch"] for h in out.summary.history] == [1, 2, 3, 4]  # epochs by their number, from 1
    # the run folder in Ray Train's layout: the 2 best epochs by val_log_loss, and the latest
    loss = {h["epoch"]: h["val_log_loss"] for h in out.summary.history}
    # epoch numbers from 1; their checkpoint folders from 0 (epoch-0000 holds epoch 1)
    want = {f"epoch-{e - 1:04d}" for e in {*sorted(loss, key=loss.get)[:2], 4}}
    run_dir = Path(out.run_path)
    assert {p.name for p in run_dir.glob("epoch-*")} == want
    for folder in run_dir.glob("epoch-*"):
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["state_file"]["size"] == (folder / "state.pt").stat().st_size
    assert out.best_metrics["epoch"] == min(loss, key=loss.get)
    # the export is the best epoch's checkpoint
    assert (out.model_dir / "weights.pt").is_file()
    assert json.loads((out.model_dir / "metrics.json").read_text())["best_epoch"] == min(loss, key=loss.get)
    # every epoch's scalars in TensorBoard, read back
    events = EventAccumulator(str(out.tensorboard)).Reload()
    assert [e.step for e in events.Scalars("train_loss")] == [1, 2, 3, 4]  # TensorBoard's step: the epoch's number
    assert [e.value for e in events.Scalars("val_log_loss")] == pytest.approx([loss[e] for e in range(1, 5)], rel=1e-6)
    # and its hyperparameters with the best epoch's figures in the HParams tab, read back as TensorBoard does
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams = EventAccumulator(str(Path(out.tensorboard.path) / "hparams")).Reload()
    content = hparams.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["train.epochs"].number_value == 4 and start.hparams["model.name"].string_value == "mlp"
    assert start.hparams["storage.name"].string_value == "local"
    best = out.best_metrics
    assert [e.value for e in hparams.Scalars("hparam/val_log_loss")] == pytest.approx([best["val_log_loss"]])
    assert [e.value for e in hparams.Scalars("hparam/epochs_run")] == [4]
    # the driver is left as it was: threads, our loggers, and the global generator that the loop seeds
    # (the export draws from it to build its model, as in worker mode: so once more without one)
    assert torch.get_num_threads() == threads and ours.level == level
    rng = torch.random.get_rng_state()
    run_training(_cfg(shards, tmp_path, "train.epochs=1", "storage.name=local2"), export=False)
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_resume_after_a_truncated_checkpoint_uses_the_one_before(ray_session, shards, tmp_path, capfd):
    args = ["train.epochs=5", "storage.num_to_keep=5", "storage.name=trunc", "storage.run=trunc",
            "train.deterministic=true"]
    run_training(_cfg(shards, tmp_path, *args, "train.stop_after=3"), export=False)
    state = tmp_path / "results" / "trunc" / "epoch-0002" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # the last save cut short (a full disk, a killed process)
    capfd.readouterr()
    out = run_training(_cfg(shards, tmp_path, *args, "storage.resume=true"), export=False)
    said = "".join(capfd.readouterr())
    warning = [ln for ln in said.splitlines() if ln.startswith("warning: checkpoint epoch 3 (epoch-0002)")]
    assert len(warning) == 1 and warning[0].endswith("; using epoch 2 (epoch-0001)"), said[-3000:]
    assert "state.pt is 100 bytes, meta.json says" in warning[0]
    assert "resumed from the checkpoint of epoch 2 (epoch-0001): continuing at epoch 3 of 5" in said
    assert [h["epoch"] for h in out.summary.history] == [1, 2, 3, 4, 5]
    assert out.summary.epochs_per_rank == [3]  # epochs 3, 4 and 5 ran again here


# ---- Ctrl-C ------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    """A user's shell: no cluster to join (each command starts its own local Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _cli(tmp_path, shards, command: str, *args: str) -> subprocess.Popen:
    env = _env()
    argv = [command, "--device", "cpu", "--data", str(shards), f"storage.path={tmp_path / 'results'}",
            f"storage.models_dir={tmp_path / 'models'}", *args]
    return subprocess.Popen([sys.executable, "-m", "alchemetric_ray.cli", *argv], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _interrupt_after(proc: subprocess.Popen, pattern: str, *, group: bool, timeout: float = 600,
                     sig: int = signal.SIGINT, during: list[int] | None = None) -> tuple[str, str]:
    """Read the process's stdout until a line matches ``pattern``, send ``sig`` (to the process, or to
    its process group as a terminal's Ctrl-C does), and return all it printed.  ``during``: gets the
    number of processes the command had started (its Ray's) when the signal was sent."""
    from test_no_loss import _session_processes

    seen, deadline = [], time.monotonic() + timeout
    try:
        for line in proc.stdout:
            seen.append(line)
            if re.search(pattern, line):
                if during is not None:
                    during.append(len(_session_processes(proc.pid)) - 1)
                (os.killpg(proc.pid, sig) if group else proc.send_signal(sig))
                break
            if time.monotonic() > deadline:
                break
        out, err = proc.communicate(timeout=300)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return "".join(seen) + out, err


def _resume_line(err: str) -> list[str]:
    """The one line a Ctrl-C ends with, and the argv of the command it names."""
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupted ")]
    assert len(lines) == 1, err[-3000:]
    command = lines[0].split("; continue with: ", 1)[1]
    argv = shlex.split(command)
    assert argv[0] == "alchemetric-ray" and argv[-1] == "--resume"
    return argv[1:]


def _epochs_printed(out: str, total: int) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(EPOCH_LINE.format(n=r"(\d+)", m=total), out, re.M)]


@pytest.mark.slow
def test_three_stops_keep_the_finished_epochs_and_each_resume_continues_after_them(stocknet_shards, tmp_path):
    """One local-mode `train` (no Ray started) stopped three times and resumed each time, as a user
    and a scheduler stop it: a Ctrl-C to the process after epoch 2, a Ctrl-C to its process group (a
    terminal's) after epoch 3, a SIGTERM after epoch 4 (exit 143, one line, no process left); the
    last resume runs to the end.  Each stop keeps exactly the epochs whose lines were printed and
    exports nothing; each resume continues after them, no epoch twice; MLflow (an embedded store)
    holds the finished epochs at each stop (KILLED) and every step once at the end, in one run.  The
    shards were built with settings of their own and are trained on without naming them: the saved
    config says them."""
    from test_no_loss import _session_processes

    names = "ret_1,ret_5,vol_20,rsi_14"
    shards = stocknet_shards("AAPL,MSFT,XOM", "features.window=8", "features.horizon=2", f"features.names={names}")
    total, store = 8, f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _cli(tmp_path, shards, "train", *TRAIN, f"train.epochs={total}", f"storage.num_to_keep={total}",
                f"tracking.mlflow_uri={store}")
    run_id, after = None, 0
    for done, sig, group in ((2, signal.SIGINT, False), (3, signal.SIGINT, True), (4, signal.SIGTERM, False)):
        out, err = _interrupt_after(proc, EPOCH_LINE.format(n=done, m=total), group=group, sig=sig)
        by = " by SIGTERM" if sig == signal.SIGTERM else ""
        assert proc.returncode == 128 + sig, (proc.returncode, err[-3000:])
        assert re.search(rf"^interrupted{by} after epoch {done} of {total}; continue with: ", err, re.M), err[-3000:]
        assert "Traceback" not in err + out and "SIGTERM received" not in err, err[-3000:]
        assert _epochs_printed(out, total) == list(range(after + 1, done + 1)), out[-3000:]
        if after:
            assert (f"resumed from the checkpoint of epoch {after} (epoch-{after - 1:04d}): continuing at epoch "
                    f"{after + 1} of {total}" in out + err), out[-3000:]
        run_dir = next((tmp_path / "results").glob("ctrlc-*"))
        kept = sorted(p.name for p in run_dir.glob("epoch-*") if (p / "meta.json").is_file())
        assert kept[-1] == f"epoch-{done - 1:04d}", kept
        assert not (tmp_path / "models").exists()  # nothing exported from an interrupted run
        (rid, status), steps = _mlflow_run(store)
        assert status == "KILLED" and steps == list(range(1, done + 1)) and rid == (run_id or rid), (status, steps)
        run_id = rid
        # a one-worker local run reads its cached shards with pyarrow and starts no Ray: no session,
        # and nothing of the stopped process is left
        ray_line = [ln for ln in out.splitlines() if ln.startswith("ray  ")]
        assert ray_line[0].startswith("ray              not started: one worker in this process reads its cached "
                                      "shards with pyarrow") and "ray: session logs in " not in out, out[-3000:]
        assert _session_processes(proc.pid) == []
        after = done
        proc = subprocess.Popen([sys.executable, "-m", "alchemetric_ray.cli", *_resume_line(err)], cwd=tmp_path,
                                env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    assert f"continuing at epoch {after + 1} of {total}" in out + err and \
        _epochs_printed(out, total) == list(range(after + 1, total + 1)), out[-3000:]
    assert (tmp_path / "models" / "ctrlc" / "weights.pt").is_file()
    assert _mlflow_run(store) == ((run_id, "FINISHED"), list(range(1, total + 1)))  # every epoch's step once
    features = json.loads((tmp_path / "models" / "ctrlc" / "config.json").read_text())["features"]
    assert (features["horizon"], features["names"]) == (2, names.split(","))


@pytest.mark.slow
def test_a_worker_group_stopped_four_ways_keeps_the_finished_epochs_and_each_resume_continues_after_them(shards,
                                                                                                       tmp_path):
    """One worker-mode `train` (a Ray Train worker group: a Ray starts) stopped as a user and a scheduler
    stop it, and resumed after each stop (local mode's stops: the test above):

    1. SIGHUP (a closed terminal) while the worker group starts: exit 129, one line that says to run the
       same command again, nothing kept;
    2. that command again, Ctrl-C to its process group (Ray Train's own SIGINT handler) after epoch 2;
    3. its resume, SIGTERM to the process mid-epoch: exit 143, one line naming the command that resumes;
    4. that resume in local mode (``train.local_mode=true``), Ctrl-C after one epoch: a complete
       checkpoint newer than any Ray Train's snapshot lists (local mode never writes the snapshot, and
       after a stop it lags behind the reports all the same);
    5. the worker-mode resume again, to the end: it prefers that checkpoint on disk over Ray's snapshot,
       runs each remaining epoch once, and ranks and prunes the folders the snapshot never listed.

    Each stop keeps the epochs it says and exports nothing; each worker-mode stop leaves no process of
    its Ray, nothing half-written."""
    from test_no_loss import _clean_stop, processes_left

    total = 20  # worker mode trains on while Ray's controller stops the group: room for two such stops
    args = [*TRAIN, f"train.epochs={total}", "storage.num_to_keep=1", "train.metric=val_log_loss",
            "train.local_mode=false"]
    results, models = tmp_path / "results", tmp_path / "models"

    def stop(proc: subprocess.Popen, pattern: str, sig: int, *, group: bool = False) -> tuple[str, str, int]:
        """Stop ``proc`` once a line matches ``pattern``: its output, and how many processes (its Ray's) it
        had when signalled; its exit code is checked, and that every one of them ended within 10 s."""
        during: list[int] = []
        out, err = _interrupt_after(proc, pattern, group=group, sig=sig, during=during)
        assert proc.returncode == 128 + sig, (proc.returncode, out[-2000:], err[-3000:])
        left = processes_left(proc.pid)
        assert left == [], left
        # nothing half-written: no stage beside any output, and no output that was not finished
        assert not list(tmp_path.rglob(".*.tmp-*")) and not [p for p in models.rglob("*") if p.is_file()]
        return out, err, during[0] if during else -1

    def resume(argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "alchemetric_ray.cli", *argv], cwd=tmp_path, env=_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    def kept(run_dir: Path) -> list[str]:
        return sorted(p.name for p in run_dir.glob("epoch-*") if (p / "meta.json").is_file())

    def listed_by_ray(run_dir: Path) -> set[str]:
        return set(re.findall(r'"checkpoint_dir_name": ?"(epoch-\d+)"',
                              (run_dir / "checkpoint_manager_snapshot.json").read_text()))

    def says_worker_group(out: str) -> None:  # a worker group starts a Ray, and says so
        ray_line = [ln for ln in out.splitlines() if ln.startswith("ray  ")]
        assert ray_line == ["ray              a Ray Train worker group runs the loop"], out[-3000:]
        assert "ray: session logs in " in out, out[-3000:]
        # its one worker reads the cached shards itself (pyarrow), without Ray Data
        assert re.search(r"^left for data +\S+ CPU  \(the worker reads its cached shards once with pyarrow: no Ray "
                         r"Data\)$", out, re.M), out[-3000:]

    # 1. SIGHUP while the worker group starts (Ray is up): nothing to resume, the same command again
    out, err, during = stop(_cli(tmp_path, shards, "train", *args), r"^resource plan", signal.SIGHUP)
    _clean_stop(err, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIGHUP" in lines[0], err[-3000:]
    assert "; continue with: " not in lines[0] and lines[0].endswith("run the same command again"), lines
    assert during >= 1, during
    assert not list(results.glob("ctrlc-*/epoch-*"))

    # 2. the same command, Ctrl-C to its process group after epoch 2 (a worker's epoch lines reach the
    # driver's stdout as the worker printed them)
    out, err, during = stop(_cli(tmp_path, shards, "train", *args), EPOCH_LINE.format(n=2, m=total), signal.SIGINT,
                            group=True)
    found = re.search(rf"^interrupted after epoch (\d+) of {total}; continue with: ", err, re.M)
    assert found, (out[-2000:], err[-3000:])
    done = int(found.group(1))
    # the line reaches the driver a little after the worker wrote it, and Ray's controller takes a
    # few seconds to stop the worker group, which trains on meanwhile: later, but before the end
    assert 2 <= done < total - 3, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert during >= 1, during
    run_dir = sorted(results.glob("ctrlc-*"))[-1]  # the newest: this command's (1.'s is older)
    assert kept(run_dir)[-1] == f"epoch-{done - 1:04d}", kept(run_dir)
    assert not models.exists()  # nothing exported from an interrupted run
    says_worker_group(out)
    worker_resume = _resume_line(err)

    # 3. its resume, SIGTERM to the process mid-epoch (after the first epoch line it prints)
    out, err, during = stop(resume(worker_resume), EPOCH_LINE.format(n=done + 1, m=total), signal.SIGTERM)
    assert (f"resumed from the checkpoint of epoch {done} (epoch-{done - 1:04d}): continuing at epoch {done + 1} of "
            f"{total}" in out + err), out[-3000:]
    _clean_stop(err, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0], err[-3000:]
    assert "; continue with: alchemetric-ray " in lines[0], lines
    found = re.search(rf"^interrupted by SIGTERM after epoch (\d+) of {total}; continue with: ", lines[0])
    assert found and done < int(found.group(1)) < total - 1, lines
    done = int(found.group(1))
    assert during >= 1, during
    assert kept(run_dir)[-1] == f"epoch-{done - 1:04d}", kept(run_dir)
    says_worker_group(out)
    assert _resume_line(err) == worker_resume  # the same command (--resume is in it already)

    # 4. that resume in local mode, Ctrl-C after its one epoch: a checkpoint Ray's snapshot never lists
    local_resume = [*worker_resume[:-1], "train.local_mode=true", "--resume"]
    out, err, _ = stop(resume(local_resume), EPOCH_LINE.format(n=done + 1, m=total), signal.SIGINT)
    assert "train loop       in this process (Ray Train local mode)" in out, out[-3000:]
    assert (f"resumed from the checkpoint of epoch {done} (epoch-{done - 1:04d}): continuing at epoch {done + 1} of "
            f"{total}" in out + err), out[-3000:]
    assert re.search(rf"^interrupted after epoch {done + 1} of {total}; continue with: ", err, re.M), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert _epochs_printed(out, total) == [done + 1], out[-3000:]
    done += 1
    assert kept(run_dir)[-1] == f"epoch-{done - 1:04d}", kept(run_dir)
    listed = listed_by_ray(run_dir)  # Ray Train's snapshot: behind what is on disk
    assert listed and max(listed) < f"epoch-{done - 1:04d}", (listed, done)
    assert not models.exists()

    # 5. the worker-mode resume again, to the end: from the newest complete checkpoint on disk
    finished = subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", *worker_resume], cwd=tmp_path,
                              capture_output=True, text=True, timeout=900, env=_env())
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (f"resumed from the checkpoint of epoch {done} (epoch-{done - 1:04d}): continuing at epoch {done + 1} of "
            f"{total}" in finished.stdout + finished.stderr), finished.stdout[-3000:]
    assert _epochs_printed(finished.stdout, total) == list(range(done + 1, total + 1))  # each remaining epoch once
    assert (models / "ctrlc" / "weights.pt").is_file()
    says_worker_group(finished.stdout)
    # the folder the snapshot never listed is ranked and pruned like Ray's own: what stays is the best
    # epoch and the latest, and whatever Ray's snapshot still lists (Ray's to prune)
    history = json.loads((run_dir / f"epoch-{total - 1:04d}" / "meta.json").read_text())["loop"]["history"]
    loss = {h["epoch"]: h["val_log_loss"] for h in history}
    assert sorted(loss) == list(range(1, total + 1)), sorted(loss)
    best = min(loss, key=loss.get)
    best_and_latest = {f"epoch-{e - 1:04d}" for e in {best, total}}  # numbers from 1, folders from 0
    assert {p.name for p in run_dir.glob("epoch-*")} == best_and_latest | listed_by_ray(run_dir)
    if best != done:
        assert not (run_dir / f"epoch-{done - 1:04d}").exists()


def _mlflow_run(store: str) -> tuple[tuple[str, str], list[int]]:
    """The store's one run: (its id, its status), and the steps of its train_loss metric, in order."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store)
    runs = [run for exp in client.search_experiments() for run in client.search_runs([exp.experiment_id])]
    assert len(runs) == 1, runs
    info = runs[0].info
    return (info.run_id, info.status), sorted(m.step for m in client.get_metric_history(info.run_id, "train_loss"))
