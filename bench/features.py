"""The feature build at the scale of a real universe, side by side in one run (issue 41 item 4).

    .venv/bin/python bench/features.py                         # 3,000 tickers x 3,500 days (~10M rows)
    .venv/bin/python bench/features.py --tickers 300 --days 800 --small 100   # a quick look

Every figure comes from a fresh Python process of its own (its own peak RSS), on bars written once
as one Parquet file per ticker (the `--data DIR` a user gives):

1. the universe (``--tickers`` x ``--days``) from raw bars to shards, with Ray's tasks on every core:
   time, rows/s, the driver's peak RSS and the largest peak RSS of a Ray worker process (what one task
   held, sampled every 0.1 s);
2. the packaged stocknet prices and a 500-ticker table: this tree's build against ``--baseline``'s
   (a git commit, checked out in a temporary worktree), each the same in-process call;
3. a 1M-row universe: our build on one core and on two (each process builds once, then ``REPEATS`` times
   more: their median), against ``reference_script`` (``REPEATS`` runs: the median; a plain
   single-process numpy script that reads the same Parquet files, computes the same 16 features and
   the label and writes one Parquet file) on one core;
4. peak RSS per task from 1M to the universe's rows;
5. an append of the last 21 days (one daily-feed file of every ticker's bars) to the universe built
   without them, against that build (each timed in its process after the modules are imported).
Results: ``bench/results/features-<rows>.json``; the table is printed.
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

from _common import machine, write_result

REPO = Path(__file__).resolve().parents[1]
APPEND_DAYS = 21
REPEATS = 5  # item 3's builds after the first in a process, and the plain script's runs

# the child: one build (or append) in a fresh process; prints one JSON line
CHILD = r"""
import json, os, resource, sys, threading, time
sys.path.insert(0, {repo!r})
import psutil
peak = {{"workers": 0}}
def sample():
    me = psutil.Process()
    while True:
        for child in me.children(recursive=True):
            try:
                if "ray::" in " ".join(child.cmdline()[:1]):
                    peak["workers"] = max(peak["workers"], child.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.1)
cpus = {cpus!r}
if cpus:  # Ray's workers to watch (without Ray, the scan of every process would only slow the build down)
    threading.Thread(target=sample, daemon=True).start()
    import ray
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
from alchemetric_ray.config import load_config
if {append!r}:  # each timed once its modules are imported (the append's: the API's, torch's among them)
    import alchemetric_ray as ar
    from alchemetric_ray.data.append import append_bars
else:
    from alchemetric_ray.data.shards import build_shards
cfg = load_config(None, {overrides!r})
start = time.perf_counter()
if {append!r}:
    shards = ar.features(cfg, data={data!r}, out={out!r}, append=True)
    rows = dict(shards.rows)
    seconds = warm = time.perf_counter() - start
else:
    built = build_shards(cfg, {out!r})
    rows = built.manifest.rows
    seconds = time.perf_counter() - start
    again = []  # the same build again in the same process: modules imported, Ray's workers warm (the median)
    for k in range({again!r}):
        start = time.perf_counter()
        build_shards(cfg, {out!r} + f"-again{{k}}")
        again.append(time.perf_counter() - start)
    warm = sorted(again)[len(again) // 2]
def peak_mib():
    # this process's own high-water mark (VmHWM): Linux carries ru_maxrss over an exec, so it would report
    # the benchmark's parent (which made the bars) where that was larger
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({{"seconds": seconds, "warm_seconds": warm, "rows": rows,
                              "driver_peak_mib": peak_mib(),
                              "worker_peak_mib": peak["workers"] / 2**20}}))
"""


def write_universe(folder: Path, tickers: int, days: int, seed: int = 7) -> int:
    """One Parquet file of daily bars per synthetic ticker; the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars

    folder.mkdir(parents=True, exist_ok=True)
    rows = 0
    for ticker, bars in synthetic_bars(SyntheticMarket(n_tickers=tickers, n_days=days, seed=seed)):
        pq.write_table(pa.Table.from_pandas(bars, preserve_index=False), folder / f"{ticker}.parquet")
        rows += len(bars)
    return rows


