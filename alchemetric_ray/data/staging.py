"""The features before any split: every ticker's features and labels, then the per-date pass.

:func:`stage_features` is the part of the feature build (``data/shards.py``) that no split depends
on.  The tickers are computed in groups of about ``features.group_rows`` bars, each by
:func:`alchemetric_ray.data.panel.compute_group`, and written to the staging folder as
``part-NNNNN.arrow`` (uncompressed Arrow IPC, ``cross_section.write_staged``) in group order (rows
ordered by ticker, then date).  Where the build runs:

* as Ray tasks (``num_cpus=1``) in the Ray this process runs in: one already up (a notebook's
  ``ray.init()``, a session's), or the cluster ``RAY_ADDRESS`` names (``ray job submit``) when the input
  spans more than one group (``features.distributed=auto``); or always (``true``, starting a local
  Ray where there is none: ``placement.session.ensure_ray``); or a local Ray ``auto`` starts for a folder
  of per-ticker files of :data:`LOCAL_RAY_GROUPS` groups or more (sized by its files' bytes before any is
  read, :data:`BYTES_PER_ROW`), where the cores pay for the start: ~17M bars on 2 cores (figures at
  :data:`LOCAL_RAY_GROUPS`).
  At most :data:`IN_FLIGHT_PER_CPU` tasks per cluster CPU are in flight, so that the driver holds a
  bounded number of groups.  Each result comes back to the driver as Arrow tables, which it writes: the
  staging folder is on the driver's disk, which other nodes do not see;
* otherwise in the driver (``auto`` below that size or for any other input, or ``false``).

Who reads the files: for a folder of per-ticker files on a Ray of one node (this one), each task reads and
validates its own group of files (groups by file size; ``bars.ingest.ingest_files``, with an ingest report
of its own, merged in file order into the build's: ``bars.report.merge_reports``), writes its staged rows
and its validated bars (``bars/``) where the driver would (the same disk), and returns its record, its rows'
dates and its report: the driver only lists the files and collects the records. Ingest's errors are the same
one line as in the driver (a bad file's ``DataError``; "no ticker has at least N rows" on the merged
report). Otherwise (one long table, the synthetic or built-in data, a cluster of several nodes whose other
nodes do not see the driver's files) the driver reads the bars and forms the groups, and sends each group's
bars to its task as one Arrow table (:func:`_group_payload`; frames of other columns as they are).

Memory in the driver: the file list and up to :data:`IN_FLIGHT_PER_CPU` results per CPU (a 200k-row group's
features ~33 MB and bars ~9 MB; none where the tasks read the files and write their own); a task holds one
group (~100 MB at 200k rows).

The per-date pass (``data/cross_section.py``) then takes each column in turn; with Ray, the rows of
each contiguous bucket of dates go to a task of their own and the results are put back in row order.
Every value depends on its date's rows only, in the same order, so the results equal a one-process
build bit for bit.

A ticker that fails inside a group is found by computing the group's tickers one by one, and the build
stops with one line naming it and the file it came from (:class:`~alchemetric_ray.errors.FeatureError`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sized, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from alchemetric_ray.bars.report import merge_reports
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data import features as feat
from alchemetric_ray.data import tails as tails_store
from alchemetric_ray.data.bars_store import BARS_DIR, bars_table, write_table_part
from alchemetric_ray.data.cross_section import (
    STAGED_SUFFIX,
    apply_cross_section,
    date_buckets,
    plan_ops,
    transform_column,
    write_staged,
)
from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.data.panel import GroupResult, compute_group
from alchemetric_ray.errors import FeatureError, ShardError, UserError

# Bars per group (features.group_rows' default).  Measured on this 2-core machine (2026-12-05, under
# load from other work; a synthetic 400 tickers x 1,500 days; the vectorized compute_group at 0.8-1.1M
# rows/s in one process, a warm 2-CPU Ray): a task's fixed cost is ~3 ms (one ticker: 2.8 ms round
# trip), while sending the frames and the result back costs ~0.4 ms per 1k rows (195k rows: 264 ms as a
# task against 183 ms in the driver), which no group size amortizes.  The fixed part is ~1.5% of a
# 200k-row group (~200 ms of compute); a task then holds ~100 MB (bars 9 MB, result 33 MB, the panel's
# intermediates), and the packaged data (108k rows) is one group.  A local Ray's start and its workers'
# first imports took 6-9 s here, against 2.3 s for the 574k labelled rows of 400 x 1,500 in one process
# (build_shards wall time: distributed=false 4.7 s, true 18.9 s; cs_rank + cs_normalize=rank: 8.6 s and
# 18.2 s): Ray pays where it is up already (warm, in one process: pass 1 in 1.4-2.0 s as 3 or 6 tasks against
# 1.8-2.2 s in the driver), or on a cluster; `auto` starts a local Ray only for a folder large enough
# (LOCAL_RAY_GROUPS).
GROUP_ROWS = 200_000
# A folder of per-ticker files is sized before it is read: bytes per bar of a daily file (measured:
# bench/features.py:write_universe's Parquet, 600 x 3,500 days: 120.8 MB for 2.1M rows, 57.5 B a bar;
# a yfinance-style CSV row "2020-01-02,123.45,124.0,122.1,123.9,123.9,1234567" is 50-65 B).
BYTES_PER_ROW = 60
# auto starts a local Ray for a folder of at least this many groups' bars (16M rows at the default
# group_rows).  The break-even, measured on this 2-core machine (2026-12-05, under load from other sessions:
# load average 3-4), build_shards on write_universe folders x 3,500 days, each in a fresh process, with the
# files read inside the tasks: 200 tickers (687k labelled rows) driver 2.6 s vs a local Ray 17.1 s (its start
# 8.2 s, pass 1 7.2 s against 1.4 s); 600 (2.06M) 4.5 s vs 16.9 s (start 6.0 s, pass 1 8.7 s against 2.6 s);
# 1,500 (5.15M) 10.3 s vs 22.9 s (start 8.4 s, pass 1 10.0 s against 6.3 s).  Pass 1 costs the driver
# ~1.2 us a bar and the 4-worker local Ray ~0.4 us a bar beyond a fixed ~6.5 s (its workers' start with the
# runtime env, ~1.5 s, and first imports, ~1.5 s, on 2 loaded cores) plus 6-8 s for the start itself:
# break-even ~13.5 s / 0.8 us = ~17M bars.  More cores move it lower (not measured here).
LOCAL_RAY_GROUPS = 80
CANCEL_WAIT_S = 30  # at most this long for cancelled tasks to end (a killed worker's task ends at once)
IN_FLIGHT_PER_CPU = 2  # tasks in flight per cluster CPU: the CPUs stay busy while results come back
# (group index, its result, its tickers read, its rows' days where its task staged them itself, else None)
_Computed = Iterator[tuple[int, GroupResult, int, 'np.ndarray | None']]
_SAFE_TICKER = re.compile(r"[A-Za-z0-9._^=-]+")


def min_history(cfg: RunConfig) -> int:
    """Bars a ticker needs: the feature warm-up, the label's reach and a little to learn from."""
    names = feat.resolve_feature_names(cfg.features.names, cfg.features.set)
    return feat.warmup_bars(names) + LabelSpec.from_config(cfg.features).reach + max(cfg.features.window, 20)


