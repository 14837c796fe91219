"""Bars -> labelled, normalized Parquet feature shards with a JSON manifest, written atomically.

Layout of ``OUT``::

    OUT/manifest.json
    OUT/split=train/part-00000.parquet ...   (rows ordered by ticker, then date)
    OUT/split=val/...
    OUT/split=test/...                       (an append adds part-NNNNN.K.parquet: data/append_write.py)

Columns: ``date`` (timestamp), ``ticker``, one float32 column per feature (normalized with the
train segment's statistics), ``label`` (int64 class id), ``fwd_ret`` (float32 forward log
return, for evaluation), ``label_end`` (date of the last bar the label looks at).

Pass 1 computes features and labels by groups of tickers (in the driver or as Ray tasks) into a
staging folder and collects the trading calendar; a cross-sectional label or feature (``cs_rank``,
``cs_zscore``, the market-relative features, ``features.cs_normalize``) then takes a per-date pass
over the staging folder (``data/cross_section.py``), which drops dates with too few stocks: both in
``data/staging.py``.  The split plan is then fixed; pass 2 fits the normalization on train rows;
pass 3 normalizes and writes the final shards, a staged group at a time (as Ray tasks where pass 1
ran as tasks on this one node: ``data/shard_parts.py``).  The bars of each group are kept in ``OUT/bars``
(``data/bars_store.py``) for appends.  Everything is written under a temporary folder beside ``OUT``
that replaces ``OUT`` only once complete.  Memory in the driver: one group's rows (``features.group_rows``,
and up to two per CPU of bars in flight with Ray), and during the per-date pass one column of every row
(about 80 bytes a row at its peak, measured; see ``data/cross_section.py``).

A regression target's ``label`` is float32 (the cross-sectional value); a class target's is int64.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from alchemetric_ray.config import RunConfig
from alchemetric_ray.data import features as feat
from alchemetric_ray.data.bars_store import BARS_DIR
from alchemetric_ray.data.cross_section import read_staged
from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.data.manifest import MANIFEST, Manifest
from alchemetric_ray.data.normalize import Normalizer, NormalizerFit, zscore_from_moments
from alchemetric_ray.data.shard_parts import (
    PartJob,
    PartSizes,
    TrainRows,
    feature_columns,
    group_moments,
    run_groups,
    write_parts,
)
from alchemetric_ray.data.splits import SPLITS, SplitPlan, SplitSpec, plan_splits
from alchemetric_ray.data.staging import StagedFeatures, stage_features, staged_files
from alchemetric_ray.data.tails import TAILS_DIR
from alchemetric_ray.errors import ShardError
from alchemetric_ray.fsutil import unwritable_ancestor
from alchemetric_ray.outputs import claim, staged_output
from alchemetric_ray.storage import Location, locate, preflight

ROWS_PER_FILE = 250_000
ROWS_PER_ROW_GROUP = 65_536
# the robust normalization's reservoir takes blocks of this many train rows in row order, so that its sample
# (and so its statistics, to the last bit) does not depend on how the build grouped the tickers (staging's
# groups by rows in the driver, by file size where Ray tasks read the files); zscore's per-ticker moments
# do not either
FIT_ROWS = 65_536


@dataclass
class ShardSummary:
    out: Location
    manifest: Manifest
    seconds: float


def split_dir(out: str | Path | Location, split: str) -> Path:
    """A split's folder in a local shard folder (where shards are built)."""
    return (out.local if isinstance(out, Location) else Path(out)) / f"split={split}"


def split_files(shards: str | Path | Location, split: str, manifest: Manifest) -> list[Location]:
    """The Parquet files of one split: those the manifest lists, and only those (a manifest from
    before the list existed: every Parquet file in the split's folder)."""
    where = locate(shards)
    if manifest.files:
        return [where / name for name in manifest.files.get(split, [])]
    folder = where / f"split={split}"
    return [folder / name for name in folder.listing("*.parquet", folders=False)]


_CHAIN_NAME = re.compile(r"^(part-\d+)(?:\.\d+)?\.parquet$")


