"""The Python API (issue 48): ``import alchemetric_ray as ar`` in this process, after a ``ray.init()``
of the session's (``ray_session``), on real shards and real training steps.

- the public surface: names, lazy imports, no module shadowing a function;
- typed results that read in a notebook (one screen, an HTML table) and come back from ``result.json``;
- a script and the command line leave the same things;
- nothing process-wide outlives a call (signal handlers, loggers, the environment, matplotlib's
  backend), errors are exceptions, one call at a time.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

import alchemetric_ray as ar
from alchemetric_ray.api.guard import ProcessState, api_call

REPO = Path(__file__).resolve().parents[1]
FUNCTIONS = ("load_config", "features", "train", "tune", "load_model", "predict", "evaluate", "promote", "refit",
             "doctor", "env", "submit", "load_result", "runs")


def test_the_public_surface_is_functions_and_error_classes_and_importing_it_loads_no_engine():
    assert set(FUNCTIONS) <= set(ar.__all__)
    errors = [name for name in ar.__all__ if name not in FUNCTIONS and name != "__version__"]
    # every UserError subclass of the package is public, and Interrupted: a KeyboardInterrupt, which a
    # user's `except Exception` does not swallow
    import alchemetric_ray.errors as err

    defined = {n for n, c in vars(err).items() if inspect.isclass(c) and issubclass(c, err.UserError)}
    stops = {n for n, c in vars(err).items() if inspect.isclass(c) and issubclass(c, err.Interrupted)}
    assert set(errors) == defined | stops and stops == {"Interrupted", "InterruptedBeforeDone"}
    assert issubclass(ar.Interrupted, KeyboardInterrupt) and not issubclass(ar.Interrupted, Exception)
    line = str(ar.Interrupted("interrupted after epoch 2 of 5").continued_by("ar.train(cfg, resume=True)"))
    assert line == "interrupted after epoch 2 of 5; continue with: ar.train(cfg, resume=True)"
    probe = ("import sys, alchemetric_ray as ar; "
             "print(sorted(m for m in ('torch', 'ray', 'pandas', 'pyarrow', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_no_module_of_the_package_takes_a_public_function_s_name():
    """Importing a sub-package sets it as an attribute of its parent: a folder named ``train`` would
    replace ``ar.train`` after any ``import alchemetric_ray.train.x``."""
    for module in pkgutil.walk_packages(ar.__path__, "alchemetric_ray."):
        importlib.import_module(module.name)
    for name in FUNCTIONS:
        assert inspect.isfunction(getattr(ar, name)), name
    assert not set(FUNCTIONS) & {m.name for m in pkgutil.iter_modules(ar.__path__)}


def test_submit_knows_every_command_of_the_command_line():
    from alchemetric_ray.api.jobs import COMMANDS
    from alchemetric_ray.cli import COMMANDS as CLI

    assert set(COMMANDS) == set(CLI)


def test_load_config_takes_strings_and_dicts_and_refuses_a_wrong_key_with_an_exception():
    cfg = ar.load_config(None, "train.epochs=3", {"train": {"lr": 0.01}}, {"model.hidden": 16})
    assert (cfg.train.epochs, cfg.train.lr, cfg.model.hidden) == (3, 0.01, 16)
    with pytest.raises(ar.ConfigError, match="did you mean"):
        ar.load_config(None, "train.epoch=3")



@pytest.fixture(scope="module")
def trained(ray_session, stocknet_dir, tmp_path_factory):
    """One ``ar.train(..., evaluate=True)`` after the session's ``ray.init()``, with the process's state
    noted before it (a user's handlers, loggers, environment and matplotlib backend)."""
    import logging

    import matplotlib

    matplotlib.use("svg")  # the user's choice: it must stay
    root = tmp_path_factory.mktemp("api")
    previous = signal.signal(signal.SIGUSR1, lambda *a: None)  # a user's handler, as a kernel has some
    logging.getLogger("ray").setLevel(logging.INFO)  # as a user's ray.init() leaves it
    cfg = ar.load_config(None, "data.tickers=AAPL,MSFT,XOM", f"storage.path={root / 'results'}",
                         f"storage.models_dir={root / 'models'}", "storage.name=api", "train.epochs=2",
                         "model.hidden=8", "device.name=cpu")
    before = ProcessState.capture()
    try:
        result = ar.train(cfg, data=stocknet_dir, evaluate=True)
        yield result, before.differences(), matplotlib.get_backend(), cfg, root
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.slow
def test_a_train_call_returns_a_result_a_notebook_reads(trained):
    result, changed, backend, cfg, root = trained
    assert list(result.history["epoch"]) == [1, 2]
    assert result.best.epoch in (1, 2) and result.best.metric == "val_balanced_accuracy"
    assert result.best.value == result.history[result.best.metric].max()
    assert Path(result.model_dir).is_dir() and Path(result.run_dir, "result.json").is_file()
    assert result.plan.workers == 1 and "workers" in str(result.plan)
    assert result.evaluation is not None and result.evaluation.verdict.line.startswith("edge over the best baseline")
    text = repr(result)
    assert len(text.splitlines()) <= 25 and result.name in text and "history" in text
    assert "<table" in result._repr_html_()
    assert result.model.name == "api" and result.model.features == list(result.model.loaded.manifest.features)


@pytest.mark.slow
def test_nothing_process_wide_outlives_a_call(trained):
    result, changed, backend, cfg, root = trained
    assert changed == []
    assert backend == "svg"


@pytest.mark.slow
def test_a_result_comes_back_from_its_folder_and_runs_lists_it(trained):
    result, changed, backend, cfg, root = trained
    again = ar.load_result(result.run_dir)
    assert type(again) is type(result)
    pd.testing.assert_frame_equal(again.history, result.history)
    assert (again.best, again.model_dir, again.plan.text) == (result.best, result.model_dir, result.plan.text)
    assert again.evaluation.verdict == result.evaluation.verdict
    assert again.config == result.config
    saved = json.loads(Path(result.run_dir, "result.json").read_text())
    assert (saved["format"], saved["version"], saved["kind"]) == ("alchemetric-ray result", 1, "train")
    listed = ar.runs(cfg)
    assert listed.loc[0, "name"] == result.name and listed.loc[0, "kind"] == "train"
    assert listed.loc[0, "verdict"] == result.evaluation.verdict.line
    with pytest.raises(ar.ResultError, match="no result.json"):
        ar.load_result(root)


@pytest.mark.slow
def test_the_trained_model_predicts_and_evaluates_without_a_second_load(trained, tmp_path, loads):
    result, changed, backend, cfg, root = trained
    model = result.model  # loaded once by the evaluation of train(evaluate=True)
    frame = ar.predict(model, out=tmp_path / "signals.parquet")
    assert {"ticker", "date", "score", "position"} <= set(frame.columns) and len(frame)
    pd.testing.assert_frame_equal(frame, ar.load_result(tmp_path / "signals.parquet"))
    evaluation = model.evaluate(out=tmp_path / "eval")
    assert evaluation.verdict.signal in (True, False) and len(evaluation.contenders) >= 3
    same = json.dumps(ar.load_result(tmp_path / "eval").as_dict(), sort_keys=True)  # NaN != NaN: as text
    assert same == json.dumps(evaluation.as_dict(), sort_keys=True)
    assert loads == []


def test_a_script_and_the_command_line_leave_the_same_shards(stocknet_dir, tmp_path):
    from alchemetric_ray.cli import main

    args = ["data.tickers=AAPL,MSFT", f"data.path={stocknet_dir}", "data.source=files"]
    shards = ar.features(ar.load_config(None, *args), out=tmp_path / "api")
    assert main(["features", "--quiet", "--out", str(tmp_path / "cli"), *args]) == 0
    files = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*") if p.is_file()}
    assert files == {p.relative_to(tmp_path / "cli").as_posix() for p in (tmp_path / "cli").rglob("*") if p.is_file()}
    manifests = [json.loads((tmp_path / side / "manifest.json").read_text()) for side in ("api", "cli")]
    for manifest in manifests:
        manifest.pop("created")
        manifest["build"].pop("seconds")  # how long each took: the one part of a build's record that differs
    assert manifests[0] == manifests[1]
    assert shards.tickers == ["AAPL", "MSFT"] and sum(shards.rows.values()) > 0
    assert len(repr(shards).splitlines()) <= 25
    again = ar.load_result(tmp_path / "cli")
    assert (again.tickers, again.features, again.rows, again.splits) == (shards.tickers, shards.features,
                                                                         shards.rows, shards.splits)


@pytest.mark.slow
def test_a_script_and_the_command_line_leave_the_same_run_and_model_files(trained, stocknet_dir):
    """``alchemetric-ray train --evaluate`` with the config of the script's ``ar.train(cfg, evaluate=True)``:
    the same files in the run folder and in the model folder (its evaluation report included)."""
    from alchemetric_ray.cli import main

    result, changed, backend, cfg, root = trained
    args = ["train", "--evaluate", "--data", str(stocknet_dir), "data.tickers=AAPL,MSFT,XOM",
            f"storage.path={root / 'results'}", f"storage.models_dir={root / 'models'}", "storage.name=api-cli",
            "train.epochs=2", "model.hidden=8", "device.name=cpu"]
    assert main(args) == 0
    cli_run = max((root / "results").glob("api-cli-*"))

    def files(folder: Path) -> set[str]:
        # TensorBoard's event files carry the host and time in their names, a look its time and id (and the
        # script's model may have more looks: another test of this module evaluates it again)
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                 and "events.out.tfevents" not in p.name]
        return {"looks/<a look>" if name.startswith("looks/") else name for name in names}

    assert files(cli_run) == files(Path(result.run_dir))
    assert files(root / "models" / "api-cli") == files(Path(result.model_dir))
    assert type(ar.load_result(cli_run)) is type(result)