class _Progress:
    """Tickers done and rows/s rewritten in place: on a terminal only (in a log or a pipe it would be noise)."""

    def __init__(self, label: str, enabled: bool):
        from alchemetric_ray.console import is_tty

        self.label, self.enabled, self.last = label, enabled and is_tty(), 0.0
        self.open = False  # a progress line without its newline yet
        self.start = time.monotonic()

    def __call__(self, done: int, total: int | None = None, final: bool = False, rows: int = 0) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        of = f"/{total}" if total else ""
        rate = f", {rows / max(now - self.start, 1e-9):,.0f} rows/s" if rows else ""
        print(f"\r{self.label}: {done}{of} tickers{rate}\x1b[K", end="\n" if final else "", file=sys.stderr,
              flush=True)
        self.open = not final

    def close(self) -> None:
        """End an open progress line, so that an error message that follows is a line of its own."""
        if self.open:
            print(file=sys.stderr, flush=True)
            self.open = False


@dataclass
class StagedFeatures:
    """Pass 1 and the per-date pass of ``build_shards``, which no split depends on: every ticker's
    features and labels in ``folder`` (``part-NNNNN.arrow``, one per group of tickers, in ticker
    order), before any split plan or normalization.  A walk-forward stages them once and builds each
    refit's shards from them."""

    folder: Path
    names: list[str]
    label: dict  # the LabelSpec's fields
    stats: dict  # calendar, input hash, tickers, skipped tickers, non-finite rows
    cross_section: dict
    report: object | None  # ingest's IngestReport, where files were read
    source_description: str | None
    # the manifest's `build`: mode (driver or ray), tasks (Ray tasks of both passes), groups, nodes (that ran
    # tasks), rows_per_group, seconds (features: pass 1 with Ray's start; ray_start; cross_section)
    build: dict = field(default_factory=dict)


