"""``features --append`` (issue 41 item 3): an append of the last month equals a fresh build of the
whole range, row for row, for every row the fresh build labels; revisions are refused in one line and
``--rebuild`` rebuilds; nothing new writes nothing; a failure leaves the folder as it was.

Real files and the real ingest: a 12-ticker synthetic market written as one Parquet file per ticker,
and the packaged stocknet CSVs, each cut into the bars before the last 21 dates and the last 21
dates (with a few dates of overlap, which must equal the kept bars)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

import alchemetric_ray as ar
from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars
from alchemetric_ray.data import bars_store
from alchemetric_ray.data import tails as tails_store
from alchemetric_ray.data.append import EMA_BARS, tail_bars
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.panel import compute_group
from alchemetric_ray.data.shards import file_chains
from alchemetric_ray.errors import DataError, ShardError
from alchemetric_ray.storage import locate

REPO = Path(__file__).resolve().parents[1]
TICKERS, DAYS, MONTH, OVERLAP, LAG = 12, 700, 21, 5, 3
LAGGING = "SYN0007"


@pytest.fixture(scope="module")
def market(tmp_path_factory):
    """Folders of per-ticker Parquet files: ``all`` (every bar), ``head`` (all but the last MONTH dates),
    ``tail`` (the last MONTH dates and the OVERLAP before them); and the split dates to build with."""
    root = tmp_path_factory.mktemp("market")
    frames = dict(synthetic_bars(SyntheticMarket(n_tickers=TICKERS, n_days=DAYS, seed=11)))
    calendar = np.unique(np.concatenate([f["date"].to_numpy() for f in frames.values()]))
    cut = calendar[-MONTH]
    for name in ("all", "head", "tail"):
        (root / name).mkdir()
    for ticker, frame in frames.items():
        frame.to_parquet(root / "all" / f"{ticker}.parquet", index=False)
        # one ticker's bars end LAG dates before the others' in the folder appended to: its rows of those
        # dates join dates other tickers already have rows on (the per-date pass writes them again)
        end = calendar[-MONTH - LAG] if ticker == LAGGING else cut
        frame[frame["date"] < end].to_parquet(root / "head" / f"{ticker}.parquet", index=False)
        frame[frame["date"] >= calendar[-MONTH - OVERLAP]].to_parquet(root / "tail" / f"{ticker}.parquet",
                                                                      index=False)
    day = lambda i: str(np.datetime64(calendar[i], "D"))  # noqa: E731
    return {"root": root, "frames": frames, "calendar": calendar,
            "splits": [f"features.train_end={day(350)}", f"features.val_end={day(520)}"]}


def build(data: Path, out: Path, *overrides: str) -> ar.Shards:
    shards = ar.features(ar.load_config(None, *overrides), data=str(data), out=out)
    assert (out / bars_store.BARS_DIR).is_dir()  # the build keeps its input bars
    return shards


def rows(folder: Path) -> pd.DataFrame:
    """Every row the manifest lists, with its split, by ticker then date."""
    manifest = Manifest.read(folder)
    parts = []
    for split in ("train", "val", "test"):
        for name in manifest.files[split]:
            frame = pq.read_table(folder / name).to_pandas()
            frame["split"] = split
            parts.append(frame)
    return pd.concat(parts, ignore_index=True).sort_values(["ticker", "date"], kind="stable").reset_index(drop=True)


def assert_same_rows(appended: Path, fresh: Path) -> None:
    a, f = rows(appended), rows(fresh)
    assert len(a) == len(f), (len(a), len(f))
    for column in ("ticker", "date", "split", "label_end"):
        assert (a[column].to_numpy() == f[column].to_numpy()).all(), column
    names = Manifest.read(fresh).features
    np.testing.assert_allclose(a[names].to_numpy(), f[names].to_numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["fwd_ret"].to_numpy(), f["fwd_ret"].to_numpy(), rtol=1e-6, atol=1e-7)
    if a["label"].dtype.kind == "i":
        assert (a["label"].to_numpy() == f["label"].to_numpy()).all()
    else:
        np.testing.assert_allclose(a["label"].to_numpy(), f["label"].to_numpy(), rtol=1e-5, atol=1e-6)
    ma, mf = Manifest.read(appended), Manifest.read(fresh)
    assert ma.rows == mf.rows and ma.class_counts == mf.class_counts and ma.splits == mf.splits
    assert sorted(ma.tickers) == sorted(mf.tickers)
    if mf.cross_section:
        for key in ("dates_kept", "dates_dropped", "rows_dropped", "max_names"):
            assert ma.cross_section[key] == mf.cross_section[key], key
    # a ticker is never in two chains of files of a split (a file and an append's continuations of it:
    # sequence windows are built a chain at a time)
    for split in ("train", "val", "test"):
        seen: set[str] = set()
        for chain in file_chains([locate(appended / name) for name in ma.files[split]]):
            tickers = {t for f in chain for t in pq.read_table(f.path, columns=["ticker"]).column(0).to_pylist()}
            assert not tickers & seen, (split, tickers & seen)
            seen |= tickers


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_tail_is_derived_from_the_slowest_ema():
    assert (1 - 1 / 14) ** EMA_BARS < 1e-12 <= (1 - 1 / 14) ** (EMA_BARS - 1)
    assert tail_bars(["ret_1", "vol_60"]) == 60 + EMA_BARS


@pytest.mark.parametrize("settings", [
    [],
    ["features.label=cs_rank", "features.names=[ret_1,ret_5_rel,vol_20]"],
], ids=["three_class", "cs_rank-relative"])
def test_an_appended_month_equals_a_fresh_build_row_for_row(market, tmp_path, settings):
    root, overrides = market["root"], [*market["splits"], *settings]
    build(root / "head", tmp_path / "appended", *overrides)
    before = Manifest.read(tmp_path / "appended")
    assert DAYS - MONTH > tail_bars(before.features) + 50  # the tail is a true tail, not the whole history
    result = ar.features(data=str(root / "tail"), out=tmp_path / "appended", append=True)
    build(root / "all", tmp_path / "fresh", *overrides)
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")

    manifest = Manifest.read(tmp_path / "appended")
    added = manifest.rows["test"] - before.rows["test"]
    assert added > MONTH * TICKERS * 0.8
    (entry,) = manifest.appends
    assert entry["kind"] == "append" and entry["rows"] == {"train": 0, "val": 0, "test": added}
    assert entry["bars"]["first_date"] == str(np.datetime64(market["calendar"][-MONTH - LAG], "D"))  # LAGGING's
    assert entry["last_date"] == manifest.splits["test_end"] and len(entry["input_hash"]) == 64
    assert result.notes[0].startswith(f"appended {added} rows for {TICKERS} tickers (dates {entry['first_date']}..")
    assert result.notes[0].endswith(f"; test segment now {manifest.rows['test']} rows")
    assert json.loads((tmp_path / "appended" / "result.json").read_text())["result"]["rows"] == manifest.rows
    listed = {name for names in manifest.files.values() for name in names}
    on_disk = {str(p.relative_to(tmp_path / "appended")) for p in (tmp_path / "appended").rglob("*.parquet")}
    assert listed == on_disk  # the test files and tails it replaced are gone; the new bars and tails are listed
    # each ticker's new rows from its tail and EMAs' states; with a per-date pass, the tickers whose rows
    # reach the dates LAGGING's new rows join are computed again from the bars store
    assert entry["computed"] == ({"from_tails": 1, "from_bars": TICKERS - 1} if before.cross_section else
                                 {"from_tails": TICKERS, "from_bars": 0})
    assert_tails_follow(tmp_path / "appended", market["calendar"][-1])

    # the same bars again: nothing new, nothing written, one line, exit code 0 from the command line
    unchanged = digest(tmp_path / "appended")
    again = ar.features(data=str(root / "tail"), out=tmp_path / "appended", append=True)
    assert again.notes[0].startswith("nothing to append: ")
    assert again.notes[0].endswith(f"last date {np.datetime64(market['calendar'][-1], 'D')}")
    assert digest(tmp_path / "appended") == unchanged


def test_two_appends_in_a_row_equal_one_fresh_build(market, tmp_path):
    """The rows the first append could not label yet (its newest bars) join at the second."""
    root, calendar = market["root"], market["calendar"]
    overrides = [*market["splits"], "features.label=cs_rank", "features.names=[ret_1,ret_5_rel,vol_20]"]
    build(root / "head", tmp_path / "appended", *overrides)
    for name, keep in (("first", lambda d: d < calendar[-10]), ("second", lambda d: d >= calendar[-12])):
        (tmp_path / name).mkdir()
        for f in sorted((root / "tail").glob("*.parquet")):
            frame = pd.read_parquet(f)
            frame[keep(frame["date"].to_numpy())].to_parquet(tmp_path / name / f.name, index=False)
        ar.features(data=str(tmp_path / name), out=tmp_path / "appended", append=True)
    build(root / "all", tmp_path / "fresh", *overrides)
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")
    manifest = Manifest.read(tmp_path / "appended")
    assert [a["bars"]["file"] for a in manifest.appends] == ["bars/part-00001.parquet", "bars/part-00002.parquet"]
    assert manifest.files["bars"] == ["bars/part-00000.parquet", *[a["bars"]["file"] for a in manifest.appends]]
    # the first append brought LAGGING up to the others: the second computes every ticker from its tail
    assert [a["computed"] for a in manifest.appends] == [{"from_tails": 1, "from_bars": TICKERS - 1},
                                                         {"from_tails": TICKERS, "from_bars": 0}]
    assert manifest.files["tails"] == ["tails/part-00002.parquet"]
    assert_tails_follow(tmp_path / "appended", calendar[-1])


def assert_tails_follow(folder: Path, last_date) -> None:
    """The folder's tails (data/tails.py) hold every ticker's last bars up to ``last_date``, its last row
    and its EMAs' states after it, as a fresh build of the same bars keeps them."""
    manifest = Manifest.read(folder)
    tails = tails_store.read(folder, manifest.files)
    assert tails is not None and sorted(tails.tickers) == tails.tickers == sorted(manifest.tickers)
    assert set(tails.last_bar().values()) == {np.datetime64(last_date, "ns")}
    reach = manifest.label["reach"]
    fresh = compute_group([(t, bars) for t, bars in bars_of(folder).items()], list(manifest.features),
                          manifest.label_spec, 1, tails=True).tails
    want = tails_store.Tails.from_table(fresh)
    assert want.tickers == tails.tickers and (want.lengths == tails.lengths).all()
    assert (want.checkpoint == tails.checkpoint).all() and (want.last_row == tails.last_row).all()
    ends = np.cumsum(tails.lengths) - 1
    assert (tails.checkpoint == tails.cols["date"][ends - reach]).all()  # the last bar with a label
    for column in ("date", "close", "volume"):
        assert (want.cols[column] == tails.cols[column]).all(), column
    for key, states in want.emas.items():
        np.testing.assert_allclose(tails.emas[key], states, rtol=1e-9, atol=1e-12)


