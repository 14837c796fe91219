"""One model load per command (issue 46): `predict` and `evaluate` load the saved model once in the
driver (``artifacts.export.load_model``: a ``torch.load`` and a model build, on object storage a
full download) and pass the loaded model on: to the command's config, the scoring, the inputs and
the report.  Scored in this process (one actor on this machine), nothing loads it again."""

import shutil

import pytest

from alchemetric_ray.cli import main


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_command_loads_its_model_once(ray_session, stock_model, tmp_path, loads, command):
    model = tmp_path / "stock"
    shutil.copytree(stock_model, model)  # evaluate records its look in the model folder
    out = tmp_path / ("signals.parquet" if command == "predict" else "eval")
    assert main([command, "--device", "cpu", "--model", str(model), "--out", str(out)]) == 0
    assert loads == [str(model)]


@pytest.mark.slow
def test_train_evaluate_loads_the_exported_model_once(ray_session, stocknet_dir, tmp_path, loads):
    """`train --evaluate`: the export is loaded once, by the evaluation of it."""
    assert main(["train", "--evaluate", "--data", str(stocknet_dir), "--device", "cpu", "data.tickers=AAPL,MSFT,XOM",
                 f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                 "storage.name=once", "train.epochs=1", "model.hidden=8"]) == 0
    assert len(loads) == 1 and loads[0].endswith("once")