def stage_features(cfg: RunConfig, folder: Path, *, bars: Iterable[tuple[str, pd.DataFrame]] | None = None,
                   source_description: str | None = None, progress: bool = False,
                   keep_bars: Path | None = None) -> StagedFeatures:
    """Read the bars (``cfg.data``, or ``bars``) and write every ticker's features and labels to
    ``folder``; ``keep_bars``: a folder to keep each group's bars in (``bars_store.write_part``)."""
    from alchemetric_ray.bars.sources import open_source

    names = feat.resolve_feature_names(cfg.features.names, cfg.features.set)
    spec = LabelSpec.from_config(cfg.features)
    report = None
    files = None
    if bars is None:
        source = open_source(cfg.data, min_history=min_history(cfg))
        bars, report = source.bars, source.report
        source_description = source_description or source.description
        if source.kind == "files":
            files = _folder_input(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    bar = _Progress("features", progress)
    runner = _Runner(cfg)
    try:
        if files is not None:
            runner.choose_for_folder(sum(size for _, _, size in files))
        if files is not None and runner.ray and _files_readable_by_tasks():
            parts: dict[int, Any] = {}
            runner.ingest = "tasks"
            computed = _computed_files(files, runner, keep_bars, parts, folder)
            stats = _pass_features(computed, folder, bar, runner, total=len(files))
            if report is not None:  # the source's report, filled in as reading the files in the driver fills it
                report.__dict__.update(merge_reports([parts[i] for i in sorted(parts)],
                                                     cfg.data.on_duplicate).__dict__)
        else:
            total = len(bars) if isinstance(bars, Sized) else None
            stats = _pass_features(_computed(_groups(bars, runner.group_rows), runner, keep_bars), folder, bar,
                                   runner, total=total)
    except BaseException:
        bar.close()  # an open progress line ends before the error message
        raise
    kept_tails = stats.pop("tails")
    if keep_bars is not None and kept_tails:  # what an append resumes each ticker from, beside its bars
        tails_store.write(keep_bars, 0, kept_tails)
    clock = time.monotonic()
    cross_section = _pass_cross_section(folder, stats, source_description, runner)
    runner.seconds["cross_section"] = round(time.monotonic() - clock, 3)
    return StagedFeatures(folder, names, dict(spec.__dict__), stats, cross_section, report, source_description,
                          runner.record())


# ---- where the work runs ---------------------------------------------------------------------------


class _Runner:
    """The driver or Ray tasks, decided on the first groups (:meth:`choose`), and what ran where."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.names = feat.resolve_feature_names(cfg.features.names, cfg.features.set)
        self.spec = LabelSpec.from_config(cfg.features)
        self.need = min_history(cfg)
        self.setting = cfg.features.distributed
        self.group_rows = cfg.features.group_rows
        self.ray = False
        self.decided = False
        self.ingest = "driver"  # where the files were read: the driver, or the Ray tasks (a folder's files)
        self.tasks, self.groups = 0, 0
        self.nodes: set[str] = set()
        self.seconds: dict[str, float] = {}

    def choose(self, one_group: bool, worth_local: bool = False) -> None:
        """Ray tasks for ``true``; for ``auto`` where a Ray is up, where a cluster is named to join and the
        input spans more than one group, or where the input is large enough to pay for a local Ray's start
        (``worth_local``: a folder of :data:`LOCAL_RAY_GROUPS` groups or more, :meth:`choose_for_folder`)."""
        self.decided = True
        if self.setting == "false":
            return
        if (self.setting == "auto" and not _ray_up() and not worth_local
                and (one_group or not os.environ.get("RAY_ADDRESS"))):
            return
        from alchemetric_ray.placement.session import ensure_ray

        clock = time.monotonic()
        ensure_ray(self.cfg)
        self.seconds["ray_start"] = round(time.monotonic() - clock, 3)
        self.ray = True

    def choose_for_folder(self, total_bytes: int) -> None:
        """:meth:`choose` for a folder of per-ticker files, from their size before any is read."""
        rows = total_bytes / BYTES_PER_ROW
        self.choose(one_group=rows <= self.group_rows, worth_local=rows >= LOCAL_RAY_GROUPS * self.group_rows)

    def cpus(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 0)))

    def record(self) -> dict:
        return {"mode": "ray" if self.ray else "driver", "tasks": self.tasks, "groups": self.groups,
                "nodes": len(self.nodes) if self.ray else 1, "rows_per_group": self.group_rows, "ingest": self.ingest,
                "seconds": dict(self.seconds)}

    # -- the per-date pass: one column's transform by buckets of dates --------------------------------

    def by_dates(self, kind: str, values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
        """``transform_column`` over contiguous buckets of dates, each a Ray task; the rows put back in order."""
        import ray

        buckets = date_buckets(code, n_dates, max(1, min(self.cpus(), math.ceil(len(code) / self.group_rows))))
        if len(buckets) < 2:
            return transform_column(kind, values, code, n_dates)
        order = np.argsort(code, kind="stable")  # a date's rows keep their order: the same sums, bit for bit
        sorted_code = code[order]
        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_date_task)
        refs, spans = [], []
        for lo, hi in buckets:
            a, b = np.searchsorted(sorted_code, [lo, hi])
            refs.append(task.remote(kind, values[order[a:b]], sorted_code[a:b] - lo, hi - lo))
            spans.append((a, b))
        self.tasks += len(refs)
        out = np.empty(len(values))
        try:
            for (a, b), part in zip(spans, _get_all(refs)):
                out[order[a:b]] = part
        except BaseException:
            _cancel(refs)
            raise
        return out


def _date_task(kind: str, values: np.ndarray, code: np.ndarray, n_dates: int) -> np.ndarray:
    return transform_column(kind, values, code, n_dates)


def _ray_up() -> bool:
    ray = sys.modules.get("ray")  # not imported: not up (importing it costs a second)
    return bool(ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized())


def _get_all(refs: list, what: str = "a per-date task of the feature build") -> list:
    """``ray.get``, with a task's own error (one line) raised as itself, not as Ray's wrapper (its
    traceback), and a task Ray lost (its worker killed, out of memory) as one line naming ``what``."""
    import ray
    from ray.exceptions import RayError, RayTaskError

    try:
        return ray.get(refs)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, UserError):
            raise cause from None
        raise FeatureError(f"{what} failed ({_one_line(cause if isinstance(cause, BaseException) else exc)})") \
            from None
    except RayError as exc:
        raise FeatureError(f"{what} failed ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _cancel(refs: Iterable) -> None:
    """Every task of ``refs`` stopped (its worker killed where it runs), and ended before this returns (up to
    :data:`CANCEL_WAIT_S`): a task that writes into the build's temporary folder must be gone before the
    caller's error removes that folder, or it could write there again."""
    import ray

    refs = list(refs)
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
    except Exception:
        pass


# ---- pass 1: per ticker, by groups ------------------------------------------------------------------


def _groups(bars: Iterable[tuple[str, pd.DataFrame]], group_rows: int) -> Iterator[list[tuple[str, pd.DataFrame]]]:
    """The tickers in groups of at least ``group_rows`` bars (the last one may be smaller), in input order."""
    group: list[tuple[str, pd.DataFrame]] = []
    rows = 0
    for ticker, frame in bars:
        if not _SAFE_TICKER.fullmatch(ticker) or ticker.startswith("."):
            raise ShardError(f"ticker {ticker!r} is not a safe name (letters, digits, '.', '_', '^', '=', '-')")
        group.append((ticker, frame))
        rows += len(frame)
        if rows >= group_rows:
            yield group
            group, rows = [], 0
    if group:
        yield group


def compute_checked(frames: list[tuple[str, pd.DataFrame]], names: list[str], spec: LabelSpec,
                    need: int, tails: bool = False) -> GroupResult:
    """``compute_group``; where it raises, the ticker that fails alone is named, with its file."""
    try:
        return compute_group(frames, names, spec, need, tails=tails)
    except UserError:
        raise
    except Exception as exc:
        raise _culprit(frames, names, spec, need, exc) from None


def _culprit(frames, names, spec, need, exc: Exception) -> FeatureError:
    for ticker, frame in frames:
        try:
            compute_group([(ticker, frame)], names, spec, need)
        except Exception as alone:
            return FeatureError(f"ticker {ticker}{_from(frame)}: its features could not be computed "
                                f"({_one_line(alone)})")
    tickers = [t for t, _ in frames]
    return FeatureError(f"the features of tickers {tickers[0]}..{tickers[-1]} could not be computed together, though "
                        f"each one alone could ({_one_line(exc)})")


def _from(frame: pd.DataFrame) -> str:
    source = frame.attrs.get("source")
    return f" (file {source})" if source else ""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _keep(folder: Path | None, index: int, frames: list[tuple[str, pd.DataFrame]]) -> None:
    """The group's bars kept in ``folder/bars`` (for appends); a ticker whose bars cannot be is named."""
    if folder is None:
        return
    table = _bars_checked(frames)
    try:
        write_table_part(folder, index, table)
    except Exception as exc:
        raise FeatureError(f"the bars of tickers {frames[0][0]}..{frames[-1][0]} could not be kept "
                           f"({_one_line(exc)})") from None


def _bars_checked(frames: list[tuple[str, pd.DataFrame]]) -> pa.Table:
    """``bars_table``; where it raises, the ticker whose bars cannot be kept is named, with its file."""
    try:
        return bars_table(frames)
    except Exception as exc:
        for ticker, frame in frames:
            try:
                bars_table([(ticker, frame)])
            except Exception as alone:
                raise FeatureError(f"ticker {ticker}{_from(frame)}: its bars could not be kept "
                                   f"({_one_line(alone)})") from None
        raise FeatureError(f"the bars of tickers {frames[0][0]}..{frames[-1][0]} could not be kept "
                           f"({_one_line(exc)})") from None


_BAR_COLUMNS = ("date", "open", "high", "low", "close", "volume")  # the canonical bars ingest gives


def _group_payload(frames: list[tuple[str, pd.DataFrame]]) -> Any:
    """What a group's task is sent: its canonical bars as one Arrow table with the tickers, their row counts and
    files (one buffer per column: 200k rows reached a task in 13 ms against 37 ms as 200 pandas frames,
    measured here), or the frames themselves where one is not canonical bars (other columns or types, a
    caller's ``bars=``): those go as they are, so that a ticker that fails is named as in the driver."""
    for _, frame in frames:
        if (tuple(frame.columns) != _BAR_COLUMNS or set(frame.attrs) - {"source"}
                or not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1
                or frame["date"].dtype != "datetime64[ns]"
                or any(frame[c].dtype != np.float64 for c in _BAR_COLUMNS[1:])):
            return frames
    columns = {c: np.concatenate([frame[c].to_numpy() for _, frame in frames]) for c in _BAR_COLUMNS}
    return (pa.table(columns), [t for t, _ in frames], [len(f) for _, f in frames],
            [f.attrs.get("source") for _, f in frames])


def _group_frames(payload: Any) -> list[tuple[str, pd.DataFrame]]:
    """:func:`_group_payload`'s frames again, column for column the same."""
    if isinstance(payload, list):
        return payload
    table, tickers, lengths, sources = payload
    arrays = {c: table.column(c).to_numpy() for c in _BAR_COLUMNS}
    frames = []
    start = 0
    for ticker, n, source in zip(tickers, lengths, sources):
        frame = pd.DataFrame({c: values[start:start + n] for c, values in arrays.items()})
        if source is not None:
            frame.attrs["source"] = source
        frames.append((ticker, frame))
        start += n
    return frames


def _group_task(payload, names, spec, need, tails) -> tuple[GroupResult, str]:
    import ray

    return compute_checked(_group_frames(payload), names, spec, need, tails), ray.get_runtime_context().get_node_id()


def _computed(groups: Iterator[list[tuple[str, pd.DataFrame]]], runner: _Runner,
              keep_bars: Path | None) -> _Computed:
    """(group index, its result, its tickers) for every group, in any order: in the driver, or as Ray tasks with a
    bounded number in flight."""
    names, spec, need = runner.names, runner.spec, runner.need
    first = next(groups, None)
    second = next(groups, None) if first is not None else None
    if not runner.decided:
        runner.choose(one_group=second is None)
    ahead = [g for g in (first, second) if g is not None]

    def every() -> Iterator[list[tuple[str, pd.DataFrame]]]:
        yield from ahead
        ahead.clear()  # the driver holds no group it has handed on
        yield from groups

    if not runner.ray:
        for index, frames in enumerate(every()):
            _keep(keep_bars, index, frames)
            runner.groups += 1
            yield index, compute_checked(frames, names, spec, need, keep_bars is not None), len(frames), None
        return
    import ray

    # SPREAD: a group's inputs come from the driver wherever it runs, so no node is nearer its data
    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_group_task)
    pending: dict[Any, tuple[int, str, int]] = {}  # a task -> its group, its tickers and how many
    try:
        for index, frames in enumerate(every()):
            _keep(keep_bars, index, frames)
            pending[task.remote(_group_payload(frames), names, spec, need, keep_bars is not None)] = (
                index, f"{frames[0][0]}..{frames[-1][0]}", len(frames))
            runner.groups += 1
            runner.tasks += 1
            del frames
            while len(pending) >= IN_FLIGHT_PER_CPU * runner.cpus():  # re-read: an autoscaler adds nodes
                yield from _finished(pending, runner, wait_for=1)
        while pending:
            yield from _finished(pending, runner, wait_for=1)
    except BaseException:
        _cancel(pending)
        raise


