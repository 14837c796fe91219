"""The stocknet test-segment table: rank IC [95% CI] per target, loss and model, next to the baselines.

    .venv/bin/python scripts/stocknet_targets.py                 # all six rows, about 6 minutes on 2 cores
    .venv/bin/python scripts/stocknet_targets.py cs_rank:ic:lstm  # chosen rows: label:loss:model

Each row trains on the packaged stocknet prices with the default config (a local Ray, the CPU) and
evaluates on the held-back test segment; one JSON line per run, then a markdown table.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from alchemetric_ray.config import load_config
from alchemetric_ray.signals.evaluate import evaluate
from alchemetric_ray.training.trainer import run_training

RUNS = [("three_class", "auto", "mlp"), ("cs_rank", "mse", "mlp"), ("cs_rank", "ic", "mlp"),
        ("cs_zscore", "mse", "mlp"), ("cs_rank", "ic", "lstm"), ("cs_rank", "ic", "tcn")]
NOT_LEARNED = ("deep model", "momentum 20d", "buy and hold")


def run(label: str, loss: str, model: str, work: Path) -> dict:
    started = time.time()
    name = f"{label}-{loss}-{model}"
    cfg = load_config(None, [f"features.label={label}", f"train.loss={loss}", f"model.name={model}",
                             f"storage.path={work / 'results'}", f"storage.models_dir={work / 'models'}",
                             f"storage.name={name}", "device.name=cpu"])
    result = evaluate(run_training(cfg, progress=False).model_dir, None, work / f"eval-{name}")
    rows = {r["name"]: {**{k: r["rank_ic"][k] for k in ("mean", "ci_low", "ci_high")},
                        "ls_sharpe": r["long_short"]["sharpe"]} for r in result["rows"]}
    return {"label": label, "loss": loss, "model": model, "seconds": time.time() - started, "rows": rows,
            "verdict": result["verdict"]["line"], "segment": result["segment"]}


def _ci(r: dict) -> str:
    return f"{r['mean']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"


def main(argv: list[str]) -> None:
    runs = [tuple(arg.split(":")) for arg in argv] or RUNS
    out = []
    with tempfile.TemporaryDirectory(prefix="alchemetric-targets-") as work:
        for label, loss, model in runs:
            out.append(run(label, loss, model, Path(work)))
            print(json.dumps(out[-1]), flush=True)
    print(f"\ntest segment {out[0]['segment']['start']}..{out[0]['segment']['end']}")
    print("| target | loss | model | deep model rank IC [95% CI] | L/S Sharpe | learned baselines, same target "
          "| verdict |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        rows = r["rows"]
        learned = "; ".join(f"{n} {_ci(v)}" for n, v in rows.items() if n not in NOT_LEARNED)
        print(f"| {r['label']} | {r['loss']} | {r['model']} | {_ci(rows['deep model'])} | "
              f"{rows['deep model']['ls_sharpe']:.2f} | {learned} | {r['verdict'].split(' (')[0]} |")


if __name__ == "__main__":
    main(sys.argv[1:])
