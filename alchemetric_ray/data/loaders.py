"""Ray Data loaders over the feature shards, in two modes.

* tabular: each batch is one float32 tensor (batch, n_features) plus the labels; all feature
  columns are stacked in one step per Arrow batch (:class:`TabularCollate`), not per column
  through a dict of tensors.
* sequence: windows of the last ``window`` bars of one ticker, (batch, window, n_features),
  built by the task that reads a file (:func:`read_windows`): no ticker spans two files of a split
  (data/shards.py writes them so), so windows need no shuffle across files and a streamed epoch
  costs a read and a window build per file.  A window never crosses tickers, and each split is
  its own dataset, so a window never crosses a split boundary either.

Every batch is ``(x, y, date, fwd)``: features, label (int64 class ids, or float32 for a
regression target), the row's date (int64 days since 1970) and its forward return (float32).  The
date and the forward return are what the signal metrics (IC, rank IC per date) and a per-date loss
need; the step itself reads ``x`` and ``y``.

Reproducible order when asked (``train.deterministic``): the trainer turns on Ray Data's
``preserve_order`` (rows, and windows, then come in the files' order: ticker, then date), and the
worker shuffles with a seeded generator.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import numpy as np
import pyarrow as pa
import torch
from ray.data.collate_fn import ArrowBatchCollateFn, NumpyBatchCollateFn

from alchemetric_ray.data.manifest import MANIFEST, Manifest
from alchemetric_ray.data.shards import file_chains, split_files
from alchemetric_ray.errors import ShardError
from alchemetric_ray.storage import Location, locate


def read_split(shards: str | Path | Location, split: str, *, columns: list[str] | None = None,
               manifest: Manifest | None = None):
    """One split of the shards (local or on object storage) as a Ray Dataset: the files its manifest lists."""
    return read_parquet_files(_listed_files(shards, split, manifest or Manifest.read(shards)), columns=columns)


def read_split_windows(shards: str | Path | Location, split: str, window: int, *, columns: list[str] | None = None,
                       manifest: Manifest | None = None):
    """One split's sequence windows (:func:`read_windows`), once no ticker is found cut between two
    of its files (:func:`check_whole_tickers`: each file's first and last row group, every time,
    since a trial driver skips the full check)."""
    manifest = manifest or Manifest.read(shards)
    check_whole_tickers(shards, split, manifest)
    return read_windows(_listed_files(shards, split, manifest), manifest.features, window, columns=columns)


def _listed_files(shards: str | Path | Location, split: str, manifest: Manifest) -> list[Location]:
    files = split_files(shards, split, manifest)
    if not files:
        raise ShardError(f"{shards}: split '{split}' has no Parquet files")
    return files


def read_parquet_folder(folder: str | Path, *, columns: list[str] | None = None,
                        windows: tuple[list[str], int] | None = None):
    """Every Parquet file of a local folder as a Ray Dataset (:func:`read_parquet_files`); with
    ``windows=(features, window)``, their sequence windows (:func:`read_windows`: the folder holds
    a ticker per file, or at least never one ticker in two files)."""
    files = [locate(p) for p in sorted(Path(folder).resolve().glob("*.parquet"))]
    if windows:
        return read_windows(files, *windows, columns=columns)
    return read_parquet_files(files, columns=columns)


def read_parquet_files(files: list[Location], *, columns: list[str] | None = None):
    """Our own Parquet files, on one file system, as a Ray Dataset: one read task and block per file.

    Ray 2.60's default Parquet reader (DataSource V2) starts a pool of 32 footer-reading actors
    for every execution of the dataset, i.e. every streamed epoch and every prediction: ~2 s of
    fixed cost per read on a small node, more than the read itself (bench/PROFILE.md, "Ingest").
    Our shards and staging folders are a few files in one folder, so the V1 reader (file metadata
    on the driver, one task per file) plans them with none of that.  The switch is read at call
    time and only for this call.  One read task and block per file (<= ROWS_PER_FILE rows, ~20 MB):
    left to itself Ray splits each file into ~24 blocks of ~0.7 MB to reach its 200-block
    minimum, and moving 100 tiny objects costs more than reading the rows."""
    import ray.data

    filesystem = None if not files or files[0].is_local else files[0].filesystem  # pickled to the read tasks
    ctx = ray.data.DataContext.get_current()
    previous, ctx.use_datasource_v2 = ctx.use_datasource_v2, False
    try:
        return ray.data.read_parquet([f.path for f in files], filesystem=filesystem, columns=columns,
                                     partitioning=None, override_num_blocks=max(1, len(files)))
    finally:
        ctx.use_datasource_v2 = previous


def deterministic_context() -> None:
    """Make Ray Data keep block order (call on the driver before datasets are built)."""
    from ray.data import DataContext

    DataContext.get_current().execution_options.preserve_order = True


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # (x, y, date, fwd)


def label_tensor(values: np.ndarray) -> torch.Tensor:
    """Labels as the loss takes them: float32 for a regression target, int64 class ids otherwise."""
    values = np.asarray(values)
    dtype = np.float32 if np.issubdtype(values.dtype, np.floating) else np.int64
    return torch.from_numpy(np.array(values, dtype=dtype))


def keys_tensors(date: np.ndarray, fwd_ret: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(date as int64 days since 1970, forward return as float32)."""
    days = np.asarray(date).astype("datetime64[D]").astype(np.int64)
    return torch.from_numpy(days), torch.from_numpy(np.array(fwd_ret, dtype=np.float32))


