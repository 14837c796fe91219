"""Issue 43: `alchemetric-ray refit`, the nightly refit with a gated promotion, against a real `mlflow
server` on 127.0.0.1 (the session's), real Parquet bars of the packaged prices cut into nights, real
training steps; and its failures: a refit killed at each step (a real SIGKILL, tests/refit_kill.py), a
second refit while one runs, a challenger that fails, the registry down.  The gate's rule itself is
tested on known daily series."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, free_port

from alchemetric_ray import cli

TICKERS = 14
CUTS = ("2017-01-31", "2017-03-31", "2017-05-31", "2017-07-31")  # the history, then a night of new bars each
MODEL = ["--device", "cpu", "train.epochs=2", "model.hidden=8"]


@pytest.fixture(scope="module")
def nights(stocknet_dir, tmp_path_factory) -> list[Path]:
    """``[history, new_1, .., new_4]``: Parquet files of 14 packaged tickers' bars, cut at ``CUTS``."""
    folder = tmp_path_factory.mktemp("refit-bars")
    frames = []
    for csv in sorted(Path(stocknet_dir).glob("*.csv"))[:TICKERS]:
        frame = pd.read_csv(csv).rename(columns=str.lower)
        frames.append(frame.assign(ticker=csv.stem, date=pd.to_datetime(frame["date"])))
    bars = pd.concat(frames)[["ticker", "date", "open", "high", "low", "close", "volume"]]
    edges = [pd.Timestamp.min, *map(pd.Timestamp, CUTS), pd.Timestamp.max]
    out = []
    for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        path = folder / ("history.parquet" if k == 0 else f"new-{k}.parquet")
        bars[(bars["date"] > lo) & (bars["date"] <= hi)].to_parquet(path, index=False)
        out.append(path)
    return out


def _champion(tmp_path: Path, history: Path, uri: str, name: str) -> None:
    """Version 1 of ``name``, trained on the history and made champion."""
    assert cli.main(["train", "--data", str(history), *MODEL, f"storage.path={tmp_path / 'results'}",
                     f"storage.models_dir={tmp_path / 'models'}", f"storage.name={name}",
                     f"tracking.mlflow_uri={uri}"]) == 0
    registry = f"tracking.mlflow_uri={uri}"
    assert cli.main(["promote", "--model", f"models:/{name}/1", "--reason", "the first", registry]) == 0


def _refit(name: str, data: Path | str, out: Path, uri: str, *overrides: str) -> list[str]:
    return ["refit", "--model", f"models:/{name}@champion", "--data", str(data), "--out", str(out), *MODEL,
            f"tracking.mlflow_uri={uri}", *overrides]


def _aliases(client, name: str) -> dict[str, str]:
    """alias -> version, of the registered model ``name``."""
    return {alias: str(version) for alias, version in client.get_registered_model(name).aliases.items()}


LOOSE = ("refit.margin=1", "refit.max_dsr_drop=10")  # a gate any finite challenger passes
STRICT = ("refit.margin=0", "refit.max_dsr_drop=0")  # one that needs a challenger better on both counts


