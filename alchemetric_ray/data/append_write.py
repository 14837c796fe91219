"""How an append writes (:mod:`~alchemetric_ray.data.append`): the new rows as continuations of the test
files (or the test segment again, where rows of it were computed again), the new bars as a bars part, the
tails as a new tails part, then the manifest with its ``appends`` entry; every file written removed on a
failure before the manifest is, and the files it no longer lists removed after it."""

from __future__ import annotations

import bisect
import dataclasses
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from alchemetric_ray.data import bars_store
from alchemetric_ray.data import tails as tails_store
from alchemetric_ray.data.append_bars import bars_table, day, digest, stack
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.normalize import Normalizer
from alchemetric_ray.data.splits import SplitPlan
from alchemetric_ray.errors import ShardError, UserError
from alchemetric_ray.storage import Location

_PART = re.compile(r"part-(\d+)\.parquet$")
_Summary = TypeVar("_Summary", covariant=True)


class _Job(Protocol[_Summary]):
    """What writing reads of an append (``append._Job``, which this module cannot import: append.py
    imports it)."""

    where: Location
    manifest: Manifest
    parts: list[Path]
    description: str

    @property
    def folder(self) -> Path: ...

    def summary(self, manifest: Manifest, line: str) -> _Summary: ...


def _schema(names: list[str], regression: bool) -> pa.Schema:
    """The shards' columns (data/shards.py writes the same)."""
    return pa.schema([("date", pa.timestamp("ns")), ("ticker", pa.string()),
                      *[(n, pa.float32()) for n in names],
                      ("label", pa.float32() if regression else pa.int64()), ("fwd_ret", pa.float32()),
                      ("label_end", pa.timestamp("ns"))])


def _next_index(folder: Path) -> int:
    """One past the highest part number in ``folder`` (listed or not): a new name never replaces a file."""
    numbers = [int(m.group(1)) for p in folder.glob("part-*.parquet") if (m := _PART.search(p.name))]
    return max(numbers, default=-1) + 1


@dataclass
class NewRows:
    """What an append computed: the rows to write (raw features, before normalization), the first date it
    wrote again whole (a per-date pass; else None) and that pass's counts, the folder's tails brought up to
    date (``data/tails.py``; None: it keeps none) and how many tickers it computed from their tails and from
    the bars store (``computed``); whether the test segment is written again (``rewrite``: some of its rows
    were computed again), else extended (:meth:`_TestWriter.extend`)."""

    rows: pd.DataFrame
    a0: Any = None
    cs_record: dict = field(default_factory=dict)
    tails: pa.Table | None = None
    computed: dict[str, int] = field(default_factory=dict)
    rewrite: bool = True  # rows of the test segment on dates from a0 on are computed again: write it again


