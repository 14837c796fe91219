import json

import pytest

from alchemetric_ray.config import RunConfig, load_config
from alchemetric_ray.errors import ConfigError


def test_defaults_validate_and_round_trip_through_json():
    cfg = load_config()
    again = RunConfig.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(cfg.to_json())["train"]["lr"] == cfg.train.lr


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 0.01\n  epochs: 3\nmodel:\n  name: lstm\nfeatures:\n  names: [ret_1, rsi_14]\n")
    cfg = load_config(path, ["train.lr=0.002", "precision.mode=bf16", "features.horizon=5"])
    assert cfg.train.lr == 0.002  # override beats file
    assert cfg.train.epochs == 3  # file beats default
    assert cfg.model.name == "lstm"
    assert cfg.precision.mode == "bf16"
    assert cfg.features.horizon == 5
    assert cfg.features.names == ["ret_1", "rsi_14"]


def test_comma_list_override_and_null():
    cfg = load_config(None, ["features.names=ret_1,ret_5", "data.path=null"])
    assert cfg.features.names == ["ret_1", "ret_5"]
    assert cfg.data.path is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=0", "config 'train.lr': 0.0 is invalid, expected > 0"),
        ("train.lr=-1e-3", "config 'train.lr': -0.001 is invalid, expected > 0"),
        ("train.batch_size=0", "config 'train.batch_size': 0 is invalid, expected >= 1"),
        ("train.epochs=2.5", "config 'train.epochs': expected an integer, got 2.5"),
        ("train.lr=fast", "config 'train.lr': expected a number, got 'fast'"),
        ("train.deterministic=maybe", "config 'train.deterministic': expected true or false, got 'maybe'"),
        ("precision.mode=fp8", "config 'precision.mode': 'fp8' is not one of auto, fp32, fp16, bf16"),
        ("train.schedule=cosin", "did you mean 'cosine'?"),
        ("device.name=tpu", "config 'device.name': 'tpu' is invalid"),
        ("features.train_frac=0.9", "train_frac + val_frac < 1"),
        ("storage.name=../escape", "config 'storage.name': '../escape' is invalid"),
        ("model.dropout=1.0", "config 'model.dropout': 1.0 is invalid, expected in [0, 1)"),
    ],
)
def test_each_validation_error_names_key_and_value(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_keys_suggest_the_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'train.learning_rat'.*known:|did you mean"):
        load_config(None, ["train.learning_rat=0.1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'train.btach_size'; did you mean 'train.batch_size'\?"):
        load_config(None, ["train.btach_size=8"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'; did you mean 'train'\?"):
        load_config(None, ["trian.lr=0.1"])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  hiden: 32\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown config key 'model.hiden'; did you mean 'model.hidden'\?"):
        load_config(path)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "broken.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        load_config(scalar)


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["lr"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["lr=0.1"])


def test_replace_returns_validated_copy():
    cfg = load_config()
    other = cfg.replace("model.hidden=8")
    assert other.model.hidden == 8 and cfg.model.hidden != 8
    with pytest.raises(ConfigError):
        cfg.replace("model.hidden=0")


# ---- train.mode follows train.metric ---------------------------------------------------------------

# Written out here, not read from the code: which way each selection metric improves.
DIRECTIONS = {"val_accuracy": "max", "val_balanced_accuracy": "max", "val_macro_f1": "max", "val_roc_auc": "max",
              "val_mcc": "max", "val_log_loss": "min", "val_mse": "min", "val_ic": "max", "val_rank_ic": "max",
              "val_icir": "max", "val_rank_icir": "max"}
REGRESSION_ONLY = {"val_mse"}


@pytest.mark.parametrize("metric", sorted(DIRECTIONS))
def test_selection_direction_is_derived_from_the_metric(metric):
    from alchemetric_ray.scoring.objective import selection_mode

    label = "features.label=cs_rank" if metric in REGRESSION_ONLY else "features.label=three_class"
    cfg = load_config(None, [label, f"train.metric={metric}"])
    assert cfg.train.mode == "auto" and selection_mode(cfg) == DIRECTIONS[metric]
    agreeing = load_config(None, [label, f"train.metric={metric}", f"train.mode={DIRECTIONS[metric]}"])
    assert selection_mode(agreeing) == DIRECTIONS[metric]


def test_auto_metric_is_the_targets_own():
    from alchemetric_ray.scoring.objective import selection_metric

    assert selection_metric(load_config(None, [])) == "val_balanced_accuracy"
    assert selection_metric(load_config(None, ["features.label=cs_rank"])) == "val_rank_ic"
    assert selection_metric(load_config(None, ["features.label=cs_zscore", "train.metric=val_ic"])) == "val_ic"
    # val_rank_ic scores every target, classes included
    assert selection_metric(load_config(None, ["features.label=binary", "train.metric=val_rank_ic"])) == "val_rank_ic"


def test_mode_that_contradicts_the_metric_is_refused_in_one_line_and_the_cli_exits_2(capsys):
    from alchemetric_ray.cli import main

    message = ("config 'train.mode': 'max' contradicts train.metric='val_log_loss', where smaller is better; "
               "set train.mode=min or train.mode=auto")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.metric=val_log_loss", "train.mode=max"])
    assert str(err.value) == message
    with pytest.raises(ConfigError, match="'min' contradicts train.metric='val_accuracy', where larger is better"):
        load_config(None, ["train.metric=val_accuracy", "train.mode=min"])
    assert main(["train", "train.metric=val_log_loss", "train.mode=max"]) == 2
    assert capsys.readouterr().err.strip() == f"alchemetric-ray train: error: {message}"
    with pytest.raises(ConfigError,
                       match="config 'train.metric': 'val_loss' is not one of .*did you mean 'val_log_loss'"):
        load_config(None, ["train.metric=val_loss"])