def bars_of(folder: Path) -> dict[str, pd.DataFrame]:
    """Every bar the folder keeps (``bars/``), by ticker."""
    manifest = Manifest.read(folder)
    table = pd.concat([pd.read_parquet(folder / name) for name in manifest.files["bars"]], ignore_index=True)
    return {str(t): frame.drop(columns="ticker").sort_values("date").reset_index(drop=True)
            for t, frame in table.groupby("ticker", sort=True)}


def test_a_daily_feed_in_one_file_appends_as_the_same_bars_in_a_folder_do(market, tmp_path):
    """A vendor's file of every ticker's new bars (read whole where ingest would keep them as they are,
    bars/columnar.py): the folder appended equals a fresh build, as with a file per ticker."""
    root = market["root"]
    build(root / "head", tmp_path / "appended", *market["splits"])
    feed = pd.concat([pd.read_parquet(f).assign(ticker=f.stem) for f in sorted((root / "tail").glob("*.parquet"))])
    feed.sort_values(["date", "ticker"]).to_parquet(tmp_path / "feed.parquet", index=False)
    ar.features(data=str(tmp_path / "feed.parquet"), out=tmp_path / "appended", append=True)
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")
    assert Manifest.read(tmp_path / "appended").appends[-1]["computed"] == {"from_tails": TICKERS, "from_bars": 0}


