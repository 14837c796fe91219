"""A full disk is one line (``fsutil.DiskFullError``), never torch's RuntimeError, and leaves nothing
half-written: the files' free space is checked before writing, a real ENOSPC during the write is
caught too, the temporary file goes, and an old file stays as it was.

Two ways to fill a disk: ``shutil.disk_usage`` reporting little free space or a write that raises
ENOSPC (in Python), and a real 256 KiB tmpfs (where this machine lets us mount one, as root)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import alchemetric_ray.fsutil as fsutil
from alchemetric_ray.artifacts.checkpoint import CheckpointMeta, LoopState, checkpoint_problem, save_checkpoint
from alchemetric_ray.artifacts.export import (
    MIN_EXPORT_BYTES,
    check_models_dir,
    estimated_export_bytes,
    export_model,
    load_model,
)
from alchemetric_ray.cli import main
from alchemetric_ray.config import load_config
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.shards import build_shards
from alchemetric_ray.errors import DiskFullError, UserError
from alchemetric_ray.fsutil import atomic_torch_save, atomic_write_json, atomic_write_text
from alchemetric_ray.outputs import MARK

TINY_DISK = "256k"
SYN = ["data.source=synthetic", "data.synthetic_tickers=6", "data.synthetic_days=400"]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    assert isinstance(exc, UserError)
    return text


def leftovers(folder: Path) -> list[str]:
    """Hidden files and folders (the writers' temporary ``.name.tmp-*``) under ``folder``; an output's
    mark (``outputs.MARK``) is no leftover."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*") if p.name != MARK)


def _usage(free: int):
    """``shutil.disk_usage`` of a 1 GB disk with ``free`` bytes left."""
    return lambda path: shutil._ntuple_diskusage(10**9, 10**9 - free, free)


# ---- in Python: little free space reported, or ENOSPC from the write ----------------------------------


def test_little_free_space_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    target = tmp_path / "models" / "alchemetric" / "weights.pt"
    target.parent.mkdir(parents=True)
    atomic_torch_save({"w": torch.ones(4)}, target)
    before = target.read_bytes()
    monkeypatch.setattr(shutil, "disk_usage", _usage(400_000))
    with pytest.raises(DiskFullError) as err:
        atomic_torch_save({"w": torch.zeros(3_000_000)}, target)  # 12 MB of float32
    line = one_line(err.value)
    assert re.fullmatch(rf"no space left for {re.escape(str(target))}: 12\.\d MB needed, 400\.0 kB free in "
                        rf"{re.escape(str(target.parent))}", line), line
    assert target.read_bytes() == before and leftovers(tmp_path) == []

    with pytest.raises(DiskFullError, match=r"no space left for .*config\.json: 5\d\d\.\d kB needed, 400\.0 kB free"):
        atomic_write_json(target.parent / "config.json", {"x": "y" * 500_000})
    assert not (target.parent / "config.json").exists() and leftovers(tmp_path) == []


def _enospc_after(fraction: float):
    """A low-level write that gets ``fraction`` of the bytes onto the disk, then finds it full."""
    def write_all(fd: int, data: memoryview) -> None:
        os.write(fd, data[: int(len(data) * fraction)])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_all


@pytest.mark.parametrize("what", ["torch", "json", "text"])
def test_enospc_during_the_write_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch, what):
    target = tmp_path / {"torch": "state.pt", "json": "meta.json", "text": "model_card.md"}[what]
    write = {"torch": lambda: atomic_torch_save({"w": torch.arange(50_000.0)}, target),
             "json": lambda: atomic_write_json(target, {"rows": list(range(50_000))}),
             "text": lambda: atomic_write_text(target, "a line\n" * 50_000)}[what]
    target.write_bytes(b"the old file")
    monkeypatch.setattr(fsutil, "_write_all", _enospc_after(0.5))
    with pytest.raises(DiskFullError) as err:
        write()
    line = one_line(err.value)
    assert line.startswith(f"no space left for {target}: ") and f"free in {tmp_path}" in line, line
    assert target.read_bytes() == b"the old file" and leftovers(tmp_path) == []


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    def broken(fd, data):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fsutil, "_write_all", broken)
    with pytest.raises(OSError) as err:
        atomic_write_json(tmp_path / "x.json", {})
    assert not isinstance(err.value, DiskFullError) and err.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_a_written_file_reports_its_size_and_sha256(tmp_path):
    path = tmp_path / "state.pt"
    written = atomic_torch_save({"w": torch.arange(1000.0)}, path)
    data = path.read_bytes()
    assert written.size == len(data) and written.sha256 == hashlib.sha256(data).hexdigest()
    assert written.as_dict() == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(1000.0))


def test_models_dir_without_room_is_refused_before_training(tmp_path, monkeypatch):
    models = tmp_path / "models"  # not there yet: its nearest folder's disk counts
    check_models_dir(models)
    monkeypatch.setattr(shutil, "disk_usage", _usage(300_000))
    with pytest.raises(DiskFullError) as err:
        check_models_dir(models)
    assert one_line(err.value) == (f"no space left for the model in models directory {models}: 1.1 MB needed, "
                                   f"300.0 kB free in {tmp_path}")
    check_models_dir(models, need=100_000)  # a known small model fits
    with pytest.raises(DiskFullError, match=r"5\.1 MB needed, 300\.0 kB free"):
        check_models_dir(models, need=5_000_000)
    assert not models.exists()


