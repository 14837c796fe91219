"""Ingest on the real stocknet folder, and one deliberately broken copy per validation rule."""

import time

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.bars.cleaning import validate_bars
from alchemetric_ray.bars.ingest import iter_bars
from alchemetric_ray.bars.report import IngestReport
from alchemetric_ray.errors import DataError, UserError

CANONICAL = ["date", "open", "high", "low", "close", "volume"]
LATE_STARTERS = {"ABBV": 1177, "AGFS": 661, "BABA": 745, "GMRE": 297}  # clean rows (AGFS: after drops)


def ingest(path, **kwargs):
    report = IngestReport()
    bars = dict(iter_bars(path, report=report, **kwargs))
    return bars, report


def raises_one_line(path, *parts, **kwargs) -> str:
    """Iterate and expect a DataError whose one-line message holds every one of ``parts``."""
    with pytest.raises(DataError) as info:
        list(iter_bars(path, **kwargs))
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    return message


def raw_copy(stocknet_dir, ticker="AAPL") -> pd.DataFrame:
    return pd.read_csv(stocknet_dir / f"{ticker}.csv")


def write_csv(tmp_path, df: pd.DataFrame, name="AAPL.csv"):
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    df.to_csv(folder / name, index=False)
    return folder


def as_text(df: pd.DataFrame, column: str) -> pd.DataFrame:
    out = df.copy()
    out[column] = out[column].astype(object)
    return out


def assert_canonical(bars: pd.DataFrame):
    assert list(bars.columns) == CANONICAL
    assert bars["date"].dtype == np.dtype("datetime64[ns]")
    assert all(bars[c].dtype == np.float64 for c in CANONICAL[1:])
    assert bars["date"].is_monotonic_increasing and bars["date"].is_unique
    assert (bars["date"] == bars["date"].dt.normalize()).all()
    assert isinstance(bars.index, pd.RangeIndex)


# --------------------------------------------------------------------------------------------
# The real stocknet folder
# --------------------------------------------------------------------------------------------


def test_stocknet_folder_ingests_every_ticker(stocknet_dir):
    start = time.perf_counter()
    bars, report = ingest(stocknet_dir)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"ingesting stocknet took {elapsed:.1f} s"

    assert len(bars) == 88 and report.tickers == 88 and report.files == 88  # .tsv and LICENSE ignored
    assert list(bars) == sorted(bars)
    assert "StockTable" not in bars and "LICENSE" not in bars
    for frame in bars.values():
        assert_canonical(frame)
    assert report.rows_kept == sum(len(f) for f in bars.values())
    assert report.rows_read == report.rows_kept + sum(report.dropped.values())
    assert {len(bars[t]) for t in ("ABBV", "BABA", "GMRE")} == {1177, 745, 297}
    assert report.skipped_tickers == {}

    # PTR, REX and SNP each have one row of empty cells (2016-06-29): dropped, counted, named
    assert report.dropped["empty_cell"] == 3
    for ticker in ("PTR", "REX", "SNP"):
        assert len(bars[ticker]) == 1257
        assert pd.Timestamp("2016-06-29") not in set(bars[ticker]["date"])
        [warning] = [w for w in report.warnings if w.startswith(f"{ticker}.csv:")]
        assert "2016-06-29" in warning and "Close" in warning and "empty" in warning

    # every rule is in the counts, also those that dropped nothing
    # AGFS and SPLP lose zero-volume runs; SPLP's five real days closing at 17.00 are kept
    assert {r: n for r, n in report.dropped.items() if n} == {"empty_cell": 3, "zero_volume": 56}
    assert report.dropped["nonpositive_price"] == 0 and report.dropped["high_below_low"] == 0
    assert "empty_cell 3" in report.summary() and "88 tickers from 88 files" in report.summary()