def test_a_folder_without_tails_is_appended_to_from_its_bars_store(market, tmp_path):
    """A folder built before builds kept tails: the append computes every ticker from the bars store, as
    before, equals a fresh build, and writes no tails (the next one does the same)."""
    root = market["root"]
    build(root / "head", tmp_path / "appended", *market["splits"])
    shutil.rmtree(tmp_path / "appended" / tails_store.TAILS_DIR)  # and its manifest without them, as it was then
    manifest = json.loads((tmp_path / "appended" / "manifest.json").read_text())
    del manifest["files"][tails_store.TAILS_DIR]
    (tmp_path / "appended" / "manifest.json").write_text(json.dumps(manifest))
    ar.features(data=str(root / "tail"), out=tmp_path / "appended", append=True)
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")
    manifest = Manifest.read(tmp_path / "appended")
    assert manifest.appends[-1]["computed"] == {"from_tails": 0, "from_bars": TICKERS}
    assert tails_store.TAILS_DIR not in manifest.files and not (tmp_path / "appended" / tails_store.TAILS_DIR).exists()


def test_new_bars_as_a_dataframe_go_through_the_same_ingest(market, tmp_path):
    root = market["root"]
    build(root / "head", tmp_path / "appended", *market["splits"])
    tail = pd.concat([pd.read_parquet(f).assign(ticker=f.stem) for f in sorted((root / "tail").glob("*.parquet"))])
    with pytest.raises(DataError, match="volume"):  # validated as a file is
        ar.features(data=tail.drop(columns=["volume"]), out=tmp_path / "appended", append=True)
    result = ar.features(data=tail, out=tmp_path / "appended", append=True)
    assert result.notes[0].startswith("appended ")
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")


