"""Loop overhead: our per-worker loop under TorchTrainer + Ray Data vs plain PyTorch loops.

    .venv/bin/python bench/loop_overhead.py                       # MLP, batch 4096
    .venv/bin/python bench/loop_overhead.py --model lstm --batch 1024
    .venv/bin/python bench/loop_overhead.py --tickers 700 --days 1500 --modes streamed --workers 2

Same shards, model, optimizer step, batch size and torch threads, in one run:
  streamed  ours with train.cache_data=false (Ray Data every epoch)  vs  plain loop that reads
            the Parquet with pyarrow each epoch -> one tensor -> batches
  cached    ours with train.cache_data=true (epochs >= 2)            vs  plain loop over tensors
            already in memory
With --workers N (tabular models): ours with scaling.workers=N (DDP, Ray Data's equal split) vs N
plain processes (torch.multiprocessing, gloo DDP on 127.0.0.1), each reading its share of the
train split (every N-th Parquet row group), the same number of steps on every rank.
samples/s is measured per epoch over the training steps (the loop's own figure for ours, summed over
the ranks), each contender run --repeats times per mode in ABBA order, medians over all epochs >= 2;
the extra seconds per epoch are the train rows at ours' rate minus the same at the plain rate.
Start-up (Ray, worker group, first read) is reported apart.  Writes
bench/results/loop-<model>-<train rows>k[-<N>workers].json.
"""

from __future__ import annotations

import argparse
import json
import socket
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