@pytest.mark.slow
def test_a_refit_promotes_keeps_and_does_nothing_without_new_bars(tmp_path, capsys, ray_session, nights,
                                                                    mlflow_server, s3):
    from mlflow import MlflowClient

    import alchemetric_ray as ar

    client = MlflowClient(tracking_uri=mlflow_server)
    _champion(tmp_path, nights[0], mlflow_server, "desk")
    out = tmp_path / "refit"
    capsys.readouterr()

    # night 1, its bars on object storage: the gate passes (on the days after the champion's test segment and
    # on the pooled walk-forward)
    bucket = s3.bucket("refit-bars")
    s3.client.put_object(Bucket="refit-bars", Key="incoming/new-1.parquet", Body=nights[1].read_bytes())
    assert cli.main(_refit("desk", f"{bucket}/incoming/new-1.parquet", out, mlflow_server, *LOOSE,
                           "refit.walk_forward=true", "signals.refit_every=300")) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("promoted models:/desk/2 over models:/desk/1: the gate passed (on the days after "
                                  "the champion's test segment 2017-"), printed[-1]
    assert any(line.startswith("refit: appended ") for line in printed)
    assert _aliases(client, "desk") == {"champion": "2", "previous": "1"}
    v2, v1 = client.get_model_version("desk", "2").tags, client.get_model_version("desk", "1").tags
    assert (v2["refit.decision"], v2["refit.champion"], v1["refit.challenger"]) == ("promoted", "1", "2")
    gate = json.loads(v2["refit.gate"])
    assert gate["passed"] and [c["what"] for c in gate["comparisons"]] == [
        "the days after the champion's test segment", "the pooled walk-forward"]
    days = gate["comparisons"][0]["difference"]["n_days"]
    assert days >= 20
    assert v2["promotion.reason"].startswith("refit: ") and v2["promotion.replaced"] == "1"
    (folder,) = (out / "refits").iterdir()
    decision = json.loads((folder / "decision.json").read_text())
    assert decision["decision"] == "promoted" and decision["gate"] == gate
    # the registered version's model card carries the decision
    card = client.download_artifacts(client.get_model_version("desk", "2").run_id, "model/model_card.md",
                                     str(tmp_path))
    assert "## Refit decision" in Path(card).read_text()
    # the day's signals: the new bars' dates, from the new champion
    signals = pd.read_parquet(folder / "signals.parquet")
    assert str(signals["date"].min().date()) > CUTS[0] and str(signals["date"].max().date()) <= CUTS[1]
    assert signals["model_id"].iloc[0].startswith("models:/desk/2 (alias champion)")
    result = ar.load_result(folder)
    assert result.promoted and result.now_champion == "models:/desk/2" and result.window["days"] == days
    assert not (out / "state.json").exists() and not (out / "refit.lock").exists()

    # the same bars again: nothing new, nothing trained, nothing registered
    assert cli.main(_refit("desk", nights[1], out, mlflow_server, *LOOSE)) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"kept models:/desk/2: no new bars in {nights[1]}: nothing trained")
    assert len(client.search_model_versions("name='desk'")) == 2

    # night 2: a small sweep of challengers, warm-started from the champion's weights, against a gate the one it
    # exports does not pass: kept out, recorded
    assert cli.main(_refit("desk", nights[2], out, mlflow_server, *STRICT, "refit.warm_start=true", "refit.sweep=true",
                           "tune.space={train.lr: [0.001, 0.003]}", "tune.search=grid")) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("kept models:/desk/2: the gate failed (") and "(refit.max_dsr_drop)" in last, last
    assert _aliases(client, "desk") == {"champion": "2", "previous": "1"}
    v3 = client.get_model_version("desk", "3")
    assert v3.tags["refit.decision"] == "kept" and client.get_model_version("desk", "2").tags[
        "refit.challenger_decision"] == "kept"
    warm = ar.load_model("models:/desk/3", ar.load_config(None, f"tracking.mlflow_uri={mlflow_server}"))
    assert warm.config.train.init_weights  # the champion's weights started it
    assert len(list((out / "refits").glob("*/results/sweep-desk-*"))) == 1  # a sweep found it
    assert len(list((out / "refits").iterdir())) == 2
    # the champion stays: its day's signals are its judged predictions' rows of the new dates (not predicted again)
    night2 = max((out / "refits").iterdir())
    judged, day = (pd.read_parquet(night2 / name) for name in ("champion-signals.parquet", "signals.parquet"))
    first = str(day["date"].min().date())
    assert first > CUTS[1] and day["model_id"].iloc[0].startswith("models:/desk/2 (alias champion)")
    pd.testing.assert_frame_equal(day.reset_index(drop=True),
                                  judged[judged["date"] >= day["date"].min()].reset_index(drop=True))


def _killed(mode: str, where: str, argv: list[str], marker: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "refit_kill.py"), mode, where, str(marker), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait(proc: subprocess.Popen, marker: Path) -> None:
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate(timeout=30)[0][-3000:] if proc.poll() is not None else "no stop"


