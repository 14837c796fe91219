"""Duplicated bars (issue 32 item 4) on one real long CSV table holding both kinds.

The table is what public daily S&P 500 files look like: a ``Ticker`` column and the first rows of
three real stocknet tickers, with an exact copy of one AAPL row right after it (overlapping
vendor pages) and, at the end of the file, a revised MSFT bar for a date MSFT already has, whose
volume differs by 22 shares (the 2017-10-30 case that refused a 433-ticker file whole).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from alchemetric_ray.bars.ingest import iter_bars
from alchemetric_ray.bars.report import ON_DUPLICATE_DEFAULT, IngestReport
from alchemetric_ray.cli import main
from alchemetric_ray.config import DataConfig, load_config
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import ConfigError, DataError

ROWS = 300  # rows per ticker: enough history for the default features, labels and the model's staging
TICKERS = ("AAPL", "MSFT", "XOM")
NAME = "sp500.csv"
COPY_ROW = 50  # AAPL's data row that is repeated exactly
REVISED_ROW = 100  # MSFT's data row that gets a revised bar appended at the end of the file
EXTRA_SHARES = 22
SET_TO_KEEP = "set data.on_duplicate=first|last|skip_ticker to keep one"


class Table:
    """The long table written to disk and where its duplicated rows sit (file lines, header = 1)."""

    def __init__(self, folder: Path, stocknet_dir: Path):
        parts = [pd.read_csv(stocknet_dir / f"{t}.csv").head(ROWS).assign(Ticker=t) for t in TICKERS]
        self.clean = pd.concat(parts, ignore_index=True)[["Ticker", "Date", "Open", "High", "Low", "Close",
                                                          "Adj Close", "Volume"]]
        aapl, msft = (self.clean.index[self.clean["Ticker"] == t] for t in ("AAPL", "MSFT"))
        copy_at = aapl[COPY_ROW]
        original = self.clean.loc[msft[REVISED_ROW]]
        revised = original.copy()
        revised["Volume"] = original["Volume"] + EXTRA_SHARES
        table = pd.concat([self.clean.loc[:copy_at], self.clean.loc[[copy_at]], self.clean.loc[copy_at + 1:],
                           revised.to_frame().T], ignore_index=True)
        self.path = folder / NAME
        table.to_csv(self.path, index=False)
        self.copy_day = self.clean.loc[copy_at, "Date"]
        self.copy_lines = (copy_at + 2, copy_at + 3)  # the row, then its copy
        self.day = original["Date"]
        self.original_volume = float(original["Volume"])
        self.revised_volume = float(revised["Volume"])
        self.lines = (msft[REVISED_ROW] + 3, len(table) + 1)  # after the inserted copy; the last line

    def clean_path(self, folder: Path) -> Path:
        path = folder / "clean.csv"
        self.clean.to_csv(path, index=False)
        return path


@pytest.fixture
def table(tmp_path, stocknet_dir) -> Table:
    return Table(tmp_path, stocknet_dir)


def ingest(path, **kwargs):
    report = IngestReport()
    return dict(iter_bars(path, report=report, **kwargs)), report


def on_day(bars: pd.DataFrame, day: str) -> pd.Series:
    [row] = bars.index[bars["date"] == pd.Timestamp(day)]
    return bars.loc[row]


def cli_error(capsys, argv) -> str:
    """Run the CLI, expect a user error: exit code 2 and one line of error text, no traceback."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, f"exit code {rc}\nstdout: {out}\nstderr: {err}"
    lines = [line for line in err.splitlines() if line.startswith("alchemetric-ray ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- the option ----------------------------------------------------------------------------


def test_the_default_is_last_everywhere():
    assert DataConfig().on_duplicate == "last" == ON_DUPLICATE_DEFAULT
    assert load_config(None, []).data.on_duplicate == "last"
    assert load_config(None, ["data.on_duplicate=skip_ticker"]).data.on_duplicate == "skip_ticker"


def test_an_unknown_option_value_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["data.on_duplicate=lats"])
    message = str(info.value)
    assert "data.on_duplicate" in message and "'lats'" in message
    assert "refuse, first, last, skip_ticker" in message and "did you mean 'last'" in message


# ---- ingest --------------------------------------------------------------------------------


def test_default_drops_the_copy_and_keeps_the_revised_bar(table, tmp_path):
    bars, report = ingest(table.path)
    reference, _ = ingest(table.clean_path(tmp_path))
    assert list(bars) == list(TICKERS)
    pd.testing.assert_frame_equal(bars["AAPL"], reference["AAPL"])  # the copy is gone, nothing else
    pd.testing.assert_frame_equal(bars["XOM"], reference["XOM"])
    msft = bars["MSFT"]
    assert len(msft) == ROWS and msft["date"].is_monotonic_increasing and msft["date"].is_unique
    assert on_day(msft, table.day)["volume"] == table.revised_volume  # the vendor's appended revision
    assert report.duplicates() == {"exact_rows_dropped": 1, "conflicting_dates": 1, "conflicting_rows_dropped": 1,
                                   "resolved_by": "last", "tickers_skipped": []}
    assert report.dropped["duplicate_row"] == 1 and report.dropped["duplicate_date"] == 1
    assert report.rows_read == 3 * ROWS + 2 and report.rows_kept == 3 * ROWS
    [copy] = [w for w in report.warnings if "repeat an earlier row exactly" in w]
    assert copy.startswith(f"{NAME} (ticker AAPL): dropped 1 row") and table.copy_day in copy
    [kept] = [w for w in report.warnings if "differing rows" in w]
    assert kept.startswith(f"{NAME} (ticker MSFT): kept the last row")
    for part in (f"duplicate date {table.day}", f"line {table.lines[0]}", f"line {table.lines[1]}",
                 "column 'Volume'", f"{table.original_volume:.0f} vs {table.revised_volume:.0f}",
                 "data.on_duplicate=last"):
        assert part in kept, (part, kept)
    assert "duplicates: 1 row repeating another exactly dropped; 1 date(s) with differing rows" in report.summary()


@pytest.mark.parametrize("policy, volume", [("first", "original_volume"), ("last", "revised_volume")])
def test_first_and_last_by_file_order(table, policy, volume):
    bars, report = ingest(table.path, on_duplicate=policy)
    row = on_day(bars["MSFT"], table.day)
    assert row["volume"] == getattr(table, volume)
    assert len(bars["MSFT"]) == ROWS and len(bars["AAPL"]) == ROWS
    assert report.duplicates()["resolved_by"] == policy and report.dropped["duplicate_date"] == 1


def test_skip_ticker_leaves_the_ticker_out_and_says_why(table):
    bars, report = ingest(table.path, on_duplicate="skip_ticker")
    assert list(bars) == ["AAPL", "XOM"] and len(bars["AAPL"]) == ROWS
    reason = report.skipped_tickers["MSFT"]
    for part in (f"duplicate date {table.day}", f"line {table.lines[0]}", f"line {table.lines[1]}",
                 "data.on_duplicate=skip_ticker"):
        assert part in reason, (part, reason)
    assert report.duplicates() == {"exact_rows_dropped": 1, "conflicting_dates": 1, "conflicting_rows_dropped": 0,
                                   "resolved_by": "skip_ticker", "tickers_skipped": ["MSFT"]}
    assert report.rows_read == 3 * ROWS + 2 and report.rows_kept == 2 * ROWS
    assert any(w.startswith(f"{NAME} (ticker MSFT): skipped ticker MSFT") for w in report.warnings)


def test_refuse_names_both_rows_and_the_option(table):
    with pytest.raises(DataError) as info:
        ingest(table.path, on_duplicate="refuse")
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"{NAME} (ticker MSFT): duplicate date {table.day} at line {table.lines[0]} and line "
                       f"{table.lines[1]} with different values (column 'Volume': {table.original_volume:.0f} vs "
                       f"{table.revised_volume:.0f}); {SET_TO_KEEP}")


