"""Jupyter's interrupt during a call, in a real kernel (issue 48, items 3 and 6).

A kernel (ipykernel, started by jupyter_client's ``KernelManager`` as Jupyter starts it) runs the
cells; the test reads its iopub messages while a cell runs, as a front end does, and once the
second epoch's line is shown (the API updates one IPython display in place: ``update_display_data``)
presses Jupyter's interrupt: ``KernelManager.interrupt_kernel()``, SIGINT to the kernel's whole
process group (the kernel and every process it started, Ray's among them).  Then, as a user would:
the cell ended with ``Interrupted`` (a ``KeyboardInterrupt``) whose line names the kept epochs and
the call that continues; the kernel still runs cells; ``ar.train(cfg, resume=True)`` in the next
cell continues after the kept epochs to the end.

- local mode (one worker in the kernel's own process, no Ray): interrupted, resumed, then the kernel
  restarted and ``ar.load_result`` reads the same result back;
- a Ray Train worker group (``train.local_mode=false``: the first call starts a local Ray in the
  kernel, later calls reuse it): the same, and after the interrupt that Ray is alive and answers, and
  none of the run's actors or placement groups is left (Ray's State API; Ray Data's two session-wide
  actors stay, as Ray Data keeps them for the next dataset); then ``ar.tune`` interrupted once a trial
  has finished, Ray checked the same way, and resumed to the end.

The kernel's environment is its own (no RAY_* variable of this process, a TMPDIR of its own under
/tmp so that its Ray's session folder and sockets are its own); every kernel is shut down as Jupyter
does, and no process it started may outlive it.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

REPO = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 600  # one cell on a loaded machine (a Ray start, a worker group, a sweep's trials)
CONTINUE = "continue with: ar.train(cfg, resume=True)"


class Kernel:
    """One ipykernel of this Python, in a folder of the test's own, driven as a front end drives it."""

    def __init__(self, tmp_path: Path):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

        spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                          display_name="alchemetric-ray kernel test", language="python", interrupt_mode="signal")

        class OneSpec(KernelSpecManager):  # none of the machine's kernel specs is read
            def get_kernel_spec(self, kernel_name, *args, **kwargs):
                return spec

        self.work, home = tmp_path / "work", tmp_path / "home"
        self.work.mkdir(exist_ok=True)
        home.mkdir(exist_ok=True)
        # short: Ray's socket paths under TMPDIR must stay under 108 bytes
        self.scratch = Path(tempfile.mkdtemp(prefix="ar-k-", dir="/tmp"))
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(home),
                    "TMPDIR": str(self.scratch), "PYTHONPATH": str(REPO), "PYTHONNOUSERSITE": "1",
                    "IPYTHONDIR": str(home / ".ipython"), "MPLCONFIGDIR": str(home / ".mpl"),
                    "JUPYTER_CONFIG_DIR": str(home / ".jupyter"), "JUPYTER_PLATFORM_DIRS": "0",
                    "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
                    "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"),
                    "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
                    "AWS_CONFIG_FILE": str(REPO / "tests" / ".no-aws-config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(REPO / "tests" / ".no-aws-credentials"),
                    "AWS_EC2_METADATA_DISABLED": "true"}
        self.km = KernelManager(kernel_name="alchemetric-test", kernel_spec_manager=OneSpec(),
                                connection_file=str(tmp_path / "kernel.json"))
        self.km.shutdown_wait_time = 120  # bounded; a graceful exit takes seconds (its Ray ends first)
        self.kc = None
        self.spawned: list = []
        self.shutdown_s = 0.0  # how long the last shutdown took, from Jupyter's request to the kernel's exit
        self._start()

    def _start(self) -> None:
        self.km.start_kernel(env=dict(self.env), cwd=str(self.work))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def run(self, code: str, on_output=None, timeout: float = CELL_TIMEOUT_S) -> Cell:
        """Execute ``code`` as a cell; every output of it (``on_output`` sees each as it arrives) until
        the kernel is idle again."""
        msg_id = self.kc.execute(code)
        outputs: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, min(left, 5)))
            except queue.Empty:
                assert self.km.is_alive(), f"the kernel died during {code!r}: {_texts(outputs)[-3000:]}"
                assert left > 0, f"{code!r} still running after {timeout:.0f}s: {_texts(outputs)[-3000:]}"
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return Cell(code, outputs)
            if kind in ("stream", "display_data", "update_display_data", "execute_result", "error"):
                output = {"output_type": kind, **content}
                outputs.append(output)
                if on_output is not None:
                    on_output(output)

    def value(self, code: str, timeout: float = CELL_TIMEOUT_S):
        """A cell whose last expression is JSON: its value (the cell must not fail)."""
        *before, last = code.rsplit("\n", 1)
        cell = self.run("\n".join(["import json as _json", *before, f"_json.dumps({last})"]), timeout=timeout)
        assert cell.error is None, cell.describe()
        return json.loads(ast.literal_eval(cell.result))  # the repr of the str, then the JSON in it

    def interrupt_on(self, code: str, text: str) -> tuple[Cell, float]:
        """Run ``code``, press Jupyter's interrupt once an output shows ``text``; the cell, and the seconds
        from the interrupt to the cell's end."""
        pressed: list[float] = []

        def watch(output: dict) -> None:
            if not pressed and any(text in t for t in _strings(output)):
                pressed.append(time.monotonic())
                self.km.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter's button

        cell = self.run(code, watch)
        assert pressed, f"{text!r} never shown: the run ended before the interrupt\n{cell.describe()}"
        return cell, time.monotonic() - pressed[0]

    def _children(self) -> list:
        import psutil

        try:
            return psutil.Process(self.pid).children(recursive=True)
        except (psutil.NoSuchProcess, TypeError):
            return []

    def restart(self) -> None:
        """Jupyter's "Restart kernel": the process ends (and what it started) and a new one starts."""
        old = self.pid
        self.spawned += self._children()
        self.km.restart_kernel(now=False)
        self.kc.wait_for_ready(timeout=120)
        assert self.pid != old

    def close(self) -> list[str]:
        """Shut the kernel down as Jupyter does; the processes it started that are still alive after."""
        import psutil

        self.spawned += self._children()
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            began = time.monotonic()
            self.km.shutdown_kernel(now=False)
            self.shutdown_s = time.monotonic() - began
        finally:
            gone, alive = psutil.wait_procs(self.spawned, timeout=120)
            ours = [p for p in psutil.process_iter(["pid", "cmdline"])
                    if str(self.scratch) in " ".join(p.info["cmdline"] or [])]
            left = {p.pid: p for p in [*alive, *ours] if p.is_running()}
            described = []
            for pid, process in left.items():
                try:
                    described.append(f"{pid} {' '.join(process.cmdline())[:160]}")
                    process.kill()  # the kernel's own children only
                except psutil.NoSuchProcess:
                    pass
            shutil.rmtree(self.scratch, ignore_errors=True)
        return described