# ---- pass 1 for a folder of per-ticker files: each task reads its own files -------------------------


def _folder_input(cfg: RunConfig) -> list[tuple[str, Path, int]] | None:
    """(ticker, file, bytes) of a local folder of per-ticker files, in ingest's order and with its checks; None
    for any other input (one long table: ingest in the driver)."""
    from alchemetric_ray.bars.ingest import folder_files

    pairs = folder_files(cfg.data.path, cfg.data.tickers) if cfg.data.path else None
    # absolute: a task's working folder need not be the driver's
    return None if pairs is None else [(ticker, path.resolve(), path.stat().st_size) for ticker, path in pairs]


def _files_readable_by_tasks() -> bool:
    """Whether Ray tasks can read the driver's files: a Ray of one node, this one, with CPUs (a local Ray).
    On a cluster of several nodes the driver reads the files and sends the bars (other nodes do not see its
    disk)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    here = ray.get_runtime_context().get_node_id()
    return len(alive) == 1 and alive[0].get("NodeID") == here and alive[0].get("Resources", {}).get("CPU", 0) > 0


def _file_groups(files: list[tuple[str, Path, int]], group_bytes: float, cpus: int) -> list[list[tuple[str, Path]]]:
    """Consecutive files in groups of about ``group_bytes`` at most, evened out by size; where they take more
    than one round of tasks on ``cpus`` CPUs, as many groups as a multiple of ``cpus`` (5 groups on 2 CPUs
    leave one idle in the third round; 6 smaller ones keep both busy: bench/features.py, docs/performance.md)."""
    total = sum(nbytes for _, _, nbytes in files)
    count = max(1, math.ceil(total / group_bytes))
    if count > cpus > 1:
        count = math.ceil(count / cpus) * cpus
    count = min(count, len(files))
    groups: list[list[tuple[str, Path]]] = [[] for _ in range(count)]
    before = 0
    for ticker, path, nbytes in files:  # a file goes to the group whose share of the total holds its middle
        groups[min(count - 1, int(count * (before + nbytes / 2) / max(total, 1)))].append((ticker, path))
        before += nbytes
    return [group for group in groups if group]


@dataclass(frozen=True)
class _FilesGroup:
    """Where a folder's group task writes: its staged rows, and its bars (``keep``: None, not kept)."""

    index: int
    staging: Path
    keep: Path | None