def test_stocknet_prices_are_adjusted_by_adj_close(stocknet_dir):
    bars, _ = ingest(stocknet_dir, tickers=["AAPL"])
    raw = raw_copy(stocknet_dir)
    got = bars["AAPL"]
    assert len(got) == len(raw)
    np.testing.assert_array_equal(got["close"].to_numpy(), raw["Adj Close"].to_numpy())
    factor = raw["Adj Close"] / raw["Close"]
    for column in ("Open", "High", "Low"):
        expected = (raw[column] * factor).to_numpy()
        np.testing.assert_allclose(got[column.lower()].to_numpy(), expected, rtol=1e-12)
    np.testing.assert_array_equal(got["volume"].to_numpy(), raw["Volume"].to_numpy(dtype=float))
    assert got["date"].iloc[0] == pd.Timestamp("2012-09-04")


def test_stocknet_zero_volume_runs_dropped_but_single_days_kept(stocknet_dir):
    bars, report = ingest(stocknet_dir, tickers=["agfs", "SPLP"])
    assert list(bars) == ["AGFS", "SPLP"]
    # AGFS: 40 rows in runs of >= 2 zero-volume days after listing; SPLP: 16 in two-day runs
    assert report.dropped["zero_volume"] == 56
    agfs = bars["AGFS"]
    assert agfs["date"].iloc[0] == pd.Timestamp("2014-11-25")  # three zero-volume days 11-20..11-24 gone
    [warning] = [w for w in report.warnings if w.startswith("AGFS.csv:") and "zero-volume" in w]
    assert "2014-11-20..2014-11-24" in warning and "Volume" in warning
    # SPLP's isolated no-trade days are kept: a thin stock, not junk
    assert (bars["SPLP"]["volume"] == 0).sum() > 20


def test_min_history_skips_late_starters(stocknet_dir):
    bars, report = ingest(stocknet_dir, min_history=1200)
    assert len(bars) == 84 and report.tickers == 84
    assert set(report.skipped_tickers) == set(LATE_STARTERS)
    for ticker, rows in LATE_STARTERS.items():
        assert ticker not in bars
        assert report.skipped_tickers[ticker].startswith(f"{rows} rows of clean history < min_history 1200")
        assert any(w.startswith(f"{ticker}.csv: skipped ticker {ticker}") for w in report.warnings)
    assert "skipped 4 tickers" in report.summary()


def test_no_ticker_left_raises_at_the_end(stocknet_dir):
    report = IngestReport()
    gen = iter_bars(stocknet_dir, tickers=["AAPL", "MSFT"], min_history=5000, report=report)
    with pytest.raises(DataError) as info:
        next(gen)
    message = str(info.value)
    assert "no ticker has at least 5000 rows of clean history" in message and str(stocknet_dir) in message
    assert "\n" not in message
    assert set(report.skipped_tickers) == {"AAPL", "MSFT"}  # the report still says why


def test_requested_tickers_are_case_insensitive(stocknet_dir):
    bars, report = ingest(stocknet_dir, tickers=["msft", "Brk-a", "MSFT"])
    assert list(bars) == ["BRK-A", "MSFT"] and report.files == 2


def test_unknown_requested_ticker(stocknet_dir):
    message = raises_one_line(stocknet_dir, "XYZ", "AAPL", tickers=["aapl", "XYZ"])
    assert "88" in message


# --------------------------------------------------------------------------------------------
# Other layouts and spellings
# --------------------------------------------------------------------------------------------


def long_table(stocknet_dir, tickers=("MSFT", "PTR", "AAPL"), column="ticker") -> pd.DataFrame:
    parts = [raw_copy(stocknet_dir, t).assign(**{column: t}) for t in tickers]
    return pd.concat(parts, ignore_index=True)


def test_long_parquet_table_grouped_by_ticker(stocknet_dir, tmp_path):
    path = tmp_path / "prices.parquet"
    table = long_table(stocknet_dir)
    table["Date"] = pd.to_datetime(table["Date"])  # a real timestamp column, not text
    table.sample(frac=1.0, random_state=0).to_parquet(path)  # shuffled rows: sorted per ticker
    bars, report = ingest(path)
    assert list(bars) == ["AAPL", "MSFT", "PTR"] and report.files == 1
    reference, _ = ingest(stocknet_dir, tickers=["AAPL", "MSFT", "PTR"])
    for ticker in bars:
        assert_canonical(bars[ticker])
        pd.testing.assert_frame_equal(bars[ticker], reference[ticker])
    assert report.dropped["empty_cell"] == 1
    assert any("prices.parquet (ticker PTR)" in w and "2016-06-29" in w for w in report.warnings)
    assert all("sorted" in w for w in report.warnings if "not in date order" in w)

    restricted, _ = ingest(path, tickers=["ptr"])
    assert list(restricted) == ["PTR"]
    raises_one_line(path, "NOPE", "prices.parquet", "AAPL", tickers=["NOPE"])