def test_a_revised_close_is_refused_in_one_line_and_rebuild_equals_a_fresh_build(market, tmp_path):
    root = market["root"]
    build(root / "head", tmp_path / "shards", *market["splits"])
    revised = tmp_path / "revised"
    shutil.copytree(root / "tail", revised)
    ticker = "SYN0003"
    frame = pd.read_parquet(revised / f"{ticker}.parquet")
    date = frame["date"].iloc[2]  # one of the OVERLAP dates the shards keep
    kept_close = frame.loc[2, "close"]
    frame.loc[2, "close"] = kept_close * 1.01
    frame.loc[2, "high"] = max(frame.loc[2, "high"], frame.loc[2, "close"])
    frame.to_parquet(revised / f"{ticker}.parquet", index=False)
    unchanged = digest(tmp_path / "shards")
    with pytest.raises(ShardError) as refused:
        ar.features(data=str(revised), out=tmp_path / "shards", append=True)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{ticker} {np.datetime64(date, 'D')}: ")
    assert f"close {kept_close * 1.01:.10g} in the new bars, {kept_close:.10g} in" in line and "--rebuild" in line
    assert digest(tmp_path / "shards") == unchanged

    result = ar.features(data=str(revised), out=tmp_path / "shards", append=True, rebuild=True)
    assert result.notes[0].startswith(f"rebuilt {tmp_path / 'shards'} from its kept bars and the new ones "
                                      f"(1 revised bar(s) of 1 ticker(s), first {ticker} ")
    fresh_data = tmp_path / "fresh-data"
    shutil.copytree(root / "all", fresh_data)
    whole = pd.read_parquet(fresh_data / f"{ticker}.parquet")
    whole.loc[whole["date"] == date, ["close", "high"]] = frame.loc[2, ["close", "high"]].to_numpy()
    whole.to_parquet(fresh_data / f"{ticker}.parquet", index=False)
    build(fresh_data, tmp_path / "fresh", *market["splits"])
    assert_same_rows(tmp_path / "shards", tmp_path / "fresh")
    (entry,) = Manifest.read(tmp_path / "shards").appends
    assert entry["kind"] == "rebuild" and entry["revised"]["dates"] == [f"{ticker} {np.datetime64(date, 'D')}"]
    # the rebuilt folder keeps its bars: the next append works
    assert ar.features(data=str(revised), out=tmp_path / "shards", append=True).notes[0].startswith(
        "nothing to append: ")


