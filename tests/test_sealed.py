"""A sealed test segment (issue 32 item 5): `train` and `tune` do not score it unless asked, every
look at it is recorded in the model folder and counted in the evaluation report, and the deflated
Sharpe ratio counts every trial behind the model (sweeps and training runs exported under its name),
beside the same book on the scored dates (gross, per date: like with like).

The ledger's own rules run without Ray; the commands run on a real local Ray, real shards, real
training steps (conftest's session model ``stock_model``, on a copy: its looks are counted here).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.cli import main

SPLITS = {"test_start": "2016-01-04", "test_end": "2016-12-30"}


# ---- the ledger (no Ray) --------------------------------------------------------------------------


def test_each_look_is_its_own_record_and_only_looks_at_the_segment_count(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    assert ledger.looks(model) == [] and ledger.look_summary([]) == "0"
    assert ledger.record_look(model, "evaluate", "2016-01-04", "2016-12-30", "test segment")
    assert ledger.record_look(model, "evaluate", "2016-06-01", "2017-03-01", "new data")  # overlaps
    assert ledger.record_look(model, "doctor --model", "2014-01-02", "2015-12-31", "another segment")
    assert len(list((model / "looks").glob("*.json"))) == 3  # one file per look: none overwrites another
    counted = ledger.looks_at(model, SPLITS["test_start"], SPLITS["test_end"])
    assert sorted(e["what"] for e in counted) == ["new data", "test segment"]  # one second: either order
    assert ledger.look_summary(counted).startswith("2 (2 evaluate), the first ")


def test_a_look_that_cannot_be_recorded_is_said_in_one_line(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert not ledger.record_look(blocked, "evaluate", "2016-01-04", "2016-12-30", "test segment")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was not recorded" in err and str(blocked) in err


def test_a_reexport_carries_the_looks_and_appends_its_trials(tmp_path):
    old = tmp_path / "m"
    old.mkdir()
    ledger.record_look(old, "evaluate", "2016-01-04", "2016-12-30", "test segment")
    sweep = ledger.trial_entry("tune", SPLITS, sweep="sweep-a", srs=[0.05, 0.01, float("nan"), -0.02],
                               chosen={"sr": 0.05, "skew": 0.0, "kurt": 3.0, "days": 250})
    (old / ledger.TRIALS).write_text(json.dumps({"entries": [sweep.as_dict()]}))
    plain = ledger.trial_entry("train", SPLITS, sweep=None, srs=[0.04],
                               chosen={"sr": 0.04, "skew": 0.1, "kurt": 3.2, "days": 250})
    files = ledger.carried(old, plain)
    assert [name for name in files if name.startswith("looks/")] == \
        [f"looks/{p.name}" for p in (old / "looks").glob("*.json")]
    entries = json.loads(files[ledger.TRIALS])["entries"]
    assert [e["command"] for e in entries] == ["tune", "train"]
    inputs = ledger.deflation_inputs(entries)
    # every trial counts, the failed one (no Sharpe ratio) too; the variance is over the finite ones
    assert inputs["n_trials"] == 5 and inputs["selections"] == 2 and inputs["chosen"]["sr"] == 0.04
    assert inputs["variance"] == pytest.approx(statistics.variance([0.05, 0.01, -0.02, 0.04]))
    fresh = ledger.carried(tmp_path / "absent", plain)  # a first export: its own trial, no looks
    assert list(fresh) == [ledger.TRIALS] and json.loads(fresh[ledger.TRIALS])["entries"] == [plain.as_dict()]
    assert ledger.deflation_inputs([plain.as_dict()]) is None  # one trial: nothing to deflate for
    other = ledger.trial_entry("tune", {"test_start": "2014-01-02", "test_end": "2014-12-31"}, sweep="old",
                               srs=[0.1, 0.2], chosen=None)
    assert ledger.trials_at([other.as_dict(), sweep.as_dict(), plain.as_dict()],
                            **{"start": SPLITS["test_start"], "end": SPLITS["test_end"]}) \
        == [sweep.as_dict(), plain.as_dict()]


# ---- the commands (a real local Ray) ----------------------------------------------------------------


def _evaluate(model, out, capsys) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["evaluate", "--device", "cpu", "--model", str(model), "--out", str(out)]) == 0
    capsys.readouterr()
    return json.loads((out / "evaluation.json").read_text()), (out / "report.md").read_text()


@pytest.mark.slow
def test_train_leaves_the_test_segment_sealed_and_evaluate_counts_its_looks(ray_session, stock_model, tmp_path,
                                                                          capsys):
    model = tmp_path / "stock"
    shutil.copytree(stock_model, model)
    metrics = json.loads((model / "metrics.json").read_text())
    assert "test" not in metrics  # `train` scored nothing on test (other tests' evaluations are its only looks)
    splits = json.loads((model / "manifest.json").read_text())["splits"]
    # other tests' evaluations of the session model: those that scored the test segment are earlier looks
    prior = len(ledger.looks_at(model, splits["test_start"], splits["test_end"]))
    assert "sealed, not scored at export" in (model / "model_card.md").read_text()
    first, report = _evaluate(model, tmp_path / "e1", capsys)
    assert first["looks"]["count"] == prior + 1 and len(first["looks"]["earlier"]) == prior
    assert "Looks at the test segment" in report and f": {prior + 1}, this one included" in report
    second, report = _evaluate(model, tmp_path / "e2", capsys)
    assert second["looks"]["count"] == prior + 2 and second["looks"]["earlier"][-1]["command"] == "evaluate"
    assert f": {prior + 2}, this one included" in report and f"the earlier: {prior + 1} (" in report
    assert "may have steered the model" in report
    recorded = ledger.looks_at(model, splits["test_start"], splits["test_end"])
    assert [e["command"] for e in recorded[prior:]] == ["evaluate", "evaluate"]
    assert recorded[prior]["start"] == first["segment"]["start"] and recorded[prior]["end"] == first["segment"]["end"]
    # one plain training run stands behind it: no deflation, and the evaluation says nothing of one
    assert first["selection"] is None and first["n_trials"] == 1 and first["rows"][0]["dsr"] is None


@pytest.mark.slow
def test_the_deflated_sharpe_counts_every_run_under_the_name_beside_its_like(ray_session, stocknet_dir,
                                                                             tmp_path, capsys):
    """Two runs exported under one name (the second asked to score the test segment: a look): the
    second model's DSR counts both runs' trials, and stands beside the same gross per-date book on
    the scored dates."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.training.trainer import run_training

    base = [f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT,XOM,JPM,WMT,GE",
            f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
            "storage.name=twice", "train.epochs=2", "model.hidden=16", "device.name=cpu"]
    run_training(load_config(None, base), progress=False)
    model = run_training(load_config(None, [*base, "train.lr=0.003", "train.score_test=true"]),
                         progress=False).model_dir
    metrics = json.loads((model / "metrics.json").read_text())
    assert "balanced_accuracy" in metrics["test"] and all("test" in b for b in metrics["baselines"].values())
    assert [e["command"] for e in ledger.looks(model)] == ["train (train.score_test)"]
    entries = json.loads((model / "trials.json").read_text())["entries"]
    assert [(e["command"], e["trials"]) for e in entries] == [("train", 1), ("train", 1)]
    assert entries[1]["chosen"]["sr"] == pytest.approx(metrics["val"]["ls_sr"])

    result, report = _evaluate(model, tmp_path / "eval", capsys)
    sel = result["selection"]
    assert sel["n_trials"] == 2 and sel["selections"] == 2 and result["n_trials"] == 2
    assert sel["val_ls_sr_gross_per_date"] == pytest.approx(metrics["val"]["ls_sr"])
    assert sel["dsr"] == result["rows"][0]["dsr"] and 0.0 <= sel["dsr"] <= 1.0
    # like with like: the scored dates' book is the trials' construction (gross, per date), not the
    # table's net annualised Sharpe
    assert math.isfinite(sel["scored_ls_sr_gross_per_date"]) and sel["scored_days"] == \
        result["rows"][0]["rank_ic"]["n_days"]
    assert "chosen among 2 trials" in report and "gross and per date" in report
    assert result["looks"]["count"] == 2  # the export's look and this one
