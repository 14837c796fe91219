"""Feature shards end to end: manifest, dtypes, train-only normalization, atomic writes, errors."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from alchemetric_ray.bars.sources import open_source
from alchemetric_ray.config import load_config
from alchemetric_ray.data.manifest import MANIFEST, Manifest
from alchemetric_ray.data.shards import build_shards, split_dir
from alchemetric_ray.errors import ShardError

SYN = ["data.source=synthetic", "data.synthetic_tickers=6", "data.synthetic_days=400"]


@pytest.fixture(scope="module")
def syn_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("syn") / "shards"
    return build_shards(load_config(None, SYN), out)


def test_manifest_and_schema(syn_shards):
    m = Manifest.read(syn_shards.out)
    assert m.features == list(m.normalization["names"]) and len(m.features) == 16
    assert m.label["classes"] == ["down", "flat", "up"] and m.label["reach"] == 2
    assert m.splits["embargo"] == 2 and len(m.tickers) == 6 and len(m.input_hash) == 64
    assert sum(m.class_counts["train"]) == m.rows["train"] > 0
    schema = pq.read_schema(next(split_dir(syn_shards.out, "train").glob("*.parquet")))
    assert str(schema.field("ret_1").type) == "float" and str(schema.field("label").type) == "int64"
    assert {"date", "ticker", "fwd_ret", "label_end"} <= set(schema.names)


REGIME_DATES = pd.bdate_range("2015-01-01", periods=400)
REGIME_SWITCH = 280  # the first val date (features.train_end is the date before it)


def _regime_bars(n_tickers: int = 4):
    """OHLCV whose daily volatility jumps 5x (0.5% -> 2.5%) on the first val date."""
    rng = np.random.default_rng(7)
    sigma = np.where(np.arange(len(REGIME_DATES)) < REGIME_SWITCH, 0.005, 0.025)
    for k in range(n_tickers):
        ret = rng.standard_normal(len(sigma)) * sigma
        close = 100 * np.exp(np.cumsum(ret))
        open_ = close * np.exp(-ret + 0.2 * sigma * rng.standard_normal(len(sigma)))
        high = np.maximum(open_, close) * np.exp(np.abs(rng.standard_normal(len(sigma))) * sigma)
        low = np.minimum(open_, close) * np.exp(-np.abs(rng.standard_normal(len(sigma))) * sigma)
        volume = np.exp(13 + 0.3 * rng.standard_normal(len(sigma)))
        yield f"REG{k}", pd.DataFrame({"date": REGIME_DATES, "open": open_, "high": high, "low": low,
                                       "close": close, "volume": volume})


def test_normalization_fitted_on_train_only(tmp_path):
    """A volatility regime change between train and val: statistics fitted on any rows beyond the
    train split's (all rows, or val's own) differ from the train-only ones, in scale by ~5x."""
    from alchemetric_ray.data.labels import LabelSpec
    from alchemetric_ray.data.shards import feature_table

    cfg = load_config(None, [f"features.train_end={REGIME_DATES[REGIME_SWITCH - 1].date()}",
                             f"features.val_end={REGIME_DATES[339].date()}"])
    built = build_shards(cfg, tmp_path / "regime", bars=_regime_bars(), source_description="regime change")
    m = Manifest.read(built.out)
    assert m.splits["val_start"] == str(REGIME_DATES[REGIME_SWITCH].date())
    names = m.features
    train = pd.read_parquet(split_dir(built.out, "train"))
    feats = train[names].to_numpy(dtype=np.float64)
    # train is standardized (up to the +-10 clip); val/test reuse the train statistics
    assert np.abs(feats.mean(axis=0)).max() < 0.05
    assert np.abs(feats.std(axis=0) - 1).max() < 0.1
    raw_center = np.asarray(m.normalization["center"])
    assert np.isfinite(raw_center).all()
    # The fitted statistics are the mean and std (ddof 1) of the raw features of exactly the
    # train rows, recomputed here from the bars
    spec = LabelSpec.from_config(cfg.features)
    raw = pd.concat([feature_table(t, f, names, spec)[0] for t, f in _regime_bars()], ignore_index=True)
    raw["date"] = pd.to_datetime(raw["date"])
    train_keys = train[["ticker", "date"]].assign(date=lambda d: pd.to_datetime(d["date"]))
    rows = train_keys.merge(raw, on=["ticker", "date"], how="left")[names].to_numpy(dtype=np.float64)
    assert len(rows) == len(train) and np.isfinite(rows).all()
    np.testing.assert_allclose(m.normalization["center"], rows.mean(axis=0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(m.normalization["scale"], rows.std(axis=0, ddof=1), rtol=1e-6)
    # val is transformed with the calm train statistics, so its volatility features sit far above 0
    val = pd.read_parquet(split_dir(built.out, "val"))
    for name in ("vol_20", "atr_14", "hl_range"):
        assert val[name].mean() > 3, (name, float(val[name].mean()))
    assert val["ret_1"].std() > 3  # 5x the train volatility, in train standard deviations


def test_rows_never_cross_split_boundaries(syn_shards):
    m = Manifest.read(syn_shards.out)
    s = m.splits
    train = pd.read_parquet(split_dir(syn_shards.out, "train"), columns=["date", "label_end"])
    val = pd.read_parquet(split_dir(syn_shards.out, "val"), columns=["date", "label_end"])
    test = pd.read_parquet(split_dir(syn_shards.out, "test"), columns=["date", "label_end"])
    assert train["label_end"].max() < pd.Timestamp(s["val_start"])
    assert val["label_end"].max() < pd.Timestamp(s["test_start"])
    assert train["date"].max() < val["date"].min() < val["date"].max() < test["date"].min()


def test_same_input_same_hash_and_rows(tmp_path, syn_shards):
    again = build_shards(load_config(None, SYN), tmp_path / "again")
    assert again.manifest.input_hash == syn_shards.manifest.input_hash
    assert again.manifest.rows == syn_shards.manifest.rows


def test_staged_features_build_every_split_as_a_build_from_the_bars_does(tmp_path):
    """A walk-forward computes the features once (stage_features) and builds each refit's shards
    from them: the same shards as a build from the bars, for two different split plans, and the
    staged features are left as they were for the next one.  Other features are refused."""
    from alchemetric_ray.data.staging import stage_features

    cfg = load_config(None, SYN)
    staged = stage_features(cfg, tmp_path / "features")
    before = sorted(p.name for p in staged.folder.iterdir())
    calendar = staged.stats["calendar"]
    for k, cut in enumerate((150, 220)):
        fold = cfg.replace(f"features.train_end={calendar[cut]}", f"features.val_end={calendar[cut + 40]}")
        fresh = build_shards(fold, tmp_path / f"fresh-{k}").manifest
        reused = build_shards(fold, tmp_path / f"reused-{k}", staged=staged).manifest
        timings = {"created": None, "build": {**fresh.build, "seconds": None}}
        # the same shards; a build from staged features keeps no bars (nor tails) to append to, a build
        # from the bars lists what it keeps
        assert set(fresh.files) - set(reused.files) == {"bars", "tails"}
        shards_only = {"files": {s: fresh.files[s] for s in ("train", "val", "test")}}
        assert {**reused.__dict__, **timings} == {**fresh.__dict__, **timings, **shards_only}
        for split in ("train", "val", "test"):
            pd.testing.assert_frame_equal(pd.read_parquet(split_dir(tmp_path / f"reused-{k}", split)),
                                          pd.read_parquet(split_dir(tmp_path / f"fresh-{k}", split)))
    assert sorted(p.name for p in staged.folder.iterdir()) == before
    with pytest.raises(ShardError, match="staged features"):
        build_shards(cfg.replace("features.names=[ret_1,vol_5]"), tmp_path / "other", staged=staged)


def _ticker_runs(files) -> list[list[str]]:
    """Per file, its tickers in row order, each once (asserting a ticker's rows are contiguous)."""
    runs = []
    for f in files:
        tickers = pq.read_table(f, columns=["ticker"]).column(0).to_pylist()
        runs.append([t for i, t in enumerate(tickers) if i == 0 or t != tickers[i - 1]])
        assert len(set(runs[-1])) == len(runs[-1]), f
    return runs


def test_parts_and_row_groups_hold_many_tickers_in_order_and_never_cut_one(tmp_path, syn_shards, monkeypatch):
    """Tickers arrive ~250 train rows at a time; row groups are cut at a fixed size, files at up to
    a fixed size but never inside a ticker (a sequence model windows one file at a time): a part
    ends early when the next ticker does not fit, and a ticker longer than a part has one alone."""
    import alchemetric_ray.data.shards as shards_mod

    monkeypatch.setattr(shards_mod, "ROWS_PER_ROW_GROUP", 300)
    for per_file in (700, 100):
        monkeypatch.setattr(shards_mod, "ROWS_PER_FILE", per_file)
        small = build_shards(load_config(None, SYN), tmp_path / f"small-{per_file}")
        for split in ("train", "val", "test"):
            files = sorted(split_dir(small.out, split).glob("*.parquet"))
            metadata = [pq.ParquetFile(f).metadata for f in files]
            groups = [[meta.row_group(i).num_rows for i in range(meta.num_row_groups)] for meta in metadata]
            assert all(g[:-1] == [300] * (len(g) - 1) and 0 < g[-1] <= 300 for g in groups), groups
            runs = _ticker_runs(files)
            flat = [t for run in runs for t in run]
            assert len(flat) == len(set(flat)) == len(small.manifest.tickers)  # no ticker in two files
            rows = [sum(g) for g in groups]
            assert all(n <= per_file or len(run) == 1 for n, run in zip(rows, runs)), (rows, runs)
            whole = pd.read_parquet(split_dir(syn_shards.out, split))
            first_of_next = [int((whole["ticker"] == run[0]).sum()) for run in runs[1:]]
            # no part ends early: the next file's first ticker did not fit in it
            assert all(n + k > per_file for n, k in zip(rows, first_of_next)), (rows, first_of_next)
            # the same rows in the same order as the default sizes write them
            cut = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            pd.testing.assert_frame_equal(cut, whole)
            if per_file == 100 and split == "train":  # below a ticker's rows: each file holds one, whole
                assert max(rows) > 100 and all(len(run) == 1 for run in runs), (rows, runs)


def test_failure_midway_leaves_previous_output_untouched(tmp_path):
    out = tmp_path / "shards"
    cfg = load_config(None, SYN)
    build_shards(cfg, out)
    before = (out / MANIFEST).read_text()

    def exploding():
        for i, pair in enumerate(open_source(cfg.data).bars):
            if i == 3:
                raise RuntimeError("disk on fire")
            yield pair

    with pytest.raises(RuntimeError, match="disk on fire"):
        build_shards(cfg, out, bars=exploding(), source_description="x")
    assert (out / MANIFEST).read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]  # no temp folder left behind


