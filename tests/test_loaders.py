"""Ray Data loaders over real shards: tabular and sequence batches, order, and a Train worker."""

import numpy as np
import pandas as pd
import pytest
import torch

from alchemetric_ray.data.loaders import (
    ShardReader,
    arrow_to_xy,
    build_datasets,
    collate_for,
    deterministic_context,
    make_windows,
)
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.shards import split_dir

WINDOW = 8


@pytest.fixture(scope="module")
def shards(stocknet_shards):
    return stocknet_shards("AAPL,MSFT,XOM,GE")


def _all_batches(ds, mode, features, **kw):
    return list(ds.iter_torch_batches(batch_size=256, collate_fn=collate_for(mode, features), **kw))


def test_tabular_batches_are_one_float_tensor(ray_session, shards):
    datasets, m = build_datasets(shards, "tabular", WINDOW)
    batches = _all_batches(datasets["train"], "tabular", m.features)
    x, y, date, fwd = (torch.cat([b[k] for b in batches]) for k in range(4))
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (m.rows["train"], 16)
    ref = pd.read_parquet(split_dir(shards, "train"))
    # each row's date (days since 1970) and forward return travel with it: what the IC metrics need
    by_key = ref.set_index(ref["date"].to_numpy().astype("datetime64[D]").astype(np.int64))["fwd_ret"]
    assert sorted(date.tolist()) == sorted(by_key.index.tolist())
    np.testing.assert_allclose(np.sort(fwd.numpy()), np.sort(ref["fwd_ret"].to_numpy()))
    # same multiset of rows as the Parquet files (order aside)
    np.testing.assert_allclose(np.sort(x[:, 0].numpy()), np.sort(ref[m.features[0]].to_numpy()))
    assert np.bincount(y.numpy()).tolist() == m.class_counts["train"]