def test_a_folder_without_bars_and_rebuild_alone_are_refused_in_one_line(market, tmp_path):
    root = market["root"]
    build(root / "head", tmp_path / "shards", *market["splits"])
    shutil.rmtree(tmp_path / "shards" / bars_store.BARS_DIR)  # the bars its manifest lists, gone
    with pytest.raises(ShardError, match=r"cannot be appended to \(its bars store lacks bars/part-00000.parquet\)"
                                         r".*rebuild it"):
        ar.features(data=str(root / "tail"), out=tmp_path / "shards", append=True)
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())  # a build from before bars were kept
    del manifest["files"][bars_store.BARS_DIR]
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"cannot be appended to \(it keeps no bars \(bars/\).*rebuild it"):
        ar.features(data=str(root / "tail"), out=tmp_path / "shards", append=True)
    with pytest.raises(ShardError, match="--rebuild goes with --append"):
        ar.features(data=str(root / "tail"), out=tmp_path / "shards", rebuild=True)
    with pytest.raises(ShardError, match="holds no feature shards"):
        ar.features(data=str(root / "tail"), out=tmp_path / "none", append=True)
    assert not (tmp_path / "none").exists()
    with pytest.raises(ShardError, match=r"^--out s3://bucket/shards: --append works on a local shard folder only"):
        ar.features(data=str(root / "tail"), out="s3://bucket/shards", append=True)


def test_an_override_that_conflicts_with_the_shards_is_refused(market, tmp_path):
    root = market["root"]
    build(root / "head", tmp_path / "shards", *market["splits"])
    with pytest.raises(ShardError, match=r"built with features.horizon=1, but this append asks for "
                                         r"features.horizon=5: drop the override"):
        ar.features(ar.load_config(None, "features.horizon=5"), data=str(root / "tail"), out=tmp_path / "shards",
                    append=True)


def test_a_failed_append_leaves_the_folder_as_it_was(market, tmp_path):
    root = market["root"]
    out = tmp_path / "shards"
    build(root / "head", out, *market["splits"])
    unchanged = digest(out)
    bad = tmp_path / "bad"
    shutil.copytree(root / "tail", bad)
    (bad / "SYN0005.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="SYN0005.parquet"):
        ar.features(data=str(bad), out=out, append=True)
    assert digest(out) == unchanged

    # a split folder that cannot be written (a read-only bind mount): the new bars written first are removed
    test_dir = out / "split=test"
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a read-only bind mount needs root")
    if subprocess.run(["mount", "--bind", str(test_dir), str(test_dir)], capture_output=True).returncode:
        pytest.skip("no bind mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(test_dir)], check=True, capture_output=True)
        with pytest.raises(ShardError, match=r"split=test.*(read-only|Read-only)") as failed:
            ar.features(data=str(root / "tail"), out=out, append=True)
        assert "\n" not in str(failed.value)
    finally:
        subprocess.run(["umount", str(test_dir)], capture_output=True)
    assert digest(out) == unchanged
    # the tails' folder, written after the test files' continuations and the new bars: those are removed
    tails_dir = out / tails_store.TAILS_DIR
    subprocess.run(["mount", "--bind", str(tails_dir), str(tails_dir)], check=True, capture_output=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(tails_dir)], check=True, capture_output=True)
        with pytest.raises(ShardError, match=r"tails.*(read-only|Read-only)"):
            ar.features(data=str(root / "tail"), out=out, append=True)
    finally:
        subprocess.run(["umount", str(tails_dir)], capture_output=True)
    assert digest(out) == unchanged


def test_the_command_line_appends_and_says_so_in_one_line(market, tmp_path):
    root = market["root"]
    build(root / "head", tmp_path / "shards", *market["splits"])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", "features", *args], capture_output=True,
                              text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})

    done = cli("--data", str(root / "tail"), "--out", "shards", "--append", "--quiet")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("appended ") and " to shards; test segment now " in line, line
    again = cli("--data", str(root / "tail"), "--out", "shards", "--append")
    assert again.returncode == 0 and again.stdout.startswith("nothing to append: "), again.stderr
    assert len(again.stdout.splitlines()) == 1
    alone = cli("--data", str(root / "tail"), "--out", "shards", "--rebuild")
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1 and "--rebuild goes with --append" in alone.stderr