def test_long_csv_table_with_symbol_column(stocknet_dir, tmp_path):
    path = tmp_path / "all.csv"
    table = long_table(stocknet_dir, ("AAPL", "MSFT"), column="Symbol")
    table.loc[table["Symbol"] == "MSFT", "Symbol"] = "NA"  # a real ticker, not a missing value
    table.to_csv(path, index=False)
    bars, _ = ingest(path)
    assert list(bars) == ["AAPL", "NA"]
    assert len(bars["NA"]) == 1258


def test_single_per_ticker_file(stocknet_dir):
    bars, report = ingest(stocknet_dir / "MSFT.csv")
    assert list(bars) == ["MSFT"] and report.files == 1


def test_odd_column_spellings_and_extra_columns(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.columns = ["DATE", "open", " High ", "l_o_w", "CLOSE", "AdjClose", "vol ume"]
    raw["Dividends"] = 0.0  # extra column: ignored
    raw = raw[["vol ume", "Dividends", "CLOSE", "open", "DATE", "l_o_w", " High ", "AdjClose"]]
    bars, _ = ingest(write_csv(tmp_path, raw))
    reference, _ = ingest(stocknet_dir, tickers=["AAPL"])
    pd.testing.assert_frame_equal(bars["AAPL"], reference["AAPL"])


def test_parquet_with_date_index_and_time_zone(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw["Date"] = pd.to_datetime(raw["Date"]).dt.tz_localize("America/New_York")
    raw.rename(columns={"Adj Close": "adj_close"}).set_index("Date").to_parquet(tmp_path / "AAPL.parquet")
    bars, _ = ingest(tmp_path)
    reference, _ = ingest(stocknet_dir, tickers=["AAPL"])
    pd.testing.assert_frame_equal(bars["AAPL"], reference["AAPL"])


def test_without_adj_close_prices_are_taken_as_given(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir).drop(columns="Adj Close")
    bars, _ = ingest(write_csv(tmp_path, raw))
    np.testing.assert_array_equal(bars["AAPL"]["close"].to_numpy(), raw["Close"].to_numpy())
    np.testing.assert_array_equal(bars["AAPL"]["open"].to_numpy(), raw["Open"].to_numpy())


def test_non_data_files_are_ignored(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir))
    (folder / "README.txt").write_text("not data")
    (folder / "StockTable.tsv").write_text("a\tb\n")
    (folder / ".~lock.AAPL.csv#").write_text("lock")
    (folder / "sub").mkdir()
    bars, report = ingest(folder)
    assert list(bars) == ["AAPL"] and report.files == 1


# --------------------------------------------------------------------------------------------
# One broken copy per rule
# --------------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    raises_one_line(tmp_path / "nowhere", "nowhere", "not found")


def test_folder_without_data_files(tmp_path):
    (tmp_path / "StockTable.tsv").write_text("Sector\tSymbol\n")
    (tmp_path / "LICENSE").write_text("MIT")
    raises_one_line(tmp_path, "no CSV or Parquet files in", str(tmp_path))


def test_missing_close_column(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir).drop(columns="Close"))
    raises_one_line(folder, "AAPL.csv: missing required column 'Close'",
                    "(found: Date, Open, High, Low, Adj Close, Volume)")


def test_unparseable_date(stocknet_dir, tmp_path):
    raw = as_text(raw_copy(stocknet_dir), "Date")
    raw.loc[9, "Date"] = "2013-02-30"
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "'Date'", "line 11", "2013-02-30")


def test_date_beyond_datetime64_range(stocknet_dir, tmp_path):
    raw = as_text(raw_copy(stocknet_dir), "Date")
    raw.loc[0, "Date"] = "1492-10-12"
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "line 2", "1492-10-12", "out of range")