class TabularCollate(ArrowBatchCollateFn):
    """Arrow batch -> (x float32 (batch, n_features), y, date, fwd)."""

    def __init__(self, features: list[str], label: str = "label"):
        super().__init__()
        self.features, self.label = list(features), label

    def __call__(self, batch: pa.Table) -> Batch:  # type: ignore[override]  # Ray's return: an unbound TypeVar
        x, y = arrow_to_xy(batch, self.features, self.label)
        return (x, y, *keys_tensors(_column(batch, "date"), _column(batch, "fwd_ret")))


def _column(batch: pa.Table, name: str) -> np.ndarray:
    col = batch.column(name)
    return col.to_numpy() if col.num_chunks != 1 else col.chunk(0).to_numpy(zero_copy_only=False)


def arrow_to_xy(batch: pa.Table, features: list[str], label: str = "label") -> tuple[torch.Tensor, torch.Tensor]:
    # (n_features, batch) filled one contiguous column at a time, then viewed transposed:
    # one allocation and one memcpy per column.
    x = np.empty((len(features), batch.num_rows), dtype=np.float32)
    for j, name in enumerate(features):
        x[j] = _column(batch, name)
    return torch.from_numpy(x).T, label_tensor(batch.column(label).to_numpy())


class SequenceCollate(NumpyBatchCollateFn):
    """Numpy batch with an ``x`` tensor column (batch, window, n_features) -> (x, y, date, fwd)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> Batch:  # type: ignore[override]  # as TabularCollate's
        x = np.array(batch["x"], dtype=np.float32)  # a writable copy
        return (torch.from_numpy(x), label_tensor(batch["label"]), *keys_tensors(batch["date"], batch["fwd_ret"]))


def make_windows(group: dict[str, np.ndarray], features: list[str], window: int) -> dict[str, np.ndarray]:
    """All full windows of one ticker's rows (sorted by date here): row i ends at bar i + window - 1.

    Every other column (label, fwd_ret, date, ticker, ...) is carried over from the window's last bar.
    """
    order = np.argsort(group["date"], kind="stable")
    n, k = len(order), len(features)
    others = [c for c in group if c not in features]
    if n < window:
        return {"x": np.zeros((0, window, k), np.float32), **{c: group[c][:0] for c in others}}
    feats = np.stack([np.asarray(group[f], dtype=np.float32)[order] for f in features], axis=1)
    windows = np.lib.stride_tricks.sliding_window_view(feats, (window, k))[:, 0]
    last = order[window - 1:]
    return {"x": np.ascontiguousarray(windows), **{c: group[c][last] for c in others}}


def read_windows(files: list[Location], features: list[str], window: int, *, columns: list[str] | None = None):
    """Per-ticker sliding windows of Parquet files in which no ticker spans two chains of files
    (``shards.file_chains``: a file and an append's continuations of it), as a Ray Dataset (columns x,
    label, fwd_ret, date, ticker and the other columns read).

    One task per chain reads it and windows each of its tickers (:func:`make_windows`), in (ticker,
    date) order: nothing is shuffled between tasks, where a ``groupby("ticker")`` would move every row
    through an all-to-all exchange on every execution, i.e. every streamed epoch.  The caller
    guarantees the chains keep tickers whole (:func:`check_whole_tickers` for shards; one file per
    ticker for prediction's staging folder)."""
    import ray.data

    filesystem = None if not files or files[0].is_local else files[0].filesystem  # pickled to the tasks
    chains = file_chains(files)
    items = ray.data.from_items([{"path": _joined(chain)} for chain in chains], override_num_blocks=max(1, len(chains)))
    return items.map_batches(_file_windows,  # type: ignore[arg-type]  # Ray's type has no room for fn_args
                             fn_args=(filesystem, list(features), window, columns),
                             batch_size=1, batch_format="numpy")


_CHAIN_SEP = "\0"  # between the paths of a chain's files in one item (no path holds it)


def _joined(chain: list[Location]) -> str:
    return _CHAIN_SEP.join(f.path for f in chain)


def _file_windows(batch: dict[str, np.ndarray | list[str]], filesystem, features: list[str], window: int,
                  columns: list[str] | None):
    """The windows of the files (or chains of files, :func:`_joined`) named in ``batch``, one ticker at a
    time (a generator: Ray Data gathers them into blocks, so a chain's windows are never all in memory
    at once)."""
    import pyarrow.parquet as pq

    for item in batch["path"]:
        parts = [pq.read_table(path, filesystem=filesystem, columns=columns) for path in str(item).split(_CHAIN_SEP)]
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
        cols = {name: _column(table, name) for name in table.column_names}
        tickers = cols["ticker"]
        order = np.argsort(tickers, kind="stable")
        starts = np.flatnonzero(tickers[order][1:] != tickers[order][:-1]) + 1
        produced = False
        for rows in np.split(order, starts) if len(order) else []:
            out = make_windows({c: v[rows] for c, v in cols.items()}, features, window)
            if len(out["x"]):
                produced = True
                yield out
        if not produced:  # every ticker shorter than the window: an empty batch keeps the columns
            yield make_windows({c: v[:0] for c, v in cols.items()}, features, window)


def folder_batches(folder: str | Path, *, windows: tuple[list[str], int] | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """The rows :func:`read_parquet_folder` gives as a Ray Dataset, read in this process with pyarrow:
    numpy batches, a file at a time (with ``windows``, a ticker's windows at a time), in the files' order."""
    import pyarrow.parquet as pq

    for path in sorted(Path(folder).resolve().glob("*.parquet")):
        if windows:
            yield from _file_windows({"path": [str(path)]}, None, *windows, None)
        else:
            table = pq.read_table(path)
            yield {name: _column(table, name) for name in table.column_names}


def check_whole_tickers(shards: str | Path | Location, split: str, manifest: Manifest) -> None:
    """No ticker of ``split`` spans two of its chains of files (``shards.file_chains``), which sequence
    windows need (:func:`read_windows`).

    Shards are ordered by ticker, then date, and written a whole ticker per file since 2026-12-01 (an
    append adds a ticker's new rows to its file's chain); older shard folders may cut a ticker between
    two files.  Reads the ticker column of each chain's first file's first and last row group only."""
    import pyarrow.parquet as pq

    previous = None
    for file in (chain[0] for chain in file_chains(split_files(shards, split, manifest))):
        with pq.ParquetFile(file.filesystem.open_input_file(file.path)) as f:
            if not f.metadata.num_row_groups:
                continue
            first = f.read_row_group(0, columns=["ticker"]).column(0)
            last = f.read_row_group(f.metadata.num_row_groups - 1, columns=["ticker"]).column(0)
        if not len(first):
            continue
        if previous and previous[1] == first[0].as_py():
            raise ShardError(f"{locate(shards) / f'split={split}'}: ticker {previous[1]!r} spans {previous[0]} and "
                             f"{Path(file.path).name}, so its sequence windows would be cut; rebuild the shards with "
                             "`alchemetric-ray features` (shards built since 2026-12-01 keep a ticker in one file)")
        previous = (Path(file.path).name, last[len(last) - 1].as_py())


KEY_COLUMNS = ("date", "ticker")  # besides the features: what every reader takes from a shard ...
TARGET_COLUMNS = ("label", "fwd_ret")  # ... (build_datasets, scoring/predictions.py:split_frame)


def shard_columns(manifest: Manifest) -> list[str]:
    """The columns every shard file must hold for the readers: date, ticker, the features, label, fwd_ret."""
    return [*KEY_COLUMNS, *manifest.features, *TARGET_COLUMNS]


def _expected_type(name: str, manifest: Manifest) -> tuple[str, Callable[[pa.DataType], bool]]:
    """(what a column must be, in words; the test of its Arrow type)."""
    if name == "date":
        return "a timestamp or date", lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t)
    if name == "ticker":
        return "a string", lambda t: (pa.types.is_string(t) or pa.types.is_large_string(t)
                                      or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)))
    if name == "label":
        if manifest.regression:
            return "floating point (a regression target)", pa.types.is_floating
        return "an integer (class ids)", pa.types.is_integer
    return "numeric", lambda t: pa.types.is_floating(t) or pa.types.is_integer(t)


