"""The shadow check's cost: ms per step and seconds per epoch with it (adaptive, every 25 steps, every
step) against the same training without it, side by side in one run, on the CPU, no Ray.

    .venv/bin/python bench/shadow.py                           # mlp and transformer, bf16 vs its fp32 shadow
    .venv/bin/python bench/shadow.py --models transformer --epochs 10 --variants every-1   # the error figures
    .venv/bin/python bench/shadow.py --epochs 3 --repeats 2    # a quicker, noisier run (default: 6 x 3, ~1.5 min)

Each run is ``--epochs`` epochs of the loop's own epoch (``training/loop.py``'s ``_train_epoch``: the
loop's ``_Worker``, ``_trainables`` (fused AdamW, cosine schedule, ``OptimizerStep``), batches from
``WorkerBatches.cached`` in host memory) under bf16 autocast on the CPU (``resolve_precision("bf16",
cpu)``, which the policy allows for both models), with a ``ShadowCheck`` against its float32 CPU copy
built as the loop builds it (``train.shadow=true``), or none.  Models: the mlp (hidden 64, tabular
batches of 16 features) and the transformer (hidden 64, 2 layers, 4 heads) on sequence batches of
the shape the loop's collate hands it, (rows, window 20, 16 features); the data is synthetic (3
classes), made once.  Every variant starts from the same weights and sees the same batches.

The machine's speed drifts, so each repeat runs every variant in turn, the next repeat in the
reverse order (off, adaptive, every-25, every-1, then every-1, ..., off): interleaved, and linear
drift cancels.  ms/step is an epoch's wall time (the loop's own end-of-epoch read included) over its
steps; the figures are medians over every run's epochs >= 2 (the first is the warm-up, and where the
adaptive interval is still at its first gap).  The overhead is the variant's median over the
no-shadow median.  Also shown: the checks per run (median) and per epoch (epochs >= 2), the interval
the runs' last checks set (the adaptive one reached; a range where the runs differ), a check's own
cost (``ShadowStats.seconds`` / checks, what the adaptive rule spaces by) and the checks' share of
the time of epochs >= 2 (the rule's budget: 5 %), and the largest errors seen against the float32
copy (whole gradient, one parameter and which, loss).  Writes bench/results/shadow-cpu.json (every
run's epochs and running check counts too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import machine, write_result

from alchemetric_ray.config import ModelConfig, TrainConfig
from alchemetric_ray.data.batches import Batching, WorkerBatches
from alchemetric_ray.hardware import DeviceChoice, resolve_precision
from alchemetric_ray.hardware.inventory import cpu_count
from alchemetric_ray.hardware.staging import HOST, DataPath
from alchemetric_ray.models import build_model, model_spec
from alchemetric_ray.training import loop
from alchemetric_ray.training.losses import make_loss
from alchemetric_ray.training.shadow import BUDGET, TOLERANCE, ShadowCheck, ShadowSettings

CPU = torch.device("cpu")
FEATURES, CLASSES, WINDOW, HIDDEN = 16, 3, 20, 64
# rows and batch per model: about 40 steps an epoch, sized for 2 cores (bf16 on this CPU is slow)
SIZES = {"mlp": {"rows": 40 * 512, "batch": 512}, "transformer": {"rows": 40 * 64, "batch": 64}}
VARIANTS = {"off": None, "adaptive": 0, "every-25": 25, "every-1": 1}  # train.shadow_every (None: no check)


def make_data(model_name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, y, date, fwd) of the synthetic training rows: tabular, or the collate's sequence shape."""
    rows = SIZES[model_name]["rows"]
    generator = torch.Generator().manual_seed(seed)
    sequence = model_spec(model_name).inputs == "sequence"
    x = torch.randn((rows, WINDOW, FEATURES) if sequence else (rows, FEATURES), generator=generator)
    last = x[:, -1] if sequence else x
    signal = last[:, 0] - last[:, 1] + 0.5 * torch.randn(rows, generator=generator)
    y = torch.bucketize(signal, torch.tensor([-0.5, 0.5]))  # 3 classes
    return x, y, torch.arange(rows) // 64, torch.zeros(rows)