def write(job: _Job[_Summary], new: NewRows, added: Mapping[str, pd.DataFrame]) -> _Summary:
    """The test segment again with the new rows, the new bars, the folder's tails, then the manifest; on
    any failure before the manifest is written, every file written here is removed."""
    rows, a0, tails = new.rows, new.a0, new.tails
    manifest, folder = job.manifest, job.folder
    plan = SplitPlan(**manifest.splits)
    if not rows.empty:
        rows = rows.sort_values(["ticker", "date"], kind="stable").reset_index(drop=True)
        plan = dataclasses.replace(plan, test_end=max(plan.test_end, day(rows["date"].max())))
        rows = rows[_in_test(plan, rows) == 2].reset_index(drop=True)
    writer = _TestWriter(folder / "split=test", _schema(list(manifest.features), manifest.regression),
                         len(manifest.classes))
    from alchemetric_ray.data.shards import file_chains, split_files

    chains = [[f.local for f in chain] for chain in file_chains(split_files(folder, "test", manifest))]
    old_tails = tails_store.listed(folder, manifest.files) if tails is not None else []
    new_table = _new_table(rows, list(manifest.features), Normalizer.from_dict(manifest.normalization),
                           writer.schema, manifest.regression)
    try:
        if new.rewrite:
            writer.rewrite(chains, new_table, a0)
        else:
            writer.extend(chains, new_table, manifest.rows.get("test", 0), manifest.class_counts.get("test", []))
        stacked = stack(added)
        bars_name = bars_store.write_table_part(folder, _next_index(folder / bars_store.BARS_DIR),
                                                bars_table(stacked))
        writer.written.append(folder / bars_name)
        tail_files: dict[str, list[str]] = {}
        if tails is not None:
            name = tails_store.write(folder, _next_index(folder / tails_store.TAILS_DIR), [tails])
            writer.written.append(folder / name)
            tail_files = {tails_store.TAILS_DIR: [name]}
        entry = _entry(job, rows, stacked, bars_name, writer.rows - manifest.rows.get("test", 0), a0)
        entry["computed"] = new.computed
        tickers = list(manifest.tickers) + sorted(set(rows["ticker"].unique()) - set(manifest.tickers)) if len(rows) \
            else list(manifest.tickers)
        updated = dataclasses.replace(
            manifest,
            splits=plan.as_dict(),
            rows={**manifest.rows, "test": writer.rows},
            class_counts={**manifest.class_counts, "test": writer.classes} if writer.classes else
            manifest.class_counts,
            tickers=tickers,
            skipped_tickers={t: why for t, why in manifest.skipped_tickers.items() if t not in set(tickers)},
            files={**{k: v for k, v in manifest.files.items() if k != tails_store.TAILS_DIR}, "test": writer.names(),
                   bars_store.BARS_DIR: [str(p.relative_to(folder)) for p in job.parts] + [bars_name], **tail_files},
            # (extended: no row of the segment is on a date from a0 on)
            cross_section=_cross_record(manifest.cross_section, new.cs_record, folder, manifest,
                                        a0 if new.rewrite else None),
            appends=[*manifest.appends, entry],
        )
        updated.write(folder)
    except OSError as exc:
        if _committed(folder, len(manifest.appends) + 1):  # written; what failed came after (a folder's sync)
            raise ShardError(f"{folder}: the append was written, but then: {exc.strerror or exc}") from None
        writer.remove()
        if isinstance(exc, UserError):  # already one line (a full disk)
            raise
        where = exc.filename or folder
        raise ShardError(f"{where}: cannot write the append ({exc.strerror or exc}); {job.where} is as it was") \
            from None
    except BaseException:
        if not _committed(folder, len(manifest.appends) + 1):  # an interrupt just after the manifest's rename
            writer.remove()
        raise
    for path in [*writer.replaced, *old_tails]:  # no longer listed: their rows are in the new files
        if path not in writer.written:
            path.unlink(missing_ok=True)
    dates = f"dates {entry['first_date']}..{entry['last_date']}" if entry["first_date"] else \
        f"bars {entry['bars']['first_date']}..{entry['bars']['last_date']} kept, no label yet"
    line = (f"appended {entry['rows']['test']} rows for {entry['tickers']} tickers ({dates}) to {job.where}; "
            f"test segment now {writer.rows} rows")
    return job.summary(updated, line)


def _committed(folder: Path, appends: int) -> bool:
    """Whether the manifest in ``folder`` is the one that records this append (its ``appends`` count)."""
    try:
        return len(Manifest.read(folder).appends) == appends
    except (ShardError, OSError):
        return False


def _in_test(plan: SplitPlan, rows: pd.DataFrame) -> np.ndarray:
    """The split of each row (:meth:`SplitPlan.assign`); a row that would land in train or val is refused."""
    split = plan.assign(rows["date"].to_numpy(), rows["label_end"].to_numpy())
    early = np.flatnonzero((split == 0) | (split == 1))
    if len(early):
        row = rows.iloc[early[0]]
        raise ShardError(f"{row['ticker']} {day(row['date'])}: the append would add a row before the test segment "
                         f"(from {plan.test_start}), which would change the train/val segments and the normalization "
                         f"fitted on train; rebuild instead: --append --rebuild")
    return split


