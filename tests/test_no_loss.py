"""Nothing lost: a command replaces only what it made itself; SIGTERM and SIGHUP end a run as Ctrl-C
does; a saved model's config says what it was trained on; a hostile environment ends in one line.

Every case runs the real command line, as a user or a scheduler meets it, in its own process where
the process matters: real files, real signals sent to a real run on a real local Ray, and that run's
Ray processes counted afterwards (a run started in a session of its own: every process it starts stays
in that session); refusals that come before any work run the command line's ``main()`` in the test's
process, one of them in a process of its own.
A worker-mode `train` is stopped by SIGHUP, Ctrl-C and SIGTERM in one run of test_local_mode.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from alchemetric_ray.errors import OutputError
from alchemetric_ray.outputs import MARK, claim, claim_signals_file

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "alchemetric_ray.cli"]
SMALL = ["model.hidden=16", "train.batch_size=64"]


def _env(**extra: str) -> dict[str, str]:
    """A user's shell: no cluster to join (each command starts its own local Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run([*CLI, *args], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _in_process(cwd: Path, monkeypatch, capsys, *args: str) -> subprocess.CompletedProcess:
    """The command line's ``main()`` in this process, from ``cwd``: its exit code and what it printed, as
    ``_cli`` returns them (for a command that refuses before any work: no process of its own needed)."""
    from alchemetric_ray.cli import main

    capsys.readouterr()
    with monkeypatch.context() as m:
        m.chdir(cwd)
        code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def _one_error(proc, command: str) -> str:
    """The one line a refused command prints (exit 2), with no traceback and no Ray started."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert lines[0].startswith(f"alchemetric-ray {command}: error: "), lines
    assert "Traceback" not in proc.stdout + proc.stderr and "ray: session logs" not in proc.stdout
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: what a test compares before and after."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _user_folder(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "draft.md").write_text("my notes\n")
    (where / "notes").mkdir()
    (where / "notes" / "idea.txt").write_text("an idea\n")
    return where


# ---- 1. only our own outputs are replaced ---------------------------------------------------------


@pytest.mark.slow
def test_every_command_refuses_a_folder_or_file_it_did_not_make_before_any_work(stock_model, stocknet_shards,
                                                                               tmp_path, monkeypatch, capsys):
    shards = stocknet_shards("AAPL,MSFT,XOM")
    user = _user_folder(tmp_path / "mine")
    model = tmp_path / "models" / "x"
    shutil.copytree(stock_model, model)
    before_user, before_model = _files(user), _files(model)
    table = tmp_path / "prices.parquet"  # a user's own Parquet file, not signals
    pd.DataFrame({"ticker": ["A"], "close": [1.0]}).to_parquet(table)
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet at all\n")

    cases = [
        ("features", ["--data", str(shards), "--out", str(user)], f"output folder {user} exists and it was not made"),
        ("features", ["--out", str(model)], f"output folder {model} exists and it is a model folder"),
        ("evaluate", ["--model", str(model), "--out", str(user)], f"report folder {user} exists and it was not made"),
        ("evaluate", ["--model", str(model), "--out", str(model)], f"report folder {model} exists and it is a model"),
        ("predict", ["--model", str(model), "--out", str(user)], f"signals output {user} is a folder"),
        ("predict", ["--model", str(model), "--out", str(table)], f"signals output {table} exists and is not"),
        ("predict", ["--model", str(model), "--out", str(text)], f"signals output {text} exists and is not"),
    ]
    for command in ("train", "tune"):  # the model folder storage.models_dir/storage.name: the user's folder
        cases.append((command, ["--data", str(shards), f"storage.models_dir={tmp_path}", "storage.name=mine",
                                f"storage.path={tmp_path / 'results'}", "tune.space={train.lr: [0.01]}"],
                      f"model folder (storage.models_dir/storage.name) {user} exists and it was not made"))
    # the last case (tune's) as a user meets it, a process of its own; the others refuse before any work, so
    # they run in this process (the command line's own main(), its exit code and what it printed)
    done = [_in_process(tmp_path, monkeypatch, capsys, command, *args) for command, args, _ in cases[:-1]]
    done.append(_cli(tmp_path, cases[-1][0], *cases[-1][1]))
    for (command, _, expected), proc in zip(cases, done):
        line = _one_error(proc, command)
        assert expected in line and ("choose a new" in line or "e.g." in line), line
    assert _files(user) == before_user and _files(model) == before_model
    assert table.is_file() and text.read_text() == "not parquet at all\n"
    assert not (tmp_path / "results").exists()  # refused before any run folder was made
    assert not any(p.name.startswith(".") and ".tmp-" in p.name for p in tmp_path.rglob("*"))


def test_our_own_outputs_are_replaced_and_each_kind_is_told_from_the_others(stock_model, stocknet_shards, tmp_path,
                                                                          s3, capsys):
    shards = stocknet_shards("AAPL,MSFT,XOM")
    claim(shards, "shards")  # shards the product built may be rebuilt in place
    claim(stock_model, "model")
    with pytest.raises(OutputError, match="it is a model folder"):
        claim(stock_model, "shards")
    with pytest.raises(OutputError, match="it is a feature-shard folder"):
        claim(shards, "evaluation")
    legacy = tmp_path / "old-model"  # a model exported before the mark existed: told by its files
    shutil.copytree(stock_model, legacy)
    (legacy / MARK).unlink()
    claim(legacy, "model")
    with pytest.raises(OutputError, match="refusing to replace it with an evaluation report folder"):
        claim(legacy, "evaluation")
    (tmp_path / "empty").mkdir()
    claim(tmp_path / "empty", "evaluation")  # an empty folder the user made for it
    # a signals file the product wrote is replaced by the next predict (the command line's code, on the
    # session's Ray); a file of the same name that it did not write is refused (the test above)
    from alchemetric_ray.cli import main

    out = tmp_path / "signals.parquet"
    for _ in range(2):
        assert main(["predict", "--model", str(stock_model), "--out", str(out)]) == 0, capsys.readouterr()
    claim_signals_file(out)
    # object storage: a prefix holding a user's objects is refused in one line, nothing touched
    bucket = s3.bucket("no-loss")
    s3.client.put_object(Bucket="no-loss", Key="notes/draft.md", Body=b"mine")
    line = _one_error(_cli(tmp_path, "features", "--data", str(shards), "--out", f"{bucket}/notes"), "features")
    assert f"output folder {bucket}/notes exists and it was not made by alchemetric-ray" in line, line
    assert s3.keys("no-loss") == ["notes/draft.md"] and s3.read("no-loss", "notes/draft.md") == b"mine"


# ---- 2. SIGTERM, SIGHUP and SIGKILL ----------------------------------------------------------------


def processes_left(sid: int) -> list[int]:
    """The processes of session ``sid`` still alive, given up to 10 s to end."""
    left = _session_processes(sid)
    for _ in range(20):
        if not left:
            break
        time.sleep(0.5)
        left = _session_processes(sid)
    return left


def _session_processes(sid: int) -> list[int]:
    """The processes alive in session ``sid`` (a command started with start_new_session: itself and
    every Ray process it started), zombies left out."""
    out = subprocess.run(["ps", "-A", "-o", "pid=,stat="], capture_output=True, text=True).stdout
    found = []
    for row in out.splitlines():
        pid, stat = row.split(None, 1)
        try:
            if os.getsid(int(pid)) == sid and not stat.startswith("Z"):
                found.append(int(pid))
        except (ProcessLookupError, PermissionError):
            pass
    return found


def _signal_after(args: list[str], cwd: Path, pattern: str, sig: int, *, timeout: float = 600):
    """Start the command in a session of its own, send ``sig`` once a stdout line matches ``pattern``
    (``tmp:``: once the command has made its staging folder in its temporary folder, TMPDIR), and return (exit
    code, stdout, stderr, Ray processes of the run seen while it ran, left 10 s after)."""
    tmp = cwd / "tmpdir"  # only where no Ray starts: Ray's socket paths under it would be too long
    tmp.mkdir(exist_ok=True)
    env = _env(TMPDIR=str(tmp)) if pattern == "tmp:" else _env()
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen, during, deadline = [], 0, time.monotonic() + timeout
    try:
        if pattern == "tmp:":  # a command that prints nothing until it is done: signalled once its staging
            # folder exists (a one-actor predict stages, scores and finishes within a second: a file inside
            # the folder can come and go between two looks)
            while not any(tmp.glob("alchemetric-*")) and proc.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert proc.poll() is None, "the command finished before its staging folder was seen"
            proc.send_signal(sig)  # first: counting the processes (a `ps`) took long enough for predict to finish
            during = max(0, len(_session_processes(proc.pid)) - 1)  # its processes as the stop begins
        for line in proc.stdout if pattern != "tmp:" else []:
            seen.append(line)
            if re.search(pattern, line):
                during = len(_session_processes(proc.pid)) - 1
                proc.send_signal(sig)
                break
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
        out, err = proc.communicate(timeout=300)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, "".join(seen) + out, err, during, processes_left(proc.pid)


def _clean_stop(err: str, out: str) -> None:
    assert "Traceback" not in err + out and "SIGTERM received" not in err and "logging.cc" not in err, err[-3000:]


@pytest.mark.slow
# a worker-mode train's SIGTERM and SIGHUP: test_local_mode.py; a sweep's SIGTERM: test_sweep.py (stopped 3 ways)
@pytest.mark.parametrize("command, pattern, sig", [
    ("predict", "tmp:", signal.SIGTERM),  # while it stages the inputs (one actor's work: no Ray, in the process)
    ("evaluate", r"^resource plan", signal.SIGTERM),  # while its first walk-forward fold trains
])
def test_a_stop_signal_ends_every_long_command_as_ctrl_c_does(stock_model, tmp_path, command, pattern, sig):
    args = {
        "predict": ["predict", "--model", str(stock_model), "--out", str(tmp_path / "out" / "signals.parquet")],
        "evaluate": ["evaluate", "--model", str(stock_model), "--out", str(tmp_path / "out" / "report"),
                     "--walk-forward", "signals.refit_every=60", "train.epochs=1"],
    }[command]
    code, out, err, during, left = _signal_after(args, tmp_path, pattern, sig)
    assert code == 128 + sig, (code, out[-2000:], err[-3000:])
    _clean_stop(err, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"interrupted by {signal.Signals(sig).name}" in lines[0], err[-3000:]
    assert "; continue with: alchemetric-ray " not in lines[0] and lines[0].endswith("run the same command again"), \
        lines
    # a command whose one actor (predict) or whose walk-forward's one worker runs in its own process starts no Ray
    assert during == 0 and left == [], (during, left)
    # nothing half-written: no stage beside any output, and no output that was not finished
    assert not [p for p in tmp_path.rglob(".*.tmp-*")]
    assert not [p for folder in ("models", "out") for p in (tmp_path / folder).rglob("*") if p.is_file()]


def test_sigterm_to_features_while_it_writes_leaves_no_stage_and_says_so(tmp_path):
    """The packaged 88 tickers take a few seconds: the signal is sent once the stage beside the output
    exists, i.e. while the shards are being written."""
    out = tmp_path / "shards"
    proc = subprocess.Popen([*CLI, "features", "--out", str(out), "--quiet"], cwd=tmp_path, env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".shards.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(tmp_path.glob(".shards.tmp-*")), "the stage never appeared"
    proc.send_signal(signal.SIGTERM)
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    _clean_stop(err, out_text)
    assert err.strip() == ("alchemetric-ray features: interrupted by SIGTERM before it finished (nothing "
                           "half-written is left); run the same command again"), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


_HOLD_A_STAGE = textwrap.dedent("""
    import sys, time
    from alchemetric_ray.fsutil import staged_dir
    with staged_dir(sys.argv[1]) as stage:
        (stage / "weights.pt").write_bytes(b"x" * 1_000_000)
        print(stage, flush=True)
        time.sleep(600)