class Run:
    """One training run: the loop's epoch, with the shadow check at ``every`` (None: without), epoch by epoch."""

    def __init__(self, model_name: str, every: int | None, columns: tuple, epochs: int, threads: int):
        batch = SIZES[model_name]["batch"]
        precision = resolve_precision("bf16", CPU, model=model_spec(model_name))
        torch.manual_seed(0)
        self.model = build_model(ModelConfig(name=model_name, hidden=HIDDEN), FEATURES, CLASSES, window=WINDOW)
        self.worker = loop._Worker(0, 1, DeviceChoice(CPU, "bench"), precision, threads)
        self.data = WorkerBatches.cached(columns, None, Batching(batch, 0), CPU, DataPath(HOST, "host memory"))
        self.steps = self.data.steps_per_epoch(0)
        self.trainables = loop._trainables(self.model, TrainConfig(batch_size=batch, epochs=epochs), self.worker,
                                           self.steps)
        self.loss_fn = make_loss("ce")
        self.shadow = None if every is None else ShadowCheck(self.model, precision, (self.loss_fn, make_loss("ce")),
                                                             CPU, ShadowSettings(every=every),
                                                             scaler=self.trainables.step.scaler)
        # per epoch (the checks' figures as running totals)
        self.record = {"epoch_s": [], "steps_per_epoch": self.steps, "checks_so_far": [], "check_s_so_far": [],
                       "every_so_far": [], "shadow": None}

    def epoch(self, epoch: int) -> None:
        started = time.perf_counter()
        loop._train_epoch(loop.Training(self.model, self.trainables, self.loss_fn, self.data, self.worker, 0, 0,
                                        self.shadow), epoch)
        self.record["epoch_s"].append(time.perf_counter() - started)
        if self.shadow is not None:
            stats = self.shadow.stats
            self.record["checks_so_far"].append(stats.checks)
            self.record["check_s_so_far"].append(stats.seconds)
            self.record["every_so_far"].append(stats.every)
            self.record["shadow"] = stats.as_dict()


