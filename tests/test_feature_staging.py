"""The feature build's first passes (data/staging.py): by groups of tickers, in the driver or as Ray
tasks (the session's Ray), the per-date pass by buckets of dates; the same shards either way; a
ticker that fails in a task named in one line; a stop signal during a Ray build."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from alchemetric_ray.config import load_config
from alchemetric_ray.data.bars_store import BARS_DIR
from alchemetric_ray.data.shards import build_shards, split_dir
from alchemetric_ray.errors import FeatureError

REPO = Path(__file__).resolve().parents[1]
# a cross-sectional label, a market-relative feature and a per-date normalization: every per-date op
CROSS = ["features.label=cs_rank", "features.names=[ret_1, ret_5_rel, vol_20]", "features.cs_normalize=rank"]
SMALL_GROUPS = "features.group_rows=20000"  # the packaged 108k rows: 6 groups


def _frames(folder: Path) -> dict[str, pd.DataFrame]:
    return {split: pd.read_parquet(split_dir(folder, split)) for split in ("train", "val", "test")}


@pytest.mark.slow
def test_ray_tasks_build_the_shards_a_one_process_build_does(ray_session, tmp_path):
    """The packaged data, as Ray tasks over groups of tickers and buckets of dates, and in this process:
    the same rows, bit for bit, the same manifest but for how it was built; the bars kept by group."""
    built = {}
    for where in ("false", "true", "auto"):
        cfg = load_config(None, [*CROSS, SMALL_GROUPS, f"features.distributed={where}"])
        built[where] = build_shards(cfg, tmp_path / where).manifest
    ray_build, driver_build = built["true"].build, built["false"].build
    assert built["auto"].build["mode"] == "ray"  # a Ray is up in this process: auto uses it
    assert driver_build["mode"] == "driver" and driver_build["tasks"] == 0 and driver_build["groups"] == 6
    assert ray_build["mode"] == "ray" and ray_build["groups"] == 6 and ray_build["tasks"] > 6  # and date buckets
    assert ray_build["nodes"] == 1 and ray_build["rows_per_group"] == 20000
    # the shards' parts written by a Ray task per group (pass 3) and by the driver: the same files
    assert ray_build["write"] == "tasks" and driver_build["write"] == "driver"
    same = {"created": None, "build": None, "built_with": None}
    assert {**built["true"].__dict__, **same} == {**built["false"].__dict__, **same}
    assert built["true"].cross_section["ops"] and len(built["true"].tickers) == 88
    for split, frame in _frames(tmp_path / "false").items():
        pd.testing.assert_frame_equal(_frames(tmp_path / "true")[split], frame, check_exact=True)
        # a ticker is never cut between two part files
        parts = [pd.read_parquet(p, columns=["ticker"])["ticker"] for p in sorted(split_dir(tmp_path / "true",
                                                                                             split).glob("*.parquet"))]
        seen = [set(p) for p in parts]
        assert [len(p) for p in parts] == [pq.ParquetFile(f).metadata.num_rows for f in sorted(
            split_dir(tmp_path / "false", split).glob("*.parquet"))]  # the same parts, row for row
        assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])
    bars = sorted((tmp_path / "true" / BARS_DIR).glob("part-*.parquet"))
    assert [p.name for p in bars] == [f"part-{k:05d}.parquet" for k in range(6)]
    kept = pd.concat([pd.read_parquet(p) for p in bars])
    assert kept["ticker"].nunique() == 88 and kept.equals(pd.concat(
        [pd.read_parquet(p) for p in sorted((tmp_path / "false" / BARS_DIR).glob("*.parquet"))]))


@pytest.mark.slow
def test_the_robust_normalization_is_fitted_the_same_by_ray_tasks_and_in_this_process(ray_session, tmp_path):
    """``robust`` (a reservoir of train rows in row order, in the driver) beside zscore's per-ticker moments
    (tasks): a build as Ray tasks and one in this process give the same statistics and rows."""
    built = {}
    for where in ("false", "true"):
        cfg = load_config(None, [SMALL_GROUPS, "features.normalization=robust", f"features.distributed={where}"])
        built[where] = build_shards(cfg, tmp_path / where).manifest
    assert built["true"].build["write"] == "tasks" and built["false"].build["write"] == "driver"
    assert built["true"].normalization == built["false"].normalization
    assert built["true"].normalization["method"] == "robust" and len(built["true"].normalization["center"]) == 16
    for split, frame in _frames(tmp_path / "false").items():
        pd.testing.assert_frame_equal(_frames(tmp_path / "true")[split], frame, check_exact=True)


def test_a_small_build_stays_in_the_driver_without_starting_ray(tmp_path):
    """auto, the whole input in one group and no Ray up: computed in the process, Ray never imported."""
    out = str(tmp_path / "out")
    script = ("import sys, json; from alchemetric_ray.config import load_config; "
              "from alchemetric_ray.data.shards import build_shards; "
              f"m = build_shards(load_config(None, ['data.tickers=AAPL,MSFT,XOM']), {out!r}).manifest; "
              "print(json.dumps({'build': m.build, 'ray': 'ray' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["build"]["mode"] == "driver" and out["build"]["groups"] == 1 and not out["ray"], out
    assert "ray_start" not in out["build"]["seconds"]


def _bars(tickers: list[str], days: int = 400) -> list[tuple[str, pd.DataFrame]]:
    from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars

    market = SyntheticMarket(n_tickers=len(tickers), n_days=days, seed=3)
    return [(name, frame) for name, (_, frame) in zip(tickers, synthetic_bars(market))]


@pytest.mark.parametrize("where", ["true", "false"])
def test_a_ticker_that_fails_in_a_task_fails_the_build_in_one_line_naming_it_and_its_file(ray_session, tmp_path,
                                                                                       where):
    """Inside a Ray task (and in the driver): the group's tickers are computed one by one to name the culprit."""
    bars = _bars(["AAA", "BBB", "CCC", "DDD"])
    broken = bars[2][1].copy()
    broken["notes"] = [["a list"]] * len(broken)  # a column the bars' digest (part of compute_group) cannot hash
    broken.attrs["source"] = "/data/CCC.csv"
    bars[2] = ("CCC", broken)
    cfg = load_config(None, [f"features.distributed={where}", "features.group_rows=500"])  # two tickers a group
    with pytest.raises(FeatureError) as caught:
        build_shards(cfg, tmp_path / "out", bars=bars)
    assert type(caught.value) is FeatureError  # not Ray's wrapper, whose text is a traceback
    message = str(caught.value)
    assert "\n" not in message and message.startswith("ticker CCC (file /data/CCC.csv): its features could not "
                                                      "be computed (TypeError: "), message
    assert list(tmp_path.iterdir()) == []  # no output, no temporary folder