def test_duplicate_dates_refused_when_asked(stocknet_dir, tmp_path):
    """Two dates each held by two differing rows: data.on_duplicate=refuse names the earliest's rows."""
    raw = raw_copy(stocknet_dir)
    raw.loc[[100, 700], "Date"] = raw.loc[[99, 699], "Date"].to_numpy()
    first = raw.loc[99, "Date"]
    message = raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "duplicate date", first, "line 101", "line 102",
                              "2 dates with differing rows", "set data.on_duplicate=first|last|skip_ticker to keep one",
                              on_duplicate="refuse")
    assert "with different values (column 'Open':" in message


def test_duplicate_dates_resolved_by_default(stocknet_dir, tmp_path):
    """The same file without the option: the later row of each date is kept (the default, last)."""
    raw = raw_copy(stocknet_dir)
    raw.loc[[100, 700], "Date"] = raw.loc[[99, 699], "Date"].to_numpy()
    bars, report = ingest(write_csv(tmp_path, raw))
    got = bars["AAPL"].set_index("date")
    assert len(got) == len(raw) - 2 and got.index.is_unique
    day = pd.Timestamp(raw.loc[99, "Date"])
    assert got.loc[day, "volume"] == raw.loc[100, "Volume"]  # line 102, the later one, is the bar
    assert report.dropped["duplicate_date"] == 2 and report.duplicates()["conflicting_dates"] == 2


def test_unknown_on_duplicate_is_refused_before_reading(stocknet_dir):
    message = raises_one_line(stocknet_dir, "on_duplicate 'newest'", "refuse, first, last, skip_ticker",
                              on_duplicate="newest")
    assert "data.on_duplicate" in message


def test_unsorted_rows_are_sorted(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir).sample(frac=1.0, random_state=1)
    bars, report = ingest(write_csv(tmp_path, raw))
    reference, _ = ingest(stocknet_dir, tickers=["AAPL"])
    pd.testing.assert_frame_equal(bars["AAPL"], reference["AAPL"])
    [warning] = report.warnings
    assert warning.startswith("AAPL.csv:") and "not in date order" in warning and "Date" in warning


def test_empty_cells_dropped(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[10, "Volume"] = np.nan
    raw.loc[20, "High"] = np.nan
    raw = as_text(raw, "Open")
    raw.loc[30, "Open"] = "null"
    bars, report = ingest(write_csv(tmp_path, raw))
    assert len(bars["AAPL"]) == len(raw) - 3 and report.dropped["empty_cell"] == 3
    dropped = raw.loc[[10, 20, 30], "Date"]
    assert not set(pd.to_datetime(dropped)) & set(bars["AAPL"]["date"])
    [warning] = report.warnings
    assert warning.startswith("AAPL.csv: dropped 3 rows with empty cells")
    assert all(column in warning for column in ("Open", "High", "Volume"))
    assert all(day in warning for day in dropped)


@pytest.mark.parametrize("text, rule", [("inf", "non-finite price"), ("nan", "non-finite price"),
                                        ("-inf", "non-finite price")])
def test_a_few_nonfinite_prices_are_dropped(stocknet_dir, tmp_path, text, rule):
    raw = as_text(raw_copy(stocknet_dir), "Close")
    raw.loc[[50, 60], "Close"] = text
    bars, report = ingest(write_csv(tmp_path, raw))
    assert len(bars["AAPL"]) == len(raw) - 2 and report.dropped["nonfinite_price"] == 2
    [warning] = report.warnings
    assert rule in warning and "Close" in warning and raw.loc[50, "Date"] in warning


@pytest.mark.parametrize("text", ["inf", "nan"])
def test_many_nonfinite_prices_are_an_error(stocknet_dir, tmp_path, text):
    raw = as_text(raw_copy(stocknet_dir), "High")
    rows = list(range(200, 215))  # 15 > max(2, 1% of 1258)
    raw.loc[rows, "High"] = text
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "15 rows with a non-finite price", "'High'",
                    raw.loc[200, "Date"], f"= {text}", "at most 12 of 1258 rows")


