"""Issue 48, item 5: on the command line a sweep prints our lines only, none of Ray Tune's.

What Tune printed before (a 4-trial sweep into a pipe, and the same in a terminal): its boxed
"Configuration for experiment" table, "View detailed results here: ...", a TensorBoard hint into
Ray's session folder (``/tmp/ray/session_*/artifacts/...``, gone after a reboot, beside our own
right "TensorBoard:" line), a blank line when the sweep ended, and a three-line WARNING that
"Experiment state snapshotting has been triggered multiple times".  They are off through Tune's own
switches while the Tuner runs (``console.tune_switches``); ``--verbose`` keeps them.

:func:`assert_no_ray_tune_lines` is for every test that runs ``tune`` through the CLI: it checks
the output (stdout and stderr together) for each of those kinds.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from alchemetric_ray import console
from alchemetric_ray.config import RunConfig

# One exact phrase of each kind of line Tune prints on the driver (Ray 2.60), and of the classic
# engine's status table, should a --verbose-less run ever fall back to it with verbose > 0.
RAY_TUNE_LINES = (
    "Configuration for experiment",  # the boxed table at the start of a sweep
    "View detailed results here",
    "To visualize your results with TensorBoard",  # the hint into /tmp/ray/session_*/artifacts
    "driver_artifacts",
    "Experiment state snapshotting",  # the WARNING on frequent snapshots (and on a failed one)
    "Trial status:",  # the newer engine's heartbeat table (verbose >= 1)
    "== Status ==",  # the classic engine's status table (verbose >= 1)
    "Total run time",
)
NEW_OUTPUT, SYNC_WARNING = "RAY_AIR_NEW_OUTPUT", "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S"
_BOX = re.compile(r"^[╭├╰│]", re.M)  # the table's rounded box (Tune's AIR_TABULATE_TABLEFMT)


def assert_no_ray_tune_lines(output: str) -> None:
    """No line of Ray Tune's own in a sweep's output (stdout and stderr, pipe or terminal)."""
    lines = output.replace("\r\n", "\n").splitlines()
    found = [line for line in lines if any(phrase in line for phrase in RAY_TUNE_LINES)]
    assert not found, found[:5]
    assert not _BOX.search(output.replace("\r\n", "\n")), [line for line in lines if _BOX.match(line)][:5]
    assert not re.search(r"/tmp/ray/session_[^/\s]+/artifacts", output), output[-3000:]


def test_the_assertion_catches_what_tune_printed_before():
    before = "\n".join([
        "sweep sweep-x: up to 2 trial(s) at once",
        "╭──────────────────────────────────────────╮",
        "│ Configuration for experiment     sweep-x │",
        "╰──────────────────────────────────────────╯",
        "",
        "View detailed results here: /tmp/t/results/sweep-x",
        "To visualize your results with TensorBoard, run: `tensorboard --logdir "
        "/tmp/ray/session_2026-12-05_06-34-01_259549_14565/artifacts/2026-12-05_06-34-42/sweep-x/driver_artifacts`",
        "2026-12-05 06:36:16,120\tWARNING experiment_state.py:209 -- Experiment state snapshotting has been "
        "triggered multiple times in the last 5.0 seconds and may become a bottleneck.",
    ])
    for line in before.splitlines()[1:]:
        if line:
            with pytest.raises(AssertionError):
                assert_no_ray_tune_lines(line)
    ours = ("trial 934f3_00001 finished: 2 epoch(s), best val_balanced_accuracy 0.3543; train.lr=0.001\n"
            "TensorBoard: tensorboard --logdir /tmp/t5/results/sweep-x\n")
    assert_no_ray_tune_lines(ours)


def test_tune_switches_are_tunes_own_and_off_with_verbose(monkeypatch):
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    assert console.tune_switches(local_storage=True) == {NEW_OUTPUT: "0", SYNC_WARNING: "0"}
    # a URI: each snapshot is an upload, the frequency warning may be worth acting on
    assert console.tune_switches(local_storage=False) == {NEW_OUTPUT: "0"}
    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    assert console.tune_switches(local_storage=True) == {}


def test_the_switches_do_in_ray_what_we_say(monkeypatch):
    """Read by the installed Ray as we rely on: no newer-engine reporter (whose start-of-sweep lines
    ignore verbose=0), and no frequency warning's threshold."""
    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager
    from ray.tune.experimental.output import AirVerbosity, get_air_verbosity
    from ray.tune.experimental.output import ProgressReporter as AirProgressReporter
    from ray.tune.utils.callback import _create_default_callbacks

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    for name in (NEW_OUTPUT, SYNC_WARNING):
        monkeypatch.delenv(name, raising=False)
    assert get_air_verbosity(0) == AirVerbosity.SILENT  # Ray's default: the newer engine, even at 0
    assert _ExperimentCheckpointManager(storage=None, checkpoint_period="auto")._excessive_sync_threshold == 5
    with console.environment(console.tune_switches(local_storage=True)):
        assert get_air_verbosity(0) is None  # the classic engine, which honours verbose=0
        callbacks = _create_default_callbacks([], air_verbosity=get_air_verbosity(0))
        assert not any(isinstance(c, AirProgressReporter) for c in callbacks)
        assert _ExperimentCheckpointManager(storage=None, checkpoint_period="auto")._excessive_sync_threshold == 0
    assert NEW_OUTPUT not in os.environ  # put back after the block


