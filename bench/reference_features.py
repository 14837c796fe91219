"""The plain script `bench/features.py` measures the build against: one process, numpy and scipy.

    python bench/reference_features.py BARS_DIR OUT.parquet

Reads every ticker's Parquet file in ``BARS_DIR``, computes the default 16 features and the
three-class label (vol band, horizon 1) ticker by ticker on numpy arrays, drops the rows without
all of them and writes one Parquet file.  No validation, normalization, splits or cross-section: the
least a script computing the same numbers has to do.  Prints one JSON line: seconds, rows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.lib.stride_tricks import sliding_window_view
from scipy.signal import lfilter


def shift(x: np.ndarray, k: int) -> np.ndarray:
    out = np.full(len(x), np.nan)
    if k < len(x):
        out[k:] = x[:len(x) - k]
    return out


def rolling(x: np.ndarray, w: int, how: str, ddof: int = 1) -> np.ndarray:
    out = np.full(len(x), np.nan)
    if len(x) >= w:
        view = sliding_window_view(x, w)
        out[w - 1:] = view.mean(axis=1) if how == "mean" else view.std(axis=1, ddof=ddof)
    return out


def ema(x: np.ndarray, alpha: float, min_periods: int) -> np.ndarray:
    """pandas' ewm(alpha, adjust=False): starts at the first valid value; NaN before min_periods values."""
    out = np.full(len(x), np.nan)
    first = int(np.argmax(~np.isnan(x))) if (~np.isnan(x)).any() else len(x)
    if first >= len(x):
        return out
    y, _ = lfilter([alpha], [1, alpha - 1], x[first:], zi=[(1 - alpha) * x[first]])
    out[first:] = y
    out[first:first + min_periods - 1] = np.nan
    return out


def ratio(num: np.ndarray, den: np.ndarray, neutral: float) -> np.ndarray:
    ok = np.isfinite(den) & (np.abs(den) > 1e-12)
    out = np.where(ok, num / np.where(ok, den, 1.0), neutral)
    out[np.isnan(num) | np.isnan(den)] = np.nan
    return out


def features(o, h, lo, c, v) -> dict[str, np.ndarray]:
    logc = np.log(c)
    r1 = logc - shift(logc, 1)
    f = {f"ret_{k}": logc - shift(logc, k) for k in (1, 5, 10, 20)}
    f.update({f"vol_{w}": rolling(r1, w, "std") for w in (5, 20, 60)})
    delta = c - shift(c, 1)
    gain = ema(np.where(np.isnan(delta), np.nan, np.clip(delta, 0, None)), 1 / 14, 14)
    loss = ema(np.where(np.isnan(delta), np.nan, np.clip(-delta, 0, None)), 1 / 14, 14)
    f["rsi_14"] = ratio(gain, gain + loss, 0.5) - 0.5
    line = (ema(c, 2 / 13, 12) - ema(c, 2 / 27, 26)) / c
    f["macd"] = line
    f["macd_hist"] = line - ema(line, 2 / 10, 9)
    mid, std = rolling(c, 20, "mean"), rolling(c, 20, "std", ddof=0)
    f["bb_pctb_20"] = ratio(c - (mid - 2 * std), 4 * std, 0.5)
    prev = shift(c, 1)
    tr = np.fmax(np.fmax(h - lo, np.abs(h - prev)), np.abs(lo - prev))
    tr[np.isnan(prev)] = np.nan
    f["atr_14"] = ema(tr, 1 / 14, 14) / c
    logv = np.log1p(v)
    f["volume_z_20"] = ratio(logv - rolling(logv, 20, "mean"), rolling(logv, 20, "std"), 0.0)
    f["hl_range"] = (h - lo) / c
    f.update({f"close_sma_{w}": c / rolling(c, w, "mean") - 1 for w in (10, 50)})
    return f


def label(o: np.ndarray, c: np.ndarray) -> np.ndarray:
    logo = np.log(o)
    fwd = np.full(len(o), np.nan)
    fwd[:len(o) - 2] = logo[2:] - logo[1:len(o) - 1]
    band = 0.25 * rolling(np.log(c) - shift(np.log(c), 1), 20, "std")
    out = np.where(fwd > band, 2.0, np.where(fwd < -band, 0.0, 1.0))
    out[np.isnan(band) | np.isnan(fwd)] = np.nan
    return out


def main() -> None:
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    start = time.perf_counter()
    tables = []
    for path in sorted(folder.glob("*.parquet")):
        bars = pq.read_table(path)
        cols = [bars.column(n).to_numpy().astype(np.float64) for n in ("open", "high", "low", "close", "volume")]
        f = features(*cols)
        f["label"] = label(cols[0], cols[3])
        keep = np.all([np.isfinite(x) for x in f.values()], axis=0)
        table = {"date": bars.column("date").to_numpy()[keep], "ticker": np.full(int(keep.sum()), path.stem)}
        table.update({name: values[keep] for name, values in f.items()})
        tables.append(pa.table(table))
    pq.write_table(pa.concat_tables(tables), out)
    rows = sum(t.num_rows for t in tables)
    print(json.dumps({"seconds": time.perf_counter() - start, "rows": rows}))


if __name__ == "__main__":
    main()
