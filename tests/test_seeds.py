"""Seed ensembles (issue 42 item 3): ``train.seeds=N`` trains N runs and exports their average.

* :class:`SeedEnsemble` averages what its members' outputs stand for: scores, or class probabilities;
* ``train --evaluate`` with ``train.seeds=3``: three Ray Train runs (local mode), each the run a lone
  ``train.seed=i`` would have been; one model folder holding the three members; its evaluation scores
  the average and reports each seed's rank IC (each equal to that seed's own model's), named in the
  verdict line and the report;
* ``--resume`` of a finished ensemble trains nothing again and exports the same model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from alchemetric_ray.cli import main

MARKET = ["data.source=synthetic", "data.synthetic_tickers=8", "data.synthetic_days=300", "data.seed=5",
          "train.epochs=2", "model.hidden=16", "device.name=cpu"]


def test_a_seed_ensemble_averages_scores_and_class_probabilities():
    from alchemetric_ray.models.ensemble import SeedEnsemble
    from alchemetric_ray.models.mlp import MLP

    torch.manual_seed(0)
    x = torch.randn(6, 4)
    for classes in (1, 3):
        members = [MLP(4, classes, hidden=8).eval() for _ in range(3)]  # eval: no dropout draws
        with torch.no_grad():
            outs = [m(x) for m in members]
            got = SeedEnsemble(members)(x)
        if classes == 1:
            torch.testing.assert_close(got, torch.stack(outs).mean(0))
        else:  # the softmax of its output is the members' mean probability
            torch.testing.assert_close(torch.softmax(got, -1), torch.stack([o.softmax(-1) for o in outs]).mean(0))
    with pytest.raises(ValueError, match="at least one member"):
        SeedEnsemble([])


def _args(tmp_path, name: str, *more: str) -> list[str]:
    return [*MARKET, f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
            f"storage.name={name}", *more]


@pytest.mark.slow
def test_three_seeds_train_three_runs_export_their_ensemble_and_the_evaluation_names_each_seeds_rank_ic(
        tmp_path, capsys):
    from alchemetric_ray.artifacts.export import load_model

    assert main(["train", "--evaluate", *_args(tmp_path, "ens", "train.seeds=3")]) == 0
    out = capsys.readouterr().out
    starts = [line for line in out.splitlines() if line.startswith("seed ")]
    assert [s.split(":")[0] for s in starts] == ["seed 1 of 3", "seed 2 of 3", "seed 3 of 3"], out[-3000:]
    assert [s.split(", run ")[0].split(": ")[1] for s in starts] == ["train.seed=0", "train.seed=1", "train.seed=2"]
    assert out.count("features: building shards") == 1  # the first seed's run builds them; the others read them
    assert out.count("resource plan:") == 1 and out.count("train loop ") == 1  # the later seeds run the same plan
    # the summary names every seed's run, and TensorBoard shows them all
    (summary,) = [line for line in out.splitlines() if line.startswith("runs of the 3 seeds, best ")]
    names = [s.split(", run ")[1] for s in starts]
    assert all(f"{name} " in summary for name in names), summary
    (board,) = [line for line in out.splitlines() if line.startswith("TensorBoard: ")]
    assert board == "TensorBoard: tensorboard --logdir_spec " + ",".join(
        f"{name}:{tmp_path / 'results' / name / 'tensorboard'}" for name in names), board
    import alchemetric_ray as ar

    result = ar.load_result(tmp_path / "results" / names[-1])
    assert [s["name"] for s in result.seeds] == names and sorted(set(result.history["seed"])) == [0, 1, 2]
    assert len(result.history) == sum(s["epochs_run"] for s in result.seeds)
    model_dir = tmp_path / "models" / "ens"
    loaded = load_model(model_dir)
    assert type(loaded.model).__name__ == "SeedEnsemble" and len(loaded.model.members) == 3
    assert loaded.config.train.seeds == 3 and loaded.config.train.seed == 0
    assert loaded.config.data.source == "synthetic" and loaded.config.data.path is None  # the bars, not the shards
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert [s["seed"] for s in metrics["seeds"]] == [0, 1, 2]

    # each member is the model a lone run at its seed exports: the same weights
    assert main(["train", *_args(tmp_path, "alone", "train.seed=1")]) == 0
    alone = load_model(tmp_path / "models" / "alone").model.state_dict()
    member = loaded.model.members[1].state_dict()
    assert alone.keys() == member.keys() and all(torch.equal(alone[k], member[k]) for k in alone)

    # the evaluation scores the average and reports each seed's rank IC, the lone seed-1 model's among them
    record = json.loads((model_dir / "evaluation" / "evaluation.json").read_text())
    spread = record["seeds"]
    assert spread["seeds"] == [0, 1, 2] and len(spread["rank_ic"]) == 3 and np.isfinite(spread["rank_ic"]).all()
    assert main(["evaluate", "--model", str(tmp_path / "models" / "alone"), "--out", str(tmp_path / "alone-eval")]) == 0
    lone = json.loads((tmp_path / "alone-eval" / "evaluation.json").read_text())
    assert "seeds" not in lone
    assert spread["rank_ic"][1] == pytest.approx(lone["rows"][0]["rank_ic"]["mean"], abs=1e-9)
    verdict = record["verdict"]["line"]
    assert verdict.endswith(f"(3 seeds, rank IC per seed {min(spread['rank_ic']):+.3f} to "
                            f"{max(spread['rank_ic']):+.3f})"), verdict
    assert verdict in out  # the console's verdict line is the record's
    capsys.readouterr()
    assert "Seed ensemble: the model scores the average of 3 models trained at seeds 0, 1, 2" in \
        (model_dir / "evaluation" / "report.md").read_text()

    # --resume: the latest ensemble of this name; every seed's epochs are done, none is trained again
    weights = (model_dir / "weights.pt").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", *_args(tmp_path, "ens", "train.seeds=3")]) == 0
    out = capsys.readouterr().out
    assert out.count("all 2 epoch(s) done, none trained again") == 3 and "epoch 1/2" not in out, out[-3000:]
    again = torch.load(model_dir / "weights.pt", weights_only=True)["model"]
    first = torch.load(__import__("io").BytesIO(weights), weights_only=True)["model"]
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