def split_universe(folder: Path, head: Path, tail: Path, days: int) -> None:
    """``head``: every ticker without its last ``days`` bars (a file per ticker); ``tail``: those bars as a
    daily feed comes, one file of every ticker's bars by date (a Parquet file with a ticker column)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    head.mkdir(parents=True, exist_ok=True)
    pieces = []
    for path in sorted(folder.glob("*.parquet")):
        table = pq.read_table(path)
        pq.write_table(table.slice(0, table.num_rows - days), head / path.name)
        last = table.slice(table.num_rows - days).replace_schema_metadata(None)
        pieces.append(last.append_column("ticker", pa.array([path.stem] * last.num_rows)))
    feed = pa.concat_tables(pieces)
    pq.write_table(feed.take(pc.sort_indices(feed, [("date", "ascending"), ("ticker", "ascending")])), tail)


def child(repo: Path, overrides: list[str], out: Path, *, cpus: int | None, one_core: bool = False,
          append: bool = False, data: str | None = None, again: int = 1) -> dict:
    """One build (or append) in a fresh process; a build is then repeated ``again`` times in that process
    (``warm_seconds``: their median)."""
    code = CHILD.format(repo=str(repo), overrides=overrides, out=str(out), cpus=cpus, append=append, data=data,
                        again=again)
    command = [sys.executable, "-c", code]
    if one_core:
        command = ["taskset", "-c", "0", *command]
    env = {**os.environ, "PYTHONPATH": str(repo), "RAY_DEDUP_LOGS": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(repo))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"a benchmark child failed ({' '.join(overrides)}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["total_rows"] = sum(result["rows"].values()) if isinstance(result["rows"], dict) else result["rows"]
    return result


def _pair(result: dict) -> str:
    return f"{result['seconds']:.2f} / {result['warm_seconds']:.2f} s"


def reference(data: Path, out: Path, runs: int = 1) -> dict:
    """The plain script on one core (``runs`` > 1: run that many times, the run of the median time)."""
    command = ["taskset", "-c", "0", sys.executable, str(Path(__file__).parent / "reference_features.py"),
               str(data), str(out)]
    results = [json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
                          .splitlines()[-1]) for _ in range(runs)]
    return sorted(results, key=lambda r: r["seconds"])[len(results) // 2]


def baseline_tree(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit], check=True,
                   capture_output=True)
    return where


def against_baseline(base: Path, commit: str, table500: Path, scratch: Path) -> dict:
    """Item 2: the same build call in a fresh process, this tree against ``base`` (``commit``'s tree)."""
    figures: dict = {"baseline": commit}
    for name, overrides in (("stocknet", ["data.source=stocknet"]), ("500 tickers", [f"data.path={table500}"])):
        new = child(REPO, overrides, scratch / f"new-{len(name)}", cpus=None)
        old = child(base, overrides, scratch / f"old-{len(name)}", cpus=None)
        figures[name] = {"new": new, "old": old, "speedup": old["seconds"] / new["seconds"],
                         "speedup_warm": old["warm_seconds"] / new["warm_seconds"]}
        print(f"2. {name}, first / second build in a process: {_pair(new)} against {_pair(old)} at "
              f"{commit}: {old['seconds'] / new['seconds']:.1f}x / "
              f"{old['warm_seconds'] / new['warm_seconds']:.1f}x (target >= 3x)", flush=True)
    return figures


def only_baseline(args: argparse.Namespace) -> None:
    """Item 2 alone: the packaged data and a 500-ticker table, this tree against ``--baseline``."""
    scratch = Path(tempfile.mkdtemp(prefix="alchemetric-bench-baseline-"))
    base = None
    try:
        write_universe(scratch / "t500", 500, 1259, seed=9)
        base = baseline_tree(args.baseline, scratch / "baseline")
        figures = against_baseline(base, args.baseline, scratch / "t500", scratch)
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    write_result(args.out, "features-baseline", {"machine": machine(), "date": time.strftime("%Y-%m-%d"), **figures})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickers", type=int, default=3000)
    parser.add_argument("--days", type=int, default=3500)
    parser.add_argument("--small", type=int, default=300, help="tickers of the 1M-row universe (x --days)")
    parser.add_argument("--baseline", default="daf3096", help="the commit the build is compared with")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--only-append", action="store_true", help="item 5 only: the universe without its last "
                        "21 days built, then those days appended")
    parser.add_argument("--only-cores", action="store_true", help="item 3 only: the 1M-row universe on one core "
                        "and on all, against the plain script")
    parser.add_argument("--only-baseline", action="store_true", help="item 2 only: the packaged data and a "
                        "500-ticker table, this tree against --baseline")
    args = parser.parse_args()
    if args.only_baseline:
        return only_baseline(args)
    if args.only_append:
        return only_append(args)
    if args.only_cores:
        return only_cores(args)
    cores = os.cpu_count() or 1
    figures: dict = {}
    scratch = Path(tempfile.mkdtemp(prefix="alchemetric-bench-features-"))
    base = None
    try:
        big, small, table500 = scratch / "universe", scratch / "small", scratch / "t500"
        t0 = time.perf_counter()
        rows_big = write_universe(big, args.tickers, args.days)
        rows_small = write_universe(small, args.small, args.days, seed=8)
        write_universe(table500, 500, 1259, seed=9)
        print(f"bars written: {rows_big:,} + {rows_small:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)

        # 1 and 5: the universe without its last 21 days, then the append of those days; the whole universe
        head, tail = scratch / "head", scratch / "tail.parquet"
        split_universe(big, head, tail, APPEND_DAYS)
        fixed = ["features.train_frac=0.6", "features.val_frac=0.2"]
        full = child(REPO, [f"data.path={big}", *fixed], scratch / "full", cpus=cores)
        figures["universe"] = {**full, "input_rows": rows_big, "rows_per_s": rows_big / full["seconds"]}
        print(f"1. universe {rows_big:,} bars -> {full['total_rows']:,} rows in {full['seconds']:.1f} s "
              f"({rows_big / full['seconds']:,.0f} bars/s; again in the same process {full['warm_seconds']:.1f} s), "
              f"driver peak {full['driver_peak_mib']:.0f} MiB, "
              f"largest worker {full['worker_peak_mib']:.0f} MiB", flush=True)
        built = child(REPO, [f"data.path={head}", *fixed], scratch / "appended", cpus=cores)
        added = child(REPO, [], scratch / "appended", cpus=cores, append=True, data=str(tail))
        figures["append"] = {"build_seconds": built["seconds"], "append_seconds": added["seconds"],
                             "ratio": added["seconds"] / built["seconds"]}
        print(f"5. append {APPEND_DAYS} days: {added['seconds']:.1f} s against {built['seconds']:.1f} s for the build "
              f"= {added['seconds'] / built['seconds']:.3f} (target <= 0.05)", flush=True)

        # 3 and 4: the 1M-row universe, one core and two, against the plain script on one core
        figures["cores"] = cores_item(small, rows_small, scratch, cores)
        two = figures["cores"]["ours_all_cores"]
        figures["memory"] = {"small_worker_peak_mib": two["worker_peak_mib"],
                             "universe_worker_peak_mib": full["worker_peak_mib"],
                             "ratio": full["worker_peak_mib"] / max(two["worker_peak_mib"], 1e-9)}
        print(f"4. peak RSS per task {two['worker_peak_mib']:.0f} MiB at {rows_small:,} bars, "
              f"{full['worker_peak_mib']:.0f} MiB at {rows_big:,}: {figures['memory']['ratio']:.2f} (<= 1.5)",
              flush=True)

        # 2: this tree against the baseline commit, same call, same data
        base = baseline_tree(args.baseline, scratch / "baseline")
        figures["against_baseline"] = against_baseline(base, args.baseline, table500, scratch)
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    write_result(args.out, f"features-{args.tickers * args.days}", {"machine": machine(), **figures,
                                                                     "date": time.strftime("%Y-%m-%d")})


def cores_item(small: Path, rows_small: int, scratch: Path, cores: int) -> dict:
    """Item 3: the 1M-row universe on one core (in the driver: no Ray, the fastest one-core build; and as
    Ray tasks on a one-CPU Ray) and as Ray tasks on every core, against the plain script on one core.
    Builds of ~2 s move by 10-20 % from one to the next on a shared 2-core machine: each process builds
    once, then ``REPEATS`` times more (the median of those), and the plain script runs ``REPEATS`` times."""
    os.sync()  # what earlier items wrote (GBs after the universe's builds) is flushed now, not beside these builds
    one = child(REPO, [f"data.path={small}", "features.distributed=false"], scratch / "one", cpus=None,
                one_core=True, again=REPEATS)
    one_ray = child(REPO, [f"data.path={small}"], scratch / "one-ray", cpus=1, one_core=True, again=REPEATS)
    two = child(REPO, [f"data.path={small}"], scratch / "two", cpus=cores, again=REPEATS)
    ref = reference(small, scratch / "reference.parquet", runs=REPEATS)
    figures = {"input_rows": rows_small, "ours_one_core": one, "ours_one_core_ray": one_ray,
               "ours_all_cores": two, "reference": ref,
               "ours_vs_reference_one_core": ref["seconds"] / one["warm_seconds"],
               "all_cores_vs_one": one["warm_seconds"] / two["warm_seconds"],
               "all_cores_vs_one_ray": one_ray["warm_seconds"] / two["warm_seconds"],
               "note": f"ratios of the median of {REPEATS} builds after the first in each process (imports done, "
                       f"Ray's workers warm); the plain script: the median of {REPEATS} runs, its time without "
                       "its imports"}
    print(f"3. {rows_small:,} bars, first build in a process / the median of {REPEATS} more: ours on one core "
          f"{_pair(one)} in the driver, {_pair(one_ray)} as Ray tasks; {_pair(two)} as Ray tasks on {cores}; "
          f"the plain script {ref['seconds']:.2f} s on one core (median of {REPEATS}): ours/reference "
          f"{figures['ours_vs_reference_one_core']:.2f} (>= 0.8), {cores} cores / one "
          f"{figures['all_cores_vs_one']:.2f} (Ray on one: {figures['all_cores_vs_one_ray']:.2f}) (> 1.6)", flush=True)
    return figures


def only_cores(args: argparse.Namespace) -> None:
    """Item 3 alone, on a universe of ``--small`` tickers x ``--days`` days."""
    cores = os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(prefix="alchemetric-bench-cores-"))
    try:
        small = scratch / "small"
        rows_small = write_universe(small, args.small, args.days, seed=8)
        figures = cores_item(small, rows_small, scratch, cores)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_result(args.out, f"features-cores-{args.small * args.days}", {"machine": machine(), "cores": figures,
                                                                        "date": time.strftime("%Y-%m-%d")})


def only_append(args: argparse.Namespace) -> None:
    """Item 5 alone: the build of the universe without its last 21 days, then the append of those days."""
    cores = os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(prefix="alchemetric-bench-append-"))
    try:
        big, head, tail = scratch / "universe", scratch / "head", scratch / "tail.parquet"
        rows = write_universe(big, args.tickers, args.days)
        split_universe(big, head, tail, APPEND_DAYS)
        fixed = ["features.train_frac=0.6", "features.val_frac=0.2"]
        built = child(REPO, [f"data.path={head}", *fixed], scratch / "appended", cpus=cores)
        added = child(REPO, [], scratch / "appended", cpus=cores, append=True, data=str(tail))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = added["seconds"] / built["seconds"]
    print(f"5. append {APPEND_DAYS} days to {rows:,} bars: {added['seconds']:.1f} s against {built['seconds']:.1f} s "
          f"for the build = {ratio:.3f} (target <= 0.05)", flush=True)
    write_result(args.out, f"features-append-{rows}", {"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                                                       "build_seconds": built["seconds"],
                                                       "append_seconds": added["seconds"], "ratio": ratio})


if __name__ == "__main__":
    main()
