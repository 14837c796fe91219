"""The GPU data path on a machine without one: the device-cache decision from patched memory probes,
the pinned double-buffered staging with a patched pin, and the rule the plan states."""

import pytest
import torch

from alchemetric_ray.config import load_config
from alchemetric_ray.hardware.staging import (
    DEVICE,
    HOST,
    PINNED,
    BatchSource,
    DataPath,
    choose_data_path,
    gpu_sharers,
    nbytes,
)
from alchemetric_ray.placement.plan import plan_resources

MIB = 2**20
GPU = torch.device("cuda", 0)  # only ever handed to the decision, never used for a tensor


@pytest.fixture
def gpu_with_free(monkeypatch):
    """torch.cuda.mem_get_info reports ``free`` bytes (of 80 GiB) for the device asked about."""
    asked = []

    def make(free: int):
        def mem_get_info(device=None):
            asked.append(device)
            return free, 80 * 2**30
        monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
        return asked
    return make


@pytest.mark.parametrize("shard_mib, free_mib, fraction, sharers, kind", [
    (400, 1000, 0.5, 1, DEVICE),   # 400 <= 0.5 x 1000
    (500, 1000, 0.5, 1, DEVICE),   # at the bound
    (501, 1000, 0.5, 1, PINNED),
    (400, 1000, 0.5, 2, PINNED),   # two workers share the GPU: 250 MiB each
    (200, 1000, 0.5, 2, DEVICE),
    (10, 1000, 0.0, 1, PINNED),    # 0 = always staging
    (10, 1000, 1.0, 4, DEVICE),
])
def test_the_device_cache_is_chosen_when_the_shard_fits_a_share_of_free_memory(gpu_with_free, shard_mib, free_mib,
                                                                               fraction, sharers, kind):
    asked = gpu_with_free(free_mib * MIB)
    path = choose_data_path(GPU, cached=True, shard_bytes=shard_mib * MIB, fraction=fraction, sharers=sharers)
    assert path.kind == kind
    if fraction > 0:
        assert asked == [GPU]  # the free memory of this worker's own device
        budget = fraction * free_mib / sharers
        assert f"{shard_mib:,} MiB vs {fraction:g} x {free_mib:,} MiB free / {sharers} worker(s) = {budget:,.0f} MiB" \
            in path.reason
    else:
        assert asked == [] and path.reason == "train.device_cache_fraction=0"


def test_host_memory_everywhere_else(gpu_with_free):
    asked = gpu_with_free(10**12)
    cpu = torch.device("cpu")
    assert choose_data_path(cpu, cached=True, shard_bytes=1, fraction=0.5, sharers=1) == \
        DataPath(HOST, "cpu trains from host memory")
    assert choose_data_path(torch.device("mps"), cached=True, shard_bytes=1, fraction=0.5, sharers=1).kind == HOST
    assert choose_data_path(GPU, cached=False, shard_bytes=0, fraction=0.5, sharers=1) == \
        DataPath(HOST, "streamed from Ray Data")
    assert asked == []  # no probe for a path that never uses device memory
    unknown = choose_data_path(GPU, cached=True, shard_bytes=1, fraction=0.5, sharers=1, free_memory=lambda d: None)
    assert unknown == DataPath(PINNED, "the device's free memory is unknown")


@pytest.mark.parametrize("gpus_per_worker, sharers", [(1.0, 1), (2.0, 1), (0.5, 2), (0.25, 4), (0.3, 3), (0.0, 1)])
def test_workers_sharing_a_gpu(gpus_per_worker, sharers):
    assert gpu_sharers(gpus_per_worker) == sharers


