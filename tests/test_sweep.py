"""Ray Tune sweeps for real: ASHA stops a bad trial, the best is exported, TensorBoard reads it all,
and a sweep whose driver was killed resumes without re-running finished trials."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_no_loss import processes_left
from test_tune_lines import assert_no_ray_tune_lines

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.config import load_config
from alchemetric_ray.errors import ConfigError, SweepError
from alchemetric_ray.placement.plan import plan_resources
from alchemetric_ray.sweeps.resources import concurrency
from alchemetric_ray.sweeps.space import build_space

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    # six stocks: enough for a validation long-short book (5 or more a date), whose moments the
    # deflated Sharpe ratio of the chosen trial needs
    return stocknet_shards("AAPL,MSFT,XOM,JPM,GE,WMT")


def _sweep_args(shards, tmp_path, *extra):
    return [f"data.path={shards}", f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
            "storage.name=sw", "model.hidden=16", "train.epochs=3", "train.patience=0", "train.batch_size=512",
            "train.metric=val_log_loss", "train.mode=min", "tune.search=grid", "tune.max_concurrent_trials=1",
            "tune.grace_period=1", *extra]


def _trial_tasks(before: dict | None = None, trials: int = 0, wait_s: float = 30) -> dict[str, list[str]]:
    """The Ray tasks each one-worker trial started from its process, by name, per call of Tune's
    ``ImplicitFunc.train`` in the trial (Tune calls it for each result; the first starts the loop);
    ``before``: the calls to leave out.  Ray's state API hears of tasks a little after they ran (each process
    reports them every second): waits until ``trials`` calls have started a task, or ``wait_s`` has passed."""
    from ray.util.state import list_tasks

    deadline = time.monotonic() + wait_s
    while True:
        runs = [t.task_id for t in list_tasks(filters=[("func_or_class_name", "=", "ImplicitFunc.train")],
                                              raise_on_missing_output=False) if t.task_id not in (before or {})]
        started = {run: [t.name for t in list_tasks(filters=[("parent_task_id", "=", run)], detail=True,
                                                    raise_on_missing_output=False)] for run in runs}
        if sum(1 for names in started.values() if names) >= trials or time.monotonic() > deadline:
            return started
        time.sleep(1)


@pytest.mark.slow
def test_a_trial_told_not_to_cache_streams_its_shards_through_ray_data(ray_session, shards, tmp_path, capsys):
    """``train.cache_data=false``: the one-worker trial streams its shards every epoch from Ray Data, which its
    process starts (the cached trials of the test below start none); the plan says which."""
    from alchemetric_ray.sweeps.sweep import run_sweep

    before = _trial_tasks()
    cfg = load_config(None, _sweep_args(shards, tmp_path, "tune.space={train.lr: [0.01]}", "train.epochs=1",
                                        "train.cache_data=false"))
    out = run_sweep(cfg, export=False, progress=False)
    assert [t.epochs_run for t in out.summary.trials] == [1]
    started = _trial_tasks(before, trials=1)
    assert "ReadParquet" in sum(started.values(), []), started
    said = capsys.readouterr().out
    assert "data path        streamed from Ray Data (train.cache_data=false)" in said, said
    assert "left for data    " in said and "with pyarrow" not in said, said


# ---- the search space and the concurrency plan (no Ray needed) -----------------------------------


def test_space_kinds():
    cfg = load_config(None, ["tune.space={train.lr: {loguniform: [0.0001, 0.01]}, model.name: [mlp, gru], "
                             "model.hidden: {choice: [16, 32]}, train.batch_size: {grid: [256, 512]}, "
                             "model.dropout: 0.2}"])
    space = build_space(cfg)
    assert space["model.dropout"] == 0.2
    assert space["train.batch_size"] == {"grid_search": [256, 512]}
    assert space["model.name"].categories == ["mlp", "gru"]
    assert 0.0001 <= space["train.lr"].sample() <= 0.01
    grid = build_space(cfg.replace("tune.space={train.lr: [0.1, 0.01], model.name: [mlp]}", "tune.search=grid"))
    assert grid == {"train.lr": {"grid_search": [0.1, 0.01]}, "model.name": {"grid_search": ["mlp"]}}


@pytest.mark.parametrize("space, message", [
    ("{}", "config 'tune.space' is empty"),
    ("{train.lrr: [0.1]}", "unknown config key 'train.lrr'; did you mean 'train.lr'?"),
    ("{train.lr: {normal: [0, 1]}}", "config 'tune.space.train.lr': {'normal': [0, 1]} must be one of"),
    ("{train.lr: {loguniform: [0, 1]}}", "loguniform [0, 1] needs 0 < low < high"),
    ("{train.lr: {uniform: [1]}}", "uniform needs [low, high]"),
    ("{train.epochs: [1.5]}", "config 'train.epochs': expected an integer, got 1.5"),
])
def test_space_errors_name_the_key(space, message):
    with pytest.raises(ConfigError) as err:
        build_space(load_config(None, [f"tune.space={space}"]))
    assert message in str(err.value)


def test_grid_search_needs_lists():
    with pytest.raises(ConfigError, match="tune.search=grid needs a list of values, got loguniform"):
        build_space(load_config(None, ["tune.search=grid", "tune.space={train.lr: {loguniform: [0.001, 0.1]}}"]))


def test_optuna_search_uses_tunes_own_integration():
    from ray.tune.search.optuna import OptunaSearch

    from alchemetric_ray.sweeps.tuner import _searcher

    assert isinstance(_searcher(load_config(None, ["tune.search=optuna"])), OptunaSearch)
    assert _searcher(load_config(None, ["tune.search=random"])) is None


def test_concurrency_fits_the_cluster():
    cfg = load_config(None, ["scaling.cpus_per_worker=1"])
    plan = plan_resources(cfg, {"CPU": 4.0})
    assert concurrency(cfg, plan, {"CPU": 4.0}) == 2  # (4 - 1 for Ray Data) // (1 worker CPU + 0.1 driver)
    assert concurrency(cfg, plan, {"CPU": 2.0}) == 1  # a 2-CPU laptop runs one trial at a time
    assert concurrency(cfg.replace("tune.max_concurrent_trials=3"), plan, {"CPU": 2.0}) == 3


def test_a_one_worker_trial_holds_its_worker_and_a_worker_group_keeps_its_driver():
    """What a trial holds and what a sweep asks the autoscaler for: a one-worker trial runs the loop
    in its own process and holds the worker's CPU; a trial of several workers (or with
    tune.trial_loop=trainer) is a driver with a sliver of a CPU beside its TorchTrainer's workers."""
    from alchemetric_ray.sweeps.resources import TRIAL_DRIVER_CPU, runs_in_trial, sweep_bundles, trial_resources

    cfg = load_config(None, ["scaling.cpus_per_worker=1"])
    one = plan_resources(cfg, {"CPU": 4.0})
    assert one.num_workers == 1 and runs_in_trial(cfg, one)
    assert trial_resources(cfg, one) == {"CPU": 1}
    trainer = cfg.replace("tune.trial_loop=trainer")
    assert not runs_in_trial(trainer, one) and trial_resources(trainer, one) == {"CPU": TRIAL_DRIVER_CPU}
    two_cfg = cfg.replace("scaling.workers=2")
    two = plan_resources(two_cfg, {"CPU": 4.0})
    assert not runs_in_trial(two_cfg, two) and trial_resources(two_cfg, two) == {"CPU": TRIAL_DRIVER_CPU}
    assert sweep_bundles(two_cfg, two, 2)[:3] == [{"CPU": 1}, {"CPU": 1}, {"CPU": TRIAL_DRIVER_CPU}]
    assert sweep_bundles(cfg, one, 2)[:2] == [{"CPU": 1}, {"CPU": 1}]
    with pytest.raises(ConfigError, match="tune.trial_loop"):
        cfg.replace("tune.trial_loop=inline")