def plain_loop(cfg, shards: Path, manifest, epochs: int, threads: int, in_memory: bool, rank: int = 0,
               world: int = 1) -> list[float]:
    """samples/s per epoch of a hand-written loop over the same data (with world > 1: one rank of a
    gloo DDP group, reading its share; the figure is the group's rows over the slowest rank's time)."""
    import torch.distributed as dist

    from alchemetric_ray.hardware import OptimizerStep, adamw, resolve_precision
    from alchemetric_ray.models import build_model, model_spec
    from alchemetric_ray.scoring.predictions import model_inputs, split_frame

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    features = manifest.features
    mode = model_spec(cfg.model.name).inputs
    model = build_model(cfg.model, len(features), manifest.outputs, window=cfg.features.window)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = adamw(model.parameters(), lr=cfg.train.lr)  # the loop's AdamW
    precision = resolve_precision("fp32", torch.device("cpu"))
    step_fn = OptimizerStep(opt, precision, grad_clip=cfg.train.grad_clip, check_every=cfg.train.check_every)
    loss_fn = nn.CrossEntropyLoss()

    def load():
        if world > 1:
            return rank_share(shards, manifest, rank, world)
        frame = split_frame(shards, "train", features)
        x, rows = model_inputs(frame, features, mode, cfg.features.window)
        return torch.from_numpy(x), torch.from_numpy(rows["label"].to_numpy().astype(np.int64))

    def group(value: float, op: str) -> float:
        """The value over the ranks ("min", "sum" or "max"); this process's own with one rank."""
        if world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()))
        return float(t)

    cached = load() if in_memory else None
    rates = []
    batch = cfg.train.batch_size
    for epoch in range(epochs):
        start = time.perf_counter()
        x_all, y_all = cached if in_memory else load()
        order = torch.randperm(len(y_all))
        steps = int(group(-(-len(order) // batch), "min"))  # the same number of steps on every rank
        model.train()
        seen = 0
        for step in range(steps):
            idx = order[step * batch:(step + 1) * batch]
            loss = loss_fn(model(x_all[idx]), y_all[idx])
            step_fn(loss, epoch=epoch, step=step)
            seen += len(idx)
        elapsed = time.perf_counter() - start
        rates.append(group(seen, "sum") / group(elapsed, "max"))
    return rates


def rank_share(shards: Path, manifest, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain process's share of the train split: every world-th Parquet row group (65k rows), read with pyarrow."""
    import pyarrow.parquet as pq

    from alchemetric_ray.data.shards import split_files

    groups = [(f.path, g) for f in split_files(shards, "train", manifest)
              for g in range(pq.ParquetFile(f.path).metadata.num_row_groups)]
    tables = [pq.ParquetFile(path).read_row_group(g, columns=[*manifest.features, "label"])
              for path, g in groups[rank::world]]
    x = np.column_stack([np.concatenate([t.column(n).to_numpy() for t in tables]) for n in manifest.features])
    y = np.concatenate([t.column("label").to_numpy() for t in tables]).astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y)


def _plain_rank(rank: int, world: int, port: int, cfg, shards: Path, manifest, epochs: int, threads: int,
                in_memory: bool, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        rates = plain_loop(cfg, shards, manifest, epochs, threads, in_memory, rank=rank, world=world)
        if rank == 0:
            Path(out).write_text(json.dumps(rates))
    finally:
        dist.destroy_process_group()


def plain_processes(cfg, shards: Path, manifest, epochs: int, threads: int, in_memory: bool,
                    world: int) -> list[float]:
    """``world`` plain processes in one gloo DDP group (:func:`plain_loop` on each); rank 0's figures."""
    if world == 1:
        return plain_loop(cfg, shards, manifest, epochs, threads, in_memory)
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rates.json")
        mp.spawn(_plain_rank, args=(world, port, cfg, shards, manifest, epochs, threads, in_memory, out),
                 nprocs=world, join=True)
        return json.loads(Path(out).read_text())


def ours(cfg, shards: Path, manifest, cache: bool, name: str):
    import ray

    from alchemetric_ray.data.loaders import build_datasets
    from alchemetric_ray.models import model_spec
    from alchemetric_ray.placement.plan import plan_resources
    from alchemetric_ray.training.trainer import build_trainer

    run_cfg = cfg.replace(f"train.cache_data={'true' if cache else 'false'}")
    plan = plan_resources(run_cfg, ray.cluster_resources())
    datasets, _ = build_datasets(shards, model_spec(run_cfg.model.name).inputs, run_cfg.features.window)
    start, start_wall = time.perf_counter(), time.time()
    result = build_trainer(run_cfg, datasets, manifest, plan, name=name).fit()
    wall, end_wall = time.perf_counter() - start, time.time()
    history = result.return_value.history
    rates = [h["samples_per_s"] for h in history]
    train_time = sum(manifest.rows["train"] / r for r in rates)
    return rates, wall, wall - train_time, result.return_value.threads, breakdown(result.return_value.phases,
                                                                                   start_wall, end_wall)


PHASES = ("read", "train", "validate", "checkpoint")


def breakdown(phases: list, fit_start: float, fit_end: float) -> dict:
    """A run's wall time by phase (the worker's own records, training/phases.py) and what lies around them:
    fit() to the loop's start (Ray's controller and worker group) and the loop's end to fit()'s return."""
    from alchemetric_ray.training.phases import seconds_by_phase

    by_phase = seconds_by_phase(phases)
    seconds = {"to_loop_start": phases[0].at - fit_start, **{p: by_phase.get(p, 0.0) for p in PHASES}}
    seconds["loop_end_to_return"] = fit_end - phases[-1].at
    memory = {phase: {"private_mib": max((r.private_mib or 0) for r in phases if r.phase == phase),
                      "peak_mib": max((r.peak_mib or 0) for r in phases if r.phase == phase)}
              for phase in PHASES if any(r.phase == phase for r in phases)}
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


MODES = {"streamed": (False, "plain_parquet_each_epoch"), "cached": (True, "plain_in_memory")}


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
    parser.add_argument("--modes", default="streamed,cached", help="streamed, cached or both")
    parser.add_argument("--workers", type=int, default=1, help="ours: Train workers; plain: gloo processes")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: {args.modes!r}; expected streamed, cached or both")
    if args.workers < 1:
        parser.error(f"--workers: {args.workers}; expected >= 1")

    import ray

    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.shards import build_shards
    from alchemetric_ray.models import model_spec
    from alchemetric_ray.placement.session import ensure_ray

    if args.workers > 1 and model_spec(args.model).inputs != "tabular":
        parser.error(f"--workers {args.workers}: the plain processes split row groups, for tabular models only")
    batch = args.batch or (4096 if args.model == "mlp" else 1024)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, ["data.source=synthetic", f"data.synthetic_tickers={args.tickers}",
                                 f"data.synthetic_days={args.days}", f"model.name={args.model}",
                                 f"train.batch_size={batch}", f"train.epochs={args.epochs}", "train.patience=0",
                                 "model.dropout=0.0", f"storage.path={tmp}/results", "features.window=20",
                                 f"scaling.threads_per_worker={args.threads}", f"scaling.workers={args.workers}"])
        built = build_shards(cfg, Path(tmp) / "shards")
        shards, manifest = built.out, built.manifest
        ensure_ray(cfg)
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        # This machine's speed drifts by up to 2x over minutes, so each mode runs ours and plain
        # `--repeats` times in ABBA order (ours, plain, plain, ours, ...) and every figure is the
        # median over all their epochs >= 2.
        threads = args.threads or None
        per_epoch = {k: [] for m in modes for k in (f"ours_{m}", MODES[m][1])}
        walls, startups = {m: [] for m in modes}, {m: [] for m in modes}
        phases: dict[str, list[dict]] = {m: [] for m in modes}
        for mode in modes:
            cache, plain_key = MODES[mode]
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
                        per_epoch[plain_key].append(plain_processes(cfg, shards, manifest, args.epochs, threads or 1,
                                                                    cache, args.workers))
    ray.shutdown()
    train_rows = manifest.rows["train"]

    def med(runs):  # every run's epochs >= 2
        return statistics.median([r for rates in runs for r in (rates[1:] if len(rates) > 1 else rates)])

    def spread(runs):  # the range of the runs' own medians
        per_run = [statistics.median(rates[1:] if len(rates) > 1 else rates) for rates in runs]
        return [min(per_run), max(per_run)]

    rows = {m: (med(per_epoch[f"ours_{m}"]), med(per_epoch[MODES[m][1]])) for m in modes}
    result = {
        "benchmark": "loop_overhead", "machine": machine(), "model": args.model, "batch": batch, "threads": threads,
        "workers": args.workers, "train_rows": train_rows, "epochs": args.epochs, "repeats": args.repeats,
        "per_epoch_samples_per_s": per_epoch,
        "median_epochs_2plus": {m: {"ours": o, "plain": p, "ratio": o / p,
                                    "ours_spread": spread(per_epoch[f"ours_{m}"]),
                                    "plain_spread": spread(per_epoch[MODES[m][1]]),
                                    "extra_s_per_epoch": train_rows / o - train_rows / p}
                                for m, (o, p) in rows.items()},
        "startup_s": {m: statistics.median(v) for m, v in startups.items()},
        "wall_s": {m: statistics.median(v) for m, v in walls.items()},
        "versions": {"torch": torch.__version__, "ray": ray.__version__}, "date": time.strftime("%Y-%m-%d"),
    }
    plain_name = f"{args.workers} gloo processes" if args.workers > 1 else "plain"
    print(f"loop overhead: {args.model}, batch {batch}, {train_rows:,} train rows, {args.workers} worker(s) vs "
          f"{plain_name}, {threads} torch threads each, median of epochs 2..{args.epochs} of {args.repeats} runs "
          "each, ABBA order (the runs' own medians in brackets)")
    print(f"{'mode':10s} {'ours samples/s':>26s} {'plain samples/s':>26s} {'ratio':>7s} {'extra s/epoch':>14s}")
    for m, (o, p) in rows.items():
        (olo, ohi), (plo, phi) = spread(per_epoch[f"ours_{m}"]), spread(per_epoch[MODES[m][1]])
        print(f"{m:10s} {o:9,.0f} [{olo:,.0f}-{ohi:,.0f}] {p:9,.0f} [{plo:,.0f}-{phi:,.0f}] {o / p:7.2f} "
              f"{train_rows / o - train_rows / p:14.2f}")
    print("start-up and reporting outside the training steps: "
          + ", ".join(f"{m} {result['startup_s'][m]:.1f}s (wall {result['wall_s'][m]:.1f}s)" for m in modes))
    result["breakdown"] = {mode: print_breakdown(mode, runs) for mode, runs in phases.items()}
    name = f"loop-{args.model}-{train_rows // 1000}k" + (f"-{args.workers}workers" if args.workers > 1 else "")
    write_result(args.out, name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
