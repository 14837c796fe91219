"""The vectorized ingest gives exactly what the pandas implementation it replaced gave.

``tests/reference_ingest/`` holds that implementation (bars/cleaning.py, columns.py, files.py,
ingest.py and messages.py as they were, verbatim but for their imports): the slow reference.  Both
run on the same inputs -- the packaged stocknet table, its per-ticker CSVs, the kinds of messy
files the ingest tests use (duplicates, stale and zero-volume runs, OHLC inconsistencies, empty
cells, unsorted rows, non-finite values, other date spellings), randomly broken tables and a
synthetic folder -- and must yield the same tickers with the same bars bit for bit, the same
``IngestReport`` (every count, skipped ticker, warning) and, where the input is refused, the same
``DataError`` message after the same tickers.  No timing here: ``python tests/test_ingest_speed.py``
prints the before/after figures.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_ingest, when run as a script

from reference_ingest import cleaning as ref_cleaning
from reference_ingest import ingest as ref_ingest

from alchemetric_ray.bars import cleaning, files, ingest
from alchemetric_ray.bars.report import DUPLICATE_POLICIES, IngestReport
from alchemetric_ray.bars.stocknet import prices_path, raw_table
from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars
from alchemetric_ray.errors import DataError

PRICES = ["Open", "High", "Low", "Close", "Adj Close"]


# --------------------------------------------------------------------------------------------
# Running both
# --------------------------------------------------------------------------------------------

def run(iter_bars, path, **kwargs) -> tuple[list, IngestReport, str | None]:
    """(ticker, bars, source) as yielded, the report, and the DataError's message if one ends it."""
    report = IngestReport()
    out: list = []
    try:
        for ticker, bars in iter_bars(path, report=report, **kwargs):
            out.append((ticker, bars, bars.attrs.get("source")))
    except DataError as exc:
        return out, report, str(exc)
    return out, report, None


