"""Data files -> (ticker, raw table, source name) for ingest: a folder of per-ticker CSV/Parquet files, one
long table grouped by its ticker column, or one per-ticker file.  Ticker names are checked (safe as file
names, unique ignoring case) and requested tickers picked out; a file that cannot be read is a
:class:`~alchemetric_ray.bars.messages.DataError` naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from alchemetric_ray.bars.columns import _arrow_columns, _Columns, _LongTable, _Rows, _ticker_column
from alchemetric_ray.bars.messages import _row_ref, _rows_text
from alchemetric_ray.bars.report import IngestReport
from alchemetric_ray.errors import DataError

DATA_SUFFIXES = (".csv", ".parquet", ".pq")
# Cell texts that mean "no value" in a CSV.  "nan"/"inf" are deliberately not here: written out,
# they are values (a broken upstream computation) and fall under the non-finite rules.
MISSING_MARKERS = ("", "null", "NULL", "Null", "NA", "N/A", "n/a", "#N/A", "None", "none", "-", "--")

_SAFE_TICKER = re.compile(r"[A-Za-z0-9._^=-]+")


def _folder_files(root: Path, wanted: list[str] | None) -> list[tuple[str, Path]]:
    files = sorted((p for p in root.iterdir()
                    if p.suffix.lower() in DATA_SUFFIXES and not p.name.startswith(".") and p.is_file()),
                   key=lambda p: p.name)
    if not files:
        raise DataError(f"no CSV or Parquet files in {root}")
    by_key: dict[str, Path] = {}
    for p in files:
        _check_ticker_name(p.stem, p.name)
        other = by_key.setdefault(p.stem.upper(), p)
        if other is not p:
            raise DataError(f"{root}: two files for ticker {p.stem}: {other.name} and {p.name}")
    if wanted is not None:
        _check_wanted(wanted, [p.stem for p in files], str(root))
        keys = {w.upper() for w in wanted}
        files = [p for p in files if p.stem.upper() in keys]
    return [(p.stem, p) for p in files]


def _per_ticker_files(files: list[tuple[str, Path]], report: IngestReport):
    for ticker, p in files:
        raw = _read_ticker_file(p)
        report.files += 1
        tcol = _ticker_column(raw) if isinstance(raw, pd.DataFrame) else None  # _Columns: none
        if tcol is not None:
            distinct = cast(pd.DataFrame, raw)[tcol].dropna().astype(str).str.strip().unique()
            if len(distinct) > 1:
                raise DataError(f"{p.name}: has a '{tcol}' column with {len(distinct)} tickers; a folder "
                                "must hold one file per ticker (pass a long table as a single file)")
        yield ticker, raw, p.name


def _single_file(p: Path, wanted: list[str] | None, report: IngestReport):
    raw = _read_file(p, long_table=True)
    report.files += 1
    tcol = _ticker_column(raw)
    if tcol is None:
        _check_ticker_name(p.stem, p.name)
        if wanted is not None:
            _check_wanted(wanted, [p.stem], p.name)
        yield p.stem, raw, p.name
        return
    names = raw[tcol].astype("string").str.strip()
    empty = names.isna() | (names == "")
    if empty.any():
        rows = raw.index[empty.to_numpy()]
        report.rows_read += int(empty.sum())
        report.dropped["empty_cell"] += int(empty.sum())
        report.warnings.append(f"{p.name}: dropped {int(empty.sum())} rows with an empty '{tcol}' cell "
                               f"({_rows_text(p.name, rows)})")
        raw, names = raw[~empty.to_numpy()], names[~empty]
    codes, uniques = pd.factorize(names, sort=True)
    uniques = [str(u) for u in uniques]
    seen: dict[str, str] = {}
    for i, name in enumerate(uniques):
        if not _is_safe_ticker(name):
            first = raw.index[np.flatnonzero(codes == i)[0]]
            _check_ticker_name(name, f"{p.name} ({_row_ref(p.name, first)}, column '{tcol}')")
        other = seen.setdefault(name.upper(), name)
        if other != name:
            raise DataError(f"{p.name}: tickers {other!r} and {name!r} differ only by case")
    selected = list(range(len(uniques)))
    if wanted is not None:
        _check_wanted(wanted, uniques, p.name)
        keys = {w.upper() for w in wanted}
        selected = [i for i in selected if uniques[i].upper() in keys]
    order = np.argsort(codes, kind="stable")  # stable: each ticker's rows stay in file order
    bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
    table = _LongTable(raw)  # its columns converted once, for all tickers (bars/columns.py)
    for i in selected:
        yield uniques[i], _Rows(table, order[bounds[i]:bounds[i + 1]]), f"{p.name} (ticker {uniques[i]})"


def _check_wanted(wanted: list[str], available: list[str], where: str) -> None:
    have = {a.upper() for a in available}
    missing = [w for w in wanted if w.upper() not in have]
    if missing:
        some = ", ".join(sorted(available)[:8]) + (", ..." if len(available) > 8 else "")
        raise DataError(f"requested ticker{'s' if len(missing) > 1 else ''} {', '.join(missing)} not in "
                        f"{where} (it has {len(available)}: {some})")


def _is_safe_ticker(name: str) -> bool:
    return bool(_SAFE_TICKER.fullmatch(name)) and not name.startswith(".") and ".." not in name


def _check_ticker_name(name: str, where: str) -> None:
    if not _is_safe_ticker(name):
        raise DataError(f"{where}: unsafe ticker name {name!r}: use only letters, digits and . _ ^ = -, "
                        "not starting with '.' and without '..'")




def _read_ticker_file(p: Path) -> pd.DataFrame | _Columns:
    """A per-ticker file: :func:`_read_file`, or for a Parquet file of plain number and timestamp
    columns, its columns converted straight from Arrow (the same values, no DataFrame in between)."""
    if p.suffix.lower() != ".csv":
        table = _parquet_table(p)
        try:
            columns = _arrow_columns(table) if table is not None else None
        except Exception:  # a shortcut only: anything odd goes the way it always went
            columns = None
        if columns is not None:
            return columns
        return _read_file(p, table=table)
    return _read_file(p)


def _parquet_table(p: Path):
    """The Parquet file's table, read directly (faster than read_table's dataset: the same table), or
    None where that fails (read_table then says why)."""
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(p) as fh:
            # threads cost more than they save on a per-ticker file
            return fh.read(use_threads=fh.metadata.num_rows >= 100_000)
    except Exception:  # read_table raises what it always raised
        return None


def _read_file(p: Path, *, long_table: bool = False, table=None) -> pd.DataFrame:
    """The file as a DataFrame (``table``: its Parquet table, already read)."""
    if p.suffix.lower() == ".csv":
        return _read_csv(p, long_table)
    import pyarrow as pa
    import pyarrow.parquet as pq

    if table is None:
        table = _parquet_table(p)
    try:
        if table is None:  # read_table says what is wrong with the file, as it always did
            table = pq.read_table(p)
        df = table.to_pandas(split_blocks=True)  # a block per column: no consolidation copy; the same values
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{p.name}: not a readable Parquet file ({_first_line(exc)})") from None
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        # a pandas index saved with the table: keep it as a column when named (e.g. Date),
        # so that row numbers in messages are positions in the file
        df = df.reset_index(drop=all(name is None for name in df.index.names))
    return df


def _read_csv(p: Path, long_table: bool) -> pd.DataFrame:
    try:
        with open(p, "rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        raise DataError(f"{p.name}: cannot read ({_first_line(exc)})") from None
    if not head.strip():
        raise DataError(f"{p.name}: empty file")
    if b"\x00" in head:
        raise DataError(f"{p.name}: not a text CSV file (binary data)")
    kwargs: dict = {"keep_default_na": False, "na_values": list(MISSING_MARKERS), "encoding": "utf-8-sig"}
    try:
        if long_table:
            # A ticker column is read as text, verbatim: "NA" and "NONE" are tickers there.
            header = pd.read_csv(p, nrows=0, encoding="utf-8-sig").columns
            tcol = _ticker_column(pd.DataFrame(columns=header))
            if tcol is not None:
                kwargs["na_values"] = {c: list(MISSING_MARKERS) for c in header if c != tcol}
                kwargs["dtype"] = {tcol: str}
        return pd.read_csv(p, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{p.name}: cannot parse as CSV ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