def test_embargo_shorter_than_label_reach_is_refused(tmp_path):
    with pytest.raises(ShardError, match=r"'features.embargo': 1 is less than the label's reach \(2 bars\)"):
        build_shards(load_config(None, [*SYN, "features.embargo=1"]), tmp_path / "x")


def test_single_class_train_split_is_refused(tmp_path):
    cfg = load_config(None, [*SYN, "features.threshold_mode=fixed", "features.threshold=5.0"])
    with pytest.raises(ShardError, match=r"the train split has a single class \(flat\)"):
        build_shards(cfg, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_stocknet_folder_to_shards(stocknet_dir, tmp_path):
    out = tmp_path / "stocknet"
    s = build_shards(load_config(None, [f"data.path={stocknet_dir}", "data.source=files"]), out)
    m = s.manifest
    assert len(m.tickers) + len(m.skipped_tickers) == 88
    assert len(m.tickers) >= 80
    assert m.ingest["dropped"].get("empty_cell", 0) > 0  # PTR/REX/SNP have empty cells
    assert m.splits["train_start"] >= "2012-09-04" and m.splits["test_end"] <= "2017-09-01"
    assert all(m.rows[k] > 1000 for k in ("train", "val", "test"))


@pytest.mark.slow
def test_features_cli_on_stocknet_and_bad_input(stocknet_dir, tmp_path):
    cli = [sys.executable, "-m", "alchemetric_ray.cli", "features"]
    ok = subprocess.run([*cli, "--data", str(stocknet_dir), "--out", str(tmp_path / "s"),
                         "data.tickers=AAPL,MSFT,GOOG"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "wrote" in ok.stdout and "3 tickers" in ok.stdout
    assert json.loads((tmp_path / "s" / MANIFEST).read_text())["tickers"] == ["AAPL", "GOOG", "MSFT"]
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([*cli, "--data", str(empty), "--out", str(tmp_path / "t")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("alchemetric-ray features: error: ") and str(empty) in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()
    inside = subprocess.run([*cli, "--data", str(stocknet_dir), "--out", str(stocknet_dir / "shards")],
                            capture_output=True, text=True, timeout=120)
    assert inside.returncode == 2 and "inside the input data folder" in inside.stderr


# ---- a shard file without a column the readers need ------------------------------------------------


def _broken_copy(shards, tmp_path, split: str, edit) -> tuple:
    """A copy of the shard folder with one file of ``split`` rewritten by ``edit(table)``."""
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    manifest = Manifest.read(copy)
    part = copy / manifest.files[split][-1]
    pq.write_table(edit(pq.read_table(part)), part)
    return copy, manifest, part


@pytest.mark.parametrize("split, column", [("train", "date"), ("val", "ticker"), ("test", "fwd_ret"),
                                           ("train", "label"), ("val", "ret_5")])
def test_a_shard_without_a_column_is_refused_naming_the_file_and_the_column(syn_shards, tmp_path, split, column):
    from alchemetric_ray.data.loaders import check_shard_files

    copy, manifest, part = _broken_copy(syn_shards.out, tmp_path, split, lambda t: t.drop([column]))
    assert column in manifest.features + ["date", "ticker", "label", "fwd_ret"]
    with pytest.raises(ShardError) as err:
        check_shard_files(copy, manifest)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{part}: no column {column!r} (the manifest's shards hold date, "
                                                "ticker, label, fwd_ret and its 16 features ret_1, ret_5, "), line


def test_a_shard_with_a_column_of_another_type_is_refused(syn_shards, tmp_path):
    import pyarrow as pa
    import pyarrow.compute as pc

    from alchemetric_ray.data.loaders import check_shard_files

    def as_text(table):
        j = table.schema.get_field_index("ret_1")
        return table.set_column(j, "ret_1", pc.cast(table.column(j), pa.string()))

    copy, manifest, part = _broken_copy(syn_shards.out, tmp_path, "train", as_text)
    with pytest.raises(ShardError, match=rf"^{part}: column 'ret_1' is string, expected numeric$"):
        check_shard_files(copy, manifest)
    copy2, manifest, part = _broken_copy(syn_shards.out, tmp_path / "2", "val",
                                         lambda t: t.set_column(t.schema.get_field_index("label"), "label",
                                                                pc.cast(t.column("label"), pa.float64())))
    with pytest.raises(ShardError, match=rf"^{part}: column 'label' is double, expected an integer \(class ids\)$"):
        check_shard_files(copy2, manifest)


def test_extra_columns_and_the_label_end_are_not_required(syn_shards, tmp_path):
    import pyarrow as pa

    from alchemetric_ray.data.loaders import check_shard_files

    copy, manifest, _ = _broken_copy(syn_shards.out, tmp_path, "train",
                                     lambda t: t.drop(["label_end"]).append_column("note", pa.array(["x"] * len(t))))
    check_shard_files(copy, manifest)
