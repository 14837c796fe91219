"""One way to write a folder: ``fsutil.staged_dir`` swaps in a finished folder or leaves no trace,
on a local disk and on object storage (``pyarrow.fs``); and the names of runs and sweeps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pyarrow import fs
from pyarrow._fs import _MockFileSystem

from alchemetric_ray.config import load_config
from alchemetric_ray.errors import StorageError
from alchemetric_ray.fsutil import staged_dir
from alchemetric_ray.placement.session import run_name
from alchemetric_ray.signals.predict import direction_score
from alchemetric_ray.storage import locate


class Boom(RuntimeError):
    pass


def _old_folder(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "a.txt").write_text("old")
    return target


@pytest.mark.parametrize("as_uri", [False, True])
def test_a_local_folder_is_swapped_in_whole(tmp_path, as_uri):
    target = _old_folder(tmp_path)
    with staged_dir(f"file://{target}" if as_uri else target) as stage:
        assert stage.parent == tmp_path and stage.name.startswith(".out.tmp-")  # beside it: one rename
        (stage / "a.txt").write_text("new")
        (stage / "b.txt").write_text("new")
        assert (target / "a.txt").read_text() == "old"  # nothing changes until the block ends
    assert sorted(p.name for p in target.iterdir()) == ["a.txt", "b.txt"]
    assert (target / "a.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failed_build_leaves_the_old_folder_and_no_stage(tmp_path):
    target = _old_folder(tmp_path)
    with pytest.raises(Boom):
        with staged_dir(target) as stage:
            (stage / "a.txt").write_text("half")
            raise Boom
    assert (target / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(Boom):
        with staged_dir(tmp_path / "new" / "deeper"):
            raise Boom
    assert not list((tmp_path / "new").iterdir())  # the parent may be made, never a half folder


def _files(filesystem, base: str) -> dict[str, str]:
    out = {}
    for info in filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True)):
        if info.type == fs.FileType.File:
            with filesystem.open_input_stream(info.path) as fh:
                out[info.path] = fh.read().decode()
    return out


def _put(filesystem, path: str, text: str) -> None:
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as fh:
        fh.write(text.encode())


class _NoFolderMoves(fs.FileSystemHandler):
    """An object store's rules over an in-memory file system: files move, folders do not."""

    def __init__(self):
        self.fs = _MockFileSystem()

    def move(self, src, dest):
        if self.fs.get_file_info(src).type == fs.FileType.Directory:
            raise NotImplementedError("object stores move files only")
        self.fs.move(src, dest)

    def get_type_name(self):
        return "no-folder-moves"

    def normalize_path(self, path):
        return path

    def equals(self, other):
        return self is other

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.fs.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.fs.delete_file(path)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


@pytest.mark.parametrize("store", ["mock", "no-folder-moves"])
def test_object_storage_gets_the_whole_folder_or_keeps_the_old_one(store):
    filesystem = _MockFileSystem() if store == "mock" else fs.PyFileSystem(_NoFolderMoves())
    _put(filesystem, "bucket/models/m/a.txt", "old")
    _put(filesystem, "bucket/models/m/gone.txt", "old")
    _put(filesystem, "bucket/models/other/a.txt", "other")
    with pytest.raises(Boom):
        with staged_dir("bucket/models/m", filesystem) as stage:
            (stage / "a.txt").write_text("half")
            raise Boom
    assert not stage.exists()  # the local stage is gone too
    assert _files(filesystem, "bucket") == {"bucket/models/m/a.txt": "old", "bucket/models/m/gone.txt": "old",
                                            "bucket/models/other/a.txt": "other"}
    with staged_dir("bucket/models/m", filesystem) as stage:
        (stage / "a.txt").write_text("new")
        (stage / "sub").mkdir()
        (stage / "sub" / "b.txt").write_text("new")
    assert not stage.exists()
    assert _files(filesystem, "bucket") == {"bucket/models/m/a.txt": "new", "bucket/models/m/sub/b.txt": "new",
                                            "bucket/models/other/a.txt": "other"}
    names = [i.base_name for i in filesystem.get_file_info(fs.FileSelector("bucket/models"))]
    assert sorted(names) == ["m", "other"]  # no hidden upload prefix left behind


def test_subfolders_local_and_uri(tmp_path):
    for name in ("m-1", "m-2", "sweep-m-1"):
        (tmp_path / name).mkdir()
    (tmp_path / "m-3").write_text("a file, not a run")
    assert locate(tmp_path).listing("m-*", folders=True) == ["m-1", "m-2"]
    assert locate(f"file://{tmp_path}").listing("sweep-m-*", folders=True) == ["sweep-m-1"]
    assert locate(tmp_path / "missing").listing("m-*", folders=True) == []


def test_one_name_function_for_runs_and_sweeps(tmp_path):
    cfg = load_config(None, [f"storage.path={tmp_path}", "storage.name=m"])
    assert run_name(cfg).startswith("m-") and run_name(cfg, sweep=True).startswith("sweep-m-")
    resume = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, resume=True))
    with pytest.raises(StorageError, match="no earlier run named m-"):
        run_name(resume)
    with pytest.raises(StorageError, match="no earlier sweep named sweep-m-"):
        run_name(resume, sweep=True)
    for name in ("m-20250101-000000", "m-20250102-000000", "sweep-m-20250101-000000"):
        (tmp_path / name).mkdir()
    assert run_name(resume) == "m-20250102-000000"
    assert run_name(resume, sweep=True) == "sweep-m-20250101-000000"
    given = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, run="mine", resume=True))
    assert run_name(given) == run_name(given, sweep=True) == "mine"


def test_the_score_is_p_up_minus_p_down():
    proba = np.array([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    assert np.allclose(direction_score(proba, ["down", "flat", "up"]), [0.3, -0.5])
    assert np.allclose(direction_score(proba[:, [0, 2]], ["down", "up"]), [0.3, -0.5])


def test_object_storage_puts_the_last_files_in_place_after_all_others():
    """A manifest that lists a folder's files goes in after them: a reader that finds it finds them."""
    written: list[str] = []

    class Recording(_NoFolderMoves):
        def copy_file(self, src, dest):
            written.append(dest)
            super().copy_file(src, dest)

    filesystem = fs.PyFileSystem(Recording())
    with staged_dir("bucket/shards", filesystem, last=("manifest.json",)) as stage:
        for name in ("split=train/part-00000.parquet", "split=val/part-00000.parquet", "manifest.json", "z.txt"):
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(name)
    assert len(written) == 4 and written[-1] == "bucket/shards/manifest.json"
    assert _files(filesystem, "bucket")["bucket/shards/split=val/part-00000.parquet"] == "split=val/part-00000.parquet"
