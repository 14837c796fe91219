"""MLflow tracking (tracking/mlflow_runs.py) against a real `mlflow server` on 127.0.0.1 (sqlite backend,
local artifact root), and its refusals: an unreachable or malformed URI, MLflow not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, free_port
from mlflow_server import kill_server as _kill
from mlflow_server import start_server as _start_server

from alchemetric_ray import cli


def _train_args(tmp_path: Path, shards: Path, uri: str, name: str) -> list[str]:
    return ["train", "--data", str(shards), "--device", "cpu", f"storage.path={tmp_path / 'results'}",
            f"storage.models_dir={tmp_path / 'models'}", f"storage.name={name}", "train.epochs=2",
            "model.hidden=8", f"tracking.mlflow_uri={uri}"]


def test_an_unreachable_server_is_refused_in_one_line_before_training(tmp_path, capsys, stocknet_shards):
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    rc = cli.main(_train_args(tmp_path, stocknet_shards("AAPL,MSFT"), uri, "unreachable"))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "tracking.mlflow_uri" in err and f"{uri}/health" in err
    assert "Traceback" not in err
    assert time.monotonic() - started < 30
    assert not (tmp_path / "results").exists()  # no run was started


@pytest.mark.slow
def test_a_server_that_never_answers_is_refused_within_the_preflight_timeout(tmp_path, capsys, stocknet_shards):
    import socket

    with socket.socket() as hanging:  # accepts connections (the kernel's backlog) and never replies
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(8)
        uri = f"http://127.0.0.1:{hanging.getsockname()[1]}"
        started = time.monotonic()
        rc = cli.main(_train_args(tmp_path, stocknet_shards("AAPL,MSFT"), uri, "hanging"))
        seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{uri}/health" in err and "Traceback" not in err
    assert seconds < 30
    assert not (tmp_path / "results").exists()


def test_a_malformed_uri_is_refused_in_one_line(tmp_path, capsys):
    rc = cli.main(["train", f"storage.path={tmp_path}", "tracking.mlflow_uri=ftp://example"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "tracking.mlflow_uri" in err and "Traceback" not in err


@pytest.mark.slow
def test_without_mlflow_installed_tracking_is_refused_naming_the_extra(tmp_path):
    code = ("import sys; sys.modules['mlflow'] = None\n"
            "from alchemetric_ray import cli\n"
            f"sys.exit(cli.main(['train', 'storage.path={tmp_path}', 'storage.models_dir={tmp_path / 'm'}', "
            f"'tracking.mlflow_uri=http://127.0.0.1:1']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "alchemetric-ray[mlflow]" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_train_is_logged_and_registered_and_predict_reads_the_registry(tmp_path, capsys, ray_session,
                                                                       stocknet_shards, stocknet_dir,
                                                                       mlflow_server):
    from mlflow import MlflowClient

    shards = stocknet_shards("AAPL,MSFT")
    assert cli.main(_train_args(tmp_path, shards, mlflow_server, "tracked")) == 0
    out = capsys.readouterr().out
    assert "MLflow: run " in out and "model version tracked/1" in out
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("tracked")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "2" and run.data.params["model.hidden"] == "8"
    assert run.data.params["tracking.mlflow_uri"] == mlflow_server
    loss = client.get_metric_history(run.info.run_id, "train_loss")
    assert sorted(m.step for m in loss) == [1, 2]  # the step is the epoch's number, from 1
    tags = run.data.tags
    assert tags["device"] == "cpu" and tags["device.reason"] and tags["plan.accelerator.reason"]
    assert tags["torch_version"] and tags["ray_version"] and len(tags["data.manifest_sha256"]) == 64
    assert tags["mlflow.runName"].startswith("tracked-")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model", "model_card.md"} <= artifacts
    version = client.get_model_version("tracked", "1")
    assert version.run_id == run.info.run_id and version.source == f"runs:/{run.info.run_id}/model"

    from_folder, from_registry = tmp_path / "folder.parquet", tmp_path / "registry.parquet"
    data = ["--data", str(stocknet_dir), "--device", "cpu"]
    assert cli.main(["predict", "--model", str(tmp_path / "models" / "tracked"), *data, "--out",
                     str(from_folder), "data.tickers=AAPL,MSFT"]) == 0
    assert cli.main(["predict", "--model", "models:/tracked/1", *data, "--out", str(from_registry),
                     "data.tickers=AAPL,MSFT", f"tracking.mlflow_uri={mlflow_server}"]) == 0
    client.set_registered_model_alias("tracked", "production", "1")
    from_alias = tmp_path / "alias.parquet"
    assert cli.main(["predict", "--model", "models:/tracked@production", *data, "--out", str(from_alias),
                     "data.tickers=AAPL,MSFT", f"tracking.mlflow_uri={mlflow_server}"]) == 0
    a, b, c = pd.read_parquet(from_folder), pd.read_parquet(from_registry), pd.read_parquet(from_alias)
    columns = ["date", "ticker", "score", "position"]
    pd.testing.assert_frame_equal(a[columns], b[columns])
    pd.testing.assert_frame_equal(a[columns], c[columns])

    # what a user then sees: the experiment's runs page of the MLflow UI, rendered by headless Chromium
    from test_sweep_report import _run_chromium

    url = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs"
    dom = _run_chromium(["--virtual-time-budget=20000", "--dump-dom", url], tmp_path / "profile").stdout
    assert run.data.tags["mlflow.runName"] in dom, dom[-2000:]


@pytest.mark.slow
def test_a_server_that_dies_mid_run_does_not_lose_the_run(tmp_path, capsys, ray_session, stocknet_shards):
    import threading

    proc, uri = _start_server(tmp_path / "server")
    results = tmp_path / "results"

    def kill_once_the_run_started():  # the MLflow run exists (its id in the run folder), training not done
        deadline = time.monotonic() + 120
        while not list(results.glob("*/mlflow_run.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill(proc)

    killer = threading.Thread(target=kill_once_the_run_started, daemon=True)
    killer.start()
    try:
        started = time.monotonic()
        rc = cli.main(_train_args(tmp_path, stocknet_shards("AAPL,MSFT"), uri, "dies"))
        seconds = time.monotonic() - started
    finally:
        killer.join(timeout=5)
        _kill(proc)
    out = capsys.readouterr().out
    assert rc == 0
    assert (tmp_path / "models" / "dies" / "model_card.md").is_file()  # the run trained and exported
    lines = [line for line in out.splitlines() if line.startswith("mlflow: not logged")]
    assert len(lines) == 1 and "metrics" in lines[0] and "the model version" in lines[0]
    assert seconds < 120


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_its_trials_nested(tmp_path, capsys, ray_session, stocknet_shards,
                                                         mlflow_server):
    from mlflow import MlflowClient

    args = ["tune", "--data", str(stocknet_shards("AAPL,MSFT")), "--device", "cpu",
            f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
            "storage.name=swept", "train.epochs=2", "model.hidden=8", "tune.search=grid",
            "tune.space={train.lr: [0.01, 0.001]}", "tune.scheduler=none",  # ASHA could stop a trial at epoch 1
            f"tracking.mlflow_uri={mlflow_server}"]
    assert cli.main(args) == 0
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("swept")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(trials) == 2
    assert parent.data.tags["torch_version"] and len(parent.data.tags["data.manifest_sha256"]) == 64
    assert sorted(t.data.params["train.lr"] for t in trials) == ["0.001", "0.01"]
    for trial in trials:
        assert sorted(m.step for m in client.get_metric_history(trial.info.run_id, "train_loss")) == [1, 2]
    # the version is the exported trial's run, with that trial's params (not the sweep's base config)
    version = client.get_model_version("swept", "1")
    exported = next(t for t in trials if t.info.run_id == version.run_id)
    assert exported.data.tags["trial_id"] == parent.data.tags["best_trial_id"]
    assert parent.data.tags["exported_run_id"] == version.run_id
    best_lr = json.loads(parent.data.tags["best_config"])["train.lr"]
    assert float(exported.data.params["train.lr"]) == best_lr
    # each trial's best figure as a metric (runs sort by it), and its real start and end, inside the sweep's
    metric = parent.data.tags["metric"]
    for trial in trials:
        assert f"best.{metric}" in trial.data.metrics
        assert parent.info.start_time <= trial.info.start_time < trial.info.end_time <= parent.info.end_time
    assert version.tags[f"best.{metric}"] == f"{exported.data.metrics[f'best.{metric}']:.6g}"


@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run_and_evaluations_tag_the_versions(tmp_path, capsys, ray_session,
                                                                                 stocknet_shards, stocknet_dir,
                                                                                 mlflow_server):
    from mlflow import MlflowClient

    args = [*_train_args(tmp_path, stocknet_dir, mlflow_server, "resumed"), "data.tickers=AAPL,MSFT"]  # raw: --evaluate
    assert cli.main([*args, "train.epochs=1"]) == 0
    assert cli.main([*args, "train.epochs=2", "--resume", "--evaluate"]) == 0  # one more epoch, then scored
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("resumed")
    (run,) = client.search_runs([experiment.experiment_id])  # the resume continued the same run
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "1"  # as first logged; the change is a tag
    assert run.data.tags["resume.changed.train.epochs"] == "1 -> 2"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == [1, 2]
    evaluation = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/report.md", "evaluation/evaluation.json", "evaluation/equity.png"} <= evaluation
    verdict = run.data.tags["verdict"]
    assert verdict
    # the figures as numbers: the best epoch's and the evaluation's, on the run and tagged on its version
    assert {"best.val_balanced_accuracy", "best.epoch", "evaluation.rank_ic", "evaluation.ls_sharpe",
            "evaluation.edge"} <= set(run.data.metrics)
    assert client.get_model_version("resumed", "2").tags["evaluation.rank_ic"] == \
        f"{run.data.metrics['evaluation.rank_ic']:.6g}"
    assert client.get_model_version("resumed", "2").tags["verdict"] == verdict  # the evaluated export
    assert "verdict" not in client.get_model_version("resumed", "1").tags

    # a standalone evaluate of a registered version logs its report into that version's run and tags it
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", "models:/resumed/1", "--data", str(stocknet_dir), "--device", "cpu",
                     "--out", str(tmp_path / "eval"), "data.tickers=AAPL,MSFT",
                     f"tracking.mlflow_uri={mlflow_server}"]) == 0
    out = capsys.readouterr().out
    assert "model version resumed/1 tagged with its verdict" in out
    assert client.get_model_version("resumed", "1").tags["verdict"] in out  # the line evaluate printed
    first = json.loads((tmp_path / "eval" / "evaluation.json").read_text())
    assert first["model"]["id"].startswith("models:/resumed/1 sha256:"), first["model"]["id"]
    signals = pd.read_parquet(tmp_path / "eval" / "signals.parquet")
    assert set(signals["model_id"]) == {first["model"]["id"]}
    # a second evaluate of the same version counts the first one's look (it went back beside the model);
    # `promote` made version 1 the champion (the first one: nothing to replace)
    registry = f"tracking.mlflow_uri={mlflow_server}"
    capsys.readouterr()
    assert cli.main(["promote", "--model", "models:/resumed/1", "--reason", "the first evaluated version",
                     registry]) == 0
    assert capsys.readouterr().out == ("promoted models:/resumed/1 to champion (the first champion): the first "
                                       "evaluated version\n")
    assert cli.main(["evaluate", "--model", "models:/resumed@champion", "--data", str(stocknet_dir), "--device", "cpu",
                     "--out", str(tmp_path / "eval2"), "data.tickers=AAPL,MSFT",
                     f"tracking.mlflow_uri={mlflow_server}"]) == 0
    second = json.loads((tmp_path / "eval2" / "evaluation.json").read_text())
    assert second["looks"]["count"] == first["looks"]["count"] + 1
    assert second["model"]["id"].startswith("models:/resumed/1 (alias champion) sha256:")

    # a version in Python, as docs/tracking.md shows it: the project's loader on the downloaded folder
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.config import load_config
    from alchemetric_ray.tracking.mlflow_runs import download_model

    cfg = load_config(None, [f"tracking.mlflow_uri={mlflow_server}"])
    loaded = load_model(download_model("models:/resumed/2", cfg, tmp_path / "download"))
    assert loaded.manifest.tickers == ["AAPL", "MSFT"] and not loaded.model.training
    _promotions(client, cfg, registry, stocknet_dir, tmp_path, capsys)


def _promotions(client, cfg, registry: str, bars: Path, tmp_path: Path, capsys) -> None:
    """Issue 43 item 3 on the registered model "resumed" (versions 1, champion, and 2): promote 2, predict
    follows ``@champion``, roll back, an interrupted promotion completed by running it again, bad input."""
    import alchemetric_ray as ar

    def aliases(version: str) -> list[str]:
        return sorted(client.get_model_version("resumed", version).aliases)

    promotion = ar.promote("models:/resumed/2", reason="a better rank IC", cfg=cfg)
    assert promotion.line() == "promoted models:/resumed/2 to champion; version 1 is now previous: a better rank IC"
    assert (aliases("2"), aliases("1")) == (["champion"], ["previous"])
    tags = client.get_model_version("resumed", "2").tags
    assert (tags["promotion.reason"], tags["promotion.replaced"]) == ("a better rank IC", "1") and tags["promotion.at"]
    assert client.get_model_version("resumed", "1").tags["demotion.reason"] == "replaced by version 2: a better rank IC"
    # predict --model models:/NAME@champion follows the alias
    capsys.readouterr()
    assert cli.main(["predict", "--model", "models:/resumed@champion", "--data", str(bars), "--device", "cpu",
                     "--out", str(tmp_path / "champion.parquet"), "data.tickers=AAPL,MSFT", registry]) == 0
    ids = set(pd.read_parquet(tmp_path / "champion.parquet")["model_id"])
    assert len(ids) == 1 and ids.pop().startswith("models:/resumed/2 (alias champion) sha256:")
    capsys.readouterr()

    # roll back: the older version promoted again, with its reason; the one it replaces becomes previous
    assert cli.main(["promote", "--model", "models:/resumed/1", "--reason", "roll back: live drawdown", registry]) == 0
    assert capsys.readouterr().out.startswith("promoted models:/resumed/1 to champion; version 2 is now previous")
    assert (aliases("1"), aliases("2")) == (["champion"], ["previous"])

    # a promotion killed after moving `champion` (before `previous`): the same promotion run again completes it
    for key, value in (("promotion.reason", "killed half-way"), ("promotion.at", "2026-12-05T00:00:00Z"),
                       ("promotion.replaced", "1")):
        client.set_model_version_tag("resumed", "2", key, value)
    client.set_registered_model_alias("resumed", "champion", "2")  # what the kill left: previous still on 2
    assert cli.main(["promote", "--model", "models:/resumed/2", registry]) == 0
    assert capsys.readouterr().out == ("models:/resumed/2 is already champion (since 2026-12-05T00:00:00Z): nothing "
                                       "moved\n")
    assert (aliases("2"), aliases("1")) == (["champion"], ["previous"])
    assert client.get_model_version("resumed", "1").tags["demotion.reason"] == "replaced by version 2: killed half-way"

    # bad input: one line each, nothing moved
    for model, message in (("models:/resumed/9", "promote: --model models:/resumed/9: "),
                           (str(tmp_path), f"promote: --model '{tmp_path}' is not a registered version")):
        assert cli.main(["promote", "--model", model, registry]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    down = f"tracking.mlflow_uri=http://127.0.0.1:{free_port()}"  # no server there: refused before any move
    assert cli.main(["promote", "--model", "models:/resumed/1", down]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert (aliases("2"), aliases("1")) == (["champion"], ["previous"])


@pytest.mark.slow
def test_artifacts_on_object_storage_through_the_tracking_server(tmp_path, capsys, ray_session, stocknet_shards,
                                                                 s3):
    from alchemetric_ray.config import RunConfig
    from alchemetric_ray.tracking.mlflow_runs import download_model

    bucket = s3.bucket("mlflow-artifacts")
    proc, uri = _start_server(tmp_path / "server", f"{bucket}/team")
    try:
        assert cli.main(_train_args(tmp_path, stocknet_shards("AAPL,MSFT"), uri, "on-s3")) == 0
        keys = s3.keys("mlflow-artifacts", "team/")
        assert any(key.endswith("/artifacts/model/model_card.md") for key in keys), keys
        assert any(key.endswith("/artifacts/model_card.md") for key in keys), keys
        local = tmp_path / "models" / "on-s3"
        downloaded = download_model("models:/on-s3/1", RunConfig().replace(f"tracking.mlflow_uri={uri}"),
                                    tmp_path / "download")
        files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        # the download: every file of the model, and the note of which version it is (tracking.REGISTERED)
        got = sorted(p.relative_to(downloaded).as_posix() for p in downloaded.rglob("*") if p.is_file())
        assert sorted([*files, "registered.json"]) == got
        for name in files:
            assert (local / name).read_bytes() == (downloaded / name).read_bytes(), name
    finally:
        _kill(proc)


@pytest.mark.slow
def test_an_embedded_sqlite_store_keeps_its_artifacts_under_the_run_storage(tmp_path, capsys, ray_session,
                                                                            stocknet_shards, monkeypatch):
    """The README's local recipe: `tracking.mlflow_uri=sqlite:///...`, no server; the artifacts land
    under storage.path/mlflow-artifacts, never in ./mlruns of the folder the command runs in."""
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert cli.main([*_train_args(tmp_path, stocknet_shards("AAPL,MSFT"), store, "embedded"), "train.epochs=1"]) == 0
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("embedded").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["train.epochs"] == "1"
    assert run.info.artifact_uri.startswith((tmp_path / "results" / "mlflow-artifacts").resolve().as_uri())
    assert list((tmp_path / "results" / "mlflow-artifacts").rglob("model_card.md"))
    assert not (tmp_path / "mlruns").exists()
    assert client.get_model_version("embedded", "1").run_id == run.info.run_id


@pytest.mark.slow
def test_epochs_reach_mlflow_while_the_run_trains(tmp_path, ray_session, stocknet_shards, monkeypatch):
    """tracking.live_every_s: the driver logs each finished epoch from the run folder as the run goes.
    The run's end logs whatever is left in one batch, so a partial history seen while the command ran
    was logged live; at the end every epoch's step is there once."""
    import threading

    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    epochs = 6
    seen: list[list[int]] = []
    done = threading.Event()

    def watch():
        client = MlflowClient(tracking_uri=store)
        while not done.is_set():
            try:
                runs = client.search_runs([client.get_experiment_by_name("live").experiment_id])
                if runs:
                    seen.append(sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")))
            except Exception:  # the store or the experiment not created yet
                pass
            done.wait(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # an LSTM on small batches: epochs of a second or two here
        rc = cli.main(["train", "--data", str(stocknet_shards("AAPL,MSFT,XOM", "features.window=8")), "--device", "cpu",
                       f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                       "storage.name=live", f"train.epochs={epochs}", "train.patience=0", "model.name=lstm",
                       "model.hidden=16", "features.window=8", "train.batch_size=16", f"tracking.mlflow_uri={store}",
                       "tracking.live_every_s=0.5"])
    finally:
        done.set()
        watcher.join(timeout=30)
    assert rc == 0
    partial = [steps for steps in seen if 0 < len(steps) < epochs]
    assert partial and all(steps == list(range(1, len(steps) + 1)) for steps in partial), seen
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("live").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == \
        list(range(1, epochs + 1))
