"""One command for a CUDA machine: Python 3.10+ with torch (and numpy); no Ray, no package registry.

    python3 bench/gpu.py                        # about 10-15 minutes on one H100/H200-class GPU
    python3 bench/gpu.py --device cpu --quick   # seconds: checks the command itself runs (the tests do)

Runs, in turn and on synthetic data made on the spot:
1. ``scripts/gpu_check.py``: every precision branch (fp32, fp32+TF32, fp16+GradScaler, bf16) trains
   and lowers its loss through the product's resolver, policy and optimizer step;
2. ``bench/mixed_precision.py``: samples/s and peak memory per precision, the Transformer and the LSTM;
3. ``bench/data_path.py``: the cached shard on the device vs pinned staging vs plain host indexing,
   the MLP and the LSTM;
4. ``bench/syncs.py``: the host syncs of the loop's training step (fp32, bf16, fp16 + GradScaler and
   the IC loss) counted by torch's own detector (``torch.cuda.set_sync_debug_mode("warn")``), and
   once with the batches through pinned staging, whose event wait is deliberate (without CUDA: the
   same runs counted on the CPU in-process);
5. trials/hour per GPU (below, :func:`trials_per_hour`): the same small MLP sweep trial (plain torch,
   its shard cached on the GPU, AdamW, fp32) run by 1 process alone, then by N processes sharing the
   GPU at once (N = ``--trials-per-gpu``, the planner's most: 4), each process running its trials
   back to back, as Ray runs one-worker sweep trials with a fractional GPU each; trials/hour for each
   and their ratio side by side, with each process's peak memory (skipped without CUDA).
The results land in ``bench/results/`` (``gpu-check-<device>.json``, ``mixed-precision-*.json``,
``data-path-*.json``, ``syncs-*.json``, ``trials-per-gpu-cuda.json``); copy them back and put the figures in
docs/performance.md with their date.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import data_path  # noqa: E402  (bench/ is on the path only from here)
import mixed_precision  # noqa: E402
import syncs  # noqa: E402
import torch  # noqa: E402
from _common import machine, write_result  # noqa: E402

from alchemetric_ray.config import ModelConfig  # noqa: E402
from alchemetric_ray.hardware import resolve_device  # noqa: E402
from alchemetric_ray.models import build_model  # noqa: E402
from alchemetric_ray.placement.gpu_share import MAX_TRIALS_PER_GPU  # noqa: E402
from scripts import gpu_check  # noqa: E402

QUICK = {"check": ["--steps", "16", "--batch", "64", "--models", "mlp,lstm"],
         "precision": ["--steps", "4", "--repeats", "1", "--batches", "8,16", "--hidden", "16", "--layers", "1",
                       "--window", "8"],
         "data": ["--steps", "6", "--rounds", "1"],
         "syncs": ["--steps", "10", "--check-every", "5"]}
# One sweep trial of the trials/hour section: a daily-bar MLP (about 500 stocks x 8 years of rows), trained
# for a few epochs from its shard cached on the GPU; each process runs `trials` of them back to back.
TRIAL = {"full": {"rows": 1_000_000, "features": 16, "batch": 512, "epochs": 2, "hidden": 64, "layers": 2,
                  "trials": 3},
         "quick": {"rows": 20_000, "features": 16, "batch": 512, "epochs": 1, "hidden": 64, "layers": 2,
                   "trials": 1}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    parser.add_argument("--quick", action="store_true", help="a few steps of each: checks that the command runs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--trials-per-gpu", type=int, default=MAX_TRIALS_PER_GPU,
                        help="trial processes that share the GPU in the trials/hour section")
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else {"check": [], "precision": [], "data": [], "syncs": []}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    check_json = Path(args.out) / f"gpu-check-{resolve_device(args.device).device.type}.json"
    started = time.perf_counter()
    status = 0
    for title, run in [
        ("precision branches (scripts/gpu_check.py)",
         lambda: gpu_check.main(["--device", args.device, "--json", str(check_json), *quick["check"]])),
        ("mixed precision (bench/mixed_precision.py)",
         lambda: mixed_precision.main(["--device", args.device, "--out", args.out, *quick["precision"]])),
        ("data path (bench/data_path.py)",
         lambda: data_path.main(["--device", args.device, "--out", args.out, *quick["data"]])),
        ("host syncs of the training step (bench/syncs.py)",
         lambda: syncs.main(["--device", args.device, "--out", args.out, *quick["syncs"]])),
        ("trials/hour per GPU: 1 trial process vs several sharing the GPU",
         lambda: trials_per_hour(args.device, args.trials_per_gpu, TRIAL["quick" if args.quick else "full"],
                                 args.out)),
    ]:
        print(f"\n== {title}", flush=True)
        code = run()
        status = status or code
        print(f"== {title}: exit {code}, {time.perf_counter() - started:.0f} s so far", flush=True)
    return status


# ---- trials/hour per GPU ----------------------------------------------------------------------


def trials_per_hour(device_arg: str, sharing: int, size: dict, out: str) -> int:
    """Trials/hour on one GPU: 1 trial process alone, then ``sharing`` at once; printed side by side."""
    device = resolve_device(device_arg).device
    if device.type != "cuda":
        print(f"skipped: no CUDA GPU (device {device}); trials/hour per GPU is measured on a CUDA machine only")
        return 0
    if sharing < 2:
        print(f"skipped: --trials-per-gpu {sharing} leaves nothing to compare with 1 process")
        return 0
    name = torch.cuda.get_device_name(device)
    print(f"device {device} ({name}), torch {torch.__version__}; a trial: MLP {size['hidden']}x{size['layers']}, "
          f"{size['rows']:,} rows x {size['features']} features cached on the GPU, batch {size['batch']}, "
          f"{size['epochs']} epoch(s), AdamW, fp32; {size['trials']} trial(s) back to back per process")
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    rows = []
    for processes in (1, sharing):
        barrier, results = context.Barrier(processes), context.Queue()
        workers = [context.Process(target=_trial_process, args=(str(device), size, seed, barrier, results))
                   for seed in range(processes)]
        for worker in workers:
            worker.start()
        done = _collect(workers, results)
        failed = [d["error"] for d in done if "error" in d] or [f"exit codes {[w.exitcode for w in workers]}"]
        if len(done) < processes or any("error" in d for d in done) or any(w.exitcode for w in workers):
            print(f"{processes} trial process(es) sharing the GPU: failed: {failed[0]}")
            return 1
        wall = max(d["end"] for d in done) - min(d["start"] for d in done)
        trials = processes * size["trials"]
        rows.append({"processes": processes, "gpu_share": round(1 / processes, 4), "trials": trials,
                     "wall_s": round(wall, 2), "trials_per_hour": round(trials / wall * 3600, 1),
                     "seconds_per_trial": round(statistics.median(d["seconds_per_trial"] for d in done), 2),
                     "peak_mib_per_process": max(d["peak_mib"] for d in done)})
    alone, shared = rows
    ratio = shared["trials_per_hour"] / alone["trials_per_hour"]
    print(f"{'processes':>9}  {'GPU each':>8}  {'trials':>6}  {'wall s':>7}  {'s/trial':>7}  {'trials/hour':>11}  "
          f"{'peak MiB':>8}")
    for row in rows:
        print(f"{row['processes']:>9}  {row['gpu_share']:>8g}  {row['trials']:>6}  {row['wall_s']:>7.1f}  "
              f"{row['seconds_per_trial']:>7.2f}  {row['trials_per_hour']:>11,.0f}  "
              f"{row['peak_mib_per_process']:>8.0f}")
    print(f"trials/hour per GPU: {shared['trials_per_hour']:,.0f} with {sharing} sharing vs "
          f"{alone['trials_per_hour']:,.0f} alone = {ratio:.2f}x")
    write_result(out, "trials-per-gpu-cuda", {"machine": machine(device=name, torch=torch.__version__),
                                              "trial": size, "rows": rows, "ratio": round(ratio, 3)})
    return 0


def _collect(workers: list, results) -> list[dict]:
    """Each process's report; a process that died without one ends the wait instead of hanging it."""
    done: list[dict] = []
    while len(done) < len(workers):
        try:
            done.append(results.get(timeout=5))
        except queue.Empty:
            if any(not w.is_alive() and w.exitcode for w in workers):
                break
    for worker in workers:
        worker.join(timeout=60)
    return done