@pytest.mark.parametrize("policy", ["refuse", "first", "last", "skip_ticker"])
def test_an_exact_copy_is_dropped_under_every_option(table, policy):
    """Without the MSFT conflict even refuse reads the file: a copy is no conflict."""
    bars, report = ingest(table.path, tickers=["AAPL", "XOM"], on_duplicate=policy)
    assert len(bars["AAPL"]) == ROWS and bars["AAPL"]["date"].is_unique
    assert report.duplicates() == {"exact_rows_dropped": 1, "conflicting_dates": 0, "conflicting_rows_dropped": 0,
                                   "resolved_by": policy, "tickers_skipped": []}


def test_a_row_with_an_empty_cell_is_no_duplicate(tmp_path, stocknet_dir):
    """A blank-volume row beside a full one for the same date is an empty_cell drop, not a conflict."""
    raw = pd.read_csv(stocknet_dir / "AAPL.csv").head(ROWS)
    blank = raw.loc[[10]].assign(Volume="")
    path = tmp_path / "AAPL.csv"
    pd.concat([raw.loc[:10], blank, raw.loc[11:]]).to_csv(path, index=False)
    bars, report = ingest(path, on_duplicate="refuse")
    assert len(bars["AAPL"]) == ROWS and report.dropped["empty_cell"] == 1
    assert report.duplicates()["exact_rows_dropped"] == 0 and report.duplicates()["conflicting_dates"] == 0