def _held(manifest: Manifest) -> str:
    features = manifest.features
    named = ", ".join(features[:4]) + (", ..." if len(features) > 4 else "")
    return (f"the manifest's shards hold {', '.join(KEY_COLUMNS)}, {', '.join(TARGET_COLUMNS)} and its "
            f"{len(features)} feature{'s' if len(features) != 1 else ''} {named}")


def schema_problem(schema: pa.Schema, manifest: Manifest) -> str | None:
    """What a shard file's Arrow schema lacks for the readers (a column, or a column of the wrong
    type), in words; None where it holds every column :func:`shard_columns` names."""
    names = set(schema.names)
    missing = [name for name in shard_columns(manifest) if name not in names]
    if missing:
        listed = ", ".join(repr(name) for name in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                                                  else "")
        return f"no column{'s' if len(missing) > 1 else ''} {listed} ({_held(manifest)})"
    for name in shard_columns(manifest):
        what, fits = _expected_type(name, manifest)
        kind = schema.field(name).type
        if not fits(kind):
            return f"column {name!r} is {kind}, expected {what}"
    return None


def check_shard_files(shards: str | Path | Location, manifest: Manifest) -> None:
    """Every Parquet file of every split holds the columns the readers need, decodes, and the row
    counts match the manifest.

    A missing, truncated or corrupt shard, or one without a column (or with a column of another
    type) is refused here, on the driver, naming the file, before a run starts; Ray Data would only
    fail on it inside a Train worker (or, for the test split, at the export after training).  Each
    file's schema (its footer) is checked first, for every file, before one pass over the data,
    batch by batch (memory stays bounded).
    """
    files = {split: split_files(shards, split, manifest) for split in manifest.rows}
    for file in (f for listed in files.values() for f in listed):
        with _opened(file) as f:
            problem = schema_problem(f.schema_arrow, manifest)
        if problem:
            raise ShardError(f"{file}: {problem}")
    for split, expected in manifest.rows.items():
        rows = 0
        for file in files[split]:
            with _opened(file) as f:
                try:
                    for batch in f.iter_batches(batch_size=65_536):
                        rows += batch.num_rows
                except (pa.ArrowException, OSError, ValueError) as exc:
                    raise _corrupt(file, exc) from None
        if rows != expected:
            raise ShardError(f"{locate(shards) / f'split={split}'}: {rows} rows in its Parquet files but {MANIFEST} "
                             f"says {expected} (a shard is missing, truncated or from another build)")


