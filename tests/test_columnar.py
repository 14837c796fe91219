"""``bars/columnar.py``: one long table read whole where ingest's cleaning would keep every row as it is,
and ingest's own per-ticker path wherever a cleaning rule would drop a row, warn or fail.

Real files (Parquet and CSV, with and without Adj Close), compared with ingest's own result for the same
file (``iter_bars``): the same tickers, dates and values, and the same report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.bars.columnar import clean_long_table
from alchemetric_ray.bars.ingest import iter_bars
from alchemetric_ray.bars.report import IngestReport
from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars


def long_table(tickers: int = 6, days: int = 40, *, adjusted: bool = False) -> pd.DataFrame:
    """A clean daily feed: every ticker's bars in one table, tickers interleaved by date as a vendor
    writes them."""
    frames = []
    for ticker, bars in synthetic_bars(SyntheticMarket(n_tickers=tickers, n_days=days, seed=5)):
        frame = bars.rename(columns=str.title).assign(Ticker=ticker)
        if adjusted:
            frame["Adj Close"] = frame["Close"] * 0.5
        frames.append(frame)
    return pd.concat(frames).sort_values(["Date", "Ticker"], kind="stable").reset_index(drop=True)


def write(frame: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv":
        frame.assign(Date=frame["Date"].dt.strftime("%Y-%m-%d")).to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path


def ingested(path: Path) -> tuple[dict[str, pd.DataFrame], IngestReport]:
    report = IngestReport()
    return dict(iter_bars(path, report=report)), report


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize("adjusted", [False, True], ids=["plain", "adj_close"])
def test_a_clean_long_table_read_whole_equals_ingest_ticker_by_ticker(tmp_path, suffix, adjusted):
    path = write(long_table(adjusted=adjusted), tmp_path / f"feed{suffix}")
    report = IngestReport()
    tickers, lengths, cols = clean_long_table(path, report)
    want, want_report = ingested(path)
    assert tickers == sorted(want) and lengths.tolist() == [len(want[t]) for t in tickers]
    assert cols["date"].dtype == np.dtype("datetime64[ns]")
    start = 0
    for ticker, n in zip(tickers, lengths.tolist()):
        frame = want[ticker]
        assert (cols["date"][start:start + n] == frame["date"].to_numpy().astype("datetime64[ns]")).all()
        for c in ("open", "high", "low", "close", "volume"):
            assert (cols[c][start:start + n] == frame[c].to_numpy()).all(), (ticker, c)  # the same bits
        start += n
    assert (report.files, report.rows_read, report.rows_kept, report.tickers) == \
        (want_report.files, want_report.rows_read, want_report.rows_kept, want_report.tickers)
    assert not report.warnings and not any(report.dropped.values())


def _empty_close(f):
    f.loc[3, "Close"] = np.nan


def _date_twice(f):
    f.loc[len(f) - 1, "Date"] = f.loc[len(f) - 1 - 6, "Date"]  # the same ticker's bar a date before


def _out_of_order(f):
    rows = f.index[f["Ticker"] == f.loc[0, "Ticker"]][:2]
    f.loc[rows, "Date"] = f.loc[rows[::-1], "Date"].to_numpy()


def _nonpositive(f):
    f.loc[7, ["Open", "Low"]] = 0.0


def _high_below_low(f):
    f.loc[9, "High"] = f.loc[9, "Low"] * 0.9


def _close_above_high(f):
    f.loc[11, "Close"] = f.loc[11, "High"] * 1.01


def _zero_volume_run(f):
    f.loc[f.index[f["Ticker"] == f.loc[0, "Ticker"]][5:7], "Volume"] = 0.0


def _stale_run(f):
    rows = f.index[f["Ticker"] == f.loc[0, "Ticker"]][10:15]
    f.loc[rows, ["Open", "High", "Low", "Close"]] = 42.0


def _empty_ticker(f):
    f.loc[2, "Ticker"] = " "


@pytest.mark.parametrize("defect", [_empty_close, _date_twice, _out_of_order, _nonpositive, _high_below_low,
                                    _close_above_high, _zero_volume_run, _stale_run, _empty_ticker])
def test_anything_a_cleaning_rule_would_change_leaves_the_table_to_ingest(tmp_path, defect):
    """Each defect makes ingest drop, sort or warn: the whole-table read declines, and the report is untouched."""
    frame = long_table()
    defect(frame)
    path = write(frame, tmp_path / "feed.parquet")
    report = IngestReport()
    assert clean_long_table(path, report) is None
    assert (report.files, report.rows_read, report.tickers) == (0, 0, 0)
    _, want_report = ingested(path)
    assert want_report.warnings  # ingest says what it did


def test_an_isolated_zero_volume_day_and_four_flat_bars_are_clean(tmp_path):
    """What the cleaning rules keep (a single no-trade day; a run shorter than five flat bars) is kept whole."""
    frame = long_table()
    rows = frame.index[frame["Ticker"] == frame.loc[0, "Ticker"]]
    frame.loc[rows[3], "Volume"] = 0.0
    frame.loc[rows[10:14], ["Open", "High", "Low", "Close"]] = 42.0
    path = write(frame, tmp_path / "feed.parquet")
    got = clean_long_table(path, IngestReport())
    want, report = ingested(path)
    assert got is not None and not report.warnings
    assert got[1].sum() == sum(len(f) for f in want.values())


def test_a_folder_or_a_table_without_a_ticker_column_is_not_one_long_table(tmp_path):
    write(long_table().drop(columns="Ticker"), tmp_path / "one.parquet")
    assert clean_long_table(tmp_path / "one.parquet", IngestReport()) is None
    assert clean_long_table(tmp_path, IngestReport()) is None
