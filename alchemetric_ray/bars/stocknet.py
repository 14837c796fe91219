"""The stocknet daily prices, shipped inside the package: 88 US-listed stocks, 2012-09 .. 2017-09.

``data.source=stocknet`` (the default) reads them.  The copy is the *raw* table, one Parquet file
(``packaged/stocknet/prices.parquet``): every row of the source's per-ticker CSVs with its seven
columns (Date, Open, High, Low, Close, Adj Close, Volume) plus ``ticker``, the source's ``null``
cells as nulls and its zero-volume rows kept.  So the built-in data goes through ingest's
validation and cleaning (:func:`alchemetric_ray.bars.ingest.iter_bars`, long-table path) exactly
like files a user brings, and the ingest tests can rely on its defects.

Source and licence (``packaged/stocknet/SOURCE.md`` and ``LICENSE``): the stocknet dataset
(Xu and Cohen, 2018), MIT licence; its prices come from Yahoo Finance.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd

PACKAGE_DIR = Path(__file__).resolve().parent / "packaged" / "stocknet"
PRICES = PACKAGE_DIR / "prices.parquet"
COLUMNS = ("Date", "Open", "High", "Low", "Close", "Adj Close", "Volume")
DESCRIPTION = ("stocknet daily prices of 88 US stocks, 2012-09 .. 2017-09 (Yahoo Finance via the stocknet "
               "dataset, MIT licence), shipped with the package")
# How the source files spell numbers and empty cells: write_csvs gives back their exact bytes.
_FLOAT_FORMAT = "%.6f"
_MISSING = "null"


def prices_path() -> Path:
    """The packaged long table (for ``iter_bars``); a clear error if the install lacks it."""
    if not PRICES.is_file():
        from alchemetric_ray.errors import DataError

        raise DataError(f"built-in stocknet data missing: {PRICES} (reinstall the package)")
    return PRICES


def raw_table(tickers: list[str] | None = None) -> pd.DataFrame:
    """The raw rows (``ticker`` + the seven source columns), nulls kept; optionally some tickers only."""
    import pyarrow.parquet as pq

    filters = [("ticker", "in", list(tickers))] if tickers else None
    frame = pq.read_table(prices_path(), filters=filters).to_pandas()
    return frame[["ticker", *COLUMNS]]


def tickers() -> list[str]:
    import pyarrow.parquet as pq

    return sorted(set(pq.read_table(prices_path(), columns=["ticker"]).column("ticker").to_pylist()))


def write_csvs(folder: str | Path, tickers: list[str] | None = None) -> Path:
    """Write the packaged data back out as one ``<TICKER>.csv`` per ticker, as the source had them.

    For tests and users who edit files; the output equals the source files byte for byte
    (``sources.json`` holds their SHA-256)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for ticker, rows in raw_table(tickers).groupby("ticker", sort=True):
        frame = rows.drop(columns="ticker").assign(Date=lambda f: pd.to_datetime(f["Date"]).dt.strftime("%Y-%m-%d"))
        target = out / f"{ticker}.csv"
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{ticker}.", suffix=".tmp")
        with os.fdopen(fd, "w", newline="") as fh:
            frame.to_csv(fh, index=False, float_format=_FLOAT_FORMAT, na_rep=_MISSING, lineterminator="\n")
        os.replace(tmp, target)
    return out


def write_table(table: pd.DataFrame, target: Path = PRICES) -> Path:
    """Write the long table (maintainers: ``scripts/vendor_stocknet.py``), zstd-compressed, rows by ticker then date."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = table[["ticker", *COLUMNS]].sort_values(["ticker", "Date"], kind="stable").reset_index(drop=True)
    frame["Date"] = pd.to_datetime(frame["Date"]).dt.date
    schema = pa.schema([("ticker", pa.string()), ("Date", pa.date32()),
                        *[(c, pa.float64()) for c in COLUMNS[1:6]], ("Volume", pa.int64())])
    arrow = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    pq.write_table(arrow, tmp, compression="zstd", compression_level=19)
    os.replace(tmp, target)
    return target