def test_bars_that_cannot_be_kept_fail_the_build_in_one_line_naming_the_ticker(tmp_path):
    bars = _bars(["AAA", "BBB", "CCC"])
    broken = bars[1][1].copy()
    broken["close"] = "n/a"  # text where prices belong
    broken.attrs["source"] = "/data/BBB.csv"
    bars[1] = ("BBB", broken)
    with pytest.raises(FeatureError, match=r"^ticker BBB \(file /data/BBB.csv\): its bars could not be kept "
                                           r"\(ValueError: could not convert string to float: 'n/a'\)$"):
        build_shards(load_config(None, ["features.distributed=false"]), tmp_path / "out", bars=bars)
    assert list(tmp_path.iterdir()) == []


def test_the_progress_line_counts_tickers_and_rows_per_second_on_a_terminal(monkeypatch, capsys):
    from alchemetric_ray import console
    from alchemetric_ray.data.staging import _Progress

    monkeypatch.setattr(console, "is_tty", lambda *a, **k: True)
    bar = _Progress("features", True)
    bar(1200, 3000, rows=84_000)
    bar(3000, 3000, final=True, rows=210_000)
    err = capsys.readouterr().err
    assert err.startswith("\rfeatures: 1200/3000 tickers, ") and " rows/s" in err and err.endswith("\n")
    assert "\rfeatures: 3000/3000 tickers, " in err
    monkeypatch.setattr(console, "is_tty", lambda *a, **k: False)
    quiet = _Progress("features", True)
    quiet(1, 2, final=True, rows=10)
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_sigterm_during_a_ray_build_leaves_nothing_and_no_ray_process(tmp_path):
    """Sent once the build is handing groups to its own local Ray: one line, exit 143, no stage, no output,
    no process of the command's session left."""
    from test_no_loss import _clean_stop, _env, processes_left

    out = tmp_path / "shards"
    proc = subprocess.Popen([sys.executable, "-m", "alchemetric_ray.cli", "features", "--out", str(out), "--quiet",
                             "features.distributed=true", "features.group_rows=3000"], cwd=tmp_path, env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while (not list(tmp_path.glob(f".shards.tmp-*/{BARS_DIR}/part-00003.parquet")) and proc.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    _clean_stop(err, out_text)
    assert err.strip().splitlines()[-1] == ("alchemetric-ray features: interrupted by SIGTERM before it finished "
                                            "(nothing half-written is left); run the same command again"), err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert processes_left(proc.pid) == []


def test_date_buckets_cover_the_dates_whole_and_the_bucketed_transform_equals_the_whole():
    from alchemetric_ray.data.cross_section import date_buckets, transform_column

    rng = np.random.default_rng(0)
    code = np.sort(rng.integers(0, 50, 5000))[rng.permutation(5000)]
    values = rng.normal(size=5000).round(1)  # ties, ranked on their average
    buckets = date_buckets(code, 50, 4)
    assert buckets[0][0] == 0 and buckets[-1][1] == 50 and len(buckets) == 4
    assert all(a[1] == b[0] for a, b in zip(buckets, buckets[1:]))
    for kind in ("rank", "zscore", "demean"):
        whole = transform_column(kind, values, code, 50)
        pieces = np.empty(5000)
        for lo, hi in buckets:
            rows = (code >= lo) & (code < hi)
            pieces[rows] = transform_column(kind, values[rows], code[rows] - lo, hi - lo)
        assert np.array_equal(pieces, whole), kind
    assert date_buckets(code, 50, 1) == [(0, 50)] and date_buckets(np.zeros(3, int), 1, 4) == [(0, 1)]


def test_a_ticker_is_never_cut_between_two_part_files_when_groups_hold_many_tickers(monkeypatch, tmp_path):
    """Groups of ~16 tickers staged as one file each; the shards' parts are still cut between tickers."""
    from alchemetric_ray.data import shards

    monkeypatch.setattr(shards, "ROWS_PER_FILE", 5000)  # parts of ~4 tickers: many cuts inside each group
    summary = build_shards(load_config(None, [SMALL_GROUPS, "features.distributed=false"]), tmp_path / "out")
    for split in ("train", "val", "test"):
        parts = sorted(split_dir(tmp_path / "out", split).glob("*.parquet"))
        assert len(parts) > 3
        tickers = [pd.read_parquet(p, columns=["ticker"])["ticker"] for p in parts]
        assert sum(t.nunique() for t in tickers) == len(set().union(*map(set, tickers)))  # each ticker in one part
        assert all(len(t) <= 5000 or t.nunique() == 1 for t in tickers)
    assert summary.manifest.build["groups"] == 6


def test_a_task_ray_loses_fails_the_build_in_one_line_naming_its_tickers(ray_session):
    """A task whose worker dies (out of memory, killed) is no traceback either."""
    import os

    import ray

    from alchemetric_ray.data.staging import _get_all

    @ray.remote(num_cpus=0, max_retries=0)
    def dies():
        os._exit(1)

    with pytest.raises(FeatureError) as caught:
        _get_all([dies.remote()], "the feature task of tickers AAA..BBB")
    assert type(caught.value) is FeatureError and "\n" not in str(caught.value)
    assert str(caught.value).startswith("the feature task of tickers AAA..BBB failed (WorkerCrashedError: ")


# ---- a folder of per-ticker files: each Ray task reads and validates its own files ------------------


def _write_folder(folder: Path, tickers: int = 12, days: int = 400) -> Path:
    """Per-ticker Parquet files, one messy CSV (an exact duplicate row, a revised bar for one date, a stale
    run of flat bars) and one ticker too short to keep."""
    folder.mkdir(parents=True)
    bars = _bars([f"T{k:02d}" for k in range(tickers)], days)
    for ticker, frame in bars[:-2]:
        frame.to_parquet(folder / f"{ticker}.parquet", index=False)
    messy = bars[-2][1].copy()
    messy = pd.concat([messy, messy.iloc[[10]]]).sort_values("date", kind="stable")  # an exact copy
    revised = messy.iloc[[20]].assign(volume=messy["volume"].iloc[20] + 22)
    messy = pd.concat([messy, revised]).sort_values("date", kind="stable")  # a date with differing rows
    flat = messy.index[100:106]
    messy.loc[flat, ["open", "high", "low", "close"]] = 50.0  # six flat bars at one close: a stale run
    messy.rename(columns=str.title).assign(Date=lambda f: f["Date"].dt.strftime("%Y-%m-%d")).to_csv(
        folder / f"{bars[-2][0]}.csv", index=False)
    bars[-1][1].iloc[:60].to_parquet(folder / f"{bars[-1][0]}.parquet", index=False)  # too short: skipped
    return folder


def _build(tmp_path: Path, data: Path, where: str, name: str, *extra: str):
    cfg = load_config(None, [f"data.path={data}", "data.source=files", f"features.distributed={where}",
                             "features.group_rows=1500", *extra])
    return build_shards(cfg, tmp_path / name).manifest


def test_a_folders_groups_are_even_and_fill_the_last_round_of_tasks():
    """Files grouped by size: groups of about ``group_bytes`` at most, evened out, consecutive and whole; where
    they take more than one round on the CPUs, a multiple of the CPUs (5 groups' worth on 2 CPUs: 6)."""
    from alchemetric_ray.data.staging import _file_groups

    files = [(f"T{k:03d}", Path(f"T{k:03d}.parquet"), 100 + (k % 7)) for k in range(300)]  # 31,800 bytes
    total = sum(size for _, _, size in files)

    def sizes(groups, of=files):
        assert [t for group in groups for t, _ in group] == [t for t, _, _ in of]  # all, once, in order
        by_name = {t: size for t, _, size in of}
        return [sum(by_name[t] for t, _ in group) for group in groups]

    two = sizes(_file_groups(files, total / 4.5, cpus=2))  # 5 groups' worth on 2 CPUs: 3 full rounds
    assert len(two) == 6 and max(two) - min(two) <= 2 * 106 and max(two) <= total / 4.5
    assert len(sizes(_file_groups(files, total / 4.5, cpus=8))) == 5  # one round: as many as the size asks
    assert len(sizes(_file_groups(files, total / 4.5, cpus=1))) == 5
    assert len(sizes(_file_groups(files, total / 9, cpus=4))) == 12
    assert sizes(_file_groups(files[:3], 50.0, cpus=2), files[:3]) == [100, 101, 102]  # never more groups than files
    assert len(_file_groups([], 1000.0, cpus=2)) == 0


def test_a_folder_ingested_in_ray_tasks_builds_what_the_driver_builds(ray_session, tmp_path):
    """The files read and validated inside the tasks: the same shards, bars, ingest record (messy file,
    skipped ticker, dropped rows) and manifest as a build that reads them in the driver."""
    data = _write_folder(tmp_path / "data")
    built = {where: _build(tmp_path, data, where, where, *CROSS[:1]) for where in ("true", "false")}
    tasks, driver = built["true"], built["false"]
    assert tasks.build["ingest"] == "tasks" and tasks.build["mode"] == "ray" and tasks.build["groups"] >= 2
    assert driver.build["ingest"] == "driver" and driver.build["mode"] == "driver"
    # the files' layout follows the groups (the tasks' by size, evened out over the CPUs; the driver's by rows):
    # the rows in them are compared below, row for row
    same = {"created": None, "build": None, "built_with": None, "files": None}
    assert {**tasks.__dict__, **same} == {**driver.__dict__, **same}
    for where, manifest in built.items():  # each lists the files it wrote, and only those
        for part, names in manifest.files.items():
            folder = f"split={part}" if part in ("train", "val", "test") else part
            assert names == sorted(f"{folder}/{p.name}" for p in (tmp_path / where / folder).glob("*.parquet"))
    ingest = tasks.ingest
    assert ingest["files"] == 12 and ingest["tickers"] == 11 and list(ingest["skipped_tickers"]) == ["T11"]
    assert ingest["dropped"]["duplicate_row"] == 1 and ingest["dropped"]["duplicate_date"] == 1
    assert ingest["dropped"]["stale_price"] == 6 and ingest["warnings"] == driver.ingest["warnings"] > 0
    for split, frame in _frames(tmp_path / "false").items():
        pd.testing.assert_frame_equal(_frames(tmp_path / "true")[split], frame, check_exact=True)
    kept = {where: pd.concat([pd.read_parquet(p) for p in sorted((tmp_path / where / BARS_DIR).glob("*.parquet"))],
                             ignore_index=True) for where in ("true", "false")}
    pd.testing.assert_frame_equal(kept["true"], kept["false"], check_exact=True)


def test_cancelled_tasks_have_ended_when_the_cancel_returns(ray_session, tmp_path):
    """The build's tasks write into its temporary folder: when one fails (or a Ctrl-C lands), the others are
    cancelled and must have ended before the error removes that folder, or one could write there again (a
    CI run once found a build's folder remade by a task that was still writing).  Here a task that keeps
    writing into a folder: once ``_cancel`` returns it is done, and the folder removed stays removed."""
    import ray

    from alchemetric_ray.data.staging import _cancel

    folder = tmp_path / "out"

    @ray.remote(num_cpus=1, max_retries=0)
    def keeps_writing(where: str) -> None:
        import os

        for k in range(6000):
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "x"), "w") as f:
                f.write(str(k))
            time.sleep(0.01)

    ref = keeps_writing.remote(str(folder))
    deadline = time.monotonic() + 60
    while not (folder / "x").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _cancel([ref])
    ready, _ = ray.wait([ref], timeout=0)
    assert ready == [ref]  # ended, not only asked to
    shutil.rmtree(folder)
    time.sleep(1.0)
    assert not folder.exists()