@contextmanager
def _opened(file: Location) -> Iterator[Any]:
    """The ``pq.ParquetFile`` of a shard (its footer read); a missing or unreadable one is one line."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file.filesystem.open_input_file(file.path))
    except FileNotFoundError:
        raise ShardError(f"{file}: listed in {MANIFEST} but missing") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _corrupt(file, exc) from None
    with parquet:
        yield parquet


def _corrupt(file: Location, exc: BaseException) -> ShardError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return ShardError(f"{file}: corrupt or truncated Parquet shard ({first})")


def build_datasets(shards: str | Path | Location, mode: str, window: int, splits=("train", "val"),
                   check: bool = True) -> tuple[dict[str, Any], Manifest]:
    """The Ray Datasets the trainer hands to its workers, and the manifest."""
    manifest = Manifest.read(shards)
    if check:  # a sweep checks once on its driver, not again in every trial
        check_shard_files(shards, manifest)
    cols = shard_columns(manifest)
    datasets = {}
    for split in splits:
        if mode == "sequence":
            datasets[split] = read_split_windows(shards, split, window, columns=cols, manifest=manifest)
        else:
            datasets[split] = read_split(shards, split, columns=cols, manifest=manifest)
    return datasets, manifest


def collate_for(mode: str, features: list[str]):
    return SequenceCollate() if mode == "sequence" else TabularCollate(features)


def concat_batches(parts: list[Batch]) -> Batch:
    """Batches as one (x, y, date, fwd) tuple of contiguous host tensors."""
    if not parts:
        return (torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0))
    return cast(Batch, tuple(torch.cat([t.contiguous() for t in column]) for column in zip(*parts)))  # 4 columns


def tabular_whole(tables: list[pa.Table], features: list[str], label: str = "label") -> Batch:
    """Tables as one (x, y, date, fwd) set of tensors: what :class:`TabularCollate` gives each table, then
    :func:`concat_batches`, but with ``x`` filled in place, one column of one table at a time, into the one
    contiguous (rows, features) array (no per-table matrix, no second copy to join them)."""
    if not tables:
        return concat_batches([])
    x = np.empty((sum(t.num_rows for t in tables), len(features)), dtype=np.float32)
    rest: list[tuple[torch.Tensor, ...]] = []
    lo = 0
    for table in tables:
        hi = lo + table.num_rows
        for j, name in enumerate(features):
            x[lo:hi, j] = _column(table, name)
        rest.append((label_tensor(table.column(label).to_numpy()),
                     *keys_tensors(_column(table, "date"), _column(table, "fwd_ret"))))
        lo = hi
    y, date, fwd = (torch.cat(column) for column in zip(*rest))
    return torch.from_numpy(x), y, date, fwd


class ShardReader:
    """A split of the shards read whole in this process with pyarrow, for a one-worker run that caches
    its shard (``train.cache_data``) and so needs no Ray Data: the same columns, windows and tensors
    as the Ray Data path (:func:`build_datasets` and :func:`collate_for`), in the files' order
    (ticker, then date) and one file at a time (a sequence file's windows one ticker at a time)."""

    def __init__(self, shards: str | Path | Location, manifest: Manifest, mode: str, window: int) -> None:
        self.shards, self.manifest, self.mode, self.window = shards, manifest, mode, window

    def rows(self, split: str) -> Batch:
        import pyarrow.parquet as pq

        files, cols = _listed_files(self.shards, split, self.manifest), shard_columns(self.manifest)
        if self.mode != "sequence":
            return tabular_whole([pq.read_table(f.path, filesystem=f.filesystem, columns=cols) for f in files],
                                 self.manifest.features)
        collate = collate_for(self.mode, self.manifest.features)
        check_whole_tickers(self.shards, split, self.manifest)
        return concat_batches([collate(chunk) for chain in file_chains(files)
                               for chunk in _file_windows({"path": [_joined(chain)]}, chain[0].filesystem,
                                                          self.manifest.features, self.window, cols)])