def _files_task(files: list[tuple[str, Path]], on_duplicate: str, names: list[str], spec: LabelSpec, need: int,
                group: _FilesGroup) -> tuple[GroupResult, np.ndarray, Any, str]:
    """One group of files: read and validated (ingest, with a report of its own), its features computed and
    written where the driver would write them (the task runs on the driver's node): its labelled rows to
    ``staging/part-NNNNN.arrow``, its validated bars to the bars store.  The result without its rows, the
    rows' dates (days, unique) and the ingest report."""
    import ray

    from alchemetric_ray.bars.ingest import ingest_files

    frames, report = ingest_files(files, min_history=need, on_duplicate=on_duplicate)  # ingest's min_history
    result = compute_checked(frames, names, spec, need, group.keep is not None) if frames else \
        GroupResult(pa.table({}), [])
    if group.keep is not None and frames:
        _keep(group.keep, group.index, frames)
    days = _stage(result, group.staging, group.index)
    return result, days, report, ray.get_runtime_context().get_node_id()


def _stage(result: GroupResult, staging: Path, index: int) -> np.ndarray:
    """A group's labelled rows written to ``staging/part-NNNNN.arrow`` (none: no file) and taken out of
    ``result``; their dates (days, unique)."""
    if not result.table.num_rows:
        return np.array([], dtype="datetime64[D]")
    write_staged(result.table, staging / f"part-{index:05d}{STAGED_SUFFIX}")
    days = np.unique(result.table.column("date").to_numpy().astype("datetime64[D]"))
    result.table = pa.table({})  # written: only the group's record is kept
    return days