# ---- real sweeps ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_grid_sweep_asha_stops_the_bad_lr_and_exports_the_best(ray_session, shards, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from alchemetric_ray.sweeps.sweep import run_sweep

    # the good learning rate first: with one trial at a time ASHA has seen it when the bad one reaches rung 1
    # asked to score the test segment (`tune --evaluate`): the one look, recorded in the model folder
    cfg = load_config(None, _sweep_args(shards, tmp_path, "tune.space={train.lr: [0.01, 1.0e-9]}",
                                        "train.score_test=true"))
    before = _trial_tasks()
    out = run_sweep(cfg)
    s = out.summary
    # each one-worker trial read its cached shards with pyarrow: it started no Ray Data (no read task, no actor)
    started = _trial_tasks(before, trials=1, wait_s=4)  # (a trial that streams is seen within a second or two)
    assert len(started) >= 2 and not any(started.values()), started
    said = capsys.readouterr().out
    assert ("left for data    7 CPU  (each trial reads its cached shards once with pyarrow, in its own process: no "
            "Ray Data)") in said, said
    assert s.num_trials == 2 and {t.status for t in s.trials} == {"TERMINATED"}
    by_lr = {t.config["train.lr"]: t for t in s.trials}
    assert by_lr[1e-9].stopped_early and by_lr[1e-9].epochs_run < 3
    assert by_lr[0.01].epochs_run == 3 and not by_lr[0.01].stopped_early
    best = min(s.trials, key=lambda t: t.best_value)
    assert s.best_trial_id == best.trial_id and s.best_value == best.best_value
    assert best.config["train.lr"] != 1e-9
    # the best trial exported as the same artifact `train` makes, scored on test once
    metrics = json.loads((out.model_dir / "metrics.json").read_text())
    assert metrics["sweep"]["num_trials"] == 2 and metrics["sweep"]["best_trial_id"] == s.best_trial_id
    assert metrics["val"]["log_loss"] == pytest.approx(s.best_value)
    assert s.test_metrics == metrics["test"]
    assert [look["command"] for look in ledger.looks(out.model_dir)] == ["tune (train.score_test)"]
    trials = json.loads((out.model_dir / "trials.json").read_text())["entries"]
    assert [(e["command"], e["sweep"], e["trials"]) for e in trials] == [("tune", out.name, 2)]
    assert json.loads((out.model_dir / "config.json").read_text())["train"]["lr"] == best.config["train.lr"]
    assert out.report.is_file() and s.best_confusion is not None
    # one worker per trial: each trial ran the loop in its own process, so there is no Train run beside
    # the sweep, and the exported checkpoint is one Tune kept in the best trial's own folder
    assert [p.name for p in (tmp_path / "results").iterdir() if p.name.startswith("sweep-")] == [out.name]
    assert Path(s.best_checkpoint).parent.parent == Path(out.path)
    assert (Path(s.best_checkpoint) / "meta.json").is_file()
    # every trial's validation long-short moments at its best epoch (the ASHA-stopped one's too), and their
    # variance across the trials: what deflates the chosen trial's validation Sharpe ratio
    assert all(np.isfinite(t.val_long_short["sr"]) and t.val_long_short["days"] > 100 for t in s.trials)
    srs = [t.val_long_short["sr"] for t in s.trials]
    assert s.trial_sr_variance == pytest.approx(np.var(srs, ddof=1))
    assert metrics["sweep"]["trial_sr_variance"] == s.trial_sr_variance
    assert metrics["sweep"]["chosen_val_long_short"] == best.val_long_short
    # TensorBoard's own reader finds every trial's scalars and hyperparameters
    event_files = sorted(Path(out.path).glob("*/events.out.tfevents.*"))
    assert len(event_files) == 2
    seen_lrs = set()
    for f in event_files:
        acc = EventAccumulator(str(f.parent))
        acc.Reload()
        assert "ray/tune/val_log_loss" in acc.Tags()["scalars"]
        assert len(acc.Scalars("ray/tune/val_log_loss")) >= 1
        hp = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"]).session_start_info
        seen_lrs.add(start.hparams["train.lr"].number_value)
    assert seen_lrs == {0.01, 1e-9}
    # a sweep whose saved state names a module of ours that is gone (as one saved before issue 48
    # renamed tune/ to sweeps/ does: alchemetric_ray.tune.trial) is refused in one line on --resume
    old = tmp_path / "results" / "sweep-before-rename"
    shutil.copytree(out.path, old)
    pickled = (old / "tuner.pkl").read_bytes()
    assert b"alchemetric_ray.sweeps" in pickled
    (old / "tuner.pkl").write_bytes(pickled.replace(b"alchemetric_ray.sweeps", b"alchemetric_ray.sweepz"))
    with pytest.raises(SweepError) as refused:
        run_sweep(cfg.replace("storage.run=sweep-before-rename", "storage.resume=true"))
    assert "saved by an older alchemetric-ray (its state names the module alchemetric_ray.sweepz" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_trials_one_after_another_share_one_process_and_one_leaves_nothing_to_the_next(ray_session, shards, tmp_path):
    """Tune reuses a one-worker trial's process for the next trial (``reuse_actors``: no fresh Python, Ray, torch
    and package per trial), and a trial trains there exactly as it would first: two trials of the same config,
    the second after the first in the same process, report the same numbers at every epoch (the seed, the
    model, the optimizer, the cached shard and the threads are the trial's own, not the previous one's)."""
    from alchemetric_ray.sweeps.sweep import run_sweep

    cfg = load_config(None, _sweep_args(shards, tmp_path, "tune.space={train.lr: [0.003, 0.003]}", "train.epochs=2",
                                        "tune.scheduler=none"))
    out = run_sweep(cfg)
    assert out.summary.num_trials == 2
    results = [[json.loads(line) for line in (Path(out.path) / trial / "result.json").read_text().splitlines()]
               for trial in sorted(p.name for p in Path(out.path).glob("_trial_*"))]
    assert len({r["pid"] for rows in results for r in rows}) == 1, results  # one process ran both trials
    assert [len(rows) for rows in results] == [2, 2]
    keys = ("val_log_loss", "val_rank_ic", "train_loss")
    assert [[r[k] for k in keys] for r in results[0]] == [[r[k] for k in keys] for r in results[1]]