def test_a_few_nonpositive_prices_are_dropped(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[5, "Low"] = 0.0
    raw.loc[6, "Adj Close"] = -3.0
    bars, report = ingest(write_csv(tmp_path, raw))
    assert report.dropped["nonpositive_price"] == 2 and len(bars["AAPL"]) == len(raw) - 2
    [warning] = report.warnings
    assert "Low" in warning and "Adj Close" in warning and raw.loc[5, "Date"] in warning


def test_many_negative_prices_are_an_error(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[300:319, "Low"] = -1.5
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "20 rows with a non-positive price", "'Low'",
                    raw.loc[300, "Date"], "= -1.5")


def test_the_drop_limit_grows_with_history(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[range(0, 1200, 100), "Volume"] = -1  # 12 rows = 1% of 1258: still dropped
    bars, report = ingest(write_csv(tmp_path, raw))
    assert report.dropped["negative_volume"] == 12
    raw.loc[1250, "Volume"] = -7  # 13: too many
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "13 rows with a negative volume", "'Volume'",
                    raw.loc[0, "Date"], "= -1.0")


def test_text_in_a_number_column(stocknet_dir, tmp_path):
    raw = as_text(raw_copy(stocknet_dir), "Volume")
    raw.loc[7, "Volume"] = "12k"
    raises_one_line(write_csv(tmp_path, raw), "AAPL.csv", "'Volume'", "line 9", "'12k'")


def test_high_below_low_dropped(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[40, ["High", "Low"]] = raw.loc[40, ["Low", "High"]].to_numpy()
    raw.loc[41, "Close"] = raw.loc[41, "High"] * 1.01
    bars, report = ingest(write_csv(tmp_path, raw))
    assert report.dropped["high_below_low"] == 1 and report.dropped["ohlc_inconsistent"] == 1
    assert len(bars["AAPL"]) == len(raw) - 2
    hbl = next(w for w in report.warnings if "'High' < 'Low'" in w)
    assert hbl.startswith("AAPL.csv:") and raw.loc[40, "Date"] in hbl
    outside = next(w for w in report.warnings if "outside" in w)
    assert raw.loc[41, "Date"] in outside and "Close" in outside


def test_tiny_rounding_outside_the_range_is_kept(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[41, "Close"] = raw.loc[41, "High"] * (1 + 1e-8)
    bars, report = ingest(write_csv(tmp_path, raw))
    assert len(bars["AAPL"]) == len(raw) and not report.warnings


def test_stale_price_run_dropped(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[0:5, ["Open", "High", "Low", "Close", "Adj Close"]] = 25.0  # six placeholder rows
    raw.loc[500:503, ["Open", "High", "Low", "Close", "Adj Close"]] = 90.0  # four: not a run yet
    bars, report = ingest(write_csv(tmp_path, raw))
    assert report.dropped["stale_price"] == 6 and len(bars["AAPL"]) == len(raw) - 6
    assert bars["AAPL"]["date"].iloc[0] == pd.Timestamp(raw.loc[6, "Date"])
    [warning] = report.warnings
    assert f"{raw.loc[0, 'Date']}..{raw.loc[5, 'Date']}" in warning and "Close" in warning


def test_zero_volume_run_dropped_single_day_kept(stocknet_dir, tmp_path):
    raw = raw_copy(stocknet_dir)
    raw.loc[100:102, "Volume"] = 0  # a run: dropped
    raw.loc[200, "Volume"] = 0  # a single day: kept
    bars, report = ingest(write_csv(tmp_path, raw))
    assert report.dropped["zero_volume"] == 3 and len(bars["AAPL"]) == len(raw) - 3
    assert (bars["AAPL"]["volume"] == 0).sum() == 1
    [warning] = report.warnings
    assert f"{raw.loc[100, 'Date']}..{raw.loc[102, 'Date']}" in warning and "Volume" in warning


def test_too_short_ticker_skipped(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir))
    raw_copy(stocknet_dir, "MSFT").tail(30).to_csv(folder / "MSFT.csv", index=False)
    bars, report = ingest(folder, min_history=100)
    assert list(bars) == ["AAPL"]
    assert report.skipped_tickers == {"MSFT": "30 rows of clean history < min_history 100 (30 read)"}
    assert report.rows_read == 1258 + 30 and report.rows_kept == 1258


def test_none_left_after_cleaning(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir).head(50))
    raises_one_line(folder, "no ticker has at least 60 rows of clean history in", str(folder),
                    "AAPL: 50 rows", min_history=60)


def test_header_only_file_is_skipped(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir))
    raw_copy(stocknet_dir).head(0).to_csv(folder / "EMPTY.csv", index=False)
    bars, report = ingest(folder)
    assert list(bars) == ["AAPL"] and report.skipped_tickers["EMPTY"].startswith("0 rows")


def test_binary_file_with_csv_suffix(tmp_path):
    (tmp_path / "AAPL.csv").write_bytes(bytes(range(256)) * 64)
    raises_one_line(tmp_path, "AAPL.csv", "binary")
    (tmp_path / "AAPL.csv").write_bytes(b"\xff\xfe\x81garbage\xc3\x28" * 500)
    raises_one_line(tmp_path, "AAPL.csv", "cannot parse as CSV")


def test_empty_file(tmp_path):
    (tmp_path / "AAPL.csv").write_bytes(b"")
    raises_one_line(tmp_path, "AAPL.csv", "empty file")


def test_truncated_parquet(stocknet_dir, tmp_path):
    whole = tmp_path / "whole" / "AAPL.parquet"
    whole.parent.mkdir()
    raw_copy(stocknet_dir).to_parquet(whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "AAPL.parquet").write_bytes(data[: len(data) // 2])
    raises_one_line(cut, "AAPL.parquet", "not a readable Parquet file")
    (cut / "AAPL.parquet").write_bytes(b"PAR1" + b"\x00" * 100)
    raises_one_line(cut / "AAPL.parquet", "AAPL.parquet", "not a readable Parquet file")


@pytest.mark.parametrize("name", ["../evil", "..", ".hidden", "a/b", "a\\b", "AA PL", "x..y", "ÄPPL"])
def test_unsafe_ticker_names_in_a_long_table(stocknet_dir, tmp_path, name):
    table = long_table(stocknet_dir, ("AAPL", "MSFT"))
    table.loc[table["ticker"] == "MSFT", "ticker"] = name
    table.to_parquet(tmp_path / "prices.parquet")
    raises_one_line(tmp_path / "prices.parquet", "prices.parquet", "unsafe ticker name", repr(name),
                    "row 1259", "'ticker'")


def test_unsafe_ticker_name_from_a_file_name(stocknet_dir, tmp_path):
    folder = write_csv(tmp_path, raw_copy(stocknet_dir), name="AA PL.csv")
    raises_one_line(folder, "AA PL.csv", "unsafe ticker name 'AA PL'")


def test_folder_holding_a_long_table(stocknet_dir, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    long_table(stocknet_dir, ("AAPL", "MSFT")).to_csv(folder / "prices.csv", index=False)
    raises_one_line(folder, "prices.csv", "'ticker' column with 2 tickers")


# --------------------------------------------------------------------------------------------
# validate_bars on its own
# --------------------------------------------------------------------------------------------


def test_validate_bars_leaves_the_report_alone_on_error(stocknet_dir):
    raw = raw_copy(stocknet_dir)
    raw.loc[:30, "Close"] = -1.0
    report = IngestReport()
    with pytest.raises(DataError, match=r"^mem: 31 rows with a non-positive price"):
        validate_bars(raw, ticker="AAPL", source="mem", report=report)
    assert report == IngestReport()


def test_validate_bars_counts_into_the_report(stocknet_dir):
    raw = raw_copy(stocknet_dir, "PTR")
    report = IngestReport()
    bars = validate_bars(raw, ticker="PTR", source="PTR.csv", report=report)
    assert_canonical(bars)
    assert (report.tickers, report.rows_read, report.rows_kept) == (1, 1258, 1257)
    assert report.dropped["empty_cell"] == 1
    assert validate_bars(raw, ticker="PTR", source="PTR.csv", report=report, min_history=2000) is None
    assert report.skipped_tickers["PTR"].startswith("1257 rows of clean history < min_history 2000")
    assert report.rows_read == 2 * 1258 and report.rows_kept == 1257
