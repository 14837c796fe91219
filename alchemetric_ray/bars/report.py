"""What ingest read, kept, dropped and skipped (:class:`IngestReport`), the rules it counts dropped rows
under, and the choices of ``data.on_duplicate``."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

from alchemetric_ray.bars.messages import _LIST_MAX, _rows
from alchemetric_ray.config import DataConfig, DuplicatePolicy
from alchemetric_ray.errors import DataError

RULES = ("empty_cell", "duplicate_row", "duplicate_date", "nonfinite_price", "nonpositive_price", "nonfinite_volume",
         "negative_volume", "high_below_low", "ohlc_inconsistent", "zero_volume", "stale_price")
DUPLICATE_POLICIES = typing.get_args(DuplicatePolicy)
# Written once, in config/schema.py (DataConfig): a caller of iter_bars without a config gets what the CLI gets.
ON_DUPLICATE_DEFAULT: str = DataConfig().on_duplicate


@dataclass
class IngestReport:
    """What ingest read, kept, dropped (by rule) and skipped; filled in while iterating."""

    files: int = 0
    tickers: int = 0  # tickers yielded
    rows_read: int = 0
    rows_kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    skipped_tickers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    on_duplicate: str = ON_DUPLICATE_DEFAULT  # how dates with differing rows were resolved
    conflicting_dates: int = 0  # (ticker, date) pairs with differing rows, under any policy
    duplicate_skipped: list[str] = field(default_factory=list)  # tickers left out by skip_ticker

    def duplicates(self) -> dict:
        """The duplicate counts as the manifest (``ingest.duplicates``) and an evaluation of new
        data carry them: kept apart from ``dropped`` as well as counted there, because a reader
        deciding whether to trust the bars wants to see how conflicts were resolved, not only how
        many rows went."""
        return {"exact_rows_dropped": self.dropped.get("duplicate_row", 0),
                "conflicting_dates": self.conflicting_dates,
                "conflicting_rows_dropped": self.dropped.get("duplicate_date", 0),
                "resolved_by": self.on_duplicate,
                "tickers_skipped": list(self.duplicate_skipped)}

    def summary(self) -> str:
        lines = [f"ingested {self.tickers} ticker{'s' if self.tickers != 1 else ''} from {self.files} "
                 f"file{'s' if self.files != 1 else ''}: "
                 f"{self.rows_kept:,} of {self.rows_read:,} rows kept"]
        drops = [f"{rule} {n:,}" for rule, n in self.dropped.items() if n]
        if drops:
            lines.append("dropped rows: " + ", ".join(drops))
        dup = self.duplicates()
        if dup["exact_rows_dropped"] or dup["conflicting_dates"]:
            lines.append(f"duplicates: {_rows(dup['exact_rows_dropped'])} repeating another exactly dropped; "
                         f"{dup['conflicting_dates']} date(s) with differing rows, resolved by "
                         f"data.on_duplicate={self.on_duplicate}"
                         + (f" ({len(self.duplicate_skipped)} ticker(s) skipped)" if self.duplicate_skipped else ""))
        if self.skipped_tickers:
            shown = [f"{t} ({why})" for t, why in list(self.skipped_tickers.items())[:_LIST_MAX]]
            more = len(self.skipped_tickers) - len(shown)
            lines.append(f"skipped {len(self.skipped_tickers)} tickers: " + "; ".join(shown)
                         + (f"; and {more} more" if more else ""))
        if self.warnings:
            lines.append(f"{len(self.warnings)} warnings (first: {self.warnings[0]})")
        return "\n".join(lines)


def merge_reports(parts: list[IngestReport], on_duplicate: str = ON_DUPLICATE_DEFAULT) -> IngestReport:
    """One report from the reports of consecutive slices of the input (each Ray task's files), in input
    order: the counts summed, the skipped tickers, warnings and duplicate skips in order, as one
    iteration over all of it would have filled them in."""
    merged = IngestReport(on_duplicate=on_duplicate)
    for part in parts:
        merged.files += part.files
        merged.tickers += part.tickers
        merged.rows_read += part.rows_read
        merged.rows_kept += part.rows_kept
        for rule, n in part.dropped.items():
            merged.dropped[rule] = merged.dropped.get(rule, 0) + n
        merged.skipped_tickers.update(part.skipped_tickers)
        merged.warnings.extend(part.warnings)
        merged.conflicting_dates += part.conflicting_dates
        merged.duplicate_skipped.extend(part.duplicate_skipped)
    return merged


def _check_policy(on_duplicate: str) -> None:
    if on_duplicate not in DUPLICATE_POLICIES:
        raise DataError(f"on_duplicate {on_duplicate!r} is not one of {', '.join(DUPLICATE_POLICIES)} "
                        "(data.on_duplicate)")