""")


def test_a_killed_writer_s_stage_is_removed_by_the_next_run_and_a_live_one_s_is_kept(tmp_path):
    target = tmp_path / "features"

    def holder() -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen([sys.executable, "-c", _HOLD_A_STAGE, str(target)], env=_env(), text=True,
                                stdout=subprocess.PIPE)
        return proc, Path(proc.stdout.readline().strip())

    live, live_stage = holder()  # first: a writer sweeps the stages of gone processes before it makes its own
    killed, dead_stage = holder()
    killed.kill()  # SIGKILL: no handler runs, the stage stays
    killed.wait()
    try:
        assert dead_stage.is_dir() and live_stage.is_dir()
        proc = _cli(tmp_path, "features", "--out", str(target), "--quiet", "data.tickers=AAPL,MSFT,XOM")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not dead_stage.exists() and live_stage.is_dir()  # the gone process's stage only
        assert (target / "manifest.json").is_file()
    finally:
        live.kill()
        live.wait()


# ---- 3. a model's saved config says what it was trained on ---------------------------------------


@pytest.mark.slow
def test_features_overrides_that_disagree_with_the_shards_are_refused_naming_keys_values_and_remedy(stocknet_shards,
                                                                                                 stock_model,
                                                                                                 tmp_path):
    shards = stocknet_shards("AAPL,MSFT,XOM")
    where = [f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}"]
    for command in ("train", "tune"):
        line = _one_error(_cli(tmp_path, command, "--data", str(shards), "features.names=ret_1,ret_5",
                               "features.horizon=5", "tune.space={train.lr: [0.01]}", *where), command)
        assert f"the shards in {shards} were built with features.horizon=1, features.names=ret_1,ret_5,ret_10" in line
        assert "but this run asks for features.horizon=5, features.names=ret_1,ret_5" in line, line
        assert "alchemetric-ray features --out NEW_DIR features.horizon=5 features.names=ret_1,ret_5" in line, line
        assert "or drop the override" in line
    line = _one_error(_cli(tmp_path, "evaluate", "--model", str(stock_model), "--out", str(tmp_path / "r"),
                           "features.horizon=3"), "evaluate")
    assert f"the model in {stock_model} was trained on features with features.horizon=1, but this command asks for " \
           "features.horizon=3" in line, line
    assert not (tmp_path / "results").exists() and not (tmp_path / "r").exists()


# ---- 4. a hostile or broken environment -----------------------------------------------------------


def test_a_config_whose_aliases_explode_is_refused_in_one_line_at_once(tmp_path):
    laughs = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(laughs) + "\n")
    assert bomb.stat().st_size < 512
    cyclic = tmp_path / "cyclic.yaml"
    cyclic.write_text("train: &t {lr: [*t]}\n")
    for config in (bomb, cyclic):
        started = time.monotonic()
        line = _one_error(_cli(tmp_path, "features", "--config", str(config), "--out", str(tmp_path / "x")),
                          "features")
        assert time.monotonic() - started < 30
        assert f"config file {config}: its YAML aliases expand to more than 100000 values" in line, line
    anchors = tmp_path / "anchors.yaml"  # aliases in moderation are YAML as users write it
    anchors.write_text("train: &t {epochs: 1}\nmodel: {hidden: 8}\n")
    from alchemetric_ray.config import load_config

    assert load_config(anchors).train.epochs == 1


@pytest.fixture
def read_only_folder(tmp_path):
    """A real read-only mount where this user may mount one (root on Linux), else a path under a
    plain file, which no user can make a folder in."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("mount"):
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True)
        if made.returncode == 0:
            try:
                yield mount
            finally:
                subprocess.run(["umount", str(mount)], capture_output=True)
            return
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    yield blocker


