"""Bad input, one test per item of the checklist, each through the real CLI (``cli.main``).

For every case: exit code 2, exactly one line of error text on stderr (``alchemetric-ray <cmd>:
error: ...``) that names the offending file, column, value, key or option, no traceback, and no
partial output: the folder tree the command writes into is exactly what it was before (no output
folder, models dir, shards folder or signals file, and no temporary folder beside them).

Cases that fail before Ray starts come first; the rest share the session's Ray and one small
model trained once for the module (through ``alchemetric-ray train``).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from device_probes import no_cuda

from alchemetric_ray.cli import main

ROWS = 300  # rows of a small CSV slice: enough history for the default features and labels
TICKERS = ("AAPL", "MSFT")

# Lines on stderr that are not error text: Ray's forwarded worker and system logs (each line
# prefixed "(Name pid=N)", "(pid=gcs_server)", "(raylet)"; progress bars redraw with terminal
# escapes) and the features progress line.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_LOG = re.compile(r"^\(((\S+ )?pid=[^,)\s]+(, ip=[^)\s]+)?|raylet|gcs_server|autoscaler[^)]*)\)")
_PROGRESS = re.compile(r"^features: \d+(/\d+)? tickers$")


# ---- helpers -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Run in tmp_path: the relative defaults (results/, models/) land where the checks look."""
    monkeypatch.chdir(tmp_path)


