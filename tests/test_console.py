"""What a run prints into a pipe: the plan, one line per epoch, the verdict, errors; not Ray's chatter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alchemetric_ray import console

REPO = Path(__file__).resolve().parents[1]
# Twelve real tickers: enough for the cross-sectional verdict (10 or more), small enough to be quick.
TICKERS = "AAPL,AMZN,BA,BAC,CSCO,GE,INTC,JPM,KO,MSFT,PFE,XOM"
# What a progress bar leaves in a log: tqdm's bar cells, a carriage return, its rate or time fields.
BAR_FRAGMENTS = re.compile(r"[█▏▎▍▌▋▊▉]|\r|\d+(\.\d+)?(it|row|file)/s\]|\[\d\d:\d\d<")


def run_cli(args: list[str], ray_session, tmp_path: Path, *,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, its output into a pipe (not a TTY), joined to the session's Ray
    as `ray job submit` would (RAY_ADDRESS), with the CPU asked for explicitly."""
    env = {k: v for k, v in os.environ.items() if k != console.VERBOSE_ENV}
    env.update(RAY_ADDRESS=ray_session.get_runtime_context().gcs_address, **(extra_env or {}))
    base = [f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
            f"data.tickers={TICKERS}", "model.hidden=16", "train.batch_size=1024"]
    command, *rest = args
    flags = [a for a in rest if a.startswith("--")]
    overrides = [a for a in rest if not a.startswith("--")]
    return subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", command, "--device", "cpu", *flags, *base,
                           *overrides],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_run_into_a_pipe_prints_the_plan_one_line_per_epoch_and_the_verdict(ray_session, tmp_path):
    done = run_cli(["train", "--evaluate", "train.epochs=2", "train.patience=0"], ray_session, tmp_path)
    out = done.stdout + done.stderr
    lines = out.splitlines()
    assert done.returncode == 0, out[-4000:]
    assert "resource plan:" in done.stdout and re.search(r"^workers\s+1\b", done.stdout, re.M)
    epochs = [line for line in lines if re.search(r"\bepoch \d+/2\b", line)]
    assert [re.search(r"epoch (\d)/2", line).group(1) for line in epochs] == ["1", "2"], out[-4000:]
    # the verdict table: the model and every baseline, then the verdict line
    for contender in ("deep model", "logistic regression", "hist gradient boosting", "momentum 20d", "buy and hold"):
        assert any(line.startswith(contender) for line in lines), contender
    assert any(line.startswith("edge over the best baseline: ") for line in lines), out[-2000:]
    assert any(line.startswith("report: ") and "equity.png" in line for line in lines)
    tensorboard = next(line for line in lines if line.startswith("TensorBoard: tensorboard --logdir "))
    assert list(Path(tensorboard.split("--logdir ", 1)[1]).glob("events.out.tfevents.*"))
    assert len(lines) <= 60, f"{len(lines)} lines:\n{out}"
    assert not BAR_FRAGMENTS.search(out), out
    _only_our_lines(out)
    for noise in ("Reporting training result", "Checkpoint successfully created", "Progress bars disabled",
                  "Started a local Ray", "INFO", "RayDeprecationWarning", "has constructor arguments"):
        assert noise not in out, noise


def _only_our_lines(out: str, *, epochs: bool = True) -> None:
    """No escape byte anywhere, and our lines (the epoch lines, where the run prints them) without Ray's prefix."""
    assert "\x1b" not in out, [line for line in out.splitlines() if "\x1b" in line][:5]
    assert console.OURS not in out
    ours = [line for line in out.splitlines() if re.search(r"\bepoch \d+/\d+\b|^trial \w+ finished: ", line)]
    assert ours or not epochs, out[-3000:]
    for line in ours:
        assert not line.startswith("(") and "pid=" not in line, line
    assert not re.search(r"^\([^)]*pid=[^)]*\) (epoch|worker|trial) ", out, re.M), out[-3000:]


# A two-worker run and a sweep into a pipe, the same checks (_only_our_lines): they are the two commands
# that tests/test_side_by_side.py runs at once.


def test_our_lines_from_a_ray_worker_are_printed_without_its_prefix_and_ray_lines_keep_theirs(capsys, monkeypatch):
    """Through Ray's own print function (as the driver prints forwarded lines), into a pipe."""
    import functools

    from ray._private.worker import print_to_stdstream

    monkeypatch.setenv("RAY_COLOR_PREFIX", "0")  # what plain_output() sets for a pipe
    filtered = console._filtered(functools.partial(print_to_stdstream, ignore_prefix=False))
    filtered({"pid": 4242, "is_err": False, "actor_name": "RayTrainWorker", "ip": "127.0.0.1",
              "localhost": "127.0.0.1", "lines": [f"{console.OURS}epoch 1/2  train_loss 1.0",
                                                    "a line Ray itself printed in the worker"]})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "epoch 1/2  train_loss 1.0"
    assert out[1].endswith("a line Ray itself printed in the worker") and "pid=4242" in out[1]