@pytest.mark.parametrize("broken", ["a bad date", "no ticker long enough"])
def test_a_folder_error_inside_a_task_is_the_driver_builds_one_line(ray_session, tmp_path, broken):
    """A file that fails validation in a task, and ingest's end-of-input error on the merged report: the same
    one line (DataError, not Ray's wrapper) as a build that reads the files in the driver; nothing left."""
    from alchemetric_ray.errors import DataError

    data = _write_folder(tmp_path / "data")
    if broken == "a bad date":
        frame = pd.read_csv(data / "T10.csv")
        frame.loc[150, "Date"] = "2011-13-45"
        frame.to_csv(data / "T10.csv", index=False)
    else:
        for path in data.iterdir():
            path.unlink() if path.suffix == ".csv" else pd.read_parquet(path).iloc[:50].to_parquet(path)
    messages = {}
    for where in ("true", "false"):
        with pytest.raises(DataError) as caught:
            _build(tmp_path, data, where, f"out-{where}")
        assert type(caught.value) is DataError
        messages[where] = str(caught.value)
    assert messages["true"] == messages["false"] and "\n" not in messages["true"]
    assert ("T10.csv" in messages["true"]) if broken == "a bad date" else \
        messages["true"].startswith("no ticker has at least")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no output, no temporary folder


