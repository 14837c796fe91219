"""The configuration reference is generated from the config's fields: every field documented, the committed
docs/configuration.md up to date, every rule across fields naming the fields it reads, and --help pointing there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from alchemetric_ray.config import REFERENCE_DOC, RULES, RunConfig, load_config, reference, sections
from alchemetric_ray.config_reference import render
from alchemetric_ray.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_every_field_has_help_text():
    missing = [row.dotted for row in reference() if len(row.help.strip()) < 10]
    assert missing == [], \
        "give these fields a help text: setting(default, 'help', ...) in alchemetric_ray/config/schema.py"


def test_every_section_says_what_it_configures():
    generated = [name for name, summary in sections() if not summary or summary.startswith(f"{name.title()}Config(")]
    assert generated == [], "give these sections' dataclasses a docstring"


def test_the_reference_holds_every_key_once_with_its_default():
    rows = reference()
    keys = [row.dotted for row in rows]
    defaults = RunConfig().to_dict()
    assert keys == [f"{section}.{key}" for section in defaults for key in defaults[section]]
    assert len(set(keys)) == len(keys)
    by_key = {row.dotted: row for row in rows}
    assert by_key["train.lr"].default == "0.001" and by_key["train.lr"].allowed == "> 0"
    assert by_key["data.path"].default == "null" and by_key["data.path"].type == "string or null"
    assert by_key["precision.mode"].allowed == "auto, fp32, fp16, bf16"
    assert by_key["tracking.mlflow_uri"].default == '""'
    assert by_key["tune.space"].default == "{}" and by_key["tune.space"].type == "mapping"


def test_the_committed_reference_is_current():
    committed = REPO / REFERENCE_DOC
    assert committed.is_file(), f"{REFERENCE_DOC} is missing: run `make docs` and commit it"
    assert committed.read_text() == render(), f"{REFERENCE_DOC} is stale: run `make docs` and commit it"


def test_a_field_check_refuses_in_one_line_with_what_the_reference_says():
    """Each single-field check is the one the reference shows: its expectation text is the message's."""
    for row in reference():
        section, key = row.section, row.key
        field = next(f for f in dataclasses.fields(type(getattr(RunConfig(), section))) if f.name == key)
        check = field.metadata.get("check")
        if check is not None:
            assert check.expected == row.allowed, row.dotted
    with pytest.raises(ConfigError) as err:
        load_config(None, ["signals.quantile=0.7"])
    assert str(err.value) == "config 'signals.quantile': 0.7 is invalid, expected in (0, 0.5]"


class _Recorder:
    """A config stand-in that records every ``section.key`` a rule reads."""

    def __init__(self, cfg: RunConfig, seen: set[str]):
        self._cfg, self._seen = cfg, seen

    def __getattr__(self, section: str):
        values, seen = getattr(self._cfg, section), self._seen

        class _Section:
            def __getattr__(self, key: str):
                seen.add(f"{section}.{key}")
                return getattr(values, key)

        return _Section()


@pytest.mark.parametrize("overrides", [
    [],
    ["features.label=cs_rank", "train.loss=ic", "train.metric=val_ic", "train.mode=max"],
    ["features.train_end=2015-01-01", "features.val_end=2016-01-01", "features.train_start=2013-01-01"],
    ["train.metric=val_log_loss", "train.mode=min"],
])
def test_each_rule_names_the_fields_it_reads(overrides):
    known = {row.dotted for row in reference()}
    cfg = load_config(None, overrides)
    for each in RULES:
        assert each.says and set(each.keys) <= known, each.keys
        seen: set[str] = set()
        assert each.problem(_Recorder(cfg, seen)) is None
        assert seen <= set(each.keys), f"rule {each.keys} also reads {sorted(seen - set(each.keys))}"


def test_a_broken_rule_names_its_first_key():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["features.train_end=2015-01-01", "features.val_end=2014-01-01"])
    assert str(err.value) == "config 'features.val_end': '2014-01-01' is invalid, expected a date after train_end " \
                             "(2015-01-01)"


def test_help_lists_the_sections_and_points_to_the_reference():
    from alchemetric_ray.cli import COMMANDS, build_parser

    parser = build_parser()
    texts = {"alchemetric-ray": parser.format_help()}
    sub = next(a for a in parser._actions if a.dest == "command")
    texts |= {name: sub.choices[name].format_help() for name in COMMANDS}
    for where, text in texts.items():
        assert REFERENCE_DOC in text, where
        for name, summary in sections():
            assert f"  {name}" in text and summary in text, (where, name)