def _entry(job: _Job[Any], rows: pd.DataFrame, stacked: pd.DataFrame, bars_name: str, added_rows: int,
           a0) -> dict[str, Any]:
    """The manifest's record of this append (``appends``); ``stacked``: the new bars (:func:`stack`)."""
    return {
        "kind": "append",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": job.description,
        "input_hash": digest(stacked),
        "bars": {"file": bars_name, "tickers": int(stacked["ticker"].nunique()), "rows": len(stacked),
                 "first_date": day(stacked["date"].min()), "last_date": day(stacked["date"].max())},
        "first_date": day(rows["date"].min()) if len(rows) else None,
        "last_date": day(rows["date"].max()) if len(rows) else None,
        "rows": {"train": 0, "val": 0, "test": added_rows},
        "tickers": len(rows["ticker"].unique()) if len(rows) else 0,
        "rewritten_from": day(a0) if a0 is not None else None,
    }


class _TestWriter:
    """The test segment's part files after an append: each ticker's kept rows then its new ones, a ticker
    never in two chains of files (``shards.file_chains``), up to ROWS_PER_FILE rows a file (as
    data/shards.py writes them), under names no file has.  ``listing``: the split's files then, in order;
    ``replaced``: the old files it no longer lists."""

    def __init__(self, folder: Path, schema: pa.Schema, n_classes: int):
        self.folder, self.schema = folder, schema
        self.written: list[Path] = []
        self.listing: list[Path] = []
        self.replaced: list[Path] = []
        self.rows = 0
        self.classes = [0] * n_classes
        self.index = 0

    def rewrite(self, old_chains: list[list[Path]], new_rows: pa.Table, a0) -> None:
        """Each old chain's rows before ``a0`` (all: None), each ticker's followed by its rows of
        ``new_rows`` (by ticker then date), then the new rows of tickers no old chain holds, as new part
        files; a ticker's rows never split across files, a file closed before it would pass ROWS_PER_FILE."""
        from alchemetric_ray.data.shards import ROWS_PER_FILE

        self._start()
        new_runs = {t: (lo, hi) for t, lo, hi in _ticker_runs(new_rows)}
        pieces: list[pa.Table] = []
        sizes: list[int] = []  # rows of each ticker, in the order written
        for chain in old_chains:
            self.replaced += chain
            table = self._read(chain)
            if a0 is not None:  # the dates from the first new row on are written again, whole
                table = table.filter(pc.less(table.column("date"), pa.scalar(a0, pa.timestamp("ns"))))
            runs = _ticker_runs(table)
            if not any(t in new_runs for t, _, _ in runs):
                pieces.append(table)
                sizes.extend(hi - lo for _, lo, hi in runs)
                continue
            both = pa.concat_tables([table, new_rows])
            take = []
            for ticker, lo, hi in runs:
                extra = new_runs.pop(ticker, None)
                take.append(np.arange(lo, hi))
                if extra is not None:
                    take.append(np.arange(table.num_rows + extra[0], table.num_rows + extra[1]))
                sizes.append(hi - lo + (extra[1] - extra[0] if extra is not None else 0))
            pieces.append(both.take(pa.array(np.concatenate(take), type=pa.int64())))
        for ticker in sorted(new_runs):
            lo, hi = new_runs[ticker]
            pieces.append(new_rows.slice(lo, hi - lo))
            sizes.append(hi - lo)
        rows = pa.concat_tables(pieces) if pieces else new_rows.slice(0, 0)
        self._count(rows)
        for first, length in _file_cuts(sizes, ROWS_PER_FILE):
            self.listing.append(self.write(rows.slice(first, length)))

    def extend(self, old_chains: list[list[Path]], new_rows: pa.Table, old_rows: int, old_classes: list[int]) -> None:
        """The new rows (by ticker then date) added without rewriting the segment: the new rows of the
        tickers in each chain's range as a continuation of it (``part-NNNNN.K.parquet``), those of tickers
        outside every range as new part files.  Chains of COMPACT_AT continuations or more are written
        again whole as new part files instead, their new rows with them (the longest first, one in
        COMPACT_AT of the chains an append, which keeps up with one continuation of each an append): what
        a reader opens stays bounded, and so does what an append writes."""
        from alchemetric_ray.data.shards import ROWS_PER_FILE

        self._start()
        self.rows, self.classes = old_rows, list(old_classes) if self.classes else []
        self._count(new_rows)
        new_runs = {t: (lo, hi) for t, lo, hi in _ticker_runs(new_rows)}
        due = sorted((i for i, chain in enumerate(old_chains) if len(chain) - 1 >= COMPACT_AT),
                     key=lambda i: -len(old_chains[i]))
        compact = set(due[:-(-len(old_chains) // COMPACT_AT)])  # the longest; as many as keep up with appends
        order = sorted(new_runs)  # the new rows' tickers
        for i, chain in enumerate(old_chains):
            bounds = _ticker_range(chain[0])
            take = order[bisect.bisect_left(order, bounds[0]):bisect.bisect_right(order, bounds[1])] if bounds else []
            runs = [new_runs.pop(t) for t in take if t in new_runs]  # consecutive: the rows are by ticker
            rows = new_rows.slice(runs[0][0], runs[-1][1] - runs[0][0]) if runs else None
            if i in compact:
                self.replaced += chain
                table = self._read(chain) if rows is None else pa.concat_tables([self._read(chain), rows])
                table = table.take(pc.sort_indices(table, [("ticker", "ascending"), ("date", "ascending")]))
                sizes = [hi - lo for _, lo, hi in _ticker_runs(table)]
                self.listing += [self.write(table.slice(a, n)) for a, n in _file_cuts(sizes, ROWS_PER_FILE)]
                continue
            self.listing += chain
            if rows is not None:
                self.listing.append(self.write(rows, name=_continuation(chain)))
        rest = sorted(new_runs.items())
        if rest:
            table = pa.concat_tables([new_rows.slice(lo, hi - lo) for _, (lo, hi) in rest])
            sizes = [hi - lo for _, (lo, hi) in rest]
            self.listing += [self.write(table.slice(a, n)) for a, n in _file_cuts(sizes, ROWS_PER_FILE)]

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = _next_index(self.folder)

    def _read(self, chain: list[Path]) -> pa.Table:
        """A chain's rows, by ticker then date (a continuation's rows after its file's, as the dates go)."""
        parts = []
        for path in chain:
            table = pq.read_table(path)
            parts.append(table if table.schema == self.schema else table.cast(self.schema))
        if len(parts) == 1:
            return parts[0]
        table = pa.concat_tables(parts)
        return table.take(pc.sort_indices(table, [("ticker", "ascending"), ("date", "ascending")]))

    def _count(self, rows: pa.Table) -> None:
        self.rows += rows.num_rows
        if self.classes and rows.num_rows:
            labels, counts = np.unique(rows.column("label").to_numpy(), return_counts=True)
            for c, n in zip(labels, counts):
                self.classes[int(c)] += int(n)

    def write(self, table: pa.Table, *, name: str | None = None) -> Path:
        from alchemetric_ray.data.shards import ROWS_PER_ROW_GROUP

        if name is None:
            name = f"part-{self.index:05d}.parquet"
            self.index += 1
        path = self.folder / name
        self.written.append(path)
        # dictionary encoding for the ticker only, as data/shards.py writes
        pq.write_table(table.combine_chunks(), path, row_group_size=ROWS_PER_ROW_GROUP, use_dictionary=["ticker"])
        return path

    def names(self) -> list[str]:
        return [f"{self.folder.name}/{p.name}" for p in self.listing]

    def remove(self) -> None:
        for path in self.written:
            try:
                path.unlink(missing_ok=True)
            except OSError:  # never made (its folder refused it)
                pass


COMPACT_AT = 16  # continuations of a file after which an append writes its chain again whole
_CONTINUATION = re.compile(r"^part-(\d+)(?:\.(\d+))?\.parquet$")


def _continuation(chain: list[Path]) -> str:
    """The name of the next continuation of ``chain``: its first file's number, then one past its last and
    past any file of that name on disk (one an interrupted append left unlisted is neither read nor
    overwritten)."""
    numbers = [_CONTINUATION.match(p.name) for p in chain]
    base = numbers[0].group(1) if numbers[0] else chain[0].stem
    on_disk = [_CONTINUATION.match(p.name) for p in chain[0].parent.glob(f"part-{base}.*.parquet")]
    last = max((int(m.group(2)) for m in [*numbers, *on_disk] if m and m.group(2)), default=0)
    return f"part-{base}.{last + 1}.parquet"


def _ticker_range(path: Path) -> tuple[str, str] | None:
    """The first and last ticker of a chain's first file (chains hold ticker ranges that do not overlap: a
    ticker in a chain's range joins it), from the file's statistics where it has them; None: no row."""
    meta = pq.read_metadata(path)
    if not meta.num_rows:
        return None
    column = meta.schema.names.index("ticker")
    stats = [meta.row_group(g).column(column).statistics for g in range(meta.num_row_groups)]
    if all(st is not None and st.has_min_max for st in stats):
        return str(min(st.min for st in stats)), str(max(st.max for st in stats))
    tickers = pc.unique(pq.read_table(path, columns=["ticker"]).column(0)).to_pylist()
    return str(min(tickers)), str(max(tickers))


def _file_cuts(sizes: list[int], per_file: int) -> list[tuple[int, int]]:
    """(first row, rows) of each file for runs of ``sizes`` rows written in turn, a run never split, a
    file closed before a run would take it past ``per_file`` rows."""
    cuts = []
    start = pending = 0
    for n in sizes:
        if not n:
            continue
        if pending and pending + n > per_file:
            cuts.append((start, pending))
            start, pending = start + pending, 0
        pending += n
    if pending:
        cuts.append((start, pending))
    return cuts


def _cross_record(record: dict, new: dict, folder: Path, manifest: Manifest, a0) -> dict:
    """The manifest's record of the per-date pass, its counts brought up to date: the dates the append
    wrote again (from ``a0`` on) are counted as this pass counted them."""
    if not record or not new:
        return record
    before = 0
    if a0 is not None:
        from alchemetric_ray.data.shards import split_files

        seen = set()
        for file in split_files(folder, "test", manifest):
            d = pq.read_table(file.local, columns=["date"]).column("date").to_numpy()
            seen.update(d[d >= np.datetime64(a0, "ns")].tolist())
        before = len(seen)
    out = dict(record)
    out["dates_kept"] = int(record.get("dates_kept", 0)) - before + int(new.get("dates_kept", 0))
    out["dates_dropped"] = int(record.get("dates_dropped", 0)) + int(new.get("dates_dropped", 0))
    out["rows_dropped"] = int(record.get("rows_dropped", 0)) + int(new.get("rows_dropped", 0))
    out["max_names"] = max(int(record.get("max_names", 0)), int(new.get("max_names", 0)))
    return out


def _new_table(rows: pd.DataFrame, names: list[str], normalizer: Normalizer, schema: pa.Schema,
               regression: bool) -> pa.Table:
    """The new rows (by ticker then date) as the shards hold them: normalized float32 features, the
    label's type."""
    if rows.empty:
        return schema.empty_table()
    normed = normalizer.apply(rows[names].to_numpy())
    cols: dict[str, Any] = {"date": rows["date"].to_numpy(), "ticker": rows["ticker"].to_numpy()}
    cols.update({n: normed[:, j] for j, n in enumerate(names)})
    cols.update({"label": rows["label"].to_numpy().astype(np.float32 if regression else np.int64),
                 "fwd_ret": rows["fwd_ret"].to_numpy().astype(np.float32),
                 "label_end": rows["label_end"].to_numpy()})
    return pa.Table.from_pydict(cols, schema=schema)


def _ticker_runs(table: pa.Table) -> list[tuple[str, int, int]]:
    """(ticker, first row, end row) of each run of one ticker in ``table``."""
    if not table.num_rows:
        return []
    tickers = table.column("ticker").to_numpy(zero_copy_only=False)
    cuts = np.flatnonzero(tickers[1:] != tickers[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(tickers)]
    return [(str(tickers[lo]), lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
