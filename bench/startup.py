"""What a laptop run pays for Ray: one-worker `train` in local mode vs worker mode vs plain PyTorch.

    python bench/startup.py                      # 3 tickers, an MLP, 4 epochs, ABBA pairs
    python bench/startup.py --tickers 88 --epochs 8

Each run is a fresh process, from its start to the exported model, on the same feature shards
(built once, beforehand), in the order L W P P W L (local, worker, plain): ABBA pairs, so that a
machine whose speed drifts favours no variant.  Each child times its own parts:

* ``import``: the package (Ray, torch) imported; ``ray.init``: the local Ray up (worker mode only:
  a one-worker local run that caches its shard starts no Ray, and reads it with pyarrow);
* ``read``: up to the loop's first batch: the plan, the datasets and the first read (the loop's
  ``read`` phase: Ray Data in worker mode, pyarrow in local mode, as in the plain script);
* ``epochs``: the loop's train, validate and checkpoint phases, summed;
* ``export``: the best checkpoint to the models folder;
* ``fixed``: everything but the epochs (the process's whole wall time minus ``epochs``).

The plain script reads the same Parquet files with pyarrow and trains the same model with the
product's own optimizer step and checkpoint writer, epoch for epoch, without Ray: what is left
beside it is what Ray costs.  Prints the table and the ratios the targets are set for (local fixed /
worker fixed, at most 0.4; local end to end / plain end to end, at most 2), and writes
bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

REPO = Path(__file__).resolve().parents[1]
ORDER = ["local", "worker", "plain", "plain", "worker", "local"]


def _child(kind: str, shards: str, out: str, epochs: int) -> dict:
    started = time.perf_counter()
    marks = {}
    import ray  # noqa: F401
    import torch  # noqa: F401

    from alchemetric_ray.config import load_config

    marks["import"] = time.perf_counter() - started
    cfg = load_config(None, [f"data.path={shards}", f"storage.path={out}/results", f"storage.models_dir={out}/models",
                             "device.name=cpu", "model.hidden=32", f"train.epochs={epochs}", "train.patience=0",
                             "train.batch_size=256", f"train.local_mode={'true' if kind == 'local' else 'false'}"])
    if kind == "plain":
        return {**marks, **_plain(cfg, started)}
    if kind == "calls":
        return {**marks, **_calls(cfg)}
    from alchemetric_ray.artifacts.export import export_model
    from alchemetric_ray.placement.session import ensure_ray
    from alchemetric_ray.training.trainer import run_training

    if kind == "worker":  # a worker group needs Ray; local mode starts none (the plan's `ray` line)
        t = time.perf_counter()
        ensure_ray(cfg)
        marks["ray.init"] = time.perf_counter() - t
    t = time.perf_counter()
    outcome = run_training(cfg, export=False, progress=False)
    marks["run"] = time.perf_counter() - t
    marks["ray"] = outcome.plan.reasons.ray
    phases = outcome.summary.phases
    marks["read"] = sum(p.seconds for p in phases if p.phase in ("start", "read"))
    marks["before_loop"] = marks["run"] - sum(p.seconds for p in phases if p.phase != "start")
    marks["epochs"] = sum(p.seconds for p in phases if p.phase in ("train", "validate", "checkpoint"))
    t = time.perf_counter()
    export_model(outcome.best_checkpoint, outcome.config, outcome.shards)
    marks["export"] = time.perf_counter() - t
    return marks


def _calls(cfg) -> dict:
    """Two ``ar.train`` calls in a row in one process, as in a notebook's kernel (a worker group, so
    that Ray is needed): the first starts a local Ray, the second reuses it."""
    import alchemetric_ray as ar

    marks = {}
    for call in ("first", "second"):
        t = time.perf_counter()
        result = ar.train(cfg.replace(f"storage.name=calls-{call}"))
        wall = time.perf_counter() - t
        epochs = sum(result.phases.get(phase, 0.0) for phase in ("train", "validate", "checkpoint"))
        marks[f"{call}_wall"], marks[f"{call}_epochs"] = wall, epochs
    return marks


def _plain(cfg, started: float) -> dict:
    """The same reads, model, epochs and checkpoint writes in plain PyTorch (the product's step and writer)."""
    import pyarrow.parquet as pq
    import torch

    from alchemetric_ray.artifacts.checkpoint import load_state, save_checkpoint
    from alchemetric_ray.data.manifest import Manifest
    from alchemetric_ray.data.shards import split_dir
    from alchemetric_ray.hardware import OptimizerStep, adamw, resolve_precision
    from alchemetric_ray.models import build_model

    marks = {}
    t = time.perf_counter()
    manifest = Manifest.read(cfg.data.path)
    frames = {s: pq.read_table(split_dir(cfg.data.path, s)).to_pandas() for s in ("train", "val")}
    x = {s: torch.tensor(f[manifest.features].to_numpy("float32")) for s, f in frames.items()}
    y = {s: torch.tensor(f["label"].to_numpy("int64")) for s, f in frames.items()}
    marks["read"] = time.perf_counter() - t
    torch.manual_seed(0)
    model = build_model(cfg.model, len(manifest.features), manifest.outputs)
    optimizer = adamw(model.parameters(), lr=cfg.train.lr)
    step = OptimizerStep(optimizer, resolve_precision("fp32", torch.device("cpu")), check_every=cfg.train.check_every)
    loss_fn = torch.nn.CrossEntropyLoss()
    t = time.perf_counter()
    best, run = None, Path(cfg.storage.path) / "plain"
    for epoch in range(cfg.train.epochs):
        model.train()
        order = torch.randperm(len(y["train"]))
        for i in range(0, len(order), cfg.train.batch_size):
            idx = order[i:i + cfg.train.batch_size]
            step(loss_fn(model(x["train"][idx]), y["train"][idx]), epoch=epoch + 1, step=i)
        step.check()
        model.eval()
        with torch.no_grad():
            val = float(loss_fn(model(x["val"]), y["val"]))
        save_checkpoint(run / f"epoch-{epoch:04d}", {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                        {"epoch": epoch, "val_log_loss": val})
        best = (epoch, val) if best is None or val < best[1] else best
    marks["epochs"] = time.perf_counter() - t
    t = time.perf_counter()
    state = load_state(run / f"epoch-{best[0]:04d}")
    (Path(cfg.storage.models_dir) / "plain").mkdir(parents=True, exist_ok=True)
    torch.save(state["model"], Path(cfg.storage.models_dir) / "plain" / "weights.pt")
    marks["export"] = time.perf_counter() - t
    return marks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shards", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT:" + json.dumps(_child(args.child, args.shards, args.work, args.epochs)), flush=True)
        return 0

    work = Path(tempfile.mkdtemp(prefix="alchemetric-startup-"))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the shards and the runs' folders: this benchmark's own


def _child_run(kind: str, work: Path, args: argparse.Namespace, env: dict, i: int) -> dict | None:
    """One child process of ``kind``: its own marks, or None (its error printed)."""
    done = subprocess.run([sys.executable, __file__, "--child", kind, "--shards", str(work / "shards"),
                           "--work", str(work / f"{kind}-{i}"), "--epochs", str(args.epochs)],
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=1200)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT:")]
    if done.returncode != 0 or not lines:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT:"):])


def _measure(args: argparse.Namespace, work: Path) -> int:
    """The shards once, then each kind in ORDER in a fresh process; the figures printed and written."""
    from alchemetric_ray.bars.stocknet import tickers as stocknet_tickers
    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.shards import build_shards

    tickers = ",".join(stocknet_tickers()[:args.tickers])
    built = build_shards(load_config(None, [f"data.tickers={tickers}"]), work / "shards", progress=False)
    print(f"shards: {built.manifest.rows['train']} train rows, {len(built.manifest.tickers)} tickers; order "
          f"{' '.join(ORDER)}", flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"))}
    runs = []
    for i, kind in enumerate(ORDER):
        t = time.perf_counter()
        marks = _child_run(kind, work, args, env, i)
        if marks is None:
            return 1
        wall = time.perf_counter() - t
        runs.append({"kind": kind, "wall": wall, **marks, "fixed": wall - marks["epochs"]})
        print(f"{kind:6s} wall {wall:6.1f}s  fixed {wall - marks['epochs']:6.1f}s  epochs {marks['epochs']:5.1f}s  "
              + "  ".join(f"{k} {marks[k]:.1f}s" for k in ("import", "ray.init", "read", "export") if k in marks),
              flush=True)
    mean = {kind: {key: sum(r[key] for r in runs if r["kind"] == kind) / ORDER.count(kind)
                   for key, value in runs[ORDER.index(kind)].items() if isinstance(value, float)}
            for kind in dict.fromkeys(ORDER)}
    ratio = mean["local"]["fixed"] / mean["worker"]["fixed"]
    print(f"fixed cost (wall minus epochs), mean of 2: local {mean['local']['fixed']:.1f}s, worker "
          f"{mean['worker']['fixed']:.1f}s, plain PyTorch {mean['plain']['fixed']:.1f}s; local/worker {ratio:.2f} "
          "(target <= 0.4)")
    local_over_plain = mean["local"]["wall"] / mean["plain"]["wall"]
    print(f"end to end: local {mean['local']['wall']:.1f}s, worker {mean['worker']['wall']:.1f}s, plain "
          f"{mean['plain']['wall']:.1f}s; local/plain {local_over_plain:.2f} (target <= 2)")
    print(f"local mode's plan: ray {runs[ORDER.index('local')]['ray']}")
    calls = _child_run("calls", work, args, env, len(ORDER))
    if calls is None:
        return 1
    second_over_first = (calls["second_wall"] - calls["second_epochs"]) / (calls["first_wall"] - calls["first_epochs"])
    print(f"API, two ar.train calls in one process (a worker group): first {calls['first_wall']:.1f}s "
          f"(fixed {calls['first_wall'] - calls['first_epochs']:.1f}s, a local Ray started), second "
          f"{calls['second_wall']:.1f}s (fixed {calls['second_wall'] - calls['second_epochs']:.1f}s, the same Ray); "
          f"second/first fixed {second_over_first:.2f}")
    write_result(args.out, "startup", {"machine": machine(), "tickers": args.tickers, "epochs": args.epochs,
                                        "order": ORDER, "runs": runs, "mean": mean, "local_over_worker_fixed": ratio,
                                        "local_over_plain_wall": local_over_plain, "calls": calls,
                                        "second_over_first_fixed": second_over_first,
                                        "date": time.strftime("%Y-%m-%d")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