def file_chains(files: list[Location]) -> list[list[Location]]:
    """A split's files as chains: a part file (``part-NNNNN.parquet``) and the continuations appends wrote
    of it (``part-NNNNN.K.parquet``: the rows the K-th of them added to its tickers), in the order listed.
    A ticker's rows lie in one chain, a build's in one file; a sequence model's windows are built a chain
    at a time (data/loaders.py).  Another name is a chain of its own."""
    chains: dict[str, list[Location]] = {}
    for file in files:
        name = file.path.rsplit("/", 1)[-1]
        found = _CHAIN_NAME.match(name)
        chains.setdefault(found.group(1) if found else file.path, []).append(file)
    return list(chains.values())


def build_shards(cfg: RunConfig, out: str | Path | Location, *, bars: Iterable[tuple[str, pd.DataFrame]] | None = None,
                 source_description: str | None = None, progress: bool = False,
                 staged: StagedFeatures | None = None) -> ShardSummary:
    """Compute features and labels for every ticker and write the shards + manifest to ``out``
    (a local folder or object storage: built locally, then put in place with the manifest last).
    ``staged``: features :func:`stage_features` already wrote for the same features and label
    (another split of the same data); they are read, never changed."""
    start = time.monotonic()
    out = locate(out)
    names = feat.resolve_feature_names(cfg.features.names, cfg.features.set)
    spec = LabelSpec.from_config(cfg.features)
    embargo = spec.reach if cfg.features.embargo is None else cfg.features.embargo
    if embargo < spec.reach:
        raise ShardError(f"config 'features.embargo': {embargo} is less than the label's reach ({spec.reach} bars); "
                         "label windows would cross split boundaries")
    if staged is not None and (staged.names != names or staged.label != spec.__dict__):
        raise ShardError(f"staged features {staged.names} ({staged.label['scheme']}) are not this config's {names} "
                         f"({spec.scheme})")
    _check_output(out, cfg)
    with staged_output(out, "shards", last=(MANIFEST,)) as tmp:
        features = staged or stage_features(cfg, tmp / "_staging", bars=bars, source_description=source_description,
                                            progress=progress, keep_bars=tmp)
        stats, staging = features.stats, features.folder
        fc = cfg.features
        plan = plan_splits(stats["calendar"], SplitSpec(fc.train_frac, fc.val_frac, embargo, fc.train_end, fc.val_end,
                                                        fc.train_start))
        clock = time.monotonic()
        in_tasks = _passes_in_tasks(features)
        normalizer = _fit_normalizer(staging, names, plan, cfg, in_tasks)
        fitted = time.monotonic()
        job = PartJob(tmp, names, plan, normalizer, spec, PartSizes(ROWS_PER_FILE, ROWS_PER_ROW_GROUP))
        counts = write_parts(staged_files(staging), job, in_tasks=in_tasks)
        seconds = {**features.build.get("seconds", {}), "normalization": round(fitted - clock, 3),
                   "write": round(time.monotonic() - fitted, 3)}
        if staged is None:
            shutil.rmtree(staging)
        if not spec.regression:
            _check_classes(counts, spec.classes)
        files = {s: sorted(f"{split_dir(tmp, s).name}/{p.name}" for p in split_dir(tmp, s).glob("*.parquet"))
                 for s in SPLITS}
        # the kept bars and tails too: an append reads the files listed, never what else lies there (a file an
        # interrupted append left)
        for kept in (BARS_DIR, TAILS_DIR):
            parts = sorted(f"{kept}/{p.name}" for p in (tmp / kept).glob("part-*.parquet"))
            if parts:
                files[kept] = parts
        manifest = Manifest(
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            source=features.source_description,
            input_hash=stats["hash"],
            features=names,
            label={**spec.__dict__, "classes": spec.classes, "reach": spec.reach},
            window=cfg.features.window,
            built_with=cfg.to_dict()["features"],
            splits=plan.as_dict(),
            normalization=normalizer.as_dict(),
            rows=counts["rows"],
            class_counts=counts["classes"],
            tickers=stats["tickers"],
            skipped_tickers=stats["skipped"],
            dropped_nonfinite_rows=stats["nonfinite"],
            ingest=_ingest_summary(features.report),
            columns={"date": "date", "ticker": "ticker", "label": "label", "fwd_ret": "fwd_ret"},
            files=files,
            cross_section=features.cross_section,
            build={**features.build, "write": "tasks" if in_tasks else "driver", "seconds": seconds},
        )
        manifest.write(tmp)
    return ShardSummary(out, manifest, time.monotonic() - start)