def tree(root: Path) -> list[str]:
    """Every path under ``root`` (hidden ones included), relative: the 'no partial output' check."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def fails(capsys, argv: list[str], *names, under: Path | None = None) -> str:
    """Run the CLI and assert a clean user error: exit code 2, one line of error text naming each
    of ``names``, no traceback; and, with ``under``, that nothing under that folder changed."""
    before = tree(under) if under is not None else None
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    cmd = argv[0]
    assert rc == 2, f"exit code {rc}\nstdout: {out}\nstderr: {err}"
    lines = [line.strip() for line in _ANSI.sub("", err).replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line and not _RAY_LOG.match(line) and not _PROGRESS.match(line)]
    assert len(lines) == 1, "expected one line of error text (no traceback), got:\n" + "\n".join(lines)
    line = lines[0]
    assert line.startswith(f"alchemetric-ray {cmd}: error: "), line
    for name in names:
        assert str(name) in line, f"{name!r} not named in: {line}"
    if under is not None:
        assert tree(under) == before, f"{cmd} left output behind in {under}"
    return line


def csv_folder(tmp_path: Path, stocknet_dir: Path, name: str = "ohlcv", tickers=TICKERS, rows: int = ROWS,
               edit=None) -> Path:
    """A folder of the first ``rows`` rows of real stocknet CSVs; ``edit(ticker, lines)`` may change them."""
    folder = tmp_path / name
    folder.mkdir()
    for t in tickers:
        lines = (stocknet_dir / f"{t}.csv").read_text().splitlines()[: rows + 1]
        if edit is not None:
            lines = edit(t, lines)
        (folder / f"{t}.csv").write_text("\n".join(lines) + "\n")
    return folder


def set_cells(column: str, value: str, rows: range, ticker: str = "MSFT"):
    """An ``edit`` that writes ``value`` into ``column`` on the given data rows of one ticker."""
    def edit(t: str, lines: list[str]) -> list[str]:
        if t != ticker:
            return lines
        header = lines[0].split(",")
        j = header.index(column)
        for i in rows:
            cells = lines[i].split(",")
            cells[j] = value
            lines[i] = ",".join(cells)
        return lines
    return edit


def features(data: Path, out: Path, *overrides: str) -> list[str]:
    return ["features", "--data", data, "--out", out, *overrides]


def train(data: Path, root: Path, *overrides: str, flags: tuple = ()) -> list[str]:
    """``alchemetric-ray train`` of the smallest model, writing under ``root``; flags before overrides."""
    return ["train", "--data", data, *flags, f"storage.path={root / 'results'}",
            f"storage.models_dir={root / 'models'}", "model.hidden=8", "train.epochs=1", *overrides]


# ---- bad market data (fails before Ray starts) ---------------------------------------------


def test_empty_data_folder(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(capsys, features(empty, tmp_path / "shards"), "no CSV or Parquet files", empty, under=tmp_path)


def test_csv_without_a_close_column(capsys, tmp_path, stocknet_dir):
    def drop_close(t, lines):
        if t != "MSFT":
            return lines
        return [",".join(c for j, c in enumerate(line.split(",")) if j != 4) for line in lines]

    data = csv_folder(tmp_path, stocknet_dir, edit=drop_close)
    assert "Close" not in (data / "MSFT.csv").read_text().splitlines()[0].split(",")
    fails(capsys, features(data, tmp_path / "shards"), "MSFT.csv", "missing required column 'Close'", under=tmp_path)


@pytest.mark.parametrize("kind", ["binary-csv", "text-file", "fake-parquet"])
def test_binary_or_non_csv_file(capsys, tmp_path, stocknet_dir, kind):
    junk = random.Random(0).randbytes(4096)
    if kind == "binary-csv":  # binary bytes under a .csv name, in a folder beside a good file
        data = csv_folder(tmp_path, stocknet_dir, tickers=("AAPL",))
        (data / "MSFT.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + junk)
        names = ("MSFT.csv", "not a text CSV file")
    elif kind == "text-file":  # a single file that is neither CSV nor Parquet
        data = tmp_path / "notes.txt"
        data.write_text("Date,Open,High,Low,Close,Volume\n")
        names = ("notes.txt", "not a CSV or Parquet file")
    else:  # a .parquet name on bytes that are not Parquet
        data = csv_folder(tmp_path, stocknet_dir, tickers=("AAPL",))
        (data / "MSFT.parquet").write_bytes(junk)
        names = ("MSFT.parquet", "not a readable Parquet file")
    fails(capsys, features(data, tmp_path / "shards"), *names, under=tmp_path)


@pytest.mark.parametrize("value, what", [("nan", "non-finite price"), ("inf", "non-finite price"),
                                         ("-inf", "non-finite price"), ("-12.5", "non-positive price")])
def test_bad_prices_beyond_what_ingest_may_drop(capsys, tmp_path, stocknet_dir, value, what):
    # 300 rows: ingest may drop max(2, 1%) = 3 such rows; 5 are a broken file
    data = csv_folder(tmp_path, stocknet_dir, edit=set_cells("Close", value, range(10, 15)))
    line = fails(capsys, features(data, tmp_path / "shards"), "MSFT.csv", f"5 rows with a {what}",
                 "more than ingest may drop", "column 'Close'", under=tmp_path)
    assert f"= {float(value)!r}" in line  # the value itself


def test_a_few_bad_prices_are_dropped_not_refused(capsys, tmp_path, stocknet_dir):
    """The other side of the limit: 3 bad rows of 300 are dropped, counted and reported."""
    data = csv_folder(tmp_path, stocknet_dir, edit=set_cells("Close", "nan", range(10, 13)))
    assert main([str(a) for a in features(data, tmp_path / "shards", "--quiet")]) == 0
    out = capsys.readouterr().out
    assert "dropped rows: nonfinite_price=3" in out
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["ingest"]["dropped"]["nonfinite_price"] == 3


def test_duplicate_dates_under_refuse(capsys, tmp_path, stocknet_dir):
    def dup(t, lines):
        if t == "MSFT":  # data rows 20 and 21 (file lines 21 and 22) share a date, with another volume
            cells = lines[20].split(",")
            cells[-1] = str(int(float(cells[-1])) + 22)
            lines[21] = ",".join(cells)
        return lines

    data = csv_folder(tmp_path, stocknet_dir, edit=dup)
    day = (data / "MSFT.csv").read_text().splitlines()[20].split(",")[0]
    fails(capsys, features(data, tmp_path / "shards", "data.on_duplicate=refuse"), "MSFT.csv",
          f"duplicate date {day}", "line 21", "line 22", "data.on_duplicate", under=tmp_path)


def test_single_class_in_the_train_split(capsys, tmp_path, stocknet_dir):
    # a fixed flat band of +-1000%: every label is 'flat'
    data = csv_folder(tmp_path, stocknet_dir)
    fails(capsys, features(data, tmp_path / "shards", "features.threshold_mode=fixed", "features.threshold=10"),
          "train split has a single class (flat)", "features.threshold", under=tmp_path)


def test_fewer_rows_than_the_sequence_window_in_the_data(capsys, tmp_path, stocknet_dir):
    data = csv_folder(tmp_path, stocknet_dir, rows=120)
    fails(capsys, features(data, tmp_path / "shards", "features.window=150"),
          "no ticker has at least", "AAPL: 120 rows", under=tmp_path)


def test_a_cross_sectional_label_on_data_with_too_few_stocks_on_every_date(capsys, tmp_path, stocknet_dir):
    data = csv_folder(tmp_path, stocknet_dir)  # two tickers: a cross-section of 2 on every date
    fails(capsys, features(data, tmp_path / "shards", "features.label=cs_rank"), data,
          "no date has 10 or more stocks", "features.min_cross_section", "the most on any date: 2", under=tmp_path)


# ---- bad options and config (fails before Ray starts) --------------------------------------


@pytest.mark.parametrize("flags, overrides", [(("--model", "lstmx"), ()), ((), ("model.name=lstmx",))],
                         ids=["--model", "model.name"])
def test_unknown_model_name(capsys, tmp_path, stocknet_dir, flags, overrides):
    data = csv_folder(tmp_path, stocknet_dir)
    fails(capsys, train(data, tmp_path, *overrides, flags=flags), "unknown model 'lstmx'", "did you mean 'lstm'",
          under=tmp_path)


@pytest.mark.parametrize("override, names", [
    ("train.lr=0", ["'train.lr'", "0.0", "expected > 0"]),
    ("train.lr=-0.001", ["'train.lr'", "-0.001", "expected > 0"]),
    ("train.batch_size=0", ["'train.batch_size'", ": 0 is invalid", "expected >= 1"]),
    ("train.btach_size=64", ["unknown config key 'train.btach_size'", "did you mean 'train.batch_size'?"]),
    ("trian.lr=0.01", ["unknown config key 'trian'", "did you mean 'train'?"]),
    # a metric that cannot score the target, both ways round
    ("features.label=cs_rank train.metric=val_accuracy",
     ["'train.metric'", "val_accuracy is a classification metric", "features.label=cs_rank is a regression target"]),
    ("train.metric=val_mse", ["'train.metric'", "val_mse is a regression metric",
                              "features.label=three_class is a class target"]),
    # the IC loss: a regression target, and whole dates in a batch (the cached data path only)
    ("train.loss=ic", ["'train.loss'", "ic needs a regression target", "features.label=three_class"]),
    ("features.label=cs_rank train.loss=ic train.cache_data=false",
     ["'train.loss'", "ic needs whole dates in every batch", "set train.cache_data=true"]),
])
def test_bad_training_config(capsys, tmp_path, stocknet_dir, override, names):
    data = csv_folder(tmp_path, stocknet_dir)
    fails(capsys, train(data, tmp_path, *override.split()), *names, under=tmp_path)


def test_cuda_asked_for_by_the_doctor_without_cuda(capsys, tmp_path, monkeypatch):
    no_cuda(monkeypatch)  # torch's CUDA probe says absent, on a CUDA box too
    fails(capsys, ["doctor", "--device", "cuda"], "device 'cuda'", "CUDA is not available", under=tmp_path)


# ---- object storage we cannot use (fails before Ray starts or anything is written) -------------
# The S3 server is the session's (conftest.py: moto on 127.0.0.1, reached through AWS_ENDPOINT_URL).


def test_object_storage_without_credentials(capsys, tmp_path, stocknet_dir, monkeypatch):
    """moto accepts any key, so this is the product's own check of the AWS credential chain."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    data = csv_folder(tmp_path, stocknet_dir)
    fails(capsys, train(data, tmp_path, "storage.path=s3://runs/train"), "s3://runs/train", "no AWS credentials",
          under=tmp_path)


