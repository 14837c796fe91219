"""The command line as users type it: options and ``section.key=value`` overrides in any order, in
every command and in the ``jobs/*.py`` entry points that ``ray job submit`` runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alchemetric_ray.cli import COMMANDS, parse_args

REPO = Path(__file__).resolve().parents[1]
REQUIRED = {"features": ["--out", "X"], "predict": ["--model", "M", "--out", "S"],
            "evaluate": ["--model", "M", "--out", "R"], "promote": ["--model", "models:/M/1"],
            "refit": ["--model", "models:/M@champion", "--data", "NEW", "--out", "R"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_overrides_may_come_before_between_and_after_options(command):
    argv = [command, "train.lr=0.01", *REQUIRED.get(command, []), "--device", "cpu", "features.horizon=5", "--verbose",
            "tune.space={train.lr: [0.01, 0.001]}"]
    args = parse_args(argv)
    assert args.overrides == ["train.lr=0.01", "features.horizon=5", "tune.space={train.lr: [0.01, 0.001]}"]
    assert args.device == "cpu" and args.verbose


def test_an_unknown_option_is_still_refused_among_overrides(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["features", "data.source=builtin", "--quiet", "--out", "X", "--qiet", "features.horizon=5"])
    assert exit_.value.code == 2 and "unrecognized arguments: --qiet" in capsys.readouterr().err


def test_the_issue_s_command_line_builds_shards_with_the_late_override(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", "features", "data.source=builtin", "--quiet",
                           "--out", str(tmp_path / "X"), "features.horizon=5", "data.tickers=AAPL,MSFT"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads((tmp_path / "X" / "manifest.json").read_text())["label"]["horizon"] == 5


@pytest.mark.parametrize("job, args", [("train", []), ("tune", []), ("predict", ["--model", "M", "--out", "S"])])
def test_every_job_entry_point_takes_overrides_anywhere_and_keeps_did_you_mean(job, args, tmp_path):
    """A wrong key after an option that follows an override reaches the config (its did-you-mean error),
    rather than argparse's "unrecognized arguments"."""
    proc = subprocess.run([sys.executable, str(REPO / "jobs" / f"{job}.py"), "storage.name=x", *args, "--device", "cpu",
                           "features.horizn=3"], capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"alchemetric-ray {job}: error: override: unknown config key 'features.horizn'; "
                                   "did you mean 'features.horizon'?"), proc.stderr