# ---- features: the option through the CLI, the counts in the manifest ----------------------


def test_features_writes_the_counts_to_the_manifest(capsys, table, tmp_path):
    out = tmp_path / "shards"
    assert main(["features", "--data", str(table.path), "--out", str(out), "--quiet", "data.on_duplicate=first"]) == 0
    assert "duplicate_row=1, duplicate_date=1" in capsys.readouterr().out
    raw = json.loads((out / "manifest.json").read_text())
    expected = {"exact_rows_dropped": 1, "conflicting_dates": 1, "conflicting_rows_dropped": 1,
                "resolved_by": "first", "tickers_skipped": []}
    assert raw["ingest"]["duplicates"] == expected
    assert raw["ingest"]["dropped"]["duplicate_row"] == 1 and raw["ingest"]["dropped"]["duplicate_date"] == 1
    assert Manifest.read(out).duplicates == expected
    assert sorted(raw["tickers"]) == list(TICKERS)


def test_features_skip_ticker_in_the_manifest(table, tmp_path):
    out = tmp_path / "shards"
    assert main(["features", "--data", str(table.path), "--out", str(out), "--quiet",
                 "data.on_duplicate=skip_ticker"]) == 0
    manifest = Manifest.read(out)
    assert manifest.duplicates["tickers_skipped"] == ["MSFT"] and "MSFT" not in manifest.tickers
    assert "data.on_duplicate=skip_ticker" in manifest.ingest["skipped_tickers"]["MSFT"]


def test_features_refuse_is_one_line(capsys, table, tmp_path):
    line = cli_error(capsys, ["features", "--data", table.path, "--out", tmp_path / "shards",
                              "data.on_duplicate=refuse"])
    for part in (NAME, "ticker MSFT", f"duplicate date {table.day}", f"line {table.lines[0]}",
                 f"line {table.lines[1]}", SET_TO_KEEP):
        assert part in line, (part, line)
    assert not (tmp_path / "shards").exists()


def test_manifest_without_counts_reads_as_empty():
    """Manifests written before duplicates were counted, or of synthetic data (no ingest at all)."""
    base = {"features": ["ret_1"], "label": {"classes": []}, "splits": {}, "normalization": {}, "rows": {}}
    assert Manifest(**base, ingest={"dropped": {}}).duplicates == {}
    assert Manifest(**base, ingest=None).duplicates == {}


