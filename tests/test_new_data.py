"""`evaluate --data NEW` (issue 32 item 3): new data is scored from the model's test-segment start to
the new data's own end, and the learned baselines are fitted where the data allows, or said absent.

The new data is the session model's own tickers (conftest's ``stock_model``) with every bar moved a
whole number of 52-week years later (weekdays kept): real prices, on dates the model never saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.artifacts.export import load_model
from alchemetric_ray.cli import main

STOCK_MODEL_TICKERS = ("AAPL", "MSFT", "XOM")  # conftest's stock_model

YEAR = pd.Timedelta(weeks=52)


def _moved(stocknet_dir: Path, folder: Path, years: int) -> Path:
    folder.mkdir()
    for ticker in STOCK_MODEL_TICKERS:
        frame = pd.read_csv(stocknet_dir / f"{ticker}.csv")
        frame["Date"] = (pd.to_datetime(frame["Date"]) + years * YEAR).dt.strftime("%Y-%m-%d")
        frame.to_csv(folder / f"{ticker}.csv", index=False)
    return folder


def _evaluate(capsys, stock_model, data: Path, out: Path) -> tuple[dict, str, str]:
    capsys.readouterr()
    assert main(["evaluate", "--device", "cpu", "--model", str(stock_model), "--data", str(data),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    return json.loads((out / "evaluation.json").read_text()), (out / "report.md").read_text(), printed


def _last_labelled(data: Path, horizon: int = 1) -> str:
    """The last date every ticker has a forward return for: ``horizon`` bars before the end, plus the
    next open the return starts from."""
    dates = sorted(set.intersection(*(set(pd.read_csv(data / f"{t}.csv")["Date"]) for t in STOCK_MODEL_TICKERS)))
    return dates[-(horizon + 2)]


def test_new_data_beyond_the_models_test_end_is_scored_to_its_own_end(ray_session, stock_model, stocknet_dir,
                                                                      tmp_path, capsys):
    splits = load_model(stock_model).manifest.splits
    data = _moved(stocknet_dir, tmp_path / "new", 1)
    written, report, printed = _evaluate(capsys, stock_model, data, tmp_path / "eval")
    window = written["data"]["window"]
    assert window["start"] == splits["test_start"] == written["segment"]["start"]
    assert window["end"] == written["segment"]["end"] > splits["test_end"]
    assert window["end"] >= _last_labelled(data)
    assert window["names"] == len(STOCK_MODEL_TICKERS)
    calendar = pd.to_datetime(pd.read_csv(data / "AAPL.csv")["Date"])
    in_window = calendar[(calendar >= window["start"]) & (calendar <= window["end"])]
    assert window["days"] == len(in_window)
    model = written["rows"][0]
    assert model["name"] == "deep model" and model["rank_ic"]["n_days"] == window["days"]
    assert {r["name"] for r in written["rows"]} >= {"logistic regression", "momentum 20d", "buy and hold"}
    assert written["baselines_note"] is None  # the data reaches back past the model's training end
    assert f"Scored window {window['start']}..{window['end']}: {window['days']} days, 3 names" in report
    assert f"scored window {window['start']}..{window['end']}: {window['days']} days, 3 names" in printed


@pytest.mark.slow
def test_new_data_after_the_training_end_fits_the_baselines_on_its_own_early_rows(ray_session, stock_model,
                                                                                  stocknet_dir, tmp_path, capsys):
    splits = load_model(stock_model).manifest.splits
    years = 1
    while pd.Timestamp(pd.read_csv(stocknet_dir / "AAPL.csv")["Date"].iloc[0]) + years * YEAR \
            <= pd.Timestamp(splits["train_end"]):
        years += 1
    data = _moved(stocknet_dir, tmp_path / "later", years)
    first = pd.read_csv(data / "AAPL.csv")["Date"].iloc[0]
    assert splits["train_end"] < first < splits["test_start"], (splits, first)
    written, report, printed = _evaluate(capsys, stock_model, data, tmp_path / "eval")
    note = written["baselines_note"]
    assert note.startswith("the learned baselines were fitted on the data's own rows ")
    fitted_from, fitted_to = note.split(" rows ")[1].split(" ")[0].split("..")
    assert first <= fitted_from < fitted_to < written["data"]["window"]["start"] == splits["test_start"]
    assert f"up to the model's training end {splits['train_end']}" in note
    assert {r["name"] for r in written["rows"]} >= {"logistic regression", "momentum 20d"}
    assert f"> Baselines: {note}." in report and f"baselines: {note}" in printed


def test_new_data_wholly_after_the_test_start_has_no_learned_baselines_and_says_why(ray_session, stock_model,
                                                                                   stocknet_dir, tmp_path, capsys):
    splits = load_model(stock_model).manifest.splits
    data = _moved(stocknet_dir, tmp_path / "much-later", 6)
    first = pd.read_csv(data / "AAPL.csv")["Date"].iloc[0]
    assert first > splits["test_start"]
    written, report, printed = _evaluate(capsys, stock_model, data, tmp_path / "eval")
    assert written["baselines_note"] == (
        f"no learned baselines: the data has no labelled rows up to the model's training end {splits['train_end']}, "
        f"nor before the scored window ({written['data']['window']['start']}), to fit them on")
    assert [r["name"] for r in written["rows"]] == ["deep model", "momentum 20d", "buy and hold"]
    assert written["data"]["window"]["start"] >= first
    assert np.isfinite(written["rows"][0]["rank_ic"]["mean"])
    assert "no learned baselines" in printed and "> Baselines: no learned baselines" in report


def test_data_that_ends_before_the_test_segment_is_refused_in_one_line(stock_model, stocknet_dir, tmp_path, capsys):
    splits = load_model(stock_model).manifest.splits
    data = _moved(stocknet_dir, tmp_path / "earlier", -2)
    capsys.readouterr()
    assert main(["evaluate", "--device", "cpu", "--model", str(stock_model), "--data", str(data),
                 "--out", str(tmp_path / "eval")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("alchemetric-ray")]
    assert len(err) == 1 and (f"the data has no labelled rows from the model's test-segment start "
                              f"{splits['test_start']} on") in err[0]
    assert not (tmp_path / "eval").exists()