def summarise(runs: list[dict]) -> dict:
    """Medians over the runs' epochs >= 2 (all epochs where there is only one), and the checks' figures."""
    steps = runs[0]["steps_per_epoch"]
    epochs = [s for r in runs for s in (r["epoch_s"][1:] or r["epoch_s"])]
    per_run = [statistics.median(r["epoch_s"][1:] or r["epoch_s"]) for r in runs]
    row = {"epoch_s": statistics.median(epochs), "ms_per_step": 1000 * statistics.median(epochs) / steps,
           "ms_per_step_spread": [1000 * min(per_run) / steps, 1000 * max(per_run) / steps]}
    stats = [r["shadow"] for r in runs if r["shadow"]]
    if stats:
        # epochs >= 2: the checks' seconds and the epochs' (the first epoch's checks start at the first gap)
        skip = 1 if len(runs[0]["epoch_s"]) > 1 else 0
        later_checks = sum(r["checks_so_far"][-1] - (r["checks_so_far"][0] if skip else 0) for r in runs)
        later_check_s = sum(r["check_s_so_far"][-1] - (r["check_s_so_far"][0] if skip else 0) for r in runs)
        later_s = sum(sum(r["epoch_s"][skip:]) for r in runs)
        row.update(checks=statistics.median(s["checks"] for s in stats), every=[s["every"] for s in stats],
                   checks_per_epoch=later_checks / (len(runs) * (len(runs[0]["epoch_s"]) - skip)),
                   ms_per_check=1000 * statistics.median(s["seconds"] / max(s["checks"], 1) for s in stats),
                   check_share=later_check_s / later_s,
                   max_error=max(s["max_error"] for s in stats),
                   max_parameter_error=max(s["max_parameter_error"] for s in stats),
                   max_error_param=max(stats, key=lambda s: s["max_parameter_error"])["max_error_param"],
                   max_loss_error=max(s["max_loss_error"] for s in stats))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)} ('off' is "
                                                                        "always run: the reference)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per run (the first is the warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant, interleaved, order reversed "
                                                               "every other repeat")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: the loop's, the cores)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    variants = ["off"] + [v.strip() for v in args.variants.split(",") if v.strip() and v.strip() != "off"]
    if set(models) - set(SIZES) or set(variants) - set(VARIANTS) or args.epochs < 1 or args.repeats < 1:
        parser.error(f"--models of {', '.join(SIZES)}; --variants of {', '.join(VARIANTS)}; epochs, repeats >= 1")
    threads = args.threads or cpu_count()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    print(f"shadow check cost on the CPU: bf16 autocast against its float32 CPU copy, the loop's _train_epoch "
          f"in-process (no Ray), {args.epochs} epochs per run, {args.repeats} repeats; the variants' epochs "
          f"interleaved (order reversed every epoch), {threads} torch threads; torch {torch.__version__}")
    results = {}
    for model_name in models:
        columns = make_data(model_name)
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(args.repeats):
            here = {v: Run(model_name, VARIANTS[v], columns, args.epochs, threads) for v in variants}
            for epoch in range(args.epochs):  # each epoch of every variant in turn, the order reversed each time
                for v in (variants if (r * args.epochs + epoch) % 2 == 0 else variants[::-1]):
                    here[v].epoch(epoch)
            for v in variants:
                runs[v].append(here[v].record)
        rows = {v: summarise(runs[v]) for v in variants}
        for v, row in rows.items():  # paired: each epoch over the no-shadow run's same epoch, run beside it
            ratios = [[a / b for a, b in zip(mine["epoch_s"], off["epoch_s"])][1 if args.epochs > 1 else 0:]
                      for mine, off in zip(runs[v], runs["off"])]
            row["overhead"] = statistics.median(x for run_ratios in ratios for x in run_ratios)
            row["overhead_spread"] = [min(map(statistics.median, ratios)), max(map(statistics.median, ratios))]
        size = SIZES[model_name]
        shape = f"({size['batch']}, {WINDOW}, {FEATURES})" if model_spec(model_name).inputs == "sequence" \
            else f"({size['batch']}, {FEATURES})"
        params = sum(p.numel() for p in build_model(ModelConfig(name=model_name, hidden=HIDDEN), FEATURES, CLASSES,
                                                    window=WINDOW).parameters())
        steps = runs["off"][0]["steps_per_epoch"]
        print(f"\n{model_name}: hidden {HIDDEN}, {params:,} parameters, batches {shape}, {steps} steps an epoch "
              f"(medians of epochs 2..{args.epochs}; the runs' own medians in brackets)")
        print(f"{'variant':9s} {'ms/step [runs]':>21s} {'overhead [runs]':>19s} {'s/epoch':>8s} {'checks':>6s} "
              f"{'/epoch':>6s} {'every':>7s} {'ms/check':>8s} {'share':>6s}  largest error: gradient / parameter "
              "(which) / loss")
        for v, row in rows.items():
            lo, hi = row["ms_per_step_spread"]
            olo, ohi = row["overhead_spread"]
            line = (f"{v:9s} {row['ms_per_step']:6.2f} {f'[{lo:.2f}-{hi:.2f}]':>14s} {row['overhead']:6.3f}x "
                    f"{f'[{olo:.2f}-{ohi:.2f}]':>11s} {row['epoch_s']:8.3f}")
            if "checks" in row:
                every = sorted(set(row["every"]))
                shown = str(every[0]) if len(every) == 1 else f"{every[0]}-{every[-1]}"
                line += (f" {row['checks']:6.0f} {row['checks_per_epoch']:6.1f} {shown:>7s} {row['ms_per_check']:8.2f} "
                         f"{row['check_share']:6.1%}  "
                         f"{row['max_error']:.2%} / {row['max_parameter_error']:.2%} ({row['max_error_param']}) / "
                         f"{row['max_loss_error']:.3%}")
            print(line)
        results[model_name] = {"batch": size["batch"], "rows": size["rows"], "steps_per_epoch": steps,
                               "parameters": params, "batch_shape": shape, "rows_by_variant": rows,
                               "runs": runs}
    tol = TOLERANCE["bf16"]
    print(f"\nthe adaptive budget: checks cost at most {BUDGET:.0%} of the step time (training/shadow.py); "
          f"bf16 tolerances: gradient {tol.gradient:.0%}, parameter {tol.parameter:.0%}, loss {tol.loss:.0%}; "
          f"{time.perf_counter() - started:.0f} s in all")
    write_result(args.out, "shadow-cpu", {
        "benchmark": "shadow", "machine": machine(torch=torch.__version__, threads=threads),
        "precision": "bf16 autocast on the CPU against a float32 CPU copy", "epochs": args.epochs,
        "repeats": args.repeats, "variants": {v: VARIANTS[v] for v in variants}, "budget": BUDGET,
        "tolerance": tol.__dict__, "models": results, "date": time.strftime("%Y-%m-%d")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