# tune.trial_loop=trainer (a TorchTrainer run per trial): the sweep of
# tests/test_side_by_side.py, which runs beside a two-worker train and checks what this test checked.


# ---- one sweep stopped three ways, resumed after each ------------------------------------------------


CLI = [sys.executable, "-m", "alchemetric_ray.cli"]


def _shell_env(**extra: str) -> dict[str, str]:
    """A user's shell: no cluster to join (each command starts its own local Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _start(cwd: Path, argv: list[str], *, quiet: bool = False, **env: str) -> subprocess.Popen:
    """The command line in a session of its own (every Ray process it starts stays in it)."""
    out = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen([*CLI, *argv], cwd=cwd, env=_shell_env(**env), stdin=subprocess.DEVNULL, stdout=out,
                            stderr=out, text=True, start_new_session=True)


def _stop_on_line(proc: subprocess.Popen, pattern: str, sig: int, *, group: bool):
    """Read the command's stdout until a line matches ``pattern``, send ``sig`` (to its process group, as
    a terminal's Ctrl-C does, or to the process, as a scheduler does) and return (exit code, stdout,
    stderr, the run's processes besides the command when it was signalled, those left 10 s after)."""
    from test_no_loss import _session_processes

    seen, during, deadline = [], None, time.monotonic() + 600
    try:
        for line in proc.stdout:
            seen.append(line)
            if re.search(pattern, line):
                during = len(_session_processes(proc.pid)) - 1
                (os.killpg if group else os.kill)(proc.pid, sig)
                break
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
        out, err = proc.communicate(timeout=300)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out = "".join(seen) + out
    assert during is not None, (out[-3000:], err[-3000:])  # the line came while the sweep ran
    return proc.returncode, out, err, during, processes_left(proc.pid)