def test_a_value_the_user_set_is_kept_and_put_back(monkeypatch):
    monkeypatch.setenv(NEW_OUTPUT, "1")
    monkeypatch.delenv(SYNC_WARNING, raising=False)
    with console.environment({NEW_OUTPUT: "0", SYNC_WARNING: "0"}):
        assert os.environ[NEW_OUTPUT] == "1"
        assert os.environ[SYNC_WARNING] == "0"
    assert os.environ[NEW_OUTPUT] == "1"
    assert SYNC_WARNING not in os.environ


@pytest.mark.parametrize("verbose", [False, True])
def test_the_sweeps_tuner_runs_under_the_switches_and_verbose_0(monkeypatch, tmp_path, verbose):
    """fit_sweep as the command runs it, with Tune's Tuner replaced: what it is built with and which
    switches are set while it fits (none left after)."""
    from ray import tune

    from alchemetric_ray.sweeps import tuner as sweeps_tuner

    if verbose:
        monkeypatch.setenv(console.VERBOSE_ENV, "1")
    else:
        monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    for name in (NEW_OUTPUT, SYNC_WARNING):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    class Tuner:
        def __init__(self, trainable, *, param_space, tune_config, run_config):
            seen["run_config"] = run_config

        @staticmethod
        def can_restore(path, storage_filesystem=None):
            return False

        def fit(self):
            seen["env"] = {k: os.environ.get(k) for k in (NEW_OUTPUT, SYNC_WARNING)}
            return "grid"

    monkeypatch.setattr(tune, "Tuner", Tuner)
    monkeypatch.setattr(tune, "with_parameters", lambda fn, **kw: fn)
    monkeypatch.setattr(tune, "with_resources", lambda fn, resources: fn)
    monkeypatch.setattr(sweeps_tuner, "trial_resources", lambda cfg, plan: {"cpu": 1})
    monkeypatch.setattr(sweeps_tuner, "_trial_checkpoints", lambda cfg, plan: {})
    cfg = RunConfig().replace(f"storage.path={tmp_path / 'results'}", "tune.space={train.lr: [0.01, 0.001]}")
    job = SimpleNamespace(cfg=cfg, trial_cfg=cfg, name="sweep-x", targets={}, plan=None,
                          where=SimpleNamespace(path=str(tmp_path / "results" / "sweep-x")))
    assert sweeps_tuner.fit_sweep(job, {"train.lr": tune.grid_search([0.01])}, 1, 60.0) == "grid"
    assert seen["run_config"].verbose == (1 if verbose else 0)
    assert seen["env"] == ({NEW_OUTPUT: None, SYNC_WARNING: None} if verbose else {NEW_OUTPUT: "0", SYNC_WARNING: "0"})
    assert NEW_OUTPUT not in os.environ


def _in_a_terminal(argv: list[str], *, env: dict, cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """The command with stdin, stdout and stderr on a pseudo-terminal, as a person runs it; its output."""
    main, side = pty.openpty()
    proc = subprocess.Popen(argv, stdin=side, stdout=side, stderr=side, env=env, cwd=cwd, close_fds=True)
    os.close(side)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: every holder of the terminal's other side has closed it
                break
            if not data:
                break
            chunks.append(data)
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), b"".join(chunks).decode("utf-8", "replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)


@pytest.mark.slow
def test_a_sweep_in_a_terminal_prints_our_lines_and_none_of_tunes(ray_session, tmp_path):
    """2 trials x 1 epoch on two tickers, in a terminal (a pty), joined to the session's Ray."""
    env = {k: v for k, v in os.environ.items() if k != console.VERBOSE_ENV}
    env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    code, out = _in_a_terminal(
        [sys.executable, "-m", "alchemetric_ray.cli", "tune", "--device", "cpu",
         f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
         "data.tickers=AAPL,MSFT", "model.hidden=16", "train.batch_size=1024", "train.epochs=1",
         "tune.search=grid", "tune.scheduler=none", "tune.space={train.lr: [0.01, 0.001]}", "storage.name=pty"],
        env=env, cwd=tmp_path)
    assert code == 0, out[-4000:]
    assert_no_ray_tune_lines(out)
    assert len(re.findall(r"^trial \w+ finished: ", out, re.M)) == 2, out[-3000:]
    assert re.search(r"^sweep \S+: 2 configurations tried", out, re.M), out[-3000:]
    assert re.search(rf"^TensorBoard: tensorboard --logdir {re.escape(str(tmp_path / 'results'))}/sweep-", out, re.M)