class Cell:
    def __init__(self, code: str, outputs: list[dict]):
        self.code, self.outputs = code, outputs
        errors = [o for o in outputs if o["output_type"] == "error"]
        self.error = errors[0] if errors else None
        results = [o for o in outputs if o["output_type"] == "execute_result"]
        self.result = results[-1]["data"]["text/plain"] if results else None

    @property
    def text(self) -> str:
        return _texts(self.outputs)

    def describe(self) -> str:
        error = f"\n{self.error['ename']}: {self.error['evalue']}\n" + "\n".join(self.error["traceback"]) \
            if self.error else ""
        return f"cell {self.code!r}:\n{self.text[-4000:]}{_plain(error)[-4000:]}"


def _strings(output: dict) -> list[str]:
    found = [output.get("text", ""), output.get("evalue", "")]
    found += [v if isinstance(v, str) else str(v) for v in (output.get("data") or {}).values()]
    return [text for text in found if text]


def _texts(outputs: list[dict]) -> str:
    return "\n".join(text for o in outputs for text in _strings(o))


def _plain(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture
def kernel(tmp_path):
    kernels: list[Kernel] = []

    def start() -> Kernel:
        kernels.append(Kernel(tmp_path))
        return kernels[-1]

    yield start
    left = [line for k in kernels for line in k.close()]
    assert left == [], f"processes the kernel started outlived it: {left}"
    # ipykernel's shutdown signals the kernel's children and waits until none is left (14.4 s of SIGTERMs,
    # then the same of SIGKILLs): a Ray whose GCS and raylet were never reaped kept it waiting 29 s, and
    # Jupyter's server (5 s) killed it instead.  A local Ray of ours shuts down first (placement/session.py).
    slow = [round(k.shutdown_s) for k in kernels if k.shutdown_s >= 14]
    assert slow == [], f"a kernel took {slow} s to shut down: it waited for children that never end"


def _config_cell(root: Path, *extra: str) -> str:
    overrides = ["data.tickers=AAPL,MSFT", "model.hidden=8", "train.patience=0", "device.name=cpu",
                 f"storage.path={root / 'results'}", f"storage.models_dir={root / 'models'}", *extra]
    return f"import alchemetric_ray as ar\ncfg = ar.load_config(None, *{overrides!r})"


def _interrupted(cell: Cell, call: str = CONTINUE) -> int:
    """The cell ended with ``Interrupted`` naming the kept epochs and how to go on: the last kept epoch."""
    import re

    assert cell.error is not None, cell.describe()
    assert cell.error["ename"] == "Interrupted", cell.describe()
    found = re.fullmatch(rf"interrupted after epoch (\d+) of (\d+); {re.escape(call)}", cell.error["evalue"])
    assert found, cell.error["evalue"]
    return int(found.group(1))


@pytest.mark.slow  # a kernel, a restart and two trainings: make test only (make test-fast stays under 4 min)
def test_an_interrupted_local_train_keeps_its_epochs_resumes_in_the_next_cell_and_reads_back_after_a_restart(
        kernel, tmp_path):
    epochs = 10
    k = kernel()
    setup = k.run(_config_cell(tmp_path, f"train.epochs={epochs}", "storage.name=local", "train.batch_size=32"))
    assert setup.error is None, setup.describe()

    began = time.monotonic()
    cell, ended_in = k.interrupt_on("result = ar.train(cfg)", "epoch 2/")
    kept = _interrupted(cell)
    assert 2 <= kept < epochs, cell.error["evalue"]
    assert ended_in < 30, f"the cell took {ended_in:.0f}s to end after the interrupt"
    assert "Traceback" not in cell.text, cell.describe()
    assert k.value("1 + 1") == 2  # the kernel is usable

    resumed = k.run("result = ar.train(cfg, resume=True)\nresult.history['epoch'].tolist()")
    assert resumed.error is None, resumed.describe()
    assert resumed.result == repr(list(range(1, epochs + 1))), resumed.describe()  # every epoch once
    assert f"epoch {kept + 1}/{epochs}" in resumed.text and f"epoch {kept}/{epochs}" not in resumed.text, \
        resumed.describe()  # it continued after the kept epochs, training none again
    before = k.value("{'run_dir': str(result.run_dir), 'history': result.history.to_dict('list'), "
                     "'best': result.best.epoch, 'model_dir': str(result.model_dir)}")
    first = time.monotonic() - began

    k.restart()  # a new kernel process: nothing of the old one in memory
    again = k.value(f"__import__('alchemetric_ray').load_result({before['run_dir']!r}).history.to_dict('list')")
    assert again == before["history"]
    back = k.value(f"(lambda r: {{'best': r.best.epoch, 'model_dir': str(r.model_dir)}})("
                   f"__import__('alchemetric_ray').load_result({before['run_dir']!r}))")
    assert back == {"best": before["best"], "model_dir": before["model_dir"]}
    print(f"interrupt, resume: {first:.0f}s; the cell ended {ended_in:.1f}s after the interrupt")

    # ar.features interrupted while it builds a synthetic market of 1,500 tickers x 1,000 days (seconds of work
    # even vectorized; its imports warm from a first call): Interrupted with its one line, and nothing of the
    # shard folder, staged or final, left
    warm = k.run(f"import alchemetric_ray as ar\nar.features(ar.load_config(None, 'data.tickers=AAPL'), "
                 f"out={str(tmp_path / 'warm')!r}).tickers")
    assert warm.error is None and warm.result == "['AAPL']", warm.describe()
    target = tmp_path / "all"
    # the cue comes from another thread a second into the call, so the interrupt lands inside ar.features
    cell, ended_in = k.interrupt_on("import threading\nthreading.Timer(1.0, print, ['building']).start()\n"
                                    "shards = ar.features(ar.load_config(None, 'data.source=synthetic', "
                                    "'data.synthetic_tickers=1500', 'data.synthetic_days=1000'), "
                                    f"out={str(target)!r})", "building")
    # ar.InterruptedBeforeDone: an ar.Interrupted of a call that writes its output whole
    assert cell.error is not None and cell.error["ename"] == "InterruptedBeforeDone", cell.describe()
    assert cell.error["evalue"] == (f"interrupted before the shards in {target} were written (nothing half-written "
                                    "is left); run the same call again"), cell.error["evalue"]
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".all")]
    assert k.value("1 + 1") == 2


