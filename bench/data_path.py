"""The GPU data path: a cached shard kept on the device vs pinned staging vs plain host indexing, no Ray.

    python bench/data_path.py                   # CUDA if present, else the host path alone
    python bench/data_path.py --device cpu      # the host path, at CPU sizes (a smoke run)

A worker with ``train.cache_data=true`` holds its shard in memory and draws each batch by a random
permutation.  This trains the MLP and the LSTM on a synthetic shard of that shape through the
product's own ``BatchSource`` (``alchemetric_ray/hardware/staging.py``), model registry, precision
policy (fp32) and optimizer step, once per data path:

* ``device``: the shard copied to the GPU once, batches gathered there;
* ``pinned``: the shard in host memory, each batch gathered by ``index_select(out=...)`` into one
  of two pinned buffers and copied with ``non_blocking=True``;
* ``host``: ``x[idx]`` in host memory (pageable) and ``.to(device)``, the path before staging.

Rounds run the paths in a rotating order (a warm-up, then timed steps each); the median samples/s
per path over the rounds, their spread, and the ratios device/host and pinned/host are printed and
written to bench/results/data-path-<cuda|cpu>.json.  Without CUDA only the host path runs, and the
output says the ratios were not measured.
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
from torch import nn

from alchemetric_ray.config import ModelConfig, TrainConfig
from alchemetric_ray.hardware import OptimizerStep, adamw, resolve_device, resolve_precision
from alchemetric_ray.hardware.device import synchronize
from alchemetric_ray.hardware.staging import DEVICE, HOST, PINNED, BatchSource, DataPath, nbytes
from alchemetric_ray.models import build_model, model_spec

# rows of the cached shard, batch, model size: GPU-sized (a few GiB of shard) / 2-core-sized
SIZES = {
    "cuda": {"mlp": {"rows": 4_000_000, "features": 64, "batch": 4096, "hidden": 256, "layers": 3},
             "lstm": {"rows": 400_000, "features": 32, "window": 32, "batch": 1024, "hidden": 128, "layers": 2},
             "steps": 300, "warmup": 20, "rounds": 3},
    "cpu": {"mlp": {"rows": 20_000, "features": 16, "batch": 256, "hidden": 32, "layers": 2},
            "lstm": {"rows": 4_000, "features": 8, "window": 8, "batch": 128, "hidden": 16, "layers": 1},
            "steps": 20, "warmup": 3, "rounds": 1},
}


def synthetic_shard(rows: int, features: int, window: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, y, date, forward return) in host memory, the columns of a cached shard."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((rows, window, features) if window else (rows, features), generator=generator)
    signal = x[:, -1, :4] if window else x[:, :4]
    y = (signal.sum(dim=-1) > 0).long()
    return x, y, torch.arange(rows) // 500, torch.randn(rows, generator=generator)


def run_path(model_name: str, kind: str, columns, size: dict, device: torch.device, steps: int, warmup: int) -> float:
    """Samples/s of ``steps - warmup`` timed fp32 training steps with batches from ``kind``."""
    window = size.get("window", 0)
    source = BatchSource(columns, device, DataPath(kind, "bench"), max_rows=size["batch"])
    precision = resolve_precision("fp32", device, model=model_spec(model_name))
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=model_name, hidden=size["hidden"], layers=size["layers"], dropout=0.0),
                        size["features"], 2, window=max(window, 1)).to(device)
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), precision, grad_clip=1.0,
                            check_every=TrainConfig.check_every)  # the loop's AdamW and check cadence
    order = torch.randperm(source.rows, generator=torch.Generator().manual_seed(1))
    batch = size["batch"]
    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        at = (step * batch) % max(1, source.rows - batch)
        x, y, _, _ = source.take(order[at:at + batch])
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        step_fn(loss, epoch=0, step=step)
    synchronize(device)
    return (steps - warmup) * batch / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    parser.add_argument("--models", default="mlp,lstm")
    parser.add_argument("--rounds", type=int, help="rounds over the paths, median reported (default: by device)")
    parser.add_argument("--steps", type=int, help="steps per run, warm-up included (default: by device)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    device = resolve_device(args.device).device
    cuda = device.type == "cuda"
    sizes = SIZES["cuda" if cuda else "cpu"]
    rounds, steps, warmup = args.rounds or sizes["rounds"], args.steps or sizes["steps"], sizes["warmup"]
    paths = (DEVICE, PINNED, HOST) if cuda else (HOST,)
    name = torch.cuda.get_device_name(device) if cuda else "host"
    if not cuda:
        print(f"no CUDA (device {device}): only the plain host path runs; the device-cache and pinned-staging "
              "ratios are NOT measured here")
    print(f"device {device} ({name}), torch {torch.__version__}; {steps} steps per run ({warmup} warm-up), "
          f"{rounds} round(s) of {', '.join(paths)} in rotating order, fp32")

    rows = []
    for model_name in args.models.split(","):
        size = sizes[model_name]
        columns = synthetic_shard(size["rows"], size["features"], size.get("window", 0))
        rates: dict[str, list[float]] = {kind: [] for kind in paths}
        for r in range(rounds):
            for kind in paths[r % len(paths):] + paths[:r % len(paths)]:
                rates[kind].append(run_path(model_name, kind, columns, size, device, steps, warmup))
                if cuda:
                    torch.cuda.empty_cache()
        row = {"model": model_name, **size, "shard_mib": round(nbytes(columns) / 2**20),
               "samples_per_s": {k: statistics.median(v) for k, v in rates.items()}, "runs": rates}
        host = row["samples_per_s"][HOST]
        row["ratio_vs_host"] = {k: v / host for k, v in row["samples_per_s"].items()}
        rows.append(row)
        shown = "  ".join(f"{k} {row['samples_per_s'][k]:,.0f}/s [{min(v):,.0f}-{max(v):,.0f}]"
                          for k, v in rates.items())
        ratios = "  ".join(f"{k}/host {row['ratio_vs_host'][k]:.2f}x" for k in paths if k != HOST)
        print(f"{model_name:5s} shard {row['shard_mib']:,} MiB, batch {size['batch']}: {shown}  {ratios}")

    write_result(args.out, f"data-path-{'cuda' if cuda else 'cpu'}", {
        "benchmark": "data_path",
        "machine": machine(device=str(device), device_name=name, cuda=cuda),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "steps": steps, "warmup": warmup, "rounds": rounds, "rows": rows,
        "note": None if cuda else "no CUDA: host path only; the device and pinned ratios are not measured",
        "date": time.strftime("%Y-%m-%d"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