@pytest.mark.parametrize("settings", [
    [],
    ["features.label=cs_rank", "features.names=[ret_1,ret_5_rel,vol_20]"],
], ids=["three_class", "cs_rank-relative"])
@pytest.mark.slow
def test_the_packaged_data_s_last_month_appended_equals_a_fresh_build(stocknet_dir, tmp_path, settings):
    """The stocknet CSVs as their source wrote them (adjusted closes, empty cells, zero-volume days):
    cut by date into all but the last 21 dates and the last 21 (with 5 before them), read by ingest."""
    files = sorted(stocknet_dir.glob("*.csv"))
    dates = sorted({d for f in files for d in pd.read_csv(f, usecols=["Date"])["Date"]})
    for name, keep in (("head", lambda d: d < dates[-MONTH]), ("tail", lambda d: d >= dates[-MONTH - OVERLAP])):
        (tmp_path / name).mkdir()
        for f in files:
            header, *body = f.read_text().splitlines(keepends=True)
            (tmp_path / name / f.name).write_text(header + "".join(ln for ln in body if keep(ln.split(",")[0])))
    overrides = ["features.train_end=2015-12-31", "features.val_end=2016-11-30", *settings]
    build(tmp_path / "head", tmp_path / "appended", *overrides)
    result = ar.features(data=str(tmp_path / "tail"), out=tmp_path / "appended", append=True)
    assert result.notes[0].startswith("appended 1848 rows for 88 tickers (dates 2017-08-02..2017-08-30)")
    build(stocknet_dir, tmp_path / "fresh", *overrides)
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")


