"""Read daily OHLCV files and turn them into validated, canonical bars, one ticker at a time.

Inputs (``iter_bars(path)``):

* a folder of ``.csv`` / ``.parquet`` / ``.pq`` files, one per ticker (ticker = file stem),
  read in sorted order; other files, sub-folders and dotfiles are ignored;
* a single file that is one long table with a ``ticker`` (or ``symbol``) column, grouped by
  ticker (the whole table is read once; the tickers are still yielded one at a time);
* a single per-ticker file (ticker = file stem).

Each file is read by :mod:`~alchemetric_ray.bars.files`, its columns matched and parsed by
:mod:`~alchemetric_ray.bars.columns` and its rows cleaned by :mod:`~alchemetric_ray.bars.cleaning`
(the rules, in their order, and what each drops); :class:`~alchemetric_ray.bars.report.IngestReport`
counts what was read, kept, dropped and skipped.

Errors (:class:`DataError`, one line naming the file and the column, date, row or value): a
path that does not exist or holds no data files, an unreadable file, a missing required column,
an unparseable date or number, differing rows for one date (with ``on_duplicate="refuse"``),
too many bad values (the cleaning rules), an unsafe ticker name, an unknown requested ticker,
or no ticker left at all.  Unsorted rows are sorted, with a warning.  A ticker with fewer than
``min_history`` clean rows (or none at all) is skipped with a warning and a reason in
``IngestReport.skipped_tickers``.

Problems with the path itself (missing, empty folder, unsafe file names, unknown ``tickers=``
in a folder) are raised when :func:`iter_bars` is called; problems inside files while iterating.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pandas as pd

from alchemetric_ray.bars.cleaning import validate_bars
from alchemetric_ray.bars.files import DATA_SUFFIXES, _folder_files, _per_ticker_files, _single_file
from alchemetric_ray.bars.report import ON_DUPLICATE_DEFAULT, IngestReport, _check_policy
from alchemetric_ray.errors import DataError


def iter_bars(path: str | Path, *, tickers: list[str] | None = None, min_history: int = 0,
              report: IngestReport | None = None,
              on_duplicate: str = ON_DUPLICATE_DEFAULT) -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield (ticker, bars) one ticker at a time (bounded memory), validated.

    ``tickers`` restricts to those tickers (case-insensitive; an empty list means all).  Tickers
    left with fewer than ``min_history`` clean rows are skipped; if none is left at the end of
    the iteration, :class:`DataError` is raised.  ``report`` (if given) is filled in as it goes.
    ``on_duplicate`` says what a date with differing rows becomes (:mod:`~alchemetric_ray.bars.cleaning`,
    ``duplicate_date``); it is checked here, before any file is read.
    """
    if min_history < 0:
        raise DataError(f"min_history must be >= 0, got {min_history}")
    _check_policy(on_duplicate)
    report = IngestReport() if report is None else report
    report.on_duplicate = on_duplicate
    root = Path(path)
    wanted = _wanted(tickers)
    if not root.exists():
        raise DataError(f"data path {root}: not found")
    if root.is_dir():
        files = _folder_files(root, wanted)
        pairs: Iterator[tuple[str, pd.DataFrame, str]] = _per_ticker_files(files, report)
    elif root.is_file():
        if root.suffix.lower() not in DATA_SUFFIXES:
            raise DataError(f"{root.name}: not a CSV or Parquet file (expected one of "
                            f"{', '.join(DATA_SUFFIXES)}, or a folder of them)")
        pairs = _single_file(root, wanted, report)
    else:
        raise DataError(f"data path {root}: not a file or folder")
    return _validated(pairs, root, min_history, report, on_duplicate)


def _validated(pairs, root: Path, min_history: int, report: IngestReport, on_duplicate: str):
    yielded = 0
    for ticker, raw, source in pairs:
        bars = validate_bars(raw, ticker=ticker, source=source, report=report, min_history=min_history,
                             on_duplicate=on_duplicate)
        del raw
        if bars is not None:
            bars.attrs["source"] = source  # the file it came from: named where its features fail (data/staging.py)
            yielded += 1
            yield ticker, bars
    if yielded == 0:
        raise no_ticker_error(root, min_history, report)


def no_ticker_error(root: Path, min_history: int, report: IngestReport) -> DataError:
    """The error at the end of an iteration that yielded no ticker (also raised by a build whose Ray
    tasks ingested the folder, on their merged report)."""
    skipped = "; ".join(f"{t}: {why}" for t, why in list(report.skipped_tickers.items())[:3])
    return DataError(f"no ticker has at least {max(min_history, 1)} rows of clean history in {root}"
                     + (f" (skipped {len(report.skipped_tickers)}, e.g. {skipped})" if skipped else ""))


def folder_files(path: str | Path, tickers: list[str] | None = None) -> list[tuple[str, Path]] | None:
    """The (ticker, file) pairs :func:`iter_bars` reads from a folder of per-ticker files, in its order,
    with its checks of the names; None where ``path`` is not a folder."""
    root = Path(path)
    return _folder_files(root, _wanted(tickers)) if root.is_dir() else None


def ingest_files(files: list[tuple[str, Path]], *, min_history: int = 0,
                 on_duplicate: str = ON_DUPLICATE_DEFAULT) -> tuple[list[tuple[str, pd.DataFrame]], IngestReport]:
    """Read and validate some of a folder's files (:func:`folder_files`' pairs) as :func:`iter_bars` does,
    into a report of their own: what one Ray task of the feature build ingests.  The caller merges the
    reports in file order (:func:`~alchemetric_ray.bars.report.merge_reports`) and raises
    :func:`no_ticker_error` where no task kept a ticker."""
    _check_policy(on_duplicate)
    report = IngestReport(on_duplicate=on_duplicate)
    kept = []
    for ticker, raw, source in _per_ticker_files(files, report):
        bars = validate_bars(raw, ticker=ticker, source=source, report=report, min_history=min_history,
                             on_duplicate=on_duplicate)
        del raw
        if bars is not None:
            bars.attrs["source"] = source
            kept.append((ticker, bars))
    return kept, report


def _wanted(tickers: list[str] | None) -> list[str] | None:
    if tickers is None:
        return None
    if isinstance(tickers, str):
        tickers = [tickers]
    names = list(dict.fromkeys(str(t).strip() for t in tickers if str(t).strip()))
    return names or None
