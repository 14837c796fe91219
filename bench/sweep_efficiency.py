"""Sweep efficiency: the same N trials with ASHA vs run fully one after another, through run_sweep,
for each way a trial runs its loop.

    .venv/bin/python bench/sweep_efficiency.py --trials 4        # quick set
    .venv/bin/python bench/sweep_efficiency.py --trials 8        # full set

Every contender goes through the product's own sweep (``run_sweep``: Ray Tune) on the same
synthetic shards (built once, outside the timing), the same grid of learning rates
(``tune.search=grid``, so every sweep runs exactly the same N configs in the same order) and
``train.patience=0`` (the loop's own early stopping is off, so only the scheduler stops trials):
  asha        tune.scheduler=asha  (grace period 1 epoch, reduction factor 2, max_t = train.epochs)
  full        tune.scheduler=none  every trial runs all train.epochs
each with both trial loops (``--trial-loop both``, the default):
  in-trial    tune.trial_loop=auto     a one-worker trial runs the loop in the trial's own process
  trainer     tune.trial_loop=trainer  every trial builds a TorchTrainer (six more processes)
in the order trainer-asha, in-trial-asha, in-trial-full, trainer-full (ABBA, so a drift of the
machine's speed over the run falls on both alike).  All run with ``tune.max_concurrent_trials=1``
-- one trial after another -- so the ratios are the scheduler's and the trial loop's doing alone,
not a difference in parallelism (``--concurrency 0`` gives the product's default instead).
Reported per trial loop: wall time of each sweep and the ratio asha/full, trial-epochs run and the
fraction ASHA saved, the best validation log-loss each sweep found (ASHA must not save time by
stopping the best trial), and a trial's fixed cost and an epoch's cost solved from the asha and full
sweeps' wall times and trial-epochs; then the in-trial/trainer ratio of the fixed costs.
Without ``--warmup`` (a 1-trial 1-epoch sweep that starts Ray's workers first) the first sweep pays
the cold start.  Writes bench/results/sweep-<trials>.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import machine, write_result

# learning rates from good to useless: a grid in this order lets ASHA, which compares a trial at a
# rung only with trials that already reached it, see good trials before it judges the bad ones
LRS = [0.003, 0.01, 1e-6, 0.001, 0.03, 3e-4, 1e-5, 1e-4]




def sweep(base: list[str], tmp: Path, name: str, scheduler: str, lrs: list[float], concurrency: int, epochs: int):
    from alchemetric_ray.config import load_config
    from alchemetric_ray.sweeps.sweep import run_sweep

    cfg = load_config(None, [*base, f"storage.path={tmp / 'results'}", f"storage.models_dir={tmp / 'models'}",
                             f"storage.name={name}", f"tune.scheduler={scheduler}", f"train.epochs={epochs}",
                             f"tune.max_concurrent_trials={concurrency}",
                             "tune.space={train.lr: [" + ", ".join(repr(lr) for lr in lrs) + "]}"])
    start = time.perf_counter()
    out = run_sweep(cfg, export=False, progress=False)
    wall = time.perf_counter() - start
    trials = [{"lr": t.config.get("train.lr"), "epochs_run": t.epochs_run, "stopped_early": t.stopped_early,
               "best_val_log_loss": t.best_value, "status": t.status} for t in out.summary.trials]
    return wall, trials, out.summary.best_value


LOOPS = {"in-trial": "auto", "trainer": "trainer"}


def solve(walls: dict, epochs_run: dict, trials: int) -> tuple[float | None, float | None]:
    """A trial's fixed cost and an epoch's cost from two sweeps of the same trials: wall = trials x
    fixed + trial-epochs x per-epoch, once with ASHA and once in full."""
    extra = epochs_run["full"] - epochs_run["asha"]
    per_epoch = (walls["full"] - walls["asha"]) / extra if extra else None
    if per_epoch is None or per_epoch <= 0:  # the first sweep paid Ray's cold start (no --warmup)
        return None, None
    return (walls["full"] - epochs_run["full"] * per_epoch) / trials, per_epoch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4, help=f"1..{len(LRS)}")
    parser.add_argument("--epochs", type=int, default=4, help="train.epochs of every trial (ASHA's max_t)")
    parser.add_argument("--tickers", type=int, default=40)
    parser.add_argument("--days", type=int, default=1000)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="tune.max_concurrent_trials for both; 0 = product default")
    parser.add_argument("--trial-loop", choices=["both", *LOOPS], default="both",
                        help="which trial loops to run (both: side by side, ABBA)")
    parser.add_argument("--warmup", action="store_true", help="a 1-trial 1-epoch sweep first, outside the timing")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if not 1 <= args.trials <= len(LRS):
        parser.error(f"--trials must be 1..{len(LRS)}")

    import ray

    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.shards import build_shards
    from alchemetric_ray.placement.session import ensure_ray

    lrs = LRS[:args.trials]
    loops = list(LOOPS) if args.trial_loop == "both" else [args.trial_loop]
    # ABBA: trainer's asha, in-trial's asha and full, trainer's full
    order = ([("trainer", "asha"), ("in-trial", "asha"), ("in-trial", "full"), ("trainer", "full")]
             if len(loops) > 1 else [(loops[0], "asha"), (loops[0], "full")])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data_cfg = load_config(None, ["data.source=synthetic", f"data.synthetic_tickers={args.tickers}",
                                      f"data.synthetic_days={args.days}", "data.synthetic_effect=1.0"])
        built = build_shards(data_cfg, tmp / "shards")
        base = [f"data.path={built.out}", f"model.name={args.model}", "model.hidden=32", "train.batch_size=1024",
                "train.patience=0", "train.metric=val_log_loss", "train.mode=min", "tune.search=grid",
                "tune.grace_period=1"]
        ensure_ray(load_config(None, base))
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        warm = sweep(base, tmp, "warmup", "none", lrs[:1], 1, 1)[0] if args.warmup else None
        runs: dict[str, dict] = {loop: {} for loop in loops}
        for loop, kind in order:
            scheduler = "asha" if kind == "asha" else "none"
            runs[loop][kind] = sweep([*base, f"tune.trial_loop={LOOPS[loop]}"], tmp, f"{loop}-{kind}", scheduler, lrs,
                                     args.concurrency, args.epochs)
        cpus = ray.cluster_resources().get("CPU")
    ray.shutdown()

    planned = args.trials * args.epochs
    by_loop = {}
    for loop in loops:
        wall = {k: runs[loop][k][0] for k in ("asha", "full")}
        epochs_run = {k: sum(t["epochs_run"] for t in runs[loop][k][1]) for k in ("asha", "full")}
        fixed, per_epoch = solve(wall, epochs_run, args.trials)
        by_loop[loop] = {
            "tune.trial_loop": LOOPS[loop], "wall_s": wall, "wall_ratio_asha_vs_full": wall["asha"] / wall["full"],
            "trial_epochs": {"planned": planned, **epochs_run},
            "trial_epochs_saved": planned - epochs_run["asha"],
            "trial_epochs_saved_frac": (planned - epochs_run["asha"]) / planned,
            "seconds_per_trial_epoch_full": wall["full"] / max(1, epochs_run["full"]),
            "fixed_s_per_trial": fixed, "s_per_trial_epoch": per_epoch,
            "best_val_log_loss": {k: runs[loop][k][2] for k in ("asha", "full")},
            "trials_detail": {k: runs[loop][k][1] for k in ("asha", "full")},
        }
    fixed = {loop: by_loop[loop]["fixed_s_per_trial"] for loop in loops}
    fixed_ratio = (fixed["in-trial"] / fixed["trainer"]
                   if len(loops) > 1 and fixed["in-trial"] is not None and fixed["trainer"] else None)
    result = {
        "benchmark": "sweep_efficiency",
        "machine": machine(ray_logical_cpus=cpus),
        "versions": {"torch": torch.__version__, "ray": ray.__version__},
        "trials": args.trials, "epochs_per_trial": args.epochs, "model": args.model, "lrs": lrs,
        "train_rows": built.manifest.rows["train"], "max_concurrent_trials": args.concurrency or "product default",
        "order": [f"{loop}-{kind}" for loop, kind in order], "warmup_sweep_s": warm,
        "by_trial_loop": by_loop, "fixed_ratio_in_trial_vs_trainer": fixed_ratio,
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"sweep efficiency: {args.trials} trials x {args.epochs} epochs, {args.model}, "
          f"{built.manifest.rows['train']:,} train rows, max_concurrent_trials={args.concurrency or 'default'}, "
          f"one sweep each (order {', '.join(result['order'])}); "
          + (f"warm-up sweep {warm:.1f}s" if warm is not None else "no warm-up: the first sweep paid the cold start"))
    print(f"{'trial loop':10s} {'sweep':6s} {'wall s':>8s} {'trial-epochs':>13s} {'best val_log_loss':>18s}")
    for loop in loops:
        r = by_loop[loop]
        for k in ("full", "asha"):
            print(f"{loop:10s} {k:6s} {r['wall_s'][k]:8.1f} {r['trial_epochs'][k]:13d} "
                  f"{r['best_val_log_loss'][k]:18.4f}")
    for loop in loops:
        r = by_loop[loop]
        line = (f"{loop}: asha/full wall-time ratio {r['wall_ratio_asha_vs_full']:.2f}; trial-epochs saved "
                f"{r['trial_epochs_saved']}/{planned} ({100 * r['trial_epochs_saved_frac']:.0f}%); ")
        if r["fixed_s_per_trial"] is not None:
            line += f"a trial's fixed cost {r['fixed_s_per_trial']:.1f}s, an epoch {r['s_per_trial_epoch']:.2f}s"
        else:
            line += "a trial's fixed cost: not solvable from this run (use --warmup)"
        print(line)
        print("  stopped by ASHA: " + (", ".join(f"lr {t['lr']} after {t['epochs_run']}"
                                                  for t in r["trials_detail"]["asha"] if t["stopped_early"]) or "none"))
    if fixed_ratio is not None:
        print(f"a trial's fixed cost, in-trial/trainer: {fixed_ratio:.2f} "
              f"({fixed['in-trial']:.1f}s vs {fixed['trainer']:.1f}s)")
    write_result(args.out, f"sweep-{args.trials}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
