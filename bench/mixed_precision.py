"""Mixed precision: samples/s and peak memory for fp32, fp32+TF32, fp16+GradScaler and bf16, no Ray.

    .venv/bin/python bench/mixed_precision.py                  # CUDA if present, else the CPU subset
    .venv/bin/python bench/mixed_precision.py --device cpu     # the CPU subset, explicitly

The Transformer and the LSTM, each at two batch sizes, trained on a fixed synthetic problem through
the product's own resolve_device / resolve_precision / OptimizerStep (``scripts/gpu_check.run_one``,
imported, not copied): a warm-up, then timed steps; each combination repeated, median samples/s.
Peak memory is ``torch.cuda.max_memory_allocated`` per run on CUDA (model, optimizer state,
activations, the batch pool); the CPU has no per-run figure, so none is reported there.
The headline figure is bf16 / fp32 (TF32 off) on the Transformer (target >= 2x on H100/H200-class).

Without CUDA this says so, and runs what the precision policy allows on a CPU -- fp32, and bf16
for the Transformer (the policy refuses fp16 on CPU and bf16 for the LSTM, and TF32 is CUDA-only) --
at CPU sizes; those figures say nothing about the GPU target.  Writes
bench/results/mixed-precision-<cuda|cpu>.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import machine, write_result

from alchemetric_ray.hardware import resolve_device
from scripts.gpu_check import MODES, run_one

# sizes where a GPU is compute-bound enough for precision to matter / small enough for 2 CPU cores
SIZES = {
    "cuda": {"hidden": 512, "layers": 4, "heads": 8, "window": 64, "features": 32, "batches": "256,1024", "steps": 120,
             "repeats": 3},
    "cpu": {"hidden": 64, "layers": 2, "heads": 4, "window": 32, "features": 32, "batches": "64,256", "steps": 16,
            "repeats": 2},
}
MODELS = ("transformer", "lstm")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    parser.add_argument("--batches", help="two batch sizes, comma-separated (default: by device)")
    parser.add_argument("--steps", type=int, help="steps per run, warm-up included (default: by device)")
    parser.add_argument("--repeats", type=int, help="runs per combination, median reported (default: by device)")
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--window", type=int)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    choice = resolve_device(args.device)
    device = choice.device
    cuda = device.type == "cuda"
    if not cuda:
        print(f"no CUDA: device {choice}. The GPU figures (and the bf16 >= 2x fp32 target) are NOT measured here; "
              "running the CPU subset the precision policy allows, at CPU sizes.")
    size = dict(SIZES["cuda" if cuda else "cpu"])
    for key in ("hidden", "layers", "window", "steps", "repeats", "batches"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    batches = [int(b) for b in str(size["batches"]).split(",")]
    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"device {device} ({name}), torch {torch.__version__}; hidden {size['hidden']}, layers {size['layers']}, "
          f"window {size['window']}, {size['steps']} steps per run, median of {size['repeats']}")

    rows = []
    for model_name in MODELS:
        for batch in batches:
            for mode, tf32 in MODES:
                label = f"{mode}+tf32" if tf32 else mode
                row = {"model": model_name, "batch": batch, "precision": label}
                if tf32 and not cuda:
                    rows.append({**row, "refused": "TF32 is a CUDA matmul mode; on this device it would be plain fp32"})
                    continue
                runs = [run_one(model_name, mode, tf32, device, size["steps"], batch, n_features=size["features"],
                                window=size["window"], hidden=size["hidden"], layers=size["layers"],
                                heads=size["heads"])
                        for _ in range(size["repeats"])]
                if "refused" in runs[0]:
                    rows.append({**row, "refused": runs[0]["refused"]})
                    continue
                rates = [r["samples_per_s"] for r in runs]
                peaks = [r.get("peak_memory_bytes") for r in runs]
                rows.append({**row, "samples_per_s": statistics.median(rates), "repeats": rates,
                             "peak_memory_bytes": max(peaks) if cuda else None, "skipped_steps": runs[-1]["skipped"],
                             "first_loss": runs[-1]["first_loss"], "last_loss": runs[-1]["last_loss"],
                             "reason": runs[-1]["reason"]})

    def rate(model_name, batch, label):
        for r in rows:
            if (r["model"], r["batch"], r["precision"]) == (model_name, batch, label) and "samples_per_s" in r:
                return r["samples_per_s"]
        return None

    for r in rows:
        base = rate(r["model"], r["batch"], "fp32")
        r["ratio_vs_fp32"] = r["samples_per_s"] / base if base and "samples_per_s" in r else None
    print(f"{'model':12s} {'batch':>6s} {'precision':10s} {'samples/s':>12s} {'vs fp32':>8s} {'peak MiB':>9s}")
    for r in rows:
        if "refused" in r:
            print(f"{r['model']:12s} {r['batch']:6d} {r['precision']:10s} refused: {r['refused']}")
            continue
        peak = f"{r['peak_memory_bytes'] / 2**20:9.0f}" if r["peak_memory_bytes"] else f"{'-':>9s}"
        print(f"{r['model']:12s} {r['batch']:6d} {r['precision']:10s} {r['samples_per_s']:12,.0f} "
              f"{r['ratio_vs_fp32']:7.2f}x {peak}")
    headline = {b: (rate("transformer", b, "bf16") / rate("transformer", b, "fp32"))
                if rate("transformer", b, "bf16") and rate("transformer", b, "fp32") else None for b in batches}
    for b, ratio in headline.items():
        shown = f"{ratio:.2f}x" if ratio is not None else "n/a (bf16 or fp32 refused here)"
        verdict = ("" if not cuda or ratio is None
                   else "  (target >= 2x: met)" if ratio >= 2 else "  (target >= 2x: MISSED)")
        print(f"transformer bf16 / fp32 (TF32 off), batch {b}: {shown}{verdict}"
              + ("" if cuda else "  [CPU: not the GPU target]"))

    result = {
        "benchmark": "mixed_precision",
        "machine": machine(device=str(device), device_name=name, cuda=cuda),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "sizes": size, "batches": batches, "rows": rows,
        "transformer_bf16_vs_fp32": headline,
        "target": "bf16 >= 2x fp32 (TF32 off) on the Transformer, CUDA H100/H200-class",
        "note": None if cuda else "no CUDA: CPU subset only; says nothing about the GPU target",
        "date": time.strftime("%Y-%m-%d"),
    }
    write_result(args.out, f"mixed-precision-{'cuda' if cuda else 'cpu'}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
