"""Pack a folder of stocknet price CSVs into the package's one compressed Parquet table.

    python scripts/vendor_stocknet.py PATH/TO/stocknet

Run once by a maintainer; the result (``alchemetric_ray/bars/packaged/stocknet/prices.parquet``) is
committed, so that a clone anywhere has the data.  The table is the raw one: every CSV row with
its seven columns plus ``ticker``, the ``null`` cells as nulls and zero-volume rows kept, so
that ingest's cleaning is exercised on the packaged copy exactly as on the files.  It also
records each source file's SHA-256 in ``sources.json``, so that a test can prove
``write_csvs`` gives back the very bytes that went in.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from alchemetric_ray.bars.stocknet import PACKAGE_DIR, write_table


def main(folder: str) -> int:
    root = Path(folder)
    files = sorted(root.glob("*.csv"))
    if not files:
        print(f"vendor_stocknet: error: no CSV files in {root}", file=sys.stderr)
        return 2
    frames = []
    for p in files:
        raw = pd.read_csv(p, keep_default_na=False, na_values=["null"], dtype={"Volume": "Int64"})
        frames.append(raw.assign(ticker=p.stem))
    table = pd.concat(frames, ignore_index=True)
    write_table(table)
    digests = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    (PACKAGE_DIR / "sources.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PACKAGE_DIR}: {len(files)} tickers, {len(table):,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