def _computed_files(files: list[tuple[str, Path, int]], runner: _Runner, keep_bars: Path | None,
                    reports: dict[int, Any], staging: Path) -> _Computed:
    """:func:`_computed` for a folder of per-ticker files, ingest included: each Ray task reads and validates
    its group's files (groups by file size, ~ bars), computes its features, writes them to ``staging`` and
    its bars to ``keep_bars`` (the tasks run on the driver's node), and returns its record, its rows' days
    and its part of the ingest report (into ``reports`` by group).  Where no task kept a ticker, ingest's own
    error."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from alchemetric_ray.bars.ingest import no_ticker_error

    cfg = runner.cfg
    groups = _file_groups(files, runner.group_rows * BYTES_PER_ROW, runner.cpus())  # ~ group_rows bars at most
    if keep_bars is not None:  # the tasks write into folders that exist: none makes one (under a removed one)
        (keep_bars / BARS_DIR).mkdir(exist_ok=True)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)  # the files' node
    options: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": here}
    task = ray.remote(**options)(_files_task)
    pending: dict[Any, tuple[int, str, int]] = {}
    kept = 0
    try:
        for index, group in enumerate(groups):
            ref = task.remote(group, cfg.data.on_duplicate, runner.names, runner.spec, runner.need,
                              _FilesGroup(index, staging, keep_bars))
            pending[ref] = (index, f"{group[0][0]}..{group[-1][0]}", len(group))
            runner.groups += 1
            runner.tasks += 1
            while len(pending) >= IN_FLIGHT_PER_CPU * runner.cpus() or (index == len(groups) - 1 and pending):
                done, _ = ray.wait(list(pending), num_returns=1)
                index_done, tickers, count = pending.pop(done[0])
                result, days, report, node = _get_all(done, f"the feature task of tickers {tickers}")[0]
                runner.nodes.add(node)
                reports[index_done] = report
                kept += report.tickers
                yield index_done, result, count, days
    except BaseException:
        _cancel(pending)
        raise
    if not kept:
        from alchemetric_ray.bars.report import IngestReport

        merged = merge_reports([reports[i] for i in sorted(reports)], cfg.data.on_duplicate) if reports \
            else IngestReport()
        raise no_ticker_error(Path(str(cfg.data.path)), runner.need, merged)


def _finished(pending: dict, runner: _Runner, wait_for: int) -> _Computed:
    import ray

    done, _ = ray.wait(list(pending), num_returns=wait_for)
    for ref in done:
        index, tickers, count = pending.pop(ref)
        result, node = _get_all([ref], f"the feature task of tickers {tickers}")[0]
        runner.nodes.add(node)
        yield index, result, count, None


def _pass_features(computed: _Computed, staging: Path, progress: Callable,
                   runner: _Runner, total: int | None = None) -> dict:
    """Every group's labelled rows (``computed``: (group index, result, tickers read, and the rows' days
    where a task wrote them itself, else None)) to ``staging/part-NNNNN.arrow``; the calendar, the input
    hash and what was kept, skipped and dropped."""
    clock = time.monotonic()
    calendar = np.array([], dtype="datetime64[D]")
    by_group: dict[int, GroupResult] = {}
    done = rows = 0
    for index, result, count, days in computed:
        if days is None:  # the rows came back: written here
            days = _stage(result, staging, index)
        calendar = np.union1d(calendar, days)
        by_group[index] = result
        done += count
        rows += result.rows_in
        progress(done, total, rows=rows)
    progress(done, total, final=True, rows=rows)
    digest = hashlib.sha256()
    tickers: list[str] = []
    skipped: dict[str, str] = {}
    nonfinite = 0
    tails: list[pa.Table] = []  # the groups' tails rows, in ticker order
    for index in sorted(by_group):
        result = by_group[index]
        for ticker, value in result.digests.items():
            digest.update(ticker.encode())
            digest.update(value.encode())
        tickers += result.tickers
        skipped.update(result.skipped)
        nonfinite += result.nonfinite
        if result.tails is not None and result.tails.num_rows:
            tails.append(result.tails)
    runner.seconds["features"] = round(time.monotonic() - clock, 3)
    if not tickers:
        detail = "; ".join(f"{t}: {why}" for t, why in list(skipped.items())[:3])
        raise ShardError(f"no ticker has enough history for the features and labels ({detail or 'no data'})")
    return {"calendar": calendar, "hash": digest.hexdigest(), "tickers": tickers, "skipped": skipped,
            "nonfinite": nonfinite, "tails": tails}


# ---- the per-date pass -------------------------------------------------------------------------------


def _pass_cross_section(staging: Path, stats: dict, source: str | None, runner: _Runner) -> dict:
    """The per-date pass over the staged groups, when the label or a feature needs one; the calendar is
    then the dates it kept.  What the manifest records of it (empty when none ran)."""
    cfg = runner.cfg
    ops = plan_ops(runner.names, runner.spec, cfg.features.cs_normalize)
    if not ops:
        return {}
    transform = runner.by_dates if runner.ray else None
    report = apply_cross_section(staged_files(staging), ops, min_names=cfg.features.min_cross_section,
                                 what=source or cfg.data.path or cfg.data.source, transform=transform)
    kept = cast(np.ndarray, report.kept_dates)  # apply_cross_section always sets them
    stats["calendar"] = np.unique(kept.astype("datetime64[D]"))
    return {"normalize": cfg.features.cs_normalize, "min_names": cfg.features.min_cross_section,
            "ops": [op.__dict__ for op in ops], **report.as_dict(),
            "universe": "the tickers in the data as given: stocks listed at the data's end date only, so the "
                        "cross-section is survivorship-biased"}


def staged_files(staging: Path) -> list[Path]:
    """The staged parts, in name (= group = ticker) order."""
    return sorted(staging.glob(f"*{STAGED_SUFFIX}"))
