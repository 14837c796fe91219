"""Peak memory of the feature build with and without the per-date (cross-sectional) pass.

    .venv/bin/python bench/cross_section_memory.py --tickers 1000 --days 1000

Builds the same synthetic market's shards twice, each in a fresh Python process so that each peak
is its own (``ru_maxrss`` of the child): per-ticker labels and features (``three_class``), and the
cross-sectional build (``cs_rank`` label, ``features.cs_normalize=zscore``, the four
market-relative returns).  The per-ticker build holds one ticker; the per-date pass holds one
column of every row at a time (``data/cross_section.py``), so the difference of the two peaks
divided by the row count is the per-row cost of that pass.  Results:
``bench/results/cross-section-memory-<rows>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, write_result

PER_TICKER = "ret_1,ret_5,ret_10,ret_20,vol_5,vol_20,vol_60,rsi_14,macd,bb_pctb_20,atr_14,volume_z_20"
VARIANTS = {
    "per_ticker": ["features.label=three_class", f"features.names=[{PER_TICKER}]"],
    "cross_sectional": ["features.label=cs_rank", "features.cs_normalize=zscore",
                        f"features.names=[{PER_TICKER},ret_1_rel,ret_5_rel,ret_10_rel,ret_20_rel]"],
}
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from alchemetric_ray.config import load_config
from alchemetric_ray.data.shards import build_shards
cfg = load_config(None, {overrides!r})
start = time.perf_counter()
built = build_shards(cfg, {out!r})
print(json.dumps({{"seconds": time.perf_counter() - start, "rows": sum(built.manifest.rows.values()),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickers", type=int, default=1000)
    parser.add_argument("--days", type=int, default=1000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    repo = str(Path(__file__).resolve().parents[1])
    market = ["data.source=synthetic", f"data.synthetic_tickers={args.tickers}", f"data.synthetic_days={args.days}"]
    figures = {}
    with tempfile.TemporaryDirectory(prefix="alchemetric-csmem-") as tmp:
        for name, overrides in VARIANTS.items():
            code = CHILD.format(repo=repo, overrides=[*market, *overrides], out=str(Path(tmp) / name))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name:16s} {figures[name]['rows']:>10,} rows  peak RSS {figures[name]['peak_rss_mib']:7.1f} MiB  "
                  f"{figures[name]['seconds']:6.1f} s", flush=True)
    rows = figures["cross_sectional"]["rows"]
    extra = (figures["cross_sectional"]["peak_rss_mib"] - figures["per_ticker"]["peak_rss_mib"]) * 2**20 / rows
    print(f"the per-date pass adds {extra:.1f} bytes a row to the peak")
    write_result(args.out, f"cross-section-memory-{rows}", {
        "benchmark": "cross_section_memory", "date": time.strftime("%Y-%m-%d"), "machine": machine(),
        "tickers": args.tickers, "days": args.days, "variants": figures, "extra_bytes_per_row": extra})


if __name__ == "__main__":
    main()