@pytest.mark.slow
def test_a_failing_worker_reaches_the_pipe_as_one_line(ray_session, tmp_path):
    done = run_cli(["train", "train.epochs=2", "train.lr=1e30", "train.grad_clip=0", "storage.name=diverge",
                    "data.tickers=AAPL,MSFT"], ray_session, tmp_path)  # two tickers: it fails at its second step
    out = done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("alchemetric-ray train: error:")]
    assert done.returncode == 2, out[-4000:]
    # an honest NaN: lr=1e30 without clipping sends the weights to ~1e30 after the first step; the
    # second forward pass overflows float32 (the first epoch, step 1), on a real Ray Train worker
    assert len(errors) == 1 and "non-finite loss (nan) at epoch 1 step 1 under fp32" in errors[0], out[-4000:]
    assert "lower train.lr" in errors[0] and "Traceback" not in errors[0] and "WorkerGroupError" not in errors[0]
    assert not (tmp_path / "models" / "diverge").exists()  # nothing exported from a failed run
    assert len(out.splitlines()) <= 60, out
    assert not BAR_FRAGMENTS.search(out), out


def test_forwarded_ray_lines_are_dropped_by_their_exact_message_only():
    printed = []
    filtered = console._filtered(printed.append)
    filtered({"pid": 1, "is_err": False, "lines": [
        "epoch 1/2  train_loss 1.0",
        "Reporting training result 1: TrainingReport(...)",
        "[E core_worker.cc:2465] Actor with class name: 'PreemptionWatcher' has constructor arguments in the "
        "object store and max_restarts > 0. If the arguments ...",
        "ValueError: a real error in a worker",
    ]})
    filtered({"pid": 1, "is_err": True, "lines": ["Progress bars disabled. To enable, set `...`"]})
    assert printed == [{"pid": 1, "is_err": False,
                        "lines": ["epoch 1/2  train_loss 1.0", "ValueError: a real error in a worker"]}]


def test_verbose_brings_ray_back(monkeypatch):
    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    assert console.verbose() and console.train_logging_config().log_level == "INFO"
    monkeypatch.setenv(console.VERBOSE_ENV, "0")
    assert not console.verbose() and console.train_logging_config().log_level == "WARNING"


def test_the_features_progress_line_is_for_a_terminal_only(tmp_path, capsys):
    """In a pipe or a log the ticker count is not rewritten in place: no '\\r' fragments."""
    from alchemetric_ray.cli import main

    rc = main(["features", "--out", str(tmp_path / "shards"), "data.tickers=AAPL,MSFT"])
    captured = capsys.readouterr()
    assert rc == 0 and "\r" not in captured.err + captured.out
    assert captured.out.startswith(f"wrote {tmp_path / 'shards'}: 2 tickers")


@pytest.mark.slow
def test_a_sigterm_inside_a_finalizer_of_a_ray_worker_prints_no_traceback_and_other_errors_still_print(ray_session):
    """Ray's SIGTERM handler raises SystemExit; landing in a weakref callback, Python prints it as an
    unraisable exception with a traceback (seen from a sweep's trial process at shutdown).  A real
    SIGTERM, sent by the actor to itself inside a real weakref callback, with and without our hook."""
    import ray

    @ray.remote(num_cpus=0)
    class Finalizing:
        def run(self, quiet: bool) -> str:
            import contextlib
            import io
            import signal
            import time
            import weakref

            if quiet:
                console.quiet_worker()

            class Thing:
                pass

            def on_collect(_ref):
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # Python runs the signal handler between bytecodes
                    pass

            def on_collect_error(_ref):
                raise ValueError("a real error in a finalizer")

            captured = io.StringIO()
            with contextlib.redirect_stderr(captured):
                thing, other = Thing(), Thing()
                keep = [weakref.ref(thing, on_collect), weakref.ref(other, on_collect_error)]
                del thing, other
            return captured.getvalue() + f"\nrefs kept: {len(keep)}"

    plain = Finalizing.remote()
    shown = ray.get(plain.run.remote(False), timeout=60)
    assert "Traceback" in shown and "sigterm_handler" in shown and "SystemExit" in shown, shown  # Python's default
    assert "a real error in a finalizer" in shown, shown
    quiet = Finalizing.remote()
    shown = ray.get(quiet.run.remote(True), timeout=60)
    assert "sigterm_handler" not in shown and "SystemExit" not in shown, shown
    assert "ValueError: a real error in a finalizer" in shown, shown  # any other unraisable error still prints
    assert not getattr(sys.unraisablehook, "_alchemetric", False)  # never in the driver (this process)
    for actor in (plain, quiet):
        ray.kill(actor)


@pytest.mark.slow
def test_every_process_of_a_job_started_by_ensure_ray_has_the_quiet_stop_hook(ray_session, tmp_path):
    """Ray's worker_process_setup_hook (the job's runtime_env) installs it in processes that run none
    of our code (Train's controller): a driver joins the session's Ray as `ray job submit` would."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import ray\n"
        "from alchemetric_ray.config import RunConfig\n"
        "from alchemetric_ray.placement.session import ensure_ray\n"
        "ensure_ray(RunConfig())\n"
        "@ray.remote(num_cpus=0)\n"
        "def probe():\n"
        "    import sys\n"
        "    return getattr(sys.unraisablehook, '_alchemetric', False)\n"
        "print('hook in a plain task:', ray.get(probe.remote(), timeout=60))\n")
    env = {k: v for k, v in os.environ.items() if k != console.VERBOSE_ENV}
    env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hook in a plain task: True" in done.stdout, done.stdout + done.stderr