def _resume_argv(err: str) -> list[str]:
    """The one line a stop ends with, and the argv of the command it names (the same, with `--resume`)."""
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupted ")]
    assert len(lines) == 1, err[-3000:]
    argv = shlex.split(lines[0].split("; continue with: ", 1)[1])
    assert argv[0] == "alchemetric-ray" and argv[-1] == "--resume", argv
    return argv[1:]


def _finished_trials(sweep_dir: Path) -> dict[str, list[str]]:
    """The trials whose last (second) epoch's checkpoint is complete, with the checkpoints each keeps."""
    done = [p.parent for p in sweep_dir.glob("*/checkpoint_000001") if (p / "meta.json").is_file()]
    return {run.name: sorted(p.name for p in run.glob("checkpoint_*")) for run in done}


def _recorded_finished(sweep_dir: Path) -> set[str]:
    """The trial folders that Tune's newest saved experiment state records as finished (what a resume after a
    SIGKILL keeps); empty while no state is saved or while its file is being rewritten."""
    # newest by the start time in its name: Tune rewrites the older files too as it saves (their mtimes tie)
    states = sorted(sweep_dir.glob("experiment_state-*.json"))
    try:
        trials = [json.loads(t) for t, _ in json.loads(states[-1].read_text())["trial_data"]] if states else []
    except (OSError, ValueError, KeyError):
        return set()
    return {t["relative_logdir"] for t in trials if t.get("status") == "TERMINATED" and t.get("relative_logdir")}