# ---- a real full disk: a 256 KiB tmpfs --------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path) -> Path:
    """A 256 KiB tmpfs mounted for the test (root only), unmounted however it ends."""
    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs is not allowed here: not root")
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TINY_DISK}", "tmpfs", str(mount)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"mounting a tmpfs is not allowed here: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {(proc.stderr or proc.stdout).strip()[:200]}")
    try:
        assert shutil.disk_usage(mount).total <= 256 * 1024
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_checkpoint_bigger_than_the_disk(tiny_disk):
    ckpt = tiny_disk / "epoch-0000"
    save_checkpoint(ckpt, {"model": {"w": torch.ones(3)}}, {"epoch": 0})
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    assert checkpoint_problem(ckpt) is None

    with pytest.raises(DiskFullError) as err:  # 1.2 MB on a 256 KiB disk: refused before either file
        save_checkpoint(ckpt, {"model": {"w": torch.zeros(300_000)}}, {"epoch": 1})
    line = one_line(err.value)
    assert re.fullmatch(rf"no space left for {re.escape(str(ckpt / 'state.pt'))}: 1\.\d MB needed, \d+\.\d kB free "
                        rf"in {re.escape(str(ckpt))}", line), line
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before and checkpoint_problem(ckpt) is None


def test_the_kernels_enospc_is_the_same_one_line(tiny_disk, monkeypatch):
    """Without the free-space check the write itself meets the full disk: Python's OSError(ENOSPC),
    turned into the same line (torch.save onto the disk would raise a RuntimeError of varying text)."""
    monkeypatch.setattr(fsutil, "check_free_space", lambda *args, **kwargs: None)
    target = tiny_disk / "weights.pt"
    atomic_torch_save({"w": torch.ones(8)}, target)
    before = target.read_bytes()
    with pytest.raises(DiskFullError) as err:
        atomic_torch_save({"w": torch.zeros(300_000)}, target)
    line = one_line(err.value)
    assert re.fullmatch(rf"no space left for {re.escape(str(target))}: 1\.2 MB needed, \d+\.\d kB free in "
                        rf"{re.escape(str(tiny_disk))}", line), line
    assert target.read_bytes() == before and leftovers(tiny_disk) == []
    assert shutil.disk_usage(tiny_disk).free > 200 * 1024  # the temporary file's blocks came back


@pytest.fixture(scope="module")
def syn_shards(tmp_path_factory) -> Path:
    return build_shards(load_config(None, SYN), tmp_path_factory.mktemp("disk-full") / "shards").out


def _checkpoint(folder: Path, cfg, manifest: Manifest) -> Path:
    """A training checkpoint of an untrained model (what export_model reads), without Ray."""
    from alchemetric_ray.models import build_model

    model = build_model(cfg.model, len(manifest.features), manifest.outputs, window=cfg.features.window)
    meta = CheckpointMeta(config=cfg.to_dict(), manifest=manifest, device={"device": "cpu", "reason": "test"},
                          precision={"mode": "fp32", "reason": "test"}, plan={"num_workers": 1}, world_size=1,
                          environment={"torch": torch.__version__, "ray": "-", "git_commit": None})
    state = LoopState(epoch=0, best=0.5, history=[{"epoch": 0, "val_accuracy": 0.5}])
    save_checkpoint(folder, {"model": model.state_dict()}, meta.at(state, {"val_accuracy": 0.5}).to_dict())
    return folder


@pytest.mark.slow
def test_an_export_bigger_than_the_disk_and_the_same_export_elsewhere(tiny_disk, tmp_path, syn_shards):
    manifest = Manifest.read(syn_shards)
    overrides = [*SYN, "model.hidden=512", "storage.name=big"]
    full = load_config(None, [*overrides, f"storage.models_dir={tiny_disk / 'models'}"])
    ckpt = _checkpoint(tmp_path / "ckpt", full, manifest)
    weights = sum(t.numel() * t.element_size() for t in torch.load(ckpt / "state.pt")["model"].values())
    assert weights > 1_000_000 and estimated_export_bytes(full, manifest) > weights

    with pytest.raises(DiskFullError) as err:
        check_models_dir(full.storage.models_dir)  # before training: the 1 MiB floor does not fit either
    assert "1.1 MB needed" in one_line(err.value) and MIN_EXPORT_BYTES == 1 << 20
    with pytest.raises(DiskFullError) as err:
        export_model(ckpt, full, syn_shards)
    line = one_line(err.value)
    assert re.fullmatch(rf"no space left for the model in models directory {re.escape(str(tiny_disk / 'models'))}: "
                        rf"1\.\d MB needed, \d+\.\d kB free in {re.escape(str(tiny_disk))}", line), line
    assert [p.name for p in tiny_disk.iterdir()] == []  # no stage, no half a model

    roomy = load_config(None, [*overrides, f"storage.models_dir={tmp_path / 'models'}"])
    target = export_model(ckpt, roomy, syn_shards)
    assert sorted(p.name for p in Path(target).iterdir()) == sorted(
        ["weights.pt", "config.json", "manifest.json", "metrics.json", "meta.json", "model_card.md", "trials.json",
         ".alchemetric-ray.json"])  # the mark: a model folder of ours, which a later export may replace
    assert json.loads((Path(target) / "manifest.json").read_text()) == manifest.to_dict()
    loaded = load_model(target)
    saved = torch.load(ckpt / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(v, saved[k]) for k, v in loaded.model.state_dict().items())
    assert leftovers(tmp_path / "models") == []


def test_train_with_a_full_models_disk_is_one_line_before_ray_starts(tiny_disk, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    models = tiny_disk / "models"
    capsys.readouterr()
    rc = main(["train", *SYN, f"storage.path={tmp_path / 'results'}", f"storage.models_dir={models}",
               "train.epochs=1"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        rf"alchemetric-ray train: error: no space left for the model in models directory {re.escape(str(models))}: "
        rf"1\.1 MB needed, \d+\.\d kB free in {re.escape(str(tiny_disk))}", lines[0]), err
    assert not (tmp_path / "results").exists() and list(tiny_disk.iterdir()) == []
