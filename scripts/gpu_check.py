"""Run the real CUDA precision branches without Ray: fp32, fp32+TF32, fp16+GradScaler, bf16.

    python scripts/gpu_check.py                 # on a CUDA machine (torch only, no Ray needed)
    python scripts/gpu_check.py --device cpu --steps 20    # the same code path on a CPU

For each model and precision it trains a few hundred steps on a fixed synthetic problem through
the product's own device resolver, precision policy and optimizer step, and prints the first and
last loss, skipped steps, the final GradScaler scale and samples/s. Refused combinations print
the policy's reason instead.  ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from alchemetric_ray.config import ModelConfig, TrainConfig
from alchemetric_ray.errors import PrecisionError
from alchemetric_ray.hardware import OptimizerStep, adamw, resolve_device, resolve_precision
from alchemetric_ray.hardware.device import synchronize
from alchemetric_ray.models import build_model, model_spec

MODES = [("fp32", False), ("fp32", True), ("fp16", False), ("bf16", False)]


def run_one(model_name: str, mode: str, tf32: bool, device: torch.device, steps: int, batch: int,
            n_features: int = 32, window: int = 32, hidden: int = 128, layers: int = 2, heads: int = 4) -> dict:
    """Train ``steps`` steps of one model in one precision; samples/s after a short warm-up.

    The losses stay on the device until the end (no host sync of their own per step), and on
    CUDA the row carries the peak allocated memory of the run (``peak_memory_bytes``)."""
    label = f"{mode}+tf32" if tf32 else mode
    row = {"model": model_name, "precision": label}
    try:
        precision = resolve_precision(mode, device, model=model_spec(model_name), tf32=tf32)
    except PrecisionError as exc:
        return {**row, "refused": str(exc)}
    precision.apply_tf32_settings()
    torch.manual_seed(0)
    seq = model_spec(model_name).inputs == "sequence"
    shape = (batch * 4, window, n_features) if seq else (batch * 4, n_features)
    x_all = torch.randn(*shape, device=device)
    signal = x_all[:, -1, :4] if seq else x_all[:, :4]
    y_all = (signal.sum(dim=-1) > 0).long()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(ModelConfig(name=model_name, hidden=hidden, layers=layers, dropout=0.0, heads=heads),
                        n_features, 2, window=window).to(device)
    opt = adamw(model.parameters(), lr=1e-3)  # the loop's AdamW, read every train.check_every steps as there
    step_fn = OptimizerStep(opt, precision, grad_clip=1.0, check_every=TrainConfig.check_every)
    losses = []
    warmup = min(10, steps // 4)
    start = None
    for step in range(steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        i = (step % 4) * batch
        with precision.autocast():
            loss = nn.functional.cross_entropy(model(x_all[i:i + batch]), y_all[i:i + batch])
        losses.append(loss.detach())
        step_fn(loss, epoch=0, step=step)
    step_fn.check()  # the closing read, as the loop's at an epoch's end
    synchronize(device)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    losses = torch.stack(losses).float().cpu().tolist()
    return {
        **row,
        "first_loss": round(losses[0], 4),
        "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
        "skipped": step_fn.skipped_total,
        "scale": step_fn.scaler.get_scale() if step_fn.scaler.is_enabled() else None,
        "samples_per_s": round((steps - warmup) * batch / elapsed) if elapsed > 0 else None,
        "reason": precision.reason,
        **({"peak_memory_bytes": torch.cuda.max_memory_allocated(device)} if cuda else {}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--models", default="mlp,transformer,lstm")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    choice = resolve_device(args.device)
    print(f"device: {choice}   torch {torch.__version__}")
    rows = []
    for model_name in args.models.split(","):
        for mode, tf32 in MODES:
            row = run_one(model_name, mode, tf32, choice.device, args.steps, args.batch)
            rows.append(row)
            if "refused" in row:
                print(f"{model_name:12s} {row['precision']:10s} refused: {row['refused']}")
            else:
                print(f"{model_name:12s} {row['precision']:10s} "
                      f"loss {row['first_loss']:.4f} -> {row['last_loss']:.4f}  "
                      f"skipped {row['skipped']:3d}  scale {row['scale']}  {row['samples_per_s']} samples/s")
    if args.json:
        report = {"device": str(choice), "torch": torch.__version__, "rows": rows}
        Path(args.json).write_text(json.dumps(report, indent=2))
    trained = [r for r in rows if "refused" not in r]
    ok = all(r["last_loss"] < r["first_loss"] for r in trained)
    print("all trained runs reduced the loss" if ok else "SOME RUNS DID NOT REDUCE THE LOSS")
    return 0 if ok and trained else 1


if __name__ == "__main__":
    sys.exit(main())