def _check_output(out: Location, cfg: RunConfig) -> None:
    preflight(out)  # object storage: credentials, endpoint and bucket, before any work
    claim(out, "shards", what="output folder")  # only our own shards are replaced
    if not out.is_local:
        return
    if cfg.data.path:
        data = Path(cfg.data.path).resolve()
        target = out.local
        if target == data or data in target.parents:
            raise ShardError(f"output folder {out} is inside the input data folder {cfg.data.path}")
    blocked = unwritable_ancestor(out.local.parent)
    if blocked is not None:
        raise ShardError(f"output folder {out}: {blocked} is not a writable folder")


def feature_table(ticker: str, frame: pd.DataFrame, names: list[str], spec: LabelSpec) -> tuple[pd.DataFrame, int]:
    """Moved to :func:`alchemetric_ray.data.panel.feature_table` (the vectorized panel, one ticker)."""
    from alchemetric_ray.data.panel import feature_table as one_ticker

    return one_ticker(ticker, frame, names, spec)


def _fit_normalizer(staging: Path, names: list[str], plan: SplitPlan, cfg: RunConfig, in_tasks: bool) -> Normalizer:
    """Pass 2: the normalization, fitted on the train rows.  ``zscore``: each ticker's moments, a group at a
    time (as Ray tasks where ``in_tasks``), merged in ticker order; ``robust``: a reservoir of the train
    rows read in row order, in the driver."""
    try:
        if cfg.features.normalization == "zscore":
            moments = run_groups(group_moments, staged_files(staging), TrainRows(names, plan), in_tasks=in_tasks,
                                 what="a normalization task of the feature build")
            return zscore_from_moments(names, moments)
        fit = NormalizerFit(cfg.features.normalization, names, seed=cfg.data.seed)
        rest = np.empty((0, len(names)))
        for path in staged_files(staging):
            table = read_staged(path, columns=["date", "label_end", *names])
            train = plan.assign(table.column("date").to_numpy(), table.column("label_end").to_numpy()) == 0
            rows = np.concatenate([rest, np.column_stack([c[train] for c in feature_columns(table, names)]) if names
                                   else np.empty((int(train.sum()), 0))])
            whole = len(rows) - len(rows) % FIT_ROWS
            for lo in range(0, whole, FIT_ROWS):  # blocks of the train rows as they come, whatever the groups
                fit.add(rows[lo:lo + FIT_ROWS])
            rest = rows[whole:]
        fit.add(rest)
        return fit.finish()
    except ValueError:
        raise ShardError(f"the train split ({plan.train_start}..{plan.train_end}) has no rows") from None


def _passes_in_tasks(features: StagedFeatures) -> bool:
    """Whether passes 2 and 3 run as Ray tasks: where pass 1 did, on a Ray of this one node (the tasks see the
    staging folder and the output); the Ray is still up (the build's or the caller's)."""
    if features.build.get("mode") != "ray":
        return False
    from alchemetric_ray.data.staging import _files_readable_by_tasks, _ray_up

    return _ray_up() and _files_readable_by_tasks()


def _check_classes(counts: dict, classes: list[str]) -> None:
    present = [c for c, k in zip(classes, counts["classes"]["train"]) if k > 0]
    if len(present) < 2:
        raise ShardError(f"the train split has a single class ({', '.join(present) or 'none'}): "
                         "nothing to learn; check features.threshold / features.label")


def _ingest_summary(report) -> dict | None:
    if report is None:
        return None
    return {"files": report.files, "tickers": report.tickers, "rows_read": report.rows_read,
            "rows_kept": report.rows_kept, "dropped": dict(report.dropped),
            "skipped_tickers": dict(report.skipped_tickers), "warnings": len(report.warnings),
            "duplicates": report.duplicates()}


