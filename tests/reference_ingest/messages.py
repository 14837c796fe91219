"""Ingest's error and the wording its one-line messages share: how a message names a row of a file
(a CSV's line), a date, runs of dates, a value, a count of rows, and a list cut short after a few."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

_LIST_MAX = 5  # dates / runs / names shown in one message


def _value(v: float) -> str:
    """A number as a file would write it: 1022 for a volume, 170.5 for a price."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _day(value) -> str:
    return pd.Timestamp(value).strftime("%Y-%m-%d")


def _rows(k: int) -> str:
    return f"{k} row{'s' if k != 1 else ''}"


def _dates_text(dates) -> str:
    return _more([_day(d) for d in np.asarray(dates)[:_LIST_MAX]], len(dates))


def _more(parts: list[str], total: int) -> str:
    return ", ".join(parts) + (f" and {total - len(parts)} more" if total > len(parts) else "")


def _runs_text(dates: np.ndarray, mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.r_[idx[0], idx[breaks + 1]]
    ends = np.r_[idx[breaks], idx[-1]]
    parts = [f"{_day(dates[a])}..{_day(dates[b])}" for a, b in zip(starts[:_LIST_MAX], ends[:_LIST_MAX])]
    more = len(starts) - len(parts)
    return ", ".join(parts) + (f" and {more} more runs" if more > 0 else "")


def _row_ref(source: str, label) -> str:
    """'line N' (header = line 1) for CSV sources, else 'row N' (1-based, header not counted)."""
    if re.search(r"\.csv\b", source, flags=re.IGNORECASE):
        return f"line {int(label) + 2}"
    return f"row {int(label) + 1}"


def _rows_text(source: str, labels) -> str:
    return _more([_row_ref(source, r) for r in list(labels)[:_LIST_MAX]], len(labels))