RAY_STATE = """\
import ray
from ray.util.state import list_actors, list_placement_groups
_api = ray._private.worker.global_worker.node.webui_url  # this kernel's Ray, not one found on the machine
_api = _api if "://" in _api else "http://" + _api
_created = [("state", "=", "CREATED")]
_json.dumps({
    "initialized": ray.is_initialized(),
    "answers": ray.get(ray.remote(lambda: 1).remote()),
    "actors": sorted(a.class_name for a in list_actors(_api, filters=[("state", "=", "ALIVE")])),
    "placement_groups": [p.placement_group_id for p in list_placement_groups(_api, filters=_created)],
})"""


# Ray Data's own actors, one per Ray session, kept by Ray Data for the next dataset (not the run's)
RAY_DATA_SINGLETONS = {"_StatsActor", "_AutoscalingCoordinatorActor"}


def _ray_after_interrupt(k: Kernel) -> dict:
    """Ray in the kernel once the interrupted run's leftovers had up to 60 s to go: whether initialized and
    answering, the actors alive besides Ray Data's session-wide ones (Train's controller, workers,
    placement-group cleaner; a sweep's trials) and the placement groups still held."""
    deadline = time.monotonic() + 60
    while True:
        cell = k.run("import json as _json\n" + RAY_STATE)
        assert cell.error is None, cell.describe()
        state = json.loads(ast.literal_eval(cell.result))
        state["actors"] = [name for name in state["actors"] if name not in RAY_DATA_SINGLETONS]
        if (not state["actors"] and not state["placement_groups"]) or time.monotonic() > deadline:
            return state
        time.sleep(2)