@pytest.mark.slow
def test_unwritable_storage_and_an_unreachable_or_wrong_ray_address_end_in_one_line(read_only_folder, stocknet_shards,
                                                                                  stock_model, tmp_path):
    shards = stocknet_shards("AAPL,MSFT,XOM")
    line = _one_error(_cli(tmp_path, "train", "--data", str(shards), f"storage.path={read_only_folder / 'runs'}",
                           f"storage.models_dir={tmp_path / 'models'}"), "train")
    assert f"config 'storage.path': {read_only_folder / 'runs'}: {read_only_folder} is not" in line, line
    line = _one_error(_cli(tmp_path, "features", "--data", str(shards), "--out", str(read_only_folder / "x")),
                      "features")
    assert f"{read_only_folder} is not" in line, line

    import socket

    with socket.socket() as sock:  # a port nobody listens on: a head that is down
        sock.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    proc = _cli(tmp_path, "train", "--data", str(shards), env=_env(RAY_ADDRESS=down))
    assert time.monotonic() - started < 20
    line = _one_error(proc, "train")
    assert f"RAY_ADDRESS={down}: no Ray head answers there" in line and "unset RAY_ADDRESS" in line, line
    line = _one_error(_cli(tmp_path, "predict", "--model", str(stock_model), "--out", str(tmp_path / "s.parquet"),
                           env=_env(RAY_ADDRESS="http://127.0.0.1:8265")), "predict")
    assert "RAY_ADDRESS=http://127.0.0.1:8265 is a Ray dashboard's address" in line and "ray job submit" in line, line


