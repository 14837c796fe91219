"""Features and labels for a group of tickers at once: the unit of work of the feature build.

:func:`compute_group` takes the bars of several tickers (each a frame of date, open, high, low,
close, volume, sorted by date) and returns every labelled row with complete features, for all of
them together, ordered by ticker then date.  It is a pure function of its inputs: the build runs
it in the driver for a small input and as Ray tasks over groups of tickers otherwise
(``data/staging.py``).

Every feature and label is computed for all the tickers of the group at once, over one panel of
columnar arrays (``features.Panel``: rows by ticker then date; windows, EMAs and shifts start over
at each ticker's first bar); there is no per-ticker loop.  The values equal those of the per-ticker
pandas implementation it replaced (``tests/reference_features.py``; ``tests/test_panel.py``
compares them on the packaged data and on a synthetic market with edge cases).

**Why numpy, not polars** (measured 2026-12-05 on this 2-core machine, shared with other work:
load average 5-6; ``.venv/bin/python -m alchemetric_ray.data.panel`` prints them, and
``POLARS_MAX_THREADS=1 .venv/bin/python -m alchemetric_ray.data.panel`` the one-thread column: best
of 7 runs taken in turn, the reference 1 run; the 16 default features and the three-class label;
polars 2.1.0 as a plain ``.over("ticker")`` prototype that skips the neutral values and pandas' EMA
start, i.e. does a little less):

  ==================================  ===============  ===============  ==============================
  seconds (rows/s)                    stocknet, 88     synthetic 500 x  polars on one thread (another
                                      tickers, 108.5k  1,259, 629.5k    run): stocknet / synthetic
  ==================================  ===============  ===============  ==============================
  numpy panel, features + label       0.142 (765k)     0.473 (1.33M)    0.082 / 0.380
  polars prototype, features + label  0.191 (568k)     0.590 (1.07M)    0.132 / 0.599
  compute_group (numpy, whole)        0.222 (489k)     0.639 (985k)     0.166 / 0.772
  per-ticker pandas (before)          2.760 (39k)      9.315 (68k)      2.086 / 13.725
  ==================================  ===============  ===============  ==============================

Taken in turn, numpy was faster at both sizes, with polars on both cores or on one (and a Ray
task holds one CPU, where polars' own thread pool would compete with the other tasks).  Timed one
engine after the other instead, the load moved the figures by up to 2x between runs, and polars on
two threads once came out ahead on the synthetic table (0.315 s against 0.383 s): the two are close,
and the rest decided.  numpy keeps pandas' semantics exactly where polars needs care (NaN is not
null there; the EMA's start and its missing values), and adds no package (scipy came with
scikit-learn; pyproject.toml now names it).  The rolling windows are summed a lag at a time
(contiguous adds, each window in two passes), the EMAs are their recurrence a bar at a time over a
[bar, ticker] matrix, every ticker at once (``scipy.signal.lfilter`` did the same sums but cost 0.5 s
of imports on a build's first call).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from alchemetric_ray.data import features as feat
from alchemetric_ray.data.features import Panel
from alchemetric_ray.data.labels import LabelSpec, panel_labels
from alchemetric_ray.data.tails import ema_keep_at, record, tail_length


@dataclass
class GroupResult:
    """What :func:`compute_group` gives back for one group of tickers."""

    table: pa.Table  # date (timestamp ns), ticker (string), one float64 column per feature, label (float64),
    #                  fwd_ret (float64), label_end (timestamp ns): the labelled rows with complete features
    tickers: list[str]  # the tickers with at least one such row, in input order
    skipped: dict[str, str] = field(default_factory=dict)  # ticker -> why it has no row
    nonfinite: int = 0  # rows after the warm-up dropped for a non-finite feature value
    rows_in: int = 0  # bars read
    digests: dict[str, str] = field(default_factory=dict)  # ticker -> sha256 of its bars (the input hash)
    tails: pa.Table | None = None  # what an append resumes each ticker from (data/tails.py), where asked for


def bars_digest(frame: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()).hexdigest()


def panel_columns(panel: Panel, dates: np.ndarray, names: list[str],
                  spec: LabelSpec) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every row of ``panel`` with its raw features, label, forward return, label end, the date of the
    next bar (when a signal computed on this bar takes effect; NaT for a ticker's last) and whether
    every feature is defined; and, per ticker, the rows after the warm-up dropped as non-finite."""
    values, late_bad = feat.feature_matrix(panel, names)
    label, fwd = panel_labels(panel, spec)
    cols = {name: values[:, j] for j, name in enumerate(names)}
    cols.update(label=label, fwd_ret=fwd, label_end=_later_date(panel, dates, spec.reach),
                next_date=_later_date(panel, dates, 1), has_features=np.isfinite(values).all(axis=1))
    return cols, late_bad


