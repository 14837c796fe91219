"""How a result shows itself: a ``repr`` of one screen and an HTML table for Jupyter.

A result is a few lines of facts (``name: value``) and at most one table; both renderings come from
the same :class:`Shown`, so the terminal and the notebook say the same things.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

MAX_LINES = 25  # a result's repr fits on one screen
TABLE_ROWS = 12  # rows of its table shown in the repr (the HTML shows up to HTML_ROWS)
HTML_ROWS = 50


@dataclass
class Shown:
    """What a result shows: its title, its facts in order, and one optional table (a DataFrame)."""

    title: str
    facts: list[tuple[str, Any]] = field(default_factory=list)
    table: Any = None  # a pandas DataFrame, or None
    table_title: str = ""

    def text(self) -> str:
        lines = [self.title]
        width = max((len(k) for k, _ in self.facts), default=0)
        lines += [f"  {key:<{width}}  {_short(value)}" for key, value in self.facts]
        if self.table is not None and len(self.table):
            room = MAX_LINES - len(lines) - 3
            shown = self.table.head(max(1, min(TABLE_ROWS, room)))
            lines.append(f"  {self.table_title}" if self.table_title else "")
            lines += ["  " + line for line in shown.to_string(index=False, max_colwidth=28).splitlines()]
            if len(shown) < len(self.table):
                lines.append(f"  ... {len(self.table) - len(shown)} more rows")
        return "\n".join(lines[:MAX_LINES])

    def html(self, extra: str = "") -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td style='text-align:left'>{html.escape(_short(v))}</td></tr>" for k, v in self.facts)
        parts = [f"<div><strong>{html.escape(self.title)}</strong>", f"<table>{rows}</table>"]
        if self.table is not None and len(self.table):
            if self.table_title:
                parts.append(f"<p>{html.escape(self.table_title)}</p>")
            parts.append(self.table.head(HTML_ROWS).to_html(index=False, float_format=lambda x: f"{x:.4g}",
                                                            na_rep="n/a", border=0))
        parts.append(extra)
        parts.append("</div>")
        return "".join(parts)


def listed(items: list, first: int = 6) -> str:
    """``N (a, b, c, ...)``: how many, and the first few."""
    more = ", ..." if len(items) > first else ""
    return f"{len(items)} ({', '.join(str(i) for i in items[:first])}{more})"


def _short(value: Any, width: int = 100) -> str:
    text = "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


class Showable:
    """A result that shows itself through :meth:`shown`."""

    def shown(self) -> Shown:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.shown().text()

    def _repr_html_(self) -> str:
        return self.shown().html()
