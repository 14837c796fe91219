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
   same runs counted on the CPU in-process).
The results land in ``bench/results/`` (``gpu-check-<device>.json``, ``mixed-precision-*.json``,
``data-path-*.json``, ``syncs-*.json``); copy them back and put the figures in docs/performance.md with their date.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import data_path  # noqa: E402  (bench/ is on the path only from here)
import mixed_precision  # noqa: E402
import syncs  # noqa: E402

from alchemetric_ray.hardware import resolve_device  # noqa: E402
from scripts import gpu_check  # noqa: E402

QUICK = {"check": ["--steps", "16", "--batch", "64", "--models", "mlp,lstm"],
         "precision": ["--steps", "4", "--repeats", "1", "--batches", "8,16", "--hidden", "16", "--layers", "1",
                       "--window", "8"],
         "data": ["--steps", "6", "--rounds", "1"],
         "syncs": ["--steps", "10", "--check-every", "5"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    parser.add_argument("--quick", action="store_true", help="a few steps of each: checks that the command runs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
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
    ]:
        print(f"\n== {title}", flush=True)
        code = run()
        status = status or code
        print(f"== {title}: exit {code}, {time.perf_counter() - started:.0f} s so far", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