@pytest.mark.slow  # about 2 minutes here: a Ray start, two worker-group runs, a sweep of 3 trials, Ray's shutdown
def test_an_interrupted_worker_group_and_sweep_leave_ray_alive_and_clean_and_resume(kernel, tmp_path):
    epochs = 10
    k = kernel()
    setup = k.run(_config_cell(tmp_path, f"train.epochs={epochs}", "storage.name=group", "train.local_mode=false",
                               "train.batch_size=32"))
    assert setup.error is None, setup.describe()

    began = time.monotonic()
    cell, ended_in = k.interrupt_on("result = ar.train(cfg)", "epoch 2/")
    kept = _interrupted(cell)
    assert 2 <= kept < epochs, cell.error["evalue"]
    assert "Traceback" not in cell.text, cell.describe()
    state = _ray_after_interrupt(k)
    assert state["initialized"] and state["answers"] == 1, state  # the kernel's Ray survived the SIGINT
    assert state["actors"] == [] and state["placement_groups"] == [], state  # the run's released
    assert k.value("1 + 1") == 2

    resumed = k.run("result = ar.train(cfg, resume=True)\nresult.history['epoch'].tolist()")
    assert resumed.error is None, resumed.describe()
    assert resumed.result == repr(list(range(1, epochs + 1))), resumed.describe()
    assert f"epoch {kept + 1}/{epochs}" in resumed.text and f"epoch {kept}/{epochs}" not in resumed.text, \
        resumed.describe()
    trained = time.monotonic() - began

    # a sweep of 3 trials, one at a time, interrupted once the first has finished, resumed to the end
    began = time.monotonic()
    sweep = k.run(_config_cell(tmp_path, "train.epochs=2", "storage.name=sweep", "tune.search=grid",
                               "tune.scheduler=none", "tune.max_concurrent_trials=1",
                               "tune.space={train.lr: [0.01, 0.003, 0.001]}"))
    assert sweep.error is None, sweep.describe()
    cell, _ = k.interrupt_on("sweep = ar.tune(cfg)", " finished: ")
    assert cell.error is not None and cell.error["ename"] == "Interrupted", cell.describe()
    import re

    found = re.fullmatch(r"interrupted after ([12]) of 3 trial\(s\) finished \(sweep \S+, its state saved\); "
                         r"continue with: ar\.tune\(cfg, resume=True\)", cell.error["evalue"])
    assert found, cell.error["evalue"]
    state = _ray_after_interrupt(k)
    assert state["initialized"] and state["answers"] == 1, state
    assert state["actors"] == [] and state["placement_groups"] == [], state
    done = k.value("sweep = ar.tune(cfg, resume=True)\n{'trials': len(sweep.trials), "
                   "'epochs': sweep.trials['epochs_run'].tolist()}")
    assert done == {"trials": 3, "epochs": [2, 2, 2]}, done
    print(f"worker group: interrupt, resume {trained:.0f}s (the cell ended {ended_in:.1f}s after the interrupt); "
          f"sweep: {time.monotonic() - began:.0f}s")