def test_bars_as_a_dataframe_are_validated_as_a_file_is(stocknet_dir, tmp_path):
    frames = []
    for ticker in ("AAPL", "MSFT"):
        csv = pd.read_csv(Path(stocknet_dir) / f"{ticker}.csv")
        frames.append(pd.DataFrame({"ticker": ticker, "date": csv["Date"], "open": csv["Open"], "high": csv["High"],
                                    "low": csv["Low"], "close": csv["Close"], "volume": csv["Volume"]}))
    bars = pd.concat(frames, ignore_index=True)
    with pytest.raises(ar.DataError, match="missing column.*volume"):
        ar.features(data=bars.drop(columns=["volume"]), out=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    bars.loc[5, "close"] = -1.0  # a bad price: dropped and counted, as in a file
    shards = ar.features(data=bars, out=tmp_path / "ok")
    assert shards.tickers == ["AAPL", "MSFT"] and shards.notes == ["dropped rows: nonpositive_price=1"]


def test_one_call_at_a_time_in_a_process():
    started, release = threading.Event(), threading.Event()

    def hold():
        with api_call("train"):
            started.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait(30)
    try:
        with pytest.raises(ar.BusyError, match="ar.train is still running"):
            ar.env()
    finally:
        release.set()
        thread.join()
    assert ar.env().device.reason  # free again: the call ran and decided a device
