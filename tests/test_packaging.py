"""The packaged stocknet prices: in a built wheel, byte-faithful to the source, and the default data."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from alchemetric_ray.bars import stocknet
from alchemetric_ray.bars.sources import open_source
from alchemetric_ray.config import load_config

REPO = Path(__file__).resolve().parents[1]
PACKAGED = ("prices.parquet", "LICENSE", "SOURCE.md", "sources.json")


@pytest.mark.slow
def test_a_built_wheel_holds_the_data_its_licence_and_its_source(tmp_path):
    """An editable install reads the data from the checkout and would hide a missing package-data
    declaration; a wheel built from a copy of the sources holds only what the package declares."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "alchemetric_ray", src / "alchemetric_ray", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("alchemetric_ray-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in PACKAGED:
        assert f"alchemetric_ray/bars/packaged/stocknet/{name}" in names
    inside = zipfile.ZipFile(wheel).read("alchemetric_ray/bars/packaged/stocknet/prices.parquet")
    assert inside == stocknet.PRICES.read_bytes()


def test_written_csvs_are_the_source_files_byte_for_byte(stocknet_dir):
    digests = json.loads((stocknet.PACKAGE_DIR / "sources.json").read_text())
    assert len(digests) == 88
    written = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in stocknet_dir.glob("*.csv")}
    assert written == digests


def test_the_raw_table_keeps_its_defects():
    """Empty cells and zero-volume rows stay in the packaged table: ingest's rules are tested on them."""
    raw = stocknet.raw_table()
    assert list(raw.columns) == ["ticker", "Date", "Open", "High", "Low", "Close", "Adj Close", "Volume"]
    assert raw["ticker"].nunique() == 88 and len(raw) == 108_592
    empty = raw[raw["Close"].isna()]
    assert set(empty["ticker"]) == {"PTR", "REX", "SNP"}
    assert (raw["Volume"] == 0).sum() > 0
    ptr = stocknet.raw_table(["PTR"])
    assert set(ptr["ticker"]) == {"PTR"} and ptr["Date"].is_monotonic_increasing


def test_stocknet_is_the_default_source_through_ingest():
    cfg = load_config(None, ["data.tickers=AAPL,PTR"])
    assert cfg.data.source == "stocknet"
    source = open_source(cfg.data)
    bars = dict(source.bars)
    assert source.kind == "stocknet" and "stocknet" in source.description
    assert sorted(bars) == ["AAPL", "PTR"]
    assert bars["PTR"]["close"].notna().all()  # the null row was dropped by ingest, and counted
    assert source.report.dropped["empty_cell"] == 1
    # prices are adjusted like files: the last close equals the source's Adj Close
    raw = stocknet.raw_table(["AAPL"])
    assert bars["AAPL"]["close"].iloc[-1] == pytest.approx(raw["Adj Close"].iloc[-1])
    assert pd.Timestamp(bars["AAPL"]["date"].iloc[0]) == pd.Timestamp("2012-09-04")


def test_builtin_stays_a_valid_source():
    """Saved models' config.json files name data.source=builtin."""
    cfg = load_config(None, ["data.source=builtin", "data.tickers=IBM"])
    assert [t for t, _ in open_source(cfg.data).bars] == ["IBM"]
