"""Adding a model is one file: the registry's declarations, and a model from outside the package
(``model.module``) trained through the CLI and Ray Train workers."""


import pytest
import torch
from torch import nn

from alchemetric_ray.cli import main
from alchemetric_ray.config import ModelConfig, load_config
from alchemetric_ray.errors import ModelModuleError
from alchemetric_ray.models import MODELS, build_model, model_spec, register_model


def test_a_model_declares_its_inputs_hyperparameters_and_cpu_autocast():
    assert {name: spec.inputs for name, spec in MODELS.items()} == {
        "mlp": "tabular", "lstm": "sequence", "gru": "sequence", "tcn": "sequence", "transformer": "sequence",
        "cs_attention": "tabular"}
    assert model_spec("cs_attention").hyperparameters == ("hidden", "layers", "dropout", "heads")
    assert model_spec("transformer").hyperparameters == ("hidden", "layers", "dropout", "heads", "window")
    assert model_spec("mlp").cpu_autocast_broken is None
    assert "LSTM fails under CPU autocast" in model_spec("lstm").cpu_autocast_broken


def test_build_model_passes_only_what_the_model_declares(model_registry):
    @register_model("strict", inputs="tabular", hyperparameters=("hidden",))
    class Strict(nn.Module):  # no **kwargs: any other keyword would be a TypeError
        def __init__(self, n_features: int, n_classes: int, hidden: int):
            super().__init__()
            self.head = nn.Linear(n_features, hidden)

    model = build_model(ModelConfig(name="strict", hidden=5, heads=3), 4, 3, window=7)
    assert isinstance(model, Strict) and model.head.out_features == 5


def test_a_model_declaration_is_checked_where_it_is_written(model_registry):
    with pytest.raises(ValueError, match="unknown hyperparameter.*hidden_size"):
        register_model("bad", inputs="tabular", hyperparameters=("hidden_size",))
    with pytest.raises(ValueError, match="inputs must be one of tabular, sequence"):
        register_model("bad", inputs="image")
    with pytest.raises(ValueError, match="model 'mlp' is registered twice"):
        register_model("mlp", inputs="tabular")(type("Other", (nn.Module,), {}))


def test_model_module_is_imported_before_the_lookup(model_registry):
    assert "tiny" not in MODELS
    spec = model_spec(load_config(None, ["model.module=tiny_model", "model.name=tiny"]).model)
    assert spec.name == "tiny" and spec.inputs == "tabular"
    with pytest.raises(ModelModuleError,
                       match=r"config 'model.module': cannot import 'no_such_module' \(ModuleNotFoundError"):
        model_spec(ModelConfig(name="tiny", module="no_such_module"))


@pytest.mark.slow
def test_a_model_from_outside_the_package_trains_through_the_cli(ray_session, model_registry, tmp_path, capsys):
    from alchemetric_ray.artifacts.export import load_model

    rc = main(["train", "--device", "cpu", "model.module=tiny_model", "model.name=tiny", "model.hidden=4",
               "data.source=synthetic", "data.synthetic_tickers=4", "data.synthetic_days=200", "train.epochs=1",
               f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
               "storage.name=tiny"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 epoch(s)" in out
    loaded = load_model(tmp_path / "models" / "tiny")
    assert type(loaded.model).__name__ == "Tiny" and loaded.config.model.module == "tiny_model"
    assert [tuple(p.shape) for p in loaded.model.parameters()] == [
        (4, len(loaded.manifest.features)), (4,), (len(loaded.manifest.label["classes"]), 4),
        (len(loaded.manifest.label["classes"]),)]
    assert torch.isfinite(next(loaded.model.parameters())).all()