@pytest.mark.slow
def test_a_refit_killed_at_each_step_leaves_one_champion_and_the_next_refit_finishes_it(
        tmp_path, capsys, ray_session, nights, mlflow_server):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    _champion(tmp_path, nights[0], mlflow_server, "nightly")
    out = tmp_path / "refit"

    # killed after the challenger is trained and registered (no decision yet); a second refit meanwhile refuses
    marker = tmp_path / "stop-1"
    proc = _killed("pause", "after:_train_challenger", _refit("nightly", nights[1], out, mlflow_server, *LOOSE),
                   marker)
    _wait(proc, marker)
    capsys.readouterr()
    assert cli.main(_refit("nightly", nights[1], out, mlflow_server, *LOOSE)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another refit of models:/nightly@champion is running in" in err, err
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _aliases(client, "nightly") == {"champion": "1"}  # exactly one champion: the old one
    assert json.loads((out / "state.json").read_text())["decision"] is None and (out / "refit.lock").exists()
    # what the killed refit had downloaded (the champion from the registry) is in the refit's own folder
    assert [p.name.split("-")[0] for p in (out / ".scratch").iterdir() if p.is_dir()] == ["champion"]
    # the next refit takes the dead process's lock over and redoes the refit (the bars are already appended)
    assert cli.main(_refit("nightly", nights[1], out, mlflow_server, *LOOSE)) == 0
    printed = capsys.readouterr().out
    assert "refit: taking over the lock of a refit that ended without removing it" in printed
    assert printed.strip().splitlines()[-1].startswith("promoted models:/nightly/3 over models:/nightly/1")
    assert _aliases(client, "nightly") == {"champion": "3", "previous": "1"}
    assert not (out / ".scratch").exists()  # the killed one's scratch removed, and its own at its end

    # killed with the decision recorded, before the promotion: the next refit completes it
    marker = tmp_path / "stop-2"
    proc = _killed("kill", "before:_promote", _refit("nightly", nights[2], out, mlflow_server, *LOOSE), marker)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL and marker.exists()
    assert _aliases(client, "nightly") == {"champion": "3", "previous": "1"}
    assert json.loads((out / "state.json").read_text())["decision"] == "promoted"
    assert cli.main(_refit("nightly", nights[2], out, mlflow_server, *LOOSE)) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "completed the interrupted refit: models:/nightly/4 promoted over models:/nightly/3 (")
    assert _aliases(client, "nightly") == {"champion": "4", "previous": "3"}

    # killed just after `champion` moved (before `previous`): one champion, and the next refit completes the rest
    marker = tmp_path / "stop-3"
    proc = _killed("kill", "alias", _refit("nightly", nights[3], out, mlflow_server, *LOOSE), marker)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert _aliases(client, "nightly") == {"champion": "5", "previous": "3"}  # previous not yet moved
    assert cli.main(_refit("nightly", nights[3], out, mlflow_server, *LOOSE)) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("completed the interrupted refit: "
                                                                       "models:/nightly/5 promoted over")
    assert _aliases(client, "nightly") == {"champion": "5", "previous": "4"}
    assert not (out / "state.json").exists()

    # a .scratch the refit did not make is refused in one line, and left as it was
    (out / ".scratch").mkdir()
    (out / ".scratch" / "mine.txt").write_text("a user's file")
    assert cli.main(_refit("nightly", nights[4], out, mlflow_server, *LOOSE)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / '.scratch'} was not made by a refit" in err, err
    assert (out / ".scratch" / "mine.txt").read_text() == "a user's file" and not (out / "refit.lock").exists()
    (out / ".scratch" / "mine.txt").unlink()
    (out / ".scratch").rmdir()

    # a challenger that fails (a NaN loss): the champion stays, one line, the failed run recorded
    assert cli.main(_refit("nightly", nights[4], out, mlflow_server, *LOOSE, "train.lr=1e30")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the challenger failed while training (non-finite loss" in err and \
        "models:/nightly/5 stays champion" in err, err
    assert _aliases(client, "nightly") == {"champion": "5", "previous": "4"}
    assert "non-finite loss" in client.get_model_version("nightly", "5").tags["refit.challenger_failure"]
    experiment = client.get_experiment_by_name("nightly")
    assert [r.info.status for r in client.search_runs([experiment.experiment_id], "attributes.status = 'FAILED'")]

    # a challenger whose scoring crashes (the CPU has no bfloat16 kernel for an operator of its model): the same
    assert cli.main(_refit("nightly", nights[4], out, mlflow_server, *LOOSE, "model.module=unsupported_model",
                           "model.name=eigh", "precision.mode=bf16")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the challenger failed while being scored (NotImplementedError: " in err, err
    assert _aliases(client, "nightly") == {"champion": "5", "previous": "4"}
    assert client.get_model_version("nightly", "6").tags["refit.decision"] == "failed"

    # the registry down: refused before anything is read, appended or trained
    down = tmp_path / "down"
    assert cli.main(_refit("nightly", nights[4], down, f"http://127.0.0.1:{free_port()}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no MLflow server answers" in err and not down.exists(), err


# ---- the gate's rule, on known series -----------------------------------------------------------------------


def _ic(values: np.ndarray):
    from alchemetric_ray.signals.metrics import ICStats

    daily = pd.Series(values, index=pd.date_range("2017-01-02", periods=len(values), freq="B"))
    return ICStats(mean=float(values.mean()), std=float(values.std()), icir=0.0, t_stat=0.0, n_days=len(values),
                   ci_low=0.0, ci_high=0.0, daily=daily, rank=True)


def test_the_gate_passes_a_tie_and_refuses_a_worse_rank_ic_or_a_deflated_sharpe_drop():
    from alchemetric_ray.config import load_config
    from alchemetric_ray.refits.gate import Comparison, gate

    rng = np.random.default_rng(0)
    champion = rng.normal(0.02, 0.05, 60)
    book = SimpleNamespace(dsr=None, psr=0.8)
    refit = load_config(None, ["refit.margin=0.005", "refit.max_dsr_drop=0.1"]).refit

    def judged(challenger: np.ndarray, challenger_book=book):
        return gate([Comparison.of("the days", "2017-01-02", "2017-03-24", _ic(champion), _ic(challenger))], book,
                    challenger_book, refit)

    tie = judged(champion.copy())  # the same scores: a difference of exactly 0 every day
    assert tie.passed and tie.comparisons[0].difference.as_dict() == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0,
                                                                      "n_days": 60}
    worse = judged(champion - 0.03 + rng.normal(0, 0.005, 60))
    assert not worse.passed and "< -0.005 (refit.margin)" in worse.reason()
    assert worse.comparisons[0].difference.ci_high < 0
    better = judged(champion + 0.01)
    assert better.passed and "0.000 <= 0.1 (refit.max_dsr_drop)" in better.reason()
    dropped = judged(champion + 0.01, SimpleNamespace(dsr=0.6, psr=0.9))  # a sweep's deflated Sharpe ratio counts
    assert not dropped.passed and "a drop of 0.200 > 0.1 (refit.max_dsr_drop)" in dropped.reason()
    no_book = judged(champion + 0.01, SimpleNamespace(dsr=None, psr=float("nan")))
    assert not no_book.passed and "the challenger's is undefined" in no_book.reason()
    assert json.dumps(no_book.as_dict())  # decision.json and the registry's tag hold it as JSON


def test_a_warm_start_takes_the_weights_that_fit_and_refuses_others_in_one_line(tmp_path):
    import torch

    from alchemetric_ray.artifacts.checkpoint import initial_weights
    from alchemetric_ray.config import load_config
    from alchemetric_ray.errors import CheckpointError
    from alchemetric_ray.models import build_model
    from alchemetric_ray.models.ensemble import SeedEnsemble

    spec = load_config(None, ["model.hidden=8"]).model
    members = [build_model(spec, 5, 3) for _ in range(3)]
    torch.save({"model": SeedEnsemble(members).state_dict()}, tmp_path / "weights.pt")
    one = build_model(spec, 5, 3)
    for seed in (0, 1, 5):  # seed i of a new ensemble starts from member i (mod the members)
        state = initial_weights(tmp_path, one, seed)
        expected = members[seed % 3].state_dict()
        assert all(torch.equal(state[k], expected[k]) for k in expected)
    wider = build_model(load_config(None, ["model.hidden=16"]).model, 5, 3)
    with pytest.raises(CheckpointError) as refused:
        initial_weights(tmp_path, wider)
    assert "\n" not in str(refused.value) and "(8, 5) there, (16, 5) here" in str(refused.value)
    with pytest.raises(CheckpointError, match="not a saved model folder"):
        initial_weights(tmp_path / "missing", one)


def test_refits_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    from alchemetric_ray.refits.run import _new_folder

    folders = [_new_folder(tmp_path / "refits") for _ in range(3)]  # well within one second, or across two
    assert len(set(folders)) == 3 and all(f.is_dir() and f.parent == tmp_path / "refits" for f in folders)
    stamps = [f.name.split("-")[0] + "-" + f.name.split("-")[1] for f in folders]
    assert all(f.name in (s, f"{s}-2", f"{s}-3") for f, s in zip(folders, stamps, strict=True))