def test_a_skipped_file_is_named_on_the_console_and_no_empty_line_is_printed(stocknet_dir, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for ticker in ("AAPL", "MSFT", "XOM"):
        shutil.copy(stocknet_dir / f"{ticker}.csv", raw)
    header = (stocknet_dir / "AAPL.csv").read_text().splitlines()[0]
    (raw / "EMPTY.csv").write_text(header + "\n")
    proc = _cli(tmp_path, "features", "--data", str(raw), "--out", str(tmp_path / "shards"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^skipped 1 ticker\(s\): EMPTY \(0 rows of clean history", proc.stdout, re.M), proc.stdout
    assert not [ln for ln in proc.stdout.splitlines() if ln.rstrip().endswith(":")], proc.stdout
    assert "dropped rows" not in proc.stdout  # the packaged files of these three tickers drop nothing


def test_a_stop_signal_that_lands_in_a_finalizer_stops_the_run_after_it(capsys):
    """Python cannot raise out of a finalizer: it prints the exception and goes on.  A SIGTERM handled
    there is sent again, so the run stops right after the finalizer, with nothing printed."""
    from alchemetric_ray import interrupts

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in here, at the next instruction
            sum(range(1000))

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as a terminal has
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            with interrupts.stop_signals_as_ctrl_c():
                thing = Finalized()
                del thing
                for _ in range(1000):  # the signal sent again is raised here, in the run's own code
                    time.sleep(0.001)
        assert isinstance(stopped.value, interrupts.StopSignal) and interrupts.stop_signal() == signal.SIGTERM
    finally:
        signal.signal(signal.SIGINT, before)
    assert "Exception ignored" not in capsys.readouterr().err