def assert_same_bars(new: pd.DataFrame, ref: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(new, ref, check_exact=True)
    for col in ref.columns:  # bit for bit: -0.0 is not 0.0 here
        np.testing.assert_array_equal(new[col].to_numpy().view("int64"), ref[col].to_numpy().view("int64"),
                                      err_msg=col)


def assert_same_reports(new: IngestReport, ref: IngestReport) -> None:
    for f in dataclasses.fields(IngestReport):
        a, b = getattr(new, f.name), getattr(ref, f.name)
        assert a == b, f"IngestReport.{f.name}: {a!r} != {b!r}"
        if isinstance(b, dict):
            assert list(a) == list(b), f"IngestReport.{f.name} order"


def same(path, **kwargs) -> tuple[list, IngestReport, str | None]:
    """Run the reference and the new ingest on ``path``; assert they agree; the new one's result."""
    path = Path(path)
    for file in (sorted(path.glob("*.parquet")) if path.is_dir() else [path]):
        if file.suffix == ".parquet":  # read directly, as read_table (the reference) reads it
            assert files._parquet_table(file).equals(pq.read_table(file), check_metadata=True)
    ref = run(ref_ingest.iter_bars, path, **kwargs)
    new = run(ingest.iter_bars, path, **kwargs)
    assert new[2] == ref[2], f"error: {new[2]!r} != {ref[2]!r}"
    assert [(t, s) for t, _, s in new[0]] == [(t, s) for t, _, s in ref[0]]
    for (ticker, a, _), (_, b, _) in zip(new[0], ref[0]):
        try:
            assert_same_bars(a, b)
        except AssertionError as exc:
            raise AssertionError(f"{path} ticker {ticker}: {exc}") from None
    assert_same_reports(new[1], ref[1])
    return new


def same_validate(raw: pd.DataFrame, **kwargs) -> pd.DataFrame | None:
    """validate_bars on a DataFrame (the public entry point): the same bars, report or error."""
    outs = []
    for module in (ref_cleaning, cleaning):
        report = IngestReport()
        try:
            bars = module.validate_bars(raw.copy(), ticker="T", report=report, **kwargs)
            outs.append((bars, report, None))
        except DataError as exc:
            outs.append((None, report, str(exc)))
    (ref_bars, ref_report, ref_error), (bars, report, error) = outs
    assert error == ref_error
    assert (bars is None) == (ref_bars is None)
    if bars is not None:
        assert_same_bars(bars, ref_bars)
    assert_same_reports(report, ref_report)
    return bars


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def messy(raw: pd.DataFrame, seed: int, *, rate: float = 1.0) -> pd.DataFrame:
    """A copy of a clean per-ticker table (Date text, the six number columns) broken in every way
    ingest handles, at random places; ``rate`` scales how much is broken (more: an error)."""
    rng = np.random.default_rng(seed)
    df = raw.copy().reset_index(drop=True)
    n = len(df)

    def rows(k: float) -> np.ndarray:
        return rng.choice(n, size=max(1, int(k * rate)), replace=False)

    flat = rng.integers(0, n - 8)
    df.loc[flat:flat + 5, PRICES] = 25.0  # a stale run (six flat bars)
    short = rng.integers(0, n - 8)
    df.loc[short:short + 3, PRICES] = 31.5  # four: not a run
    zero = rng.integers(0, n - 4)
    df.loc[zero:zero + 2, "Volume"] = 0  # a zero-volume run
    df.loc[rows(2), "Volume"] = 0  # single zero days (or runs, by chance)
    i = rows(1)
    df.loc[i, ["High", "Low"]] = df.loc[i, ["Low", "High"]].to_numpy()  # high < low
    df.loc[rows(1), "Close"] = df.loc[rows(1), "High"].to_numpy() * 1.01  # close above high
    df.loc[rows(1), "Open"] = df.loc[rows(1), "High"].to_numpy() * (1 + 1e-8)  # within tolerance: kept
    df.loc[rows(1), "Low"] = 0.0  # non-positive price
    df.loc[rows(1), "Adj Close"] = -3.0
    df.loc[rows(1), "Volume"] = -7  # negative volume
    text = df.astype({c: object for c in [*PRICES, "Volume"]})
    for col, value in (("Close", "inf"), ("High", "nan"), ("Open", "-inf"), ("Volume", "inf"),
                       ("Low", "null"), ("Volume", ""), ("Open", "N/A"), ("Date", "NA"), ("Adj Close", "-")):
        text.loc[rows(0.6), col] = value
    copies = text.loc[rows(3)]  # exact copies of rows
    revised = text.loc[rows(2)].copy()  # a revised bar next to the original
    revised["Volume"] = [v + 22 if isinstance(v, (int, float)) else v for v in revised["Volume"]]
    signed = text.loc[rows(1)].copy()
    signed["Open"] = [-0.0 if v == 0 else v for v in signed["Open"]]
    out = pd.concat([text, copies, revised, signed], ignore_index=True)
    order = np.arange(len(out))
    a = rng.integers(0, len(out) - 20)
    order[a:a + 10] = order[a:a + 10][::-1]  # a few rows out of date order
    return out.iloc[order].reset_index(drop=True)


@pytest.fixture(scope="module")
def aapl(stocknet_dir) -> pd.DataFrame:
    return pd.read_csv(stocknet_dir / "AAPL.csv")


@pytest.fixture(scope="module")
def universe(tmp_path_factory) -> Path:
    """A small synthetic folder, one Parquet file per ticker (as bench/features.py writes them)."""
    folder = tmp_path_factory.mktemp("universe")
    for ticker, bars in synthetic_bars(SyntheticMarket(n_tickers=12, n_days=300, seed=9)):
        bars.to_parquet(folder / f"{ticker}.parquet", index=False)
    return folder


# --------------------------------------------------------------------------------------------
# The packaged data, the synthetic folder
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"min_history": 1000}, {"tickers": ["aapl", "GMRE", "SPLP"]},
                                    {"on_duplicate": "refuse"}])
def test_packaged_stocknet_table(kwargs):
    bars, report, error = same(prices_path(), **kwargs)
    assert error is None and len(bars) == report.tickers > 0


def test_packaged_stocknet_csvs(stocknet_dir):
    bars, report, error = same(stocknet_dir)
    assert error is None and report.files == 88


def test_stocknet_as_one_long_csv(stocknet_dir, tmp_path):
    path = tmp_path / "all.csv"
    table = raw_table()
    table["ticker"] = table["ticker"].where(table["ticker"] != "MSFT", "NA")  # a ticker, not a missing value
    table.loc[[5, 700], "ticker"] = ""  # empty ticker cells
    table.to_csv(path, index=False)
    same(path)


def test_synthetic_folder(universe):
    bars, _, error = same(universe)
    assert error is None and len(bars) == 12
    same(universe, tickers=["SYN0003", "syn0007"], min_history=250)