def _trial_process(device_name: str, size: dict, seed: int, barrier, results) -> None:
    """One trial process: its shard on the GPU, a warm-up step, then (all processes together) its trials."""
    try:
        device = torch.device(device_name)
        torch.cuda.set_device(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(size["rows"], size["features"], device=device, generator=generator)
        y = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4] > 1).long()  # 3 classes
        _train(x, y, size, device, seed, steps=1)  # CUDA context, kernels and the allocator warm
        barrier.wait(timeout=600)
        torch.cuda.reset_peak_memory_stats(device)
        start = time.monotonic()  # system-wide on Linux: comparable across the processes
        for trial in range(size["trials"]):
            _train(x, y, size, device, seed * 1000 + trial)
        torch.cuda.synchronize(device)
        end = time.monotonic()
        results.put({"start": start, "end": end, "seconds_per_trial": (end - start) / size["trials"],
                     "peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)})
    except Exception as exc:  # reported by the parent in one line
        barrier.abort()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _train(x: torch.Tensor, y: torch.Tensor, size: dict, device: torch.device, seed: int,
           steps: int | None = None) -> float:
    """One trial: a fresh MLP and AdamW, ``size['epochs']`` shuffled passes over the shard (or ``steps``)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(hidden=size["hidden"], layers=size["layers"]), size["features"], 3).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch, done, loss = size["batch"], 0, torch.zeros((), device=device)
    for _ in range(size["epochs"]):
        order = torch.randperm(x.shape[0], device=device)
        for first in range(0, x.shape[0], batch):
            idx = order[first:first + batch]
            loss = loss_fn(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            if steps is not None and done >= steps:
                return float(loss.detach())
    return float(loss.detach())  # one sync per trial, at its end


if __name__ == "__main__":
    sys.exit(main())
