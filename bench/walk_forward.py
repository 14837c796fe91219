"""What a pooled walk-forward costs: its refits, phase by phase, beside one plain `train` of the same
config in the same Ray session.

    .venv/bin/python bench/walk_forward.py                       # the packaged data, default model and refit
    .venv/bin/python bench/walk_forward.py signals.refit_every=252 model.name=lstm    # any config override

It trains the model once as `train` does (the reference: a refit is that run on fewer dates), then
runs `evaluate --walk-forward` on it and prints each refit's seconds by phase: ``train`` (its
shards from the features computed once for every refit, the fit, the export), ``stage`` (its
inputs: the shared inputs through its normalization; refit 0's also holds the one computation of
both shared feature sets), ``predict`` (Ray Data batch inference) and ``baselines`` (their fits and
scores on the block); then the totals, each phase's share, the refits per minute, and a refit's
mean time over the reference run's.  Writes bench/results/walk-forward.json.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

from alchemetric_ray.config import load_config
from alchemetric_ray.signals.evaluate import evaluate
from alchemetric_ray.training.trainer import run_training

PHASES = ("train", "stage", "predict", "baselines")


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-walk-forward-") as work:
        cfg = load_config(None, [*argv, f"storage.path={work}/results", f"storage.models_dir={work}/models",
                                 "storage.name=bench-wf"])
        started = time.monotonic()
        model_dir = run_training(cfg, progress=False).model_dir
        reference = time.monotonic() - started
        started = time.monotonic()
        result = evaluate(model_dir, None, Path(work) / "eval", cfg, pooled=True)
        total = time.monotonic() - started
    wf = result["walk_forward"]
    folds = wf["folds"]
    print(f"\nwalk-forward cost: {cfg.model.name}, refit every {wf['refit_every']} trading days "
          f"({wf['window']} window), {wf['refits']} refits; the reference `train` of the whole config: "
          f"{reference:.1f} s")
    print(f"{'refit':>5} {'scored':<23} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'sum':>7}")
    for fold in folds:
        s = fold["seconds"]
        print(f"{fold['fold']:>5} {fold['test_start'] + '..' + fold['test_end']:<23} "
              + " ".join(f"{s[p]:>8.1f}s" for p in PHASES) + f" {sum(s.values()):>6.1f}s")
    sums = {p: sum(f["seconds"][p] for f in folds) for p in PHASES}
    refits = sum(sums.values())
    print(f"{'all':>5} {'':<23} " + " ".join(f"{sums[p]:>8.1f}s" for p in PHASES) + f" {refits:>6.1f}s")
    print(f"{'share':>5} {'':<23} " + " ".join(f"{sums[p] / refits:>9.0%}" for p in PHASES))
    mean = refits / len(folds)
    seg = wf["pooled"]["segment"]
    print(f"refits: {wf['refits_per_minute']:.2f} a minute; a refit {mean:.1f} s = {mean / reference:.2f}x the "
          f"reference run; the whole evaluate --walk-forward {total:.1f} s (the main model's own test segment "
          f"and the pooled scoring included); pooled {seg['start']}..{seg['end']}, "
          f"{wf['pooled']['rows'][0]['rank_ic']['n_days']} days: {wf['pooled']['verdict']['line']}")
    write_result(Path(__file__).resolve().parent / "results", "walk-forward", {
        "benchmark": "walk-forward", "overrides": argv, "machine": machine(), "reference_train_s": reference,
        "evaluate_s": total, "refits": wf["refits"], "refit_every": wf["refit_every"], "window": wf["window"],
        "phases_s": sums, "refit_mean_s": mean, "refits_per_minute": wf["refits_per_minute"], "folds": folds,
        "pooled_rank_ic": wf["pooled"]["rows"][0]["rank_ic"], "verdict": wf["pooled"]["verdict"]["line"]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