def _auto_build(tmp_path: Path, data: Path, group_rows: int) -> dict:
    out = str(tmp_path / f"out-{group_rows}")
    script = ("import sys, json; from alchemetric_ray.config import load_config; "
              "from alchemetric_ray.data.shards import build_shards; "
              f"m = build_shards(load_config(None, ['data.path={data}', 'data.source=files', "
              f"'features.group_rows={group_rows}']), {out!r}).manifest; "
              "print(json.dumps({'build': m.build, 'ray': 'ray' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_auto_starts_a_local_ray_for_a_folder_large_enough_and_not_for_a_small_one(tmp_path):
    """auto, no Ray up: a folder of LOCAL_RAY_GROUPS groups or more (by its files' size) starts a local Ray whose
    tasks read the files; a smaller one is built in the process, Ray never imported."""
    from alchemetric_ray.data.staging import BYTES_PER_ROW, LOCAL_RAY_GROUPS

    data = _write_folder(tmp_path / "data")
    rows = sum(p.stat().st_size for p in data.iterdir()) / BYTES_PER_ROW
    small = _auto_build(tmp_path, data, group_rows=int(rows / (LOCAL_RAY_GROUPS - 1)))
    assert small["build"]["mode"] == "driver" and not small["ray"], small
    large = _auto_build(tmp_path, data, group_rows=int(rows / (LOCAL_RAY_GROUPS + 1)))
    assert large["build"]["mode"] == "ray" and large["build"]["ingest"] == "tasks" and large["ray"], large
    assert large["build"]["seconds"]["ray_start"] > 0


def test_a_group_goes_to_its_task_as_one_arrow_table_and_comes_out_the_same_frames():
    """Canonical bars travel as one Arrow table (tickers, row counts, files beside it) and are rebuilt column
    for column, digests and files included; a frame of other columns travels as it is."""
    from alchemetric_ray.data.panel import bars_digest
    from alchemetric_ray.data.staging import _group_frames, _group_payload

    bars = _bars(["AAA", "BBB", "CCC"], days=300)
    bars[1][1].attrs["source"] = "/data/BBB.csv"
    payload = _group_payload(bars)
    assert isinstance(payload, tuple) and payload[0].num_rows == 900
    for (ticker, frame), (again, rebuilt) in zip(bars, _group_frames(payload)):
        assert again == ticker and rebuilt.attrs == frame.attrs
        pd.testing.assert_frame_equal(rebuilt, frame, check_exact=True)
        assert bars_digest(rebuilt) == bars_digest(frame)
    odd = [*bars[:2], ("CCC", bars[2][1].assign(notes="x"))]
    assert _group_payload(odd) is odd