def _later_date(panel: Panel, dates: np.ndarray, reach: int) -> np.ndarray:
    """For each row, the date of the bar ``reach`` bars later in its ticker (NaT past its end)."""
    out = np.full(panel.n, np.datetime64("NaT"), dtype="datetime64[ns]")
    if panel.n > reach:
        out[: panel.n - reach] = dates[reach:]
    out[panel.left < reach] = np.datetime64("NaT")
    return out


def feature_table(ticker: str, frame: pd.DataFrame, names: list[str], spec: LabelSpec) -> tuple[pd.DataFrame, int]:
    """Every bar of one ticker with its raw features, label, forward return, label end, the date of the
    next bar and ``has_features`` (:func:`panel_columns` of a one-ticker panel); and its count of rows
    after the warm-up dropped as non-finite."""
    ((_, _, table, late_bad),) = _tables([(ticker, frame)], names, spec)
    return table, late_bad


def feature_tables(bars: Iterable[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec, *,
                   batch_rows: int = 200_000) -> Iterator[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(ticker, bars, :func:`feature_table`) for every ticker of ``bars``, in order, computed over one
    panel for each batch of tickers of about ``batch_rows`` bars (memory: one batch)."""
    batch: list[tuple[str, pd.DataFrame]] = []
    rows = 0
    for ticker, frame in bars:
        batch.append((ticker, frame))
        rows += len(frame)
        if rows >= batch_rows:
            yield from ((t, f, table) for t, f, table, _ in _tables(batch, names, spec))
            batch, rows = [], 0
    yield from ((t, f, table) for t, f, table, _ in _tables(batch, names, spec))


def _tables(batch: list[tuple[str, pd.DataFrame]], names: list[str],
            spec: LabelSpec) -> Iterator[tuple[str, pd.DataFrame, pd.DataFrame, int]]:
    together = feat.stack([frame for _, frame in batch])
    panel = Panel.from_table(together, np.array([len(frame) for _, frame in batch], dtype=np.int64))
    dates = together["date"].to_numpy().astype("datetime64[ns]")
    cols, late_bad = panel_columns(panel, dates, names, spec)
    values = np.column_stack([cols[n] for n in names]) if names else np.empty((panel.n, 0))
    for j, (ticker, frame) in enumerate(batch):
        rows = slice(int(panel.starts[j]), int(panel.starts[j] + panel.lengths[j]))
        table = pd.DataFrame({"date": dates[rows], "ticker": ticker})
        table[names] = values[rows]
        for name in ("label", "fwd_ret", "label_end", "next_date", "has_features"):
            table[name] = cols[name][rows]
        yield ticker, frame, table, int(late_bad[j])


def _digests(frames: list[tuple[str, pd.DataFrame]], together: pd.DataFrame) -> dict[str, str]:
    """:func:`bars_digest` of every frame.  pandas hashes a frame row by row, so where the frames
    share their columns and numpy dtypes, the rows of ``together`` (the frames stacked) are hashed
    once and cut by ticker."""
    if not frames:
        return {}
    first = frames[0][1]
    same = all(list(f.columns) == list(first.columns) and all(f.dtypes == first.dtypes) for _, f in frames)
    if not same or any(isinstance(t, pd.api.extensions.ExtensionDtype) for t in first.dtypes):
        return {ticker: bars_digest(frame) for ticker, frame in frames}
    hashes = pd.util.hash_pandas_object(together, index=False).to_numpy()
    ends = np.cumsum([len(f) for _, f in frames])
    return {ticker: hashlib.sha256(hashes[end - len(frame): end].tobytes()).hexdigest()
            for (ticker, frame), end in zip(frames, ends)}


def compute_group(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec,
                  need: int, *, tails: bool = False) -> GroupResult:
    """Features and labels of every ticker in ``frames``; a ticker with fewer than ``need`` bars, or
    no labelled row with complete features, is skipped with its reason.  ``tails``: with what an append
    resumes each ticker from (``GroupResult.tails``)."""
    together = feat.stack([frame for _, frame in frames])
    rows = len(together)
    digests = _digests(frames, together)
    short = {ticker: f"{len(frame)} bars, fewer than the {need} the features and labels need"
             for ticker, frame in frames if len(frame) < need}
    panel = Panel.from_table(together, np.array([len(frame) for _, frame in frames], dtype=np.int64))
    if tails:
        panel.keep_emas_at = ema_keep_at(panel.lengths, spec.reach)
    dates = together["date"].to_numpy().astype("datetime64[ns]")
    cols, late_bad = panel_columns(panel, dates, names, spec)
    computed = np.array([ticker not in short for ticker, _ in frames], dtype=bool)  # the short ones: no row
    late_bad[~computed] = 0
    keep = cols["has_features"] & np.isfinite(cols["label"]) & computed[panel.tid]
    kept_rows = np.bincount(panel.tid[keep], minlength=len(frames))
    tail_rows = None
    if tails:
        last = np.full(len(frames), -1, dtype=np.int64)
        np.maximum.at(last, panel.tid[keep], panel.pos[keep])
        bars = {c: together[c].to_numpy() for c in ("open", "high", "low", "close", "volume")}
        emas = feat.EmaStates(cast(np.ndarray, panel.keep_emas_at), panel.kept_emas)
        tail_rows = record([t for t, _ in frames], {"date": dates, **bars}, panel.lengths, last, emas,
                           tail_length(names, spec.reach))
    labelled = {ticker for (ticker, _), n in zip(frames, kept_rows) if n}
    skipped = {ticker: short.get(ticker, "no row with complete features and a label")
               for ticker, _ in frames if ticker not in labelled}
    kept = [ticker for ticker, _ in frames if ticker in labelled]
    if not kept:
        return GroupResult(pa.table({}), kept, skipped, int(late_bad.sum()), rows, digests, tail_rows)
    rows_kept = np.flatnonzero(keep)
    names_of = [ticker for ticker, _ in frames]
    columns = {"date": dates[rows_kept], "ticker": names_of, **{n: cols[n][rows_kept] for n in names},
               "label": cols["label"][rows_kept], "fwd_ret": cols["fwd_ret"][rows_kept],
               "label_end": cols["label_end"][rows_kept]}
    return GroupResult(_arrow(columns, panel.tid[rows_kept]), kept, skipped, int(late_bad.sum()), rows, digests,
                       tail_rows)


def _arrow(columns: dict, tid: np.ndarray) -> pa.Table:
    """The rows as the Arrow table pandas would give (``pa.Table.from_pandas``: the same types and
    pandas metadata, NaN as null), built from the arrays without a DataFrame of every row: the
    schema from the first row, the ticker column by index into the group's ticker names."""
    first = pd.DataFrame({"date": columns["date"][:1], "ticker": np.array(columns["ticker"], dtype=object)[tid[:1]],
                          **{name: values[:1] for name, values in list(columns.items())[2:]}})  # at once: 518 columns
    schema = pa.Table.from_pandas(first, preserve_index=False).schema
    arrays = [pa.array(values, type=field.type, from_pandas=True) for field, values in
              zip(schema, columns.values()) if field.name != "ticker"]
    ticker = pa.array(columns["ticker"], type=schema.field("ticker").type).take(pa.array(tid))
    return pa.Table.from_arrays([arrays[0], ticker, *arrays[1:]], schema=schema)


# ---- the engine, chosen by measurement: `python -m alchemetric_ray.data.panel` -----------------
def _polars_prototype(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec) -> int:
    """The default features and the three-class label of ``frames`` as plain polars window
    expressions over one long table (``.over("ticker")``): the engine numpy was measured against.
    A timing prototype only (no neutral values for flat windows, no exact pandas EMA start); rows out."""
    import polars as pl

    lengths = [len(f) for _, f in frames]
    df = pl.DataFrame({"ticker": np.repeat([t for t, _ in frames], lengths),
                       **{c: np.concatenate([f[c].to_numpy(np.float64) for _, f in frames])
                          for c in ("open", "high", "low", "close", "volume")}})
    c, h, lo, o = pl.col("close"), pl.col("high"), pl.col("low"), pl.col("open")
    lr = c.log().diff()
    delta = c.diff()

    def ema(e: pl.Expr, **kw) -> pl.Expr:
        return e.ewm_mean(adjust=False, **kw)

    gain, loss = ema(delta.clip(lower_bound=0), alpha=1 / 14, min_samples=14), \
        ema((-delta).clip(lower_bound=0), alpha=1 / 14, min_samples=14)
    line = (ema(c, span=12, min_samples=12) - ema(c, span=26, min_samples=26)) / c
    mid, sd = c.rolling_mean(20), c.rolling_std(20, ddof=0)
    prev = c.shift(1)
    tr = pl.max_horizontal(h - lo, (h - prev).abs(), (lo - prev).abs())
    logv = (pl.col("volume") + 1).log()
    vol20 = lr.rolling_std(20)
    fwd = o.log().shift(-1 - spec.horizon) - o.log().shift(-1)
    band = spec.vol_multiple * vol20 * np.sqrt(spec.horizon)
    exprs = {**{f"ret_{k}": c.log().diff(k) for k in (1, 5, 10, 20)},
             **{f"vol_{w}": lr.rolling_std(w) for w in (5, 20, 60)},
             "rsi_14": gain / (gain + loss) - 0.5, "macd": line, "macd_hist": line - ema(line, span=9, min_samples=9),
             "bb_pctb_20": (c - (mid - 2 * sd)) / (4 * sd), "atr_14": ema(tr, alpha=1 / 14, min_samples=14) / c,
             "volume_z_20": (logv - logv.rolling_mean(20)) / logv.rolling_std(20), "hl_range": (h - lo) / c,
             "close_sma_10": c / c.rolling_mean(10) - 1, "close_sma_50": c / c.rolling_mean(50) - 1,
             "fwd_ret": fwd, "label": pl.when(fwd > band).then(2.0).when(fwd < -band).then(0.0).otherwise(1.0)}
    out = df.select(pl.col("ticker"), *[e.over("ticker").alias(k) for k, e in exprs.items() if k in names or
                                         k in ("fwd_ret", "label")])
    return out.drop_nulls().height


def _numpy_only(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec) -> int:
    """The same work as :func:`_polars_prototype` with the numpy panel: features and label, no table."""
    panel = Panel.from_frames([f for _, f in frames])
    values, _ = feat.feature_matrix(panel, names)
    label, _ = panel_labels(panel, spec)
    return int((np.isfinite(values).all(axis=1) & np.isfinite(label)).sum())


def _measure() -> None:
    """Print the timings that chose the engine: compute_group (numpy), the polars prototype and the
    per-ticker pandas implementation it replaced (tests/reference_features.py, from a checkout), best
    of 7 runs taken in turn (the reference: of 1)."""
    import sys
    import time
    from pathlib import Path

    from alchemetric_ray.bars.sources import open_source
    from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars
    from alchemetric_ray.config import DataConfig

    tests = Path(__file__).resolve().parents[2] / "tests"
    sys.path.insert(0, str(tests))
    try:
        import reference_features as reference  # type: ignore[import-not-found]
    except ImportError:
        reference = None
    try:
        import polars  # noqa: F401
        has_polars = True
    except ImportError:
        has_polars = False
    names, spec = list(feat.DEFAULT_FEATURES), LabelSpec()
    need = feat.warmup_bars(names) + spec.reach + 20
    data = {"stocknet (packaged)": list(open_source(DataConfig(source="stocknet")).bars),
            "synthetic 500 x 1,259": list(synthetic_bars(SyntheticMarket(n_tickers=500, n_days=1259, seed=41)))}

    for label, frames in data.items():
        rows = sum(len(f) for _, f in frames)
        print(f"{label}: {len(frames)} tickers, {rows:,} bars, the 16 default features + three_class label")
        runs: dict[str, tuple[Callable[[], object], int]] = {
            "compute_group (numpy panel)": (lambda: compute_group(frames, names, spec, need), 7),
            "numpy panel (features + label only)": (lambda: _numpy_only(frames, names, spec), 7)}
        if has_polars:
            runs["polars prototype (features + label only)"] = (lambda: _polars_prototype(frames, names, spec), 7)
        if reference is not None:
            runs["per-ticker pandas (before)"] = (lambda: reference.reference_group(frames, names, spec, need), 1)
        for fn, _ in runs.values():
            fn()  # warm: imports, caches
        best = {what: float("inf") for what in runs}
        for rep in range(7):  # interleaved, so that a shared machine's changing load falls on all of them
            for what, (fn, repeat) in runs.items():
                if rep < repeat:
                    start = time.perf_counter()
                    fn()
                    best[what] = min(best[what], time.perf_counter() - start)
        for what, seconds in best.items():
            print(f"  {what:42s} {seconds:7.3f} s  {rows / seconds:12,.0f} rows/s")

if __name__ == "__main__":
    _measure()