def test_sequence_windows_never_cross_tickers(ray_session, shards):
    datasets, m = build_datasets(shards, "sequence", WINDOW, splits=("val",))
    ds = datasets["val"]
    ref = pd.read_parquet(split_dir(shards, "val")).sort_values(["ticker", "date"]).reset_index(drop=True)
    feats = m.features
    n_expected = sum(max(0, len(g) - WINDOW + 1) for _, g in ref.groupby("ticker"))
    rows = ds.take_all()
    assert len(rows) == n_expected
    for row in rows[:: max(1, len(rows) // 40)]:
        g = ref[ref["ticker"] == row["ticker"]].reset_index(drop=True)
        end = int(np.flatnonzero(g["date"].to_numpy() == np.datetime64(row["date"]))[0])
        assert end >= WINDOW - 1  # the whole window lies inside this ticker's rows of this split
        np.testing.assert_array_equal(row["x"], g.loc[end - WINDOW + 1: end, feats].to_numpy(dtype=np.float32))
        assert row["label"] == g.loc[end, "label"]
    x, y, date, fwd = _all_batches(ds, "sequence", feats)[0]
    assert x.shape[1:] == (WINDOW, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert date.dtype == torch.int64 and fwd.dtype == torch.float32 and len(date) == len(fwd) == len(y)


def test_make_windows_short_ticker_gives_nothing():
    group = {"date": np.arange(3), "ticker": np.array(["A"] * 3), "label": np.zeros(3), "fwd_ret": np.zeros(3),
             "f": np.arange(3.0)}
    out = make_windows(group, ["f"], 5)
    assert out["x"].shape == (0, 5, 1) and len(out["label"]) == 0


def test_deterministic_order_with_seeded_shuffle(ray_session, shards):
    from ray.data import DataContext

    ctx = DataContext.get_current()
    old = ctx.execution_options.preserve_order
    try:
        deterministic_context()
        runs = []
        for _ in range(2):
            datasets, m = build_datasets(shards, "tabular", WINDOW, splits=("train",))
            batches = _all_batches(datasets["train"], "tabular", m.features, local_shuffle_buffer_size=512,
                                   local_shuffle_seed=7)
            runs.append(torch.cat([b[1] for b in batches]))
        assert torch.equal(runs[0], runs[1])
        # sequence windows: built as each file is read, in the files' order (ticker, then date), with
        # no shuffle between tasks to reorder them and no sort
        windows, keys = [], []
        for _ in range(2):
            datasets, m = build_datasets(shards, "sequence", WINDOW, splits=("train",))
            windows.append(torch.cat([b[0] for b in _all_batches(datasets["train"], "sequence", m.features)]))
            rows = datasets["train"].select_columns(["ticker", "date"]).take_all()
            keys.append([(r["ticker"], r["date"]) for r in rows])
        assert windows[0].shape[0] > 0 and torch.equal(windows[0], windows[1])
        assert keys[0] == keys[1] == sorted(keys[0]) and len(set(keys[0])) == len(keys[0])
    finally:
        ctx.execution_options.preserve_order = old


@pytest.mark.parametrize("mode", ["tabular", "sequence"])
def test_shards_read_in_this_process_with_pyarrow_equal_ray_datas_ordered_read(ray_session, shards, mode):
    """A one-worker run that caches its shards reads them with pyarrow and no Ray (ShardReader):
    the same tensors, row for row, as Ray Data's ordered read through the same collate."""
    from ray.data import DataContext

    from alchemetric_ray.data.batches import read_all

    ctx = DataContext.get_current()
    old = ctx.execution_options.preserve_order
    try:
        deterministic_context()
        datasets, m = build_datasets(shards, mode, WINDOW)
        reader = ShardReader(shards, m, mode, WINDOW)
        for split in ("train", "val"):
            ours, ray_data = reader.rows(split), read_all(datasets[split], 256, collate_for(mode, m.features))
            assert len(ours[1]) > 0 and len(ours) == len(ray_data) == 4 and ours[0].is_contiguous()
            for a, b in zip(ours, ray_data):
                assert a.dtype == b.dtype and torch.equal(a, b)
            if mode == "tabular":
                assert len(ours[1]) == m.rows[split]
            else:  # a window per bar after each ticker's first WINDOW - 1
                assert ours[0].shape[1:] == (WINDOW, len(m.features))
    finally:
        ctx.execution_options.preserve_order = old


def test_a_ticker_cut_between_two_files_is_refused_for_windows(ray_session, shards, tmp_path):
    """Shards written before 2026-12-01 could cut a ticker between two files of a split; windows built
    a file at a time would silently lose that ticker's first windows in the second file.  Refused,
    naming the ticker and both files; rows (tabular models) need no whole tickers."""
    import json
    import shutil

    import pyarrow.parquet as pq

    from alchemetric_ray.data.manifest import MANIFEST
    from alchemetric_ray.errors import ShardError

    old = tmp_path / "old"
    shutil.copytree(shards, old)
    val = split_dir(old, "val")
    (only,) = sorted(val.glob("*.parquet"))
    table = pq.read_table(only)
    tickers = table.column("ticker").to_pylist()
    cut = tickers.count(tickers[0]) // 2  # the middle of the first ticker's rows
    assert cut > 0 and tickers[cut - 1] == tickers[cut]
    only.unlink()
    pq.write_table(table.slice(0, cut), val / "part-00000.parquet")
    pq.write_table(table.slice(cut), val / "part-00001.parquet")
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["files"]["val"] = ["split=val/part-00000.parquet", "split=val/part-00001.parquet"]
    (old / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError) as refused:
        build_datasets(old, "sequence", WINDOW, splits=("val",))
    assert str(refused.value) == (
        f"{val}: ticker '{tickers[cut]}' spans part-00000.parquet and part-00001.parquet, so its sequence windows "
        "would be cut; rebuild the shards with `alchemetric-ray features` (shards built since 2026-12-01 keep a "
        "ticker in one file)")
    datasets, _ = build_datasets(old, "tabular", WINDOW, splits=("val",))
    assert datasets["val"].count() == len(tickers)


def test_collate_matches_pyarrow_stack(shards):
    import pyarrow.parquet as pq

    m = Manifest.read(shards)
    table = pq.read_table(next(split_dir(shards, "test").glob("*.parquet")))
    x, y = arrow_to_xy(table, m.features)
    expect = np.column_stack([table.column(f).to_numpy() for f in m.features])
    np.testing.assert_array_equal(x.numpy(), expect)
    np.testing.assert_array_equal(y.numpy(), table.column("label").to_numpy())


def _count_loop(config):
    import ray.train

    from alchemetric_ray.data.loaders import collate_for

    seen = {}
    for mode in ("tabular", "sequence"):
        collate = collate_for(mode, config["features"])
        for split in ("train", "val"):
            n, shape = 0, None
            shard = ray.train.get_dataset_shard(f"{split}_{mode}")
            for x, y, _, _ in shard.iter_torch_batches(batch_size=128, collate_fn=collate):
                n += len(y)
                shape = list(x.shape[1:])
            seen[mode, split] = (n, shape)
    return seen


@pytest.mark.slow
def test_loaders_feed_a_ray_train_worker(ray_session, shards, tmp_path):
    """Both kinds of input through one real TorchTrainer worker: rows, and sequence windows."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    datasets = {}
    for mode in ("tabular", "sequence"):
        built, m = build_datasets(shards, mode, WINDOW)
        datasets.update({f"{split}_{mode}": ds for split, ds in built.items()})
    trainer = TorchTrainer(
        _count_loop,
        train_loop_config={"features": m.features},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        datasets=datasets,
        run_config=RunConfig(name="loaders", storage_path=str(tmp_path)),
    )
    seen = trainer.fit().return_value
    assert seen["tabular", "train"] == (m.rows["train"], [16])
    assert seen["sequence", "train"][1] == [WINDOW, 16] and 0 < seen["sequence", "train"][0] < m.rows["train"]
    assert seen["tabular", "val"][0] > 0 and seen["sequence", "val"][0] > 0


def test_streamed_epochs_shuffle_in_windows_and_see_every_row_once(ray_session, shards):
    """train.cache_data=false: the loop's own windowed shuffle over a real Ray Dataset."""
    from ray.data import DataContext

    from alchemetric_ray.data.batches import SHUFFLE_WINDOW, Batching, WorkerBatches

    ctx = DataContext.get_current()
    old = ctx.execution_options.preserve_order
    try:
        deterministic_context()
        datasets, m = build_datasets(shards, "tabular", WINDOW)
        collate = collate_for("tabular", m.features)
        batch = 32

        def epoch(seed, ep):
            data = WorkerBatches.streamed((datasets["train"], datasets["val"], collate), Batching(batch, seed),
                                          torch.device("cpu"))
            batches = list(data.train_batches(ep))
            assert data.rows_seen == m.rows["train"]
            return batches

        first = epoch(1, 0)
        assert all(len(b[1]) == batch for b in first[:-1]) and 0 < len(first[-1][1]) <= batch
        x = torch.cat([b[0] for b in first])
        unshuffled = torch.cat([b[0] for b in _all_batches(datasets["train"], "tabular", m.features)])
        # every row exactly once, but not in file order; no row leaves its window of SHUFFLE_WINDOW batches
        assert x.shape == unshuffled.shape == (m.rows["train"], 16)
        assert not torch.equal(x, unshuffled)

        def rows(t):
            return sorted(map(tuple, t.tolist()))

        assert rows(x) == rows(unshuffled)
        span = SHUFFLE_WINDOW * batch
        assert rows(x[:span]) == rows(unshuffled[:span]) and rows(x[span:2 * span]) == rows(unshuffled[span:2 * span])
        # the same (seed, epoch) gives the same batches; another epoch, another order
        assert torch.equal(x, torch.cat([b[0] for b in epoch(1, 0)]))
        assert not torch.equal(x, torch.cat([b[0] for b in epoch(1, 1)]))
    finally:
        ctx.execution_options.preserve_order = old