def test_an_append_continues_each_test_file_and_compacts_the_longest_chain(market, tmp_path, monkeypatch):
    """The new rows go to continuations of the test files (``part-NNNNN.K.parquet``, a file's tickers'
    rows of the K-th append), not a rewrite of the segment: several files (a small ROWS_PER_FILE), each
    continued once.  A chain of COMPACT_AT continuations is written again whole at the next append (the
    longest first, one in COMPACT_AT of them an append); the rows equal a fresh build's each time."""
    from alchemetric_ray.data import append_write, shards

    monkeypatch.setattr(shards, "ROWS_PER_FILE", 300)
    monkeypatch.setattr(append_write, "COMPACT_AT", 2)
    root, calendar = market["root"], market["calendar"]
    build(root / "head", tmp_path / "appended", *market["splits"])
    before = Manifest.read(tmp_path / "appended").files["test"]
    assert len(before) > 2
    cuts = [calendar[-MONTH - LAG], calendar[-14], calendar[-7], None]  # LAGGING first catches up
    listings = []
    for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        (tmp_path / f"feed{i}").mkdir()
        for f in sorted((root / "tail").glob("*.parquet")):
            frame = pd.read_parquet(f)
            keep = (frame["date"] >= lo) & ((frame["date"] < hi) if hi is not None else True)
            frame[keep.to_numpy()].to_parquet(tmp_path / f"feed{i}" / f.name, index=False)
        ar.features(data=str(tmp_path / f"feed{i}"), out=tmp_path / "appended", append=True)
        listings.append(Manifest.read(tmp_path / "appended").files["test"])
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert_same_rows(tmp_path / "appended", tmp_path / "fresh")
    # 1st: every file continued once; 2nd: twice; 3rd: the first chain (the longest) written again whole
    assert listings[0] == [n for b in before for n in (b, b.replace(".parquet", ".1.parquet"))]
    assert listings[1] == [n for b in before for n in (b, b.replace(".parquet", ".1.parquet"),
                                                          b.replace(".parquet", ".2.parquet"))]
    # 3rd: every chain is due; the first half of them (one in COMPACT_AT an append) written again whole
    half = -(-len(before) // 2)
    rewritten = [n for n in listings[2] if n not in listings[1]]
    assert not set(listings[1][:3 * half]) & set(listings[2]) and rewritten[0] == listings[2][0]
    assert all(re.fullmatch(r"split=test/part-\d+\.parquet", n) for n in rewritten[:half])
    assert listings[2][-4 * (len(before) - half):] == [b.replace(".parquet", k) for b in before[half:]
                                                        for k in (".parquet", ".1.parquet", ".2.parquet", ".3.parquet")]
    listed = {name for names in Manifest.read(tmp_path / "appended").files.values() for name in names}
    assert listed == {str(p.relative_to(tmp_path / "appended")) for p in (tmp_path / "appended").rglob("*.parquet")}


def test_what_an_interrupted_append_left_unlisted_is_neither_read_nor_overwritten(market, tmp_path):
    """A kill -9 between an append's first file and its manifest leaves files no manifest lists (a
    continuation, a bars part, a tails part): the folder still reads as before it, and the next append
    equals a fresh build, writing under other names and leaving those files as they were."""
    root = market["root"]
    out = tmp_path / "appended"
    build(root / "head", out, *market["splits"])
    first = Manifest.read(out).files["test"][0]
    left = [out / first.replace(".parquet", ".1.parquet"), out / "bars" / "part-00001.parquet",
            out / tails_store.TAILS_DIR / "part-00001.parquet"]
    for path in left:
        path.write_bytes(b"an interrupted append's half-written file")
    ar.features(data=str(root / "tail"), out=out, append=True)
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert_same_rows(out, tmp_path / "fresh")
    manifest = Manifest.read(out)
    assert first.replace(".parquet", ".2.parquet") in manifest.files["test"]
    assert not {str(p.relative_to(out)) for p in left} & {n for names in manifest.files.values() for n in names}
    assert all(p.read_bytes() == b"an interrupted append's half-written file" for p in left)
    # a listed file broken (a disk's fault): one line naming it, the folder as it was
    broken = out / manifest.files["bars"][0]
    broken.write_bytes(b"broken")
    unchanged = digest(out)
    with pytest.raises(ShardError, match=rf"^{re.escape(str(broken))}: the shards' kept bars cannot be read \(") as err:
        ar.features(data=str(root / "tail"), out=out, append=True, rebuild=True)
    assert "\n" not in str(err.value) and digest(out) == unchanged


@pytest.mark.slow
def test_a_sequence_model_s_windows_reach_back_across_an_append(ray_session, market, tmp_path):
    """A sequence model's windows are built a chain of files at a time: a ticker's first new windows
    reach back into its rows before the append.  The appended folder's test windows are a fresh build's,
    ticker by ticker and date by date (Ray Data's read), and the in-process reader (ShardReader) gives
    the same tensors as Ray Data's ordered read."""
    from ray.data import DataContext

    from alchemetric_ray.data.batches import read_all
    from alchemetric_ray.data.loaders import (
        ShardReader,
        build_datasets,
        collate_for,
        deterministic_context,
        read_split_windows,
    )

    root, window = market["root"], 8
    build(root / "head", tmp_path / "appended", *market["splits"])
    ar.features(data=str(root / "tail"), out=tmp_path / "appended", append=True)
    build(root / "all", tmp_path / "fresh", *market["splits"])
    assert any(name.endswith(".1.parquet") for name in Manifest.read(tmp_path / "appended").files["test"])

    def windows(folder: Path) -> list[dict]:
        return sorted(read_split_windows(folder, "test", window).take_all(), key=lambda r: (r["ticker"], r["date"]))

    appended, fresh = windows(tmp_path / "appended"), windows(tmp_path / "fresh")
    assert len(appended) == len(fresh) > TICKERS * MONTH
    for a, f in zip(appended, fresh):
        assert (a["ticker"], a["date"]) == (f["ticker"], f["date"])
        np.testing.assert_allclose(a["x"], f["x"], rtol=1e-5, atol=1e-5)
    ctx = DataContext.get_current()
    old = ctx.execution_options.preserve_order
    try:
        deterministic_context()
        datasets, manifest = build_datasets(tmp_path / "appended", "sequence", window, splits=("test",))
        ours = ShardReader(tmp_path / "appended", manifest, "sequence", window).rows("test")
        ray_data = read_all(datasets["test"], 256, collate_for("sequence", manifest.features))
        assert len(ours[1]) == len(fresh)
        for a, b in zip(ours, ray_data):
            assert torch.equal(a, b)
    finally:
        ctx.execution_options.preserve_order = old