def _columns(rows: int, window: int = 0):
    generator = torch.Generator().manual_seed(0)
    shape = (rows, window, 3) if window else (rows, 3)
    return (torch.randn(shape, generator=generator), torch.randint(0, 3, (rows,), generator=generator),
            torch.arange(rows) // 4, torch.randn(rows, generator=generator))


@pytest.mark.parametrize("window", [0, 5])
def test_pinned_staging_gathers_into_two_pinned_buffers_in_turn(window):
    cpu = torch.device("cpu")
    columns = _columns(100, window)
    pinned = []

    def pin(t):  # pin_memory() raises where there is no accelerator: record what would be pinned
        pinned.append(t)
        return t

    source = BatchSource(columns, cpu, DataPath(PINNED, "test"), max_rows=16, pin=pin)
    assert len(pinned) == 2 * len(columns)  # two buffers per column, and nothing else
    assert [tuple(t.shape) for t in pinned[:4]] == [(16, *c.shape[1:]) for c in columns]
    buffers = [pinned[:4], pinned[4:]]
    order = torch.randperm(100, generator=torch.Generator().manual_seed(1))
    for step, start in enumerate(range(0, 100, 16)):
        idx = order[start:start + 16]
        batch = source.take(idx)
        for got, column, buffer in zip(batch, columns, buffers[step % 2]):
            assert torch.equal(got, column[idx])  # the same rows as plain indexing
            assert got.data_ptr() == buffer.data_ptr()  # written in place by index_select(out=...)
    span = source.span(90, 100)
    assert all(torch.equal(got, column[90:100]) for got, column in zip(span, columns))
    with pytest.raises(ValueError, match="a batch of 17 rows is larger than the staging buffers"):
        source.take(torch.arange(17))


def test_a_staged_batch_survives_the_next_gather():
    """Double buffering: batch k is intact while batch k+1 is gathered (the GPU may still read it)."""
    cpu = torch.device("cpu")
    columns = _columns(64)
    source = BatchSource(columns, cpu, DataPath(PINNED, "test"), max_rows=8, pin=lambda t: t)
    first = [t.clone() for t in source.take(torch.arange(0, 8))]
    kept = source.take(torch.arange(8, 16))
    source.take(torch.arange(16, 24))  # reuses the first buffer
    assert all(torch.equal(t, c[8:16]) for t, c in zip(kept, columns))
    assert all(torch.equal(t, c[0:8]) for t, c in zip(first, columns))


def test_the_device_and_host_paths_index_like_plain_tensors():
    cpu = torch.device("cpu")
    columns = _columns(50, 4)
    idx = torch.tensor([7, 3, 3, 49, 0])
    for kind in (DEVICE, HOST):
        source = BatchSource(columns, cpu, DataPath(kind, "test"), max_rows=8, pin=None)
        assert source.rows == 50
        assert all(torch.equal(got, c[idx]) for got, c in zip(source.take(idx), columns))
        assert all(torch.equal(got, c[10:20]) for got, c in zip(source.span(10, 20), columns))
    assert nbytes(columns) == 50 * 4 * 3 * 4 + 50 * 8 + 50 * 8 + 50 * 4


@pytest.mark.parametrize("args, line", [
    (["device.name=cuda"], "the cached shard on the GPU when it needs at most 0.5 x the GPU's free memory / "
                           "1 worker(s) per GPU, else pinned staging"),
    (["device.name=cuda", "scaling.gpus_per_worker=0.5", "train.device_cache_fraction=0.8"],
     "at most 0.8 x the GPU's free memory / 2 worker(s) per GPU"),
    (["device.name=cuda", "train.device_cache_fraction=0"], "pinned staging: train.device_cache_fraction=0"),
    (["device.name=cuda", "train.cache_data=false"], "streamed from Ray Data"),
    (["device.name=cpu"], "the cached shard stays in host memory"),
])
def test_the_plan_says_which_data_path_the_workers_take(args, line):
    plan = plan_resources(load_config(None, args), {"CPU": 16.0, "GPU": 2.0})
    assert line in plan.reasons.data_path
    assert f"data path        {plan.reasons.data_path}" in plan.describe()


def test_a_fraction_outside_0_1_is_one_line():
    from alchemetric_ray.errors import ConfigError

    expected = r"^config 'train.device_cache_fraction': 1.5 is invalid, expected in \[0, 1\]$"
    with pytest.raises(ConfigError, match=expected):
        load_config(None, ["train.device_cache_fraction=1.5"])