def _trial_ids(trials) -> set[str]:
    """Tune's trial ids (`81a65_00004`) in trial folder names: a trial re-run in a new folder counts once."""
    return {re.search(r"_([0-9a-f]{5}_\d{5})_", name).group(1) for name in trials}


@pytest.mark.slow
def test_one_sweep_over_label_kinds_stopped_three_ways_keeps_its_state_and_each_resume_continues(tmp_path):
    """One `tune` over issue 18's space, stopped as a user and a scheduler stop it and resumed each time:
    a Ctrl-C to its process group (a terminal's) once a trial has finished, a SIGTERM to the resumed
    process once another has (exit 143, one line, no Ray process left), then the resumed driver killed
    with its Ray (SIGKILL: nothing saved but what Tune saved as it went); the same command run again
    (storage.run named) resumes and runs to the end.  Each stop prints no summary and exports
    nothing; each resume keeps the finished trials as they were and none trains its epochs twice.  The
    label kind varies across trials (a class target and a cross-sectional one), so each label gets its
    own shards from the same bars, each trial reads its own, and the trials are ranked by val_rank_ic,
    which every target reports (train.metric=auto)."""
    from alchemetric_ray.data.manifest import Manifest

    # an LSTM on small batches: trials of about two seconds (Tune reuses the trial's process, so a trial is its
    # training), long enough for a signal to land in the next
    argv = ["tune", "--device", "cpu", "data.source=synthetic", "data.synthetic_tickers=24", "data.synthetic_days=520",
            f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}", "storage.name=kinds",
            "model.name=lstm", "model.hidden=16", "features.window=8", "train.batch_size=16", "train.epochs=2",
            "tune.search=grid", "tune.scheduler=none", "tune.max_concurrent_trials=1",
            "tune.space={features.label: [three_class, cs_rank], train.lr: [0.01, 0.003, 0.001]}"]
    # six trials: the first two stops end after at most four, so the third (once Tune's saved state records one
    # more finished) always kills a sweep that has trials left
    total, kept = 6, {}  # kept: each finished trial's checkpoints, as they were when it had finished

    def stopped(code: int, sig: int, out: str, err: str, during: int, left: list[int]) -> None:
        assert code == 128 + sig, (code, out[-2000:], err[-3000:])
        assert "Traceback" not in err + out and "SIGTERM received" not in err and "logging.cc" not in err, err[-3000:]
        assert during >= 1 and left == [], (during, left)  # the sweep's Ray started, and every process of it ended
        assert "configurations tried" not in out, out[-3000:]  # no summary of a partial sweep
        assert not (tmp_path / "models").exists()  # and no export
        assert not list(tmp_path.rglob(".*.tmp-*"))  # nothing half-written beside an output

    # 1. Ctrl-C to the process group once the first trial has finished: the sweep's state saved
    code, out, err, during, left = _stop_on_line(_start(tmp_path, argv), r"^trial \S+ finished: ", signal.SIGINT,
                                                 group=True)
    stopped(code, signal.SIGINT, out, err, during, left)
    line = [ln for ln in err.splitlines() if ln.startswith("interrupted after ")]
    assert len(line) == 1, err[-3000:]
    found = re.search(rf"^interrupted after ([12]) of {total} trial\(s\) finished \(sweep (sweep-kinds-\S+), its "
                      r"state saved\); continue with: alchemetric-ray tune ", line[0])
    assert found, line
    name, sweep_dir = found.group(2), tmp_path / "results" / found.group(2)
    kept.update(_finished_trials(sweep_dir))
    assert len(kept) >= int(found.group(1)), kept

    # 2. its resume (`--resume`: the latest sweep of this name), stopped by SIGTERM once another trial has
    # finished: exit 143 and one line on stderr, nothing else
    code, out, err, during, left = _stop_on_line(_start(tmp_path, _resume_argv(err)), r"^trial \S+ finished: ",
                                                 signal.SIGTERM, group=False)
    stopped(code, signal.SIGTERM, out, err, during, left)
    assert f"resuming sweep {name}: finished trials are kept" in out, out[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0], err[-3000:]
    assert "; continue with: alchemetric-ray " in lines[0], lines
    found = re.search(rf"^interrupted by SIGTERM after (\d) of {total} trial\(s\) finished \(sweep {name}, its state "
                      r"saved\)", lines[0])
    # at least the trials kept before (Tune may count the new one just after our line about it was printed)
    assert found and len(kept) <= int(found.group(1)) < total, (lines, kept)
    assert all(_finished_trials(sweep_dir)[trial] == ckpts for trial, ckpts in kept.items())
    kept = _finished_trials(sweep_dir)

    # 3. that resume's driver killed, with its Ray, once Tune's saved state records one more finished trial
    # (Tune saves its state every second here; SIGKILL leaves it no chance to save at the stop, so a trial
    # that finished after its last save is run again by the next resume, in a folder of its own: Tune's promise)
    recorded_before = len(_recorded_finished(sweep_dir))
    driver = _start(tmp_path, _resume_argv(err), quiet=True, TUNE_GLOBAL_CHECKPOINT_S="1")
    deadline = time.monotonic() + 600
    try:
        while (time.monotonic() < deadline and driver.poll() is None
               and len(_recorded_finished(sweep_dir)) <= recorded_before):
            time.sleep(0.2)
        assert len(_recorded_finished(sweep_dir)) > recorded_before, "no trial recorded finished within 10 minutes"
        assert driver.poll() is None, driver.returncode  # killed before the sweep's end
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    for pid in processes_left(driver.pid):  # what the kill did not reach (a process of its own group)
        os.kill(pid, signal.SIGKILL)
    assert all(_finished_trials(sweep_dir)[trial] == ckpts for trial, ckpts in kept.items())
    # what the next resume keeps: the finished trials that Tune's last saved state records as finished
    recorded = _recorded_finished(sweep_dir)
    kept = {trial: ckpts for trial, ckpts in _finished_trials(sweep_dir).items() if trial in recorded}
    assert 1 <= len(kept) == len(recorded) < total and not (tmp_path / "models").exists(), (recorded, kept)

    # 4. the same command run again (storage.run named: no --resume) resumes, runs to the end and exports
    done = subprocess.run([*CLI, *argv, f"storage.run={name}", "--evaluate"], cwd=tmp_path, env=_shell_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming sweep {name}" in done.stdout, done.stdout[-3000:]
    assert_no_ray_tune_lines(done.stdout + done.stderr)  # Tune's own lines, in a pipe (issue 48 item 5)
    summary = [ln for ln in done.stdout.splitlines() if " configurations tried" in ln]
    assert summary and summary[0].startswith(f"sweep {name}: {total} configurations tried"), done.stdout[-3000:]
    s = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert s["num_trials"] == total
    assert all(t["epochs_run"] == 2 for t in s["trials"])  # no trial trained its epochs twice
    finished = _finished_trials(sweep_dir)
    # every trial finished, and none that Tune had recorded finished was run again
    assert len(_trial_ids(finished)) == total and all(finished[trial] == ckpts for trial, ckpts in kept.items())
    # the label kinds: shards per label, trials ranked by rank IC, the best exported with its own label
    assert s["metric"] == "val_rank_ic" and s["mode"] == "max"
    configs = sorted((t["config"]["features.label"], t["config"]["train.lr"]) for t in s["trials"])
    assert configs == [(label, lr) for label in ("cs_rank", "three_class") for lr in (0.001, 0.003, 0.01)]
    assert all(t["status"] == "TERMINATED" for t in s["trials"])
    assert all(np.isfinite(t["best_value"]) and t["val_rank_ic"] == t["best_value"] for t in s["trials"])
    features = tmp_path / "results" / "features"
    assert Manifest.read(features / "kinds").label["scheme"] == "three_class"
    assert Manifest.read(features / "kinds-cs_rank").label["scheme"] == "cs_rank"
    best = max(s["trials"], key=lambda t: t["best_value"])
    assert Manifest.read(tmp_path / "models" / "kinds").label["scheme"] == best["config"]["features.label"]
    assert (tmp_path / "models" / "kinds" / "weights.pt").is_file()
    # --evaluate: the exported trial against the baselines on its test segment, the report in its folder
    report = tmp_path / "models" / "kinds" / "evaluation"
    assert f"report: {report / 'report.md'}" in done.stdout and "rank IC [95% CI]" in done.stdout
    assert json.loads((report / "evaluation.json").read_text())["looks"]["count"] == 1  # the one look
    assert "test segment sealed" not in done.stdout


def test_one_selection_metric_for_every_label_the_trials_train_on():
    from alchemetric_ray.errors import SweepError
    from alchemetric_ray.sweeps.sweep import metric_for_labels

    base = load_config(None, [])  # three_class, train.metric=auto
    assert metric_for_labels(base, ["three_class"]).train.metric == "auto"  # balanced accuracy, as for train
    assert metric_for_labels(base, ["three_class", "binary"]).train.metric == "auto"
    # a cross-sectional label among them, even one the base config does not use: val_rank_ic for all
    assert metric_for_labels(base, ["cs_rank", "cs_zscore"]).train.metric == "val_rank_ic"
    assert metric_for_labels(base, ["three_class", "cs_rank"]).train.metric == "val_rank_ic"
    explicit = load_config(None, ["train.metric=val_balanced_accuracy"])
    with pytest.raises(SweepError, match=r"val_balanced_accuracy is a classification metric .*features.label=cs_rank"):
        metric_for_labels(explicit, ["three_class", "cs_rank"])