# --------------------------------------------------------------------------------------------
# Messy inputs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("on_duplicate", DUPLICATE_POLICIES)
def test_messy_csv_file(aapl, tmp_path, seed, on_duplicate):
    path = tmp_path / "AAPL.csv"
    messy(aapl, seed).to_csv(path, index=False)
    bars, report, error = same(path, on_duplicate=on_duplicate)
    assert error is None or on_duplicate in ("refuse", "skip_ticker")  # skip_ticker: no ticker left
    if error is None and on_duplicate != "skip_ticker":
        assert report.dropped["duplicate_row"] and report.dropped["stale_price"] and report.dropped["empty_cell"]


@pytest.mark.parametrize("seed", range(3))
def test_messy_tables_as_parquet_and_long_tables(aapl, stocknet_dir, tmp_path, seed):
    """The same breakage in numeric Parquet columns, and in long tables of several tickers (CSV and
    Parquet, rows of the tickers interleaved)."""
    parts = {t: messy(pd.read_csv(stocknet_dir / f"{t}.csv"), seed + 10 * k)
             for k, t in enumerate(("AAPL", "GMRE", "XOM"))}
    folder = tmp_path / "folder"
    folder.mkdir()
    for ticker, part in parts.items():
        numeric = part.copy()
        for col in [*PRICES, "Volume"]:
            numeric[col] = pd.to_numeric(numeric[col].replace({"null": None, "": None, "N/A": None, "-": None}),
                                         errors="coerce")
        numeric["Date"] = pd.to_datetime(numeric["Date"].replace({"NA": None}))
        numeric.to_parquet(folder / f"{ticker}.parquet")
    for policy in ("last", "first", "skip_ticker"):
        same(folder, on_duplicate=policy)
    long = pd.concat([p.assign(Symbol=t) for t, p in parts.items()], ignore_index=True)
    long = long.iloc[np.random.default_rng(seed).permutation(len(long))]
    long.to_csv(tmp_path / "long.csv", index=False)
    long.astype({"Date": str, **{c: str for c in [*PRICES, "Volume"]}}).to_parquet(tmp_path / "long.parquet")
    for path in (tmp_path / "long.csv", tmp_path / "long.parquet"):
        for policy in DUPLICATE_POLICIES:
            same(path, on_duplicate=policy)
        same(path, min_history=1300)
        same(path, tickers=["xom"])


@pytest.mark.parametrize("seed", range(4))
def test_too_much_breakage_is_the_same_error(aapl, tmp_path, seed):
    path = tmp_path / "AAPL.csv"
    messy(aapl, seed, rate=25).to_csv(path, index=False)
    _, _, error = same(path)
    assert error is not None


def test_a_long_table_failing_at_its_second_ticker(stocknet_dir, tmp_path):
    """The tickers before the broken one are yielded and counted, then the same error."""
    table = raw_table(["AAPL", "MSFT", "XOM"])
    for column, value in (("Open", "12k"), ("Date", "2013-02-30"), ("Date", "1500-01-01")):
        broken = table.astype({"Open": object, "Date": str})
        broken.loc[broken.index[broken["ticker"] == "MSFT"][7], column] = value
        broken.to_csv(tmp_path / "long.csv", index=False)
        bars, report, error = same(tmp_path / "long.csv")
        assert [t for t, _, _ in bars] == ["AAPL"] and error and "MSFT" in error and report.tickers == 1


def test_a_long_table_with_odd_layouts(tmp_path):
    """Long Parquet tables whose rows take the general path: a range index named Date instead of a
    date column (each ticker's rows then become a frame of their own), dates with times, a column
    that is text in one ticker only, and Volume as nullable integers."""
    table = raw_table(["AAPL", "MSFT", "SPLP"])
    no_date = table.drop(columns="Date")
    no_date.index = pd.RangeIndex(len(no_date), name="Date")
    no_date.to_parquet(tmp_path / "named.parquet")
    same(tmp_path / "named.parquet")
    timed = table.assign(Date=pd.to_datetime(table["Date"]) + pd.Timedelta(hours=16))
    timed.astype({"Date": str}).to_parquet(tmp_path / "timed.parquet")
    same(tmp_path / "timed.parquet")
    mixed = table.astype({"High": object})
    mixed.loc[mixed.index[mixed["ticker"] == "SPLP"][:3], "High"] = "inf"
    mixed.astype({"High": str}).to_parquet(tmp_path / "mixed.parquet")
    same(tmp_path / "mixed.parquet")


