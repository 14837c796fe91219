"""Ingest benchmark: Parquet shards -> torch batches, our Ray Data loader vs pyarrow, side by side.

    .venv/bin/python bench/ingest.py --rows 1000000        # quick set
    .venv/bin/python bench/ingest.py --rows 10000000       # full set

Contenders, in one process, same batch size, after a warm-up pass, median of repeats:
  pyarrow      pq.read_table -> one (rows, features) float32 tensor -> slices (the floor)
  ours_pyarrow our loader for one worker that caches its shard (a laptop's run, a one-worker job or trial):
               loaders.ShardReader (each file read whole with pyarrow, its columns copied into one
               contiguous (x, y, date, fwd) set of tensors: what Ray Data's batches give through the same
               collate, joined) -> slices
  ray_ours     our loader for several workers or a streamed shard: loaders.read_split (V1 reader, a block
               per file) -> batches.stream (iter_torch_batches(collate_fn=TabularCollate), windows sliced)
  ray_default  ray.data.read_parquet with Ray's defaults -> iter_torch_batches() -> torch.stack of the columns
Prints rows/s and the ratio to pyarrow; writes bench/results/ingest-<rows>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _common import machine, write_result

ROWS_PER_FILE = 250_000


def write_shards(folder: Path, rows: int, n_features: int) -> list[str]:
    names = [f"f{i:02d}" for i in range(n_features)]
    rng = np.random.default_rng(0)
    done = 0
    part = 0
    while done < rows:
        n = min(ROWS_PER_FILE, rows - done)
        cols = {name: rng.standard_normal(n, dtype=np.float32) for name in names}
        cols["label"] = rng.integers(0, 3, n)
        # what every batch carries beside x and y since the cross-sectional metrics: the date, the forward return
        cols["date"] = np.datetime64("2020-01-01", "ns") + ((done + np.arange(n)) // 500).astype("timedelta64[D]")
        cols["fwd_ret"] = rng.standard_normal(n, dtype=np.float32) * 0.01
        # the shards' ticker column (500 names, each a run of rows as the shards order them); only our readers
        # read it: the pyarrow contender reads the columns it always read
        cols["ticker"] = pa.array([f"T{k:03d}" for k in (done + np.arange(n)) * 500 // max(rows, 1)]) \
            .dictionary_encode()
        pq.write_table(pa.table(cols), folder / f"part-{part:05d}.parquet")
        done += n
        part += 1
    return names


def run_pyarrow(folder: Path, names: list[str], batch: int) -> int:
    table = pq.read_table(folder, columns=[*names, "label", "date", "fwd_ret"])
    x = torch.from_numpy(np.column_stack([table.column(n).to_numpy() for n in names]))
    y = torch.from_numpy(table.column("label").to_numpy())
    seen = 0
    for i in range(0, len(y), batch):
        _features, labels = x[i:i + batch], y[i:i + batch]  # the slicing is the work measured; nothing reads it
        seen += len(labels)
    return seen


def run_shard_reader(reader, batch: int) -> int:
    x, y, _date, _fwd = reader.rows("train")
    seen = 0
    for i in range(0, len(y), batch):
        _features, labels = x[i:i + batch], y[i:i + batch]  # as the loop slices a cached shard
        seen += len(labels)
    return seen


def run_ray(ds, names: list[str], batch: int, ours: bool) -> int:
    from alchemetric_ray.data.loaders import TabularCollate

    seen = 0
    if ours:
        from alchemetric_ray.data.batches import stream

        for _x, yb, _date, _fwd in stream(ds, batch, TabularCollate(names)):
            seen += len(yb)
    else:
        for b in ds.iter_torch_batches(batch_size=batch):
            _features = torch.stack([b[n] for n in names], dim=1)  # the stacking is the work measured
            seen += len(b["label"])
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    import ray

    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as tmp:
        from alchemetric_ray.data.loaders import read_split
        from alchemetric_ray.data.manifest import Manifest
        from alchemetric_ray.data.shards import split_dir

        folder = split_dir(tmp, "train")  # the layout of `alchemetric-ray features`
        folder.mkdir()
        names = write_shards(folder, args.rows, args.features)
        # the manifest of these synthetic files: no files list, so the split's folder is read
        manifest = Manifest(features=names, label={}, splits={}, normalization={}, rows={"train": args.rows})
        ours = read_split(tmp, "train", manifest=manifest)
        # no "split" column from the folder name; the columns the plain contender stacks (no dates: torch has none)
        default = ray.data.read_parquet(str(folder), partitioning=None, columns=[*names, "label"])
        from alchemetric_ray.data.loaders import ShardReader

        reader = ShardReader(tmp, manifest, "tabular", window=1)
        contenders = {
            "pyarrow": lambda: run_pyarrow(folder, names, args.batch),
            "ours_pyarrow": lambda: run_shard_reader(reader, args.batch),
            "ray_ours": lambda: run_ray(ours, names, args.batch, ours=True),
            "ray_default": lambda: run_ray(default, names, args.batch, ours=False),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for fn in contenders.values():  # warm-up: page cache, Ray workers
            fn()
        for _ in range(args.repeats):
            for name, fn in contenders.items():  # interleaved, so drift hits all alike
                start = time.perf_counter()
                assert fn() == args.rows
                times[name].append(time.perf_counter() - start)
    ray.shutdown()

    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    result = {
        "benchmark": "ingest",
        "machine": machine(),
        "versions": {"torch": torch.__version__, "ray": ray.__version__, "pyarrow": pa.__version__},
        "rows": args.rows, "features": args.features, "batch": args.batch, "repeats": times,
        "median_s": med, "rows_per_s": rate,
        "ratio_vs_pyarrow": {k: rate[k] / rate["pyarrow"] for k in rate},
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"ingest: {args.rows:,} rows x {args.features} features, batch {args.batch}, median of {args.repeats}")
    print(f"{'contender':12s} {'rows/s':>14s} {'vs pyarrow':>11s}")
    for k in contenders:
        print(f"{k:12s} {rate[k]:14,.0f} {rate[k] / rate['pyarrow']:10.2f}x")
    write_result(args.out, f"ingest-{args.rows}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
