"""Scaling: `features` + one epoch of `train` on synthetic data of two sizes; wall time and peak memory.

    .venv/bin/python bench/scaling.py --rows 100000,1000000      # quick set (a tenth of the full sizes)
    .venv/bin/python bench/scaling.py --rows 1000000,10000000    # full set

Each size runs in a fresh subprocess with its own local Ray, so every peak is that size's alone:
  features   build_shards on data.source=synthetic (tickers x days chosen to give ~rows rows)
  train      run_training, 1 epoch, MLP, batch 4096, train.cache_data=false (the worker streams its
             shard from Ray Data instead of holding it, which is what keeps its memory flat), no export
Peak memory, all high-water marks read from the kernel:
  driver     getrusage(RUSAGE_SELF).ru_maxrss of the driver process (after features, and at the end)
  worker     VmHWM of the Train worker process (/proc/<pid>/status), pid from Ray's state API
             (class RayTrainWorker), read every 0.02 s (50 Hz) while it lives; the last read is the figure.
             VmHWM counts the object-store (plasma) pages the worker has mapped to read its blocks,
             shared memory that Ray owns, so it is split too (sampled at 50 Hz, peaks; the worker also
             records both at the end of each phase, training/phases.py):
  worker_private   RssAnon: the worker's own heap (tensors, batches, model, Python)
  worker_shared    RssShmem: object-store pages mapped into the worker
  tree       sampled (0.25 s) sum of VmRSS over the driver and all its descendants (Ray's processes
             included); RSS counts shared pages once per process, so this over-states, and sampling can
             miss a short spike -- a rough figure only
Targets for 10x the rows: wall time <= 11x, worker peak <= 1.5x (the driver's ratio is reported too).
Writes bench/results/scaling-<rows>-<rows>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

DAYS = 1500
WORKER_EVERY_S = 0.02  # the Train worker's memory: 50 Hz (a 0.25 s sampler missed validation's spike)
TREE_EVERY_S = 0.25  # the whole process tree (a rough figure)
KIB = 1024


def _status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class MemorySampler(threading.Thread):
    """Finds the Train worker (Ray state API, else its process title) and keeps its VmHWM; sums the
    process tree's VmRSS."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.worker_pid: int | None = None
        self.found_by: str | None = None
        self.worker_hwm_kib = 0
        self.worker_anon_peak_kib = 0
        self.worker_shmem_peak_kib = 0
        self.worker_series: list[tuple[float, int, int]] = []  # (s, RssAnon KiB, RssShmem KiB), ~1 s apart
        self._series_t0 = 0.0
        self.tree_peak_kib = 0
        self._last_lookup = self._last_tree = 0.0

    def _find_worker(self) -> None:
        import ray
        from ray.util.state import list_actors

        try:
            actors = list_actors(address=ray.get_runtime_context().gcs_address,
                                 filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
            pids = [a.pid for a in actors if a.pid]
            if pids:
                self.worker_pid, self.found_by = pids[0], "ray.util.state.list_actors"
                return
        except Exception:  # the state API needs the dashboard; fall back to the process title
            pass
        for pid in _descendants(os.getpid()):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::RayTrainWorker"):
                self.worker_pid, self.found_by = pid, "process title ray::RayTrainWorker"
                return

    def run(self) -> None:
        while not self.stop.is_set():
            if self.worker_pid is None and time.monotonic() - self._last_lookup > 1.0:
                self._last_lookup = time.monotonic()
                self._find_worker()
            if self.worker_pid is not None:
                hwm = _status_kib(self.worker_pid, "VmHWM")
                if hwm is not None:
                    self.worker_hwm_kib = max(self.worker_hwm_kib, hwm)
                    self.worker_anon_peak_kib = max(self.worker_anon_peak_kib,
                                                    _status_kib(self.worker_pid, "RssAnon") or 0)
                    self.worker_shmem_peak_kib = max(self.worker_shmem_peak_kib,
                                                     _status_kib(self.worker_pid, "RssShmem") or 0)
                    now = time.monotonic()
                    if not self.worker_series or now - self._series_t0 - self.worker_series[-1][0] >= 1.0:
                        if not self.worker_series:
                            self._series_t0 = now
                        self.worker_series.append((round(now - self._series_t0, 1),
                                                   _status_kib(self.worker_pid, "RssAnon") or 0,
                                                   _status_kib(self.worker_pid, "RssShmem") or 0))
            if time.monotonic() - self._last_tree >= TREE_EVERY_S:  # a walk of /proc: not at the worker's rate
                self._last_tree = time.monotonic()
                tree = sum(_status_kib(pid, "VmRSS") or 0 for pid in _descendants(os.getpid()))
                self.tree_peak_kib = max(self.tree_peak_kib, tree)
            self.stop.wait(WORKER_EVERY_S)




def maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def one_size(rows: int, result_path: Path, model: str, batch: int) -> None:
    import ray

    from alchemetric_ray.config import load_config
    from alchemetric_ray.data.features import resolve_feature_names, warmup_bars
    from alchemetric_ray.data.shards import build_shards
    from alchemetric_ray.placement.session import ensure_ray
    from alchemetric_ray.training.trainer import run_training

    base_rss = maxrss_kib()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        probe = load_config(None, [])
        per_ticker = DAYS - warmup_bars(resolve_feature_names(probe.features.names, probe.features.set)) - 10
        tickers = max(1, math.ceil(rows / per_ticker))
        cfg = load_config(None, ["data.source=synthetic", f"data.synthetic_tickers={tickers}",
                                 f"data.synthetic_days={DAYS}", f"model.name={model}", f"train.batch_size={batch}",
                                 "train.epochs=1", "train.patience=0",
                                 "train.cache_data=false", f"storage.path={tmp / 'results'}",
                                 f"storage.models_dir={tmp / 'models'}", "storage.name=scaling"])
        start = time.perf_counter()
        built = build_shards(cfg, tmp / "shards")
        features_s = time.perf_counter() - start
        driver_after_features = maxrss_kib()

        ensure_ray(cfg)
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        sampler = MemorySampler()
        sampler.start()
        start = time.perf_counter()
        outcome = run_training(cfg.replace(f"data.path={built.out}"), export=False, progress=False)
        train_s = time.perf_counter() - start
        sampler.stop.set()
        sampler.join()
        driver_end = maxrss_kib()
        history = outcome.summary.history or [{}]
        total_rows = sum(built.manifest.rows.values())
        result = {
            "rows_requested": rows, "rows": total_rows, "train_rows": built.manifest.rows["train"],
            "tickers": tickers, "days": DAYS, "model": model, "batch": batch,
            "features_s": features_s, "train_s": train_s, "wall_s": features_s + train_s,
            "train_samples_per_s": history[-1].get("samples_per_s"),
            "peak_kib": {"driver_at_start": base_rss, "driver_after_features": driver_after_features,
                         "driver": driver_end,
                         "worker": sampler.worker_hwm_kib or None, "tree_sampled": sampler.tree_peak_kib,
                         "worker_private": sampler.worker_anon_peak_kib or None,
                         "worker_shared": sampler.worker_shmem_peak_kib or None},
            "worker_pid": sampler.worker_pid, "worker_found_by": sampler.found_by,
            "worker_memory_series_s_anon_kib_shmem_kib": sampler.worker_series,
            "ray_logical_cpus": ray.cluster_resources().get("CPU"),
            # the worker's own records at the end of each phase (training/phases.py): seconds, RssAnon, RssShmem,
            # and the peak resident set during the phase
            "worker_phases": [p.as_dict() for p in outcome.summary.phases],
        }
    ray.shutdown()
    result_path.write_text(json.dumps(result, indent=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000,10000000", help="two (or more) sizes, comma-separated")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one size in this process
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if args.one:
        one_size(args.one, Path(args.result), args.model, args.batch)
        return 0

    import ray
    import torch

    sizes = [int(r) for r in args.rows.split(",")]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh local Ray per size
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            path = Path(tmp) / f"{rows}.json"
            print(f"scaling: {rows:,} rows in a fresh process ...", flush=True)
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--one", str(rows), "--result", str(path),
                                   "--model", args.model, "--batch", str(args.batch)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-4000:], file=sys.stderr)
                print(f"scaling: the {rows:,}-row run failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            run = json.loads(path.read_text())
            run["process_s"] = time.perf_counter() - started
            runs.append(run)

    small, big = runs[0], runs[-1]
    size_ratio = big["rows"] / small["rows"]

    def ratio(a, b):
        return a / b if a and b else None

    ratios = {
        "rows": size_ratio,
        "features_s": ratio(big["features_s"], small["features_s"]),
        "train_s": ratio(big["train_s"], small["train_s"]),
        "wall_s": ratio(big["wall_s"], small["wall_s"]),
        **{f"peak_{k}": ratio(big["peak_kib"][k], small["peak_kib"][k])
           for k in ("driver", "driver_after_features", "worker", "worker_private", "worker_shared", "tree_sampled")},
    }
    result = {
        "benchmark": "scaling",
        "machine": machine(),
        "versions": {"torch": torch.__version__, "ray": ray.__version__},
        "train": {"model": args.model, "batch": args.batch, "epochs": 1, "cache_data": False},
        "runs": runs, "ratios_largest_vs_smallest": ratios,
        "targets": {"wall_s": "<= 11 for 10x rows", "peak_worker": "<= 1.5 for 10x rows"},
        "date": time.strftime("%Y-%m-%d"),
    }

    def mib(kib):
        return f"{kib / KIB:,.0f}" if kib else "-"

    print(f"scaling: features + 1 epoch of train (MLP, batch {args.batch}, train.cache_data=false), "
          "one fresh process per size")
    print(f"{'rows':>12s} {'features s':>11s} {'train s':>8s} {'wall s':>8s} {'samples/s':>10s} "
          f"{'driver MiB':>11s} {'worker MiB':>11s} {'private':>8s} {'shared':>7s} {'tree MiB~':>10s}")
    for r in runs:
        p = r["peak_kib"]
        print(f"{r['rows']:12,d} {r['features_s']:11.1f} {r['train_s']:8.1f} {r['wall_s']:8.1f} "
              f"{r['train_samples_per_s'] or 0:10,.0f} {mib(p['driver']):>11s} {mib(p['worker']):>11s} "
              f"{mib(p.get('worker_private')):>8s} {mib(p.get('worker_shared')):>7s} {mib(p['tree_sampled']):>10s}")

    for r in runs:  # where the worker's memory goes, phase by phase (recorded in the worker, no sampler)
        parts = [f"{p['phase']} {p['private_mib'] or 0:,.0f}/{p['peak_mib'] or 0:,.0f}"
                 for p in r.get("worker_phases") or [] if p["phase"] != "start"]
        print(f"{r['rows']:12,d} rows, worker memory per phase (MiB, private at its end / peak during it): "
              + ", ".join(parts))

    def fmt(v):
        return f"{v:.2f}" if v is not None else "n/a"

    print(f"ratio ({size_ratio:.1f}x rows): wall {fmt(ratios['wall_s'])} (features {fmt(ratios['features_s'])}, "
          f"train {fmt(ratios['train_s'])}; target <= 11 for 10x), peak worker {fmt(ratios['peak_worker'])} "
          f"(target <= 1.5; private {fmt(ratios['peak_worker_private'])}, object-store pages "
          f"{fmt(ratios['peak_worker_shared'])}), peak driver {fmt(ratios['peak_driver'])}")
    write_result(args.out, f"scaling-{'-'.join(str(s) for s in sizes)}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