@pytest.mark.parametrize("dates", [
    "text", "slashes", "mixed", "datetimes", "numbers", "bad_numbers", "timestamps", "microseconds",
    "time_zone", "date_objects", "index", "out_of_range", "invalid_day", "spaces", "pre_1970_times",
])
def test_date_spellings(aapl, tmp_path, dates):
    """Every way a date column reaches ingest: the vectorized parse or the general one, the same dates
    (or the same error)."""
    raw = aapl.head(80).copy()
    day = pd.to_datetime(raw["Date"])
    if dates == "slashes":
        raw["Date"] = day.dt.strftime("%m/%d/%Y")
    elif dates == "mixed":
        raw.loc[5, "Date"] = day[5].strftime("%m/%d/%Y")
    elif dates == "datetimes":
        raw["Date"] = (day + pd.Timedelta(hours=16)).dt.strftime("%Y-%m-%d %H:%M:%S")
    elif dates == "numbers":
        raw["Date"] = day.dt.strftime("%Y%m%d").astype(int)
    elif dates == "bad_numbers":
        raw["Date"] = day.dt.strftime("%Y%m%d").astype(float) + 0.5
    elif dates == "timestamps":
        raw["Date"] = day + pd.Timedelta(hours=9, minutes=30)
    elif dates == "microseconds":
        raw["Date"] = (day + pd.Timedelta(hours=23)).astype("datetime64[us]")
    elif dates == "time_zone":
        raw["Date"] = (day + pd.Timedelta(hours=20)).dt.tz_localize("America/New_York")
    elif dates == "date_objects":
        raw["Date"] = day.dt.date
    elif dates == "index":
        raw = raw.assign(Date=day).set_index("Date")
    elif dates == "out_of_range":
        raw.loc[3, "Date"] = "2263-01-01"
    elif dates == "invalid_day":
        raw.loc[3, "Date"] = "2013-02-29"
    elif dates == "spaces":
        raw["Date"] = " " + raw["Date"]
    elif dates == "pre_1970_times":
        raw["Date"] = day - pd.DateOffset(years=60) + pd.Timedelta(hours=13)
    same_validate(raw, source="AAPL.csv")
    if dates not in ("index", "date_objects", "time_zone"):
        raw.to_csv(tmp_path / "AAPL.csv", index=False)
        same(tmp_path / "AAPL.csv")
    if dates not in ("bad_numbers",):
        folder = tmp_path / "parquet"
        folder.mkdir()
        try:
            raw.to_parquet(folder / "AAPL.parquet")
        except Exception:
            return
        same(folder)  # a folder of per-ticker files (read straight from Arrow where plain)
        same(folder / "AAPL.parquet")  # a single file


@pytest.mark.parametrize("variant", [
    "int64_volume_with_nulls", "float32_prices", "uint32_volume", "extra_text_column", "ticker_column",
    "named_index", "date_index", "no_pandas_metadata", "seconds", "far_future", "tz_aware", "nullable_floats",
    "lower_case", "both_adj_close_spellings", "no_volume",
])
def test_parquet_column_types(aapl, tmp_path, variant):
    """Per-ticker Parquet files: converted straight from Arrow where every column is a plain number
    or timestamp, through pandas otherwise; the same either way."""
    import pyarrow as pa

    raw = messy(aapl.head(300), 5)
    for col in [*PRICES, "Volume"]:
        raw[col] = pd.to_numeric(raw[col].replace({"null": None, "": None, "N/A": None, "-": None}), errors="coerce")
    raw["Date"] = pd.to_datetime(raw["Date"].replace({"NA": None}))
    raw = raw[raw["Volume"].isna() | np.isfinite(raw["Volume"])].reset_index(drop=True)
    table = None
    if variant == "int64_volume_with_nulls":
        raw["Volume"] = raw["Volume"].astype("Int64")
    elif variant == "float32_prices":
        raw = raw.astype({c: "float32" for c in PRICES})
    elif variant == "uint32_volume":
        raw["Volume"] = raw["Volume"].fillna(0).abs().astype("uint32")
    elif variant == "extra_text_column":
        raw["Note"] = "x"
    elif variant == "ticker_column":
        raw["Ticker"] = "AAPL"
    elif variant == "named_index":
        raw.index = pd.RangeIndex(len(raw), name="n")
    elif variant == "date_index":
        raw = raw.set_index("Date")
    elif variant == "no_pandas_metadata":
        table = pa.Table.from_pandas(raw, preserve_index=False).replace_schema_metadata(None)
    elif variant == "seconds":
        raw["Date"] = raw["Date"].astype("datetime64[s]")
    elif variant == "far_future":
        raw["Date"] = raw["Date"].astype("datetime64[us]")
        raw.loc[raw.index[9], "Date"] = pd.Timestamp("2300-01-01").as_unit("us")
    elif variant == "tz_aware":
        raw["Date"] = raw["Date"].dt.tz_localize("Asia/Tokyo")
    elif variant == "nullable_floats":
        raw = raw.astype({c: "Float64" for c in PRICES})
    elif variant == "lower_case":
        raw.columns = [c.lower().replace(" ", "_") for c in raw.columns]
    elif variant == "both_adj_close_spellings":
        raw["AdjustedClose"] = raw["Adj Close"]
    elif variant == "no_volume":
        raw = raw.drop(columns="Volume")
    folder = tmp_path / "parquet"
    folder.mkdir()
    if table is None:
        raw.to_parquet(folder / "AAPL.parquet")
    else:
        pq.write_table(table, folder / "AAPL.parquet")
    for policy in ("last", "refuse"):
        same(folder, on_duplicate=policy)