# ---- predict / evaluate --data: the caller's option reaches the staging of new data ----------


def test_staging_new_data_takes_the_callers_option(stock_model, table, tmp_path):
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.predict import inputs_frame, stage_inputs

    loaded = load_model(stock_model)
    assert loaded.config.data.on_duplicate == "last"  # the model's own
    staged = tmp_path / "staged"
    staged.mkdir()
    result = stage_inputs(loaded, str(table.path), staged, on_duplicate="skip_ticker")
    assert result["tickers"] == ["AAPL", "XOM"] and not (staged / "MSFT.parquet").exists()
    assert result["duplicates"]["tickers_skipped"] == ["MSFT"]
    with pytest.raises(DataError, match=SET_TO_KEEP.replace("|", r"\|")):
        inputs_frame(loaded, str(table.path), on_duplicate="refuse")
    frame = inputs_frame(loaded, str(table.path), on_duplicate="first")
    assert frame.attrs["duplicates"] == {"exact_rows_dropped": 1, "conflicting_dates": 1,
                                         "conflicting_rows_dropped": 1, "resolved_by": "first", "tickers_skipped": []}
    assert sorted(frame["ticker"].unique()) == list(TICKERS)
    assert inputs_frame(loaded, str(table.path)).attrs["duplicates"]["resolved_by"] == "last"  # None: the model's


def test_predict_takes_the_option_from_its_config(stock_model, table, tmp_path):
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.predict import predict

    cfg = load_model(stock_model).config.replace("data.on_duplicate=skip_ticker", "device.name=cpu")
    frame = predict(stock_model, str(table.path), tmp_path / "signals.parquet", cfg)
    assert set(frame["ticker"]) == {"AAPL", "XOM"}


def test_predict_cli_refuse_is_one_line(capsys, stock_model, table, tmp_path):
    line = cli_error(capsys, ["predict", "--model", stock_model, "--data", table.path, "--out",
                              tmp_path / "signals.parquet", "data.on_duplicate=refuse"])
    for part in (NAME, f"duplicate date {table.day}", f"line {table.lines[0]}", f"line {table.lines[1]}",
                 SET_TO_KEEP):
        assert part in line, (part, line)
    assert not (tmp_path / "signals.parquet").exists()


@pytest.mark.slow
def test_evaluate_new_data_reports_the_counts_in_evaluation_json_and_the_report(stock_model, stocknet_dir, tmp_path):
    """The whole history of the model's tickers as one long table, with an exact copy of an AAPL row and a
    revised bar for MSFT's last date appended: scored on the test segment under the default (last)."""
    parts = [pd.read_csv(stocknet_dir / f"{t}.csv").assign(Ticker=t) for t in TICKERS]
    clean = pd.concat(parts, ignore_index=True)
    last_msft = clean.index[clean["Ticker"] == "MSFT"][-1]
    revised = clean.loc[[last_msft]].assign(Volume=clean.loc[last_msft, "Volume"] + EXTRA_SHARES)
    path = tmp_path / NAME
    pd.concat([clean.loc[:10], clean.loc[[10]], clean.loc[11:], revised]).to_csv(path, index=False)
    out = tmp_path / "evaluation"
    assert main(["evaluate", "--device", "cpu", "--model", str(stock_model), "--data", str(path),
                 "--out", str(out)]) == 0
    written = json.loads((out / "evaluation.json").read_text())
    assert written["data"]["path"] == str(path) and written["data"]["duplicates"] == {
        "exact_rows_dropped": 1, "conflicting_dates": 1, "conflicting_rows_dropped": 1, "resolved_by": "last",
        "tickers_skipped": []}
    assert (f"Data {path}: 1 exact duplicate row(s) dropped; 1 date(s) with differing rows, resolved by "
            "data.on_duplicate=last.") in (out / "report.md").read_text()