@pytest.mark.slow
def test_object_storage_endpoint_that_does_not_answer(capsys, tmp_path, stocknet_dir, monkeypatch):
    import socket
    import time

    data = csv_folder(tmp_path, stocknet_dir)
    with socket.socket() as silent:  # takes connections into its backlog and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        started = time.monotonic()
        fails(capsys, features(data, "s3://shards/stocks"), "s3://shards/stocks", "cannot reach object storage",
              endpoint, under=tmp_path)
        assert time.monotonic() - started < 30


def test_object_storage_bucket_that_does_not_exist(capsys, tmp_path, stocknet_dir, s3):
    data = csv_folder(tmp_path, stocknet_dir)
    fails(capsys, train(data, tmp_path, "storage.models_dir=s3://no-such-bucket/models"),
          "s3://no-such-bucket/models", "bucket 'no-such-bucket' does not exist", under=tmp_path)


def test_storage_uri_with_keys_in_it(capsys, tmp_path, stocknet_dir):
    data = csv_folder(tmp_path, stocknet_dir)
    line = fails(capsys, train(data, tmp_path, "storage.path=s3://AKIAEXAMPLEKEY:hunter2secret@runs/train"),
                 "s3://***@runs/train", "must not hold credentials", under=tmp_path)
    assert "hunter2secret" not in line and "AKIAEXAMPLEKEY" not in line