def test_validate_bars_on_frames(aapl):
    """DataFrames handed to validate_bars directly: text, numeric and nullable columns, odd indexes."""
    same_validate(aapl, source="mem")
    broken = messy(aapl, 3)
    same_validate(broken, source="AAPL.csv")
    numeric = aapl.astype({"Volume": "Int64"})
    numeric.loc[4, "Volume"] = pd.NA
    same_validate(numeric, source="x.parquet")
    same_validate(aapl.astype({"Open": "float32", "Volume": "uint32"}), source="mem")
    same_validate(aapl.set_axis([f"r{i}" for i in range(len(aapl))]), source="mem")  # labels: positions
    same_validate(aapl.iloc[::-1], source="mem")  # an integer index, reversed
    same_validate(aapl.assign(Open=aapl["Open"] > 100), source="mem")  # bool: an error
    same_validate(aapl.astype({"Date": "string[python]"}), source="AAPL.csv")
    same_validate(aapl.head(0), source="mem", min_history=5)
    same_validate(aapl.head(1), source="mem")


def test_duplicates_with_every_policy(aapl):
    raw = aapl.head(40).copy()
    twice = pd.concat([raw, raw.iloc[[3, 3, 9]], raw.iloc[[9]].assign(Volume=1.0), raw.iloc[[12]].assign(Close=np.nan)],
                      ignore_index=True)
    signed = raw.iloc[[20]].assign(Volume=0.0)
    zeros = pd.concat([twice, signed, signed.assign(Volume=-0.0)], ignore_index=True)
    text = raw.astype({"High": object})
    nans = pd.concat([text, text.iloc[[7, 7]].assign(High="nan"), text.iloc[[7, 8]].assign(High="-nan")],
                     ignore_index=True)  # non-finite values written out take part: NaN equals NaN
    for policy in DUPLICATE_POLICIES:
        for frame in (twice, zeros, zeros.iloc[::-1].reset_index(drop=True), nans):
            same_validate(frame, source="dup.csv", on_duplicate=policy)


# --------------------------------------------------------------------------------------------
# Before / after, printed (python tests/test_ingest_speed.py [folder of per-ticker files ...])
# --------------------------------------------------------------------------------------------

def main(argv: list[str]) -> None:
    inputs = [(f"{folder} (per-ticker files)", Path(folder)) for folder in argv]
    inputs.append(("packaged stocknet (one long Parquet table)", prices_path()))
    for name, path in inputs:
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(3):
            for label, iter_bars in (("before", ref_ingest.iter_bars), ("after", ingest.iter_bars)):
                start = time.perf_counter()
                n = sum(1 for _ in iter_bars(path, report=IngestReport()))
                best[label] = min(best[label], time.perf_counter() - start)
        before, after = best["before"], best["after"]
        print(f"{name}: {n} tickers: before {before:.3f} s ({1000 * before / n:.2f} ms/ticker), "
              f"after {after:.3f} s ({1000 * after / n:.2f} ms/ticker): {before / after:.1f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
