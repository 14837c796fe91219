"""Loop overhead: our per-worker loop under TorchTrainer + Ray Data vs plain PyTorch loops.

    .venv/bin/python bench/loop_overhead.py                       # MLP, batch 4096
    .venv/bin/python bench/loop_overhead.py --model lstm --batch 1024

Same shards, model, optimizer step, batch size and torch threads, in one run:
  streamed  ours with train.cache_data=false (Ray Data every epoch)  vs  plain loop that reads
            the Parquet with pyarrow each epoch -> one tensor -> batches
  cached    ours with train.cache_data=true (epochs >= 2)            vs  plain loop over tensors
            already in memory
samples/s is measured per epoch over the training steps (the loop's own figure for ours), each contender run
--repeats times per mode in ABBA order, medians over all epochs >= 2;
start-up (Ray, worker group, first read) is reported apart.  Writes bench/results/loop-<model>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import machine, write_result
from torch import nn


def plain_loop(cfg, shards: Path, manifest, epochs: int, threads: int, in_memory: bool) -> list[float]:
    """samples/s per epoch of a hand-written loop over the same data."""
    from alchemetric_ray.hardware import OptimizerStep, resolve_precision
    from alchemetric_ray.models import build_model, model_spec
    from alchemetric_ray.train.evaluate import model_inputs, split_frame

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    features = manifest.features
    mode = model_spec(cfg.model.name).inputs
    model = build_model(cfg.model, len(features), manifest.outputs, window=cfg.features.window)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    precision = resolve_precision("fp32", torch.device("cpu"))
    step_fn = OptimizerStep(opt, precision, grad_clip=cfg.train.grad_clip)
    loss_fn = nn.CrossEntropyLoss()

    def load():
        frame = split_frame(shards, "train", features)
        x, rows = model_inputs(frame, features, mode, cfg.features.window)
        return torch.from_numpy(x), torch.from_numpy(rows["label"].to_numpy().astype(np.int64))

    cached = load() if in_memory else None
    rates = []
    for epoch in range(epochs):
        start = time.perf_counter()
        x_all, y_all = cached if in_memory else load()
        order = torch.randperm(len(y_all))
        model.train()
        for step, i in enumerate(range(0, len(order), cfg.train.batch_size)):
            idx = order[i:i + cfg.train.batch_size]
            loss = loss_fn(model(x_all[idx]), y_all[idx])
            step_fn(loss, epoch=epoch, step=step)
        rates.append(len(y_all) / (time.perf_counter() - start))
    return rates


def ours(cfg, shards: Path, manifest, cache: bool, name: str):
    import ray

    from alchemetric_ray.data.loaders import build_datasets
    from alchemetric_ray.models import model_spec
    from alchemetric_ray.train.plan import plan_resources
    from alchemetric_ray.train.trainer import build_trainer

    run_cfg = cfg.replace(f"train.cache_data={'true' if cache else 'false'}")
    plan = plan_resources(run_cfg, ray.cluster_resources())
    datasets, _ = build_datasets(shards, model_spec(run_cfg.model.name).inputs, run_cfg.features.window)
    start, start_wall = time.perf_counter(), time.time()
    result = build_trainer(run_cfg, datasets, manifest, plan, name=name).fit()
    wall, end_wall = time.perf_counter() - start, time.time()
    history = result.return_value["history"]
    rates = [h["samples_per_s"] for h in history]
    train_time = sum(manifest.rows["train"] / r for r in rates)
    return rates, wall, wall - train_time, result.return_value["threads"], breakdown(result.return_value["phases"],
                                                                                   start_wall, end_wall)


PHASES = ("read", "train", "validate", "checkpoint")


def breakdown(phases: list[dict], fit_start: float, fit_end: float) -> dict:
    """A run's wall time by phase (the worker's own records, train/phases.py) and what lies around them:
    fit() to the loop's start (Ray's controller and worker group) and the loop's end to fit()'s return."""
    from alchemetric_ray.train.phases import seconds_by_phase

    by_phase = seconds_by_phase(phases)
    seconds = {"to_loop_start": phases[0]["at"] - fit_start, **{p: by_phase.get(p, 0.0) for p in PHASES}}
    seconds["loop_end_to_return"] = fit_end - phases[-1]["at"]
    memory = {phase: {"private_mib": max((r["private_mib"] or 0) for r in phases if r["phase"] == phase),
                      "peak_mib": max((r["peak_mib"] or 0) for r in phases if r["phase"] == phase)}
              for phase in PHASES if any(r["phase"] == phase for r in phases)}
    return {"seconds": seconds, "memory": memory}


def print_breakdown(label: str, runs: list[dict]) -> dict:
    """Medians over the runs of one mode, printed on two lines; returned for the results file."""
    seconds = {k: statistics.median(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}
    memory = {p: {k: statistics.median(r["memory"][p][k] for r in runs) for k in ("private_mib", "peak_mib")}
              for p in runs[0]["memory"]}
    print(f"{label}: where a run's time goes (median s): fit() -> loop start {seconds['to_loop_start']:.1f} "
          f"(Ray: controller, worker group) | " + " | ".join(f"{p} {seconds[p]:.1f}" for p in PHASES)
          + f" | loop end -> fit() return {seconds['loop_end_to_return']:.1f}")
    print(f"{label}: worker memory per phase (MiB, private at its end / peak during it): "
          + ", ".join(f"{p} {m['private_mib']:.0f}/{m['peak_mib']:.0f}" for p, m in memory.items()))
    return {"seconds": seconds, "memory": memory}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=None, help="default: 4096 (mlp), 1024 (sequence models)")
    parser.add_argument("--tickers", type=int, default=100)
    parser.add_argument("--days", type=int, default=1500)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each contender per mode, in ABBA order")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads for both loops (default: the product's choice)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    import ray

    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.shards import build_shards
    from alchemetric_ray.train.session import ensure_ray

    batch = args.batch or (4096 if args.model == "mlp" else 1024)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, ["data.source=synthetic", f"data.synthetic_tickers={args.tickers}",
                                 f"data.synthetic_days={args.days}", f"model.name={args.model}",
                                 f"train.batch_size={batch}", f"train.epochs={args.epochs}", "train.patience=0",
                                 "model.dropout=0.0", f"storage.path={tmp}/results", "features.window=20",
                                 f"scaling.threads_per_worker={args.threads}"])
        built = build_shards(cfg, Path(tmp) / "shards")
        shards, manifest = built.out, built.manifest
        ensure_ray(cfg)
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        # This machine's speed drifts by up to 2x over minutes, so each mode runs ours and plain
        # `--repeats` times in ABBA order (ours, plain, plain, ours, ...) and every figure is the
        # median over all their epochs >= 2.
        threads = args.threads or None
        per_epoch = {k: [] for k in ("ours_streamed", "plain_parquet_each_epoch", "ours_cached", "plain_in_memory")}
        walls, startups = {"streamed": [], "cached": []}, {"streamed": [], "cached": []}
        phases: dict[str, list[dict]] = {"streamed": [], "cached": []}
        modes = (("streamed", False, "plain_parquet_each_epoch"), ("cached", True, "plain_in_memory"))
        for mode, cache, plain_key in modes:
            for r in range(args.repeats):
                for who in (("ours", "plain") if r % 2 == 0 else ("plain", "ours")):
                    if who == "ours":
                        rates, wall, startup, threads, parts = ours(cfg, shards, manifest, cache=cache,
                                                                    name=f"bench-{mode}-{r}")
                        phases[mode].append(parts)
                        per_epoch[f"ours_{mode}"].append(rates)
                        walls[mode].append(wall)
                        startups[mode].append(startup)
                    else:
                        per_epoch[plain_key].append(plain_loop(cfg, shards, manifest, args.epochs, threads or 1,
                                                               in_memory=cache))
    ray.shutdown()
    startup_s, startup_c = statistics.median(startups["streamed"]), statistics.median(startups["cached"])
    wall_s, wall_c = statistics.median(walls["streamed"]), statistics.median(walls["cached"])
    ours_stream, ours_cache = per_epoch["ours_streamed"], per_epoch["ours_cached"]
    plain_stream, plain_cache = per_epoch["plain_parquet_each_epoch"], per_epoch["plain_in_memory"]

    def med(runs, skip_first):
        return statistics.median([r for rates in runs for r in (rates[1:] if skip_first and len(rates) > 1 else rates)])

    rows = {
        "streamed": (med(ours_stream, True), med(plain_stream, True)),
        "cached": (med(ours_cache, True), med(plain_cache, True)),
    }
    result = {
        "benchmark": "loop_overhead", "machine": machine(), "model": args.model, "batch": batch, "threads": threads,
        "train_rows": manifest.rows["train"], "epochs": args.epochs, "repeats": args.repeats,
        "per_epoch_samples_per_s": {"ours_streamed": ours_stream, "plain_parquet_each_epoch": plain_stream,
                                    "ours_cached": ours_cache, "plain_in_memory": plain_cache},
        "median_epochs_2plus": {k: {"ours": o, "plain": p, "ratio": o / p} for k, (o, p) in rows.items()},
        "startup_s": {"streamed": startup_s, "cached": startup_c}, "wall_s": {"streamed": wall_s, "cached": wall_c},
        "versions": {"torch": torch.__version__, "ray": ray.__version__}, "date": time.strftime("%Y-%m-%d"),
    }
    print(f"loop overhead: {args.model}, batch {batch}, {manifest.rows['train']:,} train rows, "
          f"{threads} torch threads, median of epochs 2..{args.epochs} of {args.repeats} runs each, ABBA order")
    print(f"{'mode':10s} {'ours samples/s':>15s} {'plain samples/s':>16s} {'ratio':>7s}")
    for k, (o, p) in rows.items():
        print(f"{k:10s} {o:15,.0f} {p:16,.0f} {o / p:7.2f}")
    print(f"start-up and reporting outside the training steps: streamed {startup_s:.1f}s, cached {startup_c:.1f}s "
          f"(wall {wall_s:.1f}s / {wall_c:.1f}s)")
    result["breakdown"] = {mode: print_breakdown(mode, runs) for mode, runs in phases.items()}
    write_result(args.out, f"loop-{args.model}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