# ---- cases that need Ray (the session's) -------------------------------------------------------


@pytest.fixture(scope="module")
def ohlcv(stocknet_dir, tmp_path_factory) -> Path:
    """Two whole stocknet tickers (about 1,250 days each): the data of the module's model."""
    folder = tmp_path_factory.mktemp("bad-input-data") / "ohlcv"
    folder.mkdir()
    for t in TICKERS:
        shutil.copy(stocknet_dir / f"{t}.csv", folder / f"{t}.csv")
    return folder


@pytest.fixture(scope="module")
def shards(ohlcv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-input-shards") / "shards"
    assert main(["features", "--quiet", "--data", str(ohlcv), "--out", str(out)]) == 0
    return out


@pytest.fixture
def model_dir(stock_model) -> Path:
    """A saved model (the session's: conftest.py), which these tests only read or copy."""
    return stock_model


def copy_shards(shards: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    return copy


def test_fewer_rows_than_the_sequence_window_in_training(ray_session, capsys, tmp_path, shards):
    data = copy_shards(shards, tmp_path)
    per_ticker = json.loads((data / "manifest.json").read_text())["rows"]["train"] // len(TICKERS)
    window = per_ticker + 50
    fails(capsys, train(data, tmp_path, f"features.window={window}", flags=("--model", "lstm")),
          f"'features.window': {window} bars", "no full sequence window", under=tmp_path)


@pytest.mark.parametrize("damage", ["truncated-train", "corrupt-val", "missing-test"])
def test_corrupt_or_truncated_parquet_shard(ray_session, capsys, tmp_path, shards, damage):
    data = copy_shards(shards, tmp_path)
    split = damage.split("-")[1]
    part = data / f"split={split}" / "part-00000.parquet"
    raw = bytearray(part.read_bytes())
    if damage == "truncated-train":  # an interrupted copy
        part.write_bytes(bytes(raw[: len(raw) // 2]))
        names = [f"split={split}/part-00000.parquet", "corrupt or truncated Parquet shard"]
    elif damage == "corrupt-val":  # garbage over the data pages; the footer is intact
        raw[200:3000] = random.Random(1).randbytes(2800)
        part.write_bytes(bytes(raw))
        names = [f"split={split}/part-00000.parquet", "corrupt or truncated Parquet shard"]
    else:  # a shard gone that the manifest lists
        part.unlink()
        names = [f"split={split}/part-00000.parquet", "listed in manifest.json but missing"]
    fails(capsys, train(data, tmp_path), *names, under=tmp_path)


def test_a_shard_without_a_column(ray_session, capsys, tmp_path, shards):
    """A shard rewritten without its date column (the user's case of 2026-12-02: a raw KeyError from
    the Train worker before): one line naming the file and the column, before any training."""
    import pyarrow.parquet as pq

    data = copy_shards(shards, tmp_path)
    part = data / "split=train" / "part-00000.parquet"
    pq.write_table(pq.read_table(part).drop(["date"]), part)
    line = fails(capsys, train(data, tmp_path), f"{part}: no column 'date'",
                 "(the manifest's shards hold date, ticker, label, fwd_ret and its 16 features", under=tmp_path)
    assert "KeyError" not in line


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """Python's temporary folders (predict stages its inputs there) under tmp_path, to be checked too."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("command", ["train-ohlcv", "train-shards", "predict"])
def test_device_cuda_without_cuda(ray_session, capsys, tmp_path, stocknet_dir, shards, command, request, private_tmp,
                                  monkeypatch):
    import ray

    if command == "train-ohlcv":
        argv = train(csv_folder(tmp_path, stocknet_dir), tmp_path, flags=("--device", "cuda"))
    elif command == "train-shards":
        argv = train(copy_shards(shards, tmp_path), tmp_path, flags=("--device", "cuda"))
    else:
        model = request.getfixturevalue("model_dir")
        data = csv_folder(tmp_path, stocknet_dir)
        argv = ["predict", "--device", "cuda", "--model", model, "--data", data, "--out", tmp_path / "signals.parquet"]
    # neither this process nor the Ray cluster has CUDA, whatever the host has: torch's CUDA probe
    # patched to absent, and the planners (train, predict) shown the session's resources without
    # GPUs (Ray counts a host's CUDA GPUs, and a Mac's Apple GPU, as "GPU")
    no_cuda(monkeypatch)
    cluster = ray.cluster_resources
    monkeypatch.setattr(ray, "cluster_resources", lambda: {k: v for k, v in cluster().items() if k != "GPU"})
    before = tree(tmp_path)
    fails(capsys, argv, "device 'cuda'", "no node of the Ray cluster has a CUDA GPU")
    left = sorted(set(tree(tmp_path)) - set(before))
    assert not left, f"left behind: {left}"  # the plan refuses the device before any shard is built


def test_checkpoint_from_a_different_feature_set(capsys, tmp_path, model_dir, ohlcv, private_tmp):
    """Weights of the same model kind built for another feature set (3 features) in a copy of the
    saved model: predict refuses them, naming the weights file and the feature count."""
    import torch

    from alchemetric_ray.config import RunConfig
    from alchemetric_ray.data.features import resolve_feature_names
    from alchemetric_ray.models import build_model

    foreign = tmp_path / "model"
    shutil.copytree(model_dir, foreign)
    cfg = RunConfig.from_dict(json.loads((foreign / "config.json").read_text()))
    manifest = json.loads((foreign / "manifest.json").read_text())
    other = resolve_feature_names(["ret_1", "ret_5", "rsi_14"])
    assert other != manifest["features"]
    net = build_model(cfg.model, len(other), len(manifest["label"]["classes"]), window=cfg.features.window)
    torch.save({"model": net.state_dict()}, foreign / "weights.pt")
    fails(capsys, ["predict", "--model", foreign, "--data", ohlcv, "--out", tmp_path / "signals.parquet"],
          "weights.pt", "weights do not fit model", f"with {len(manifest['features'])} features", "size mismatch",
          under=tmp_path)


@pytest.mark.parametrize("where", ["signals.parquet", "sub/signals.parquet"])
def test_signals_output_inside_the_input_folder(capsys, tmp_path, stocknet_dir, model_dir, where, private_tmp):
    data = csv_folder(tmp_path, stocknet_dir)
    out = data / where
    fails(capsys, ["predict", "--model", model_dir, "--data", data, "--out", out],
          f"signals output {out} is inside the input folder {data}", under=tmp_path)


def test_ic_loss_with_a_batch_smaller_than_a_dates_cross_section(ray_session, capsys, tmp_path):
    shards = tmp_path / "cs-shards"
    assert main(["features", "--out", str(shards), "data.source=synthetic", "data.synthetic_tickers=12",
                 "data.synthetic_days=200", "features.label=cs_rank"]) == 0
    fails(capsys, train(shards, tmp_path, "features.label=cs_rank", "train.loss=ic", "train.batch_size=8"),
          "'train.batch_size': 8 rows is smaller than a date's cross-section (12 stocks", "IC loss",
          under=tmp_path)


def test_models_dir_not_writable(ray_session, capsys, tmp_path, shards):
    """The model cannot be saved: one error naming the models directory before any training, and
    no model folder, staging folder or run results anywhere."""
    data = copy_shards(shards, tmp_path)
    if os.geteuid() == 0:  # root writes into a 0o555 folder; nobody can create a folder under a file
        blocker = tmp_path / "models.txt"
        blocker.write_text("a regular file where the models directory should be\n")
        models = blocker / "models"
    else:
        blocker = tmp_path / "readonly"
        blocker.mkdir()
        blocker.chmod(0o555)
        models = blocker / "models"
    try:
        argv = [*train(data, tmp_path, f"storage.models_dir={models}", "storage.name=small")]
        fails(capsys, argv, f"models directory {models}", f"{blocker} is not a writable folder")
    finally:
        if blocker.is_dir():
            blocker.chmod(0o755)
    assert not models.exists()
    if blocker.is_dir():
        assert list(blocker.iterdir()) == []
    # refused before training: nothing beside the inputs, not even the run's results
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["shards", blocker.name])
