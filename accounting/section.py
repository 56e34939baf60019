"""A titled table shown beside a report: the unit economics per model, the lending view,
the capacity plan, the budgets. One data shape (`Section`) for every format: the CLI's
rich table, the JSON report's `sections`, and the HTML page.

A section is built by its own module from the ledger (and, for the bridge's views, the
lease history); this module only holds and renders it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rich.markup import escape
from rich.table import Table


@dataclass(frozen=True)
class Section:
    """`key`: its name in JSON; `columns`: the keys of each row, in display order (a row
    may lack a column: shown empty); `notes`: how to read it, what it leaves out."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [{c: _json(r.get(c)) for c in self.columns if c in r} for r in self.rows],
            "notes": list(self.notes),
        }


def _json(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def cell(value: Any) -> str:
    """A value as text: floats to 3 significant decimals, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return ""
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value) if value != "" else "-"


def to_rich(section: Section) -> Table:
    # names from the ledger and notes naming `[accounting]` are no markup
    table = Table(title=escape(section.title), caption=escape("; ".join(section.notes)) or None)
    first = section.rows[0] if section.rows else {}
    for col in section.columns:
        numeric = isinstance(first.get(col), int | float | Decimal)
        table.add_column(escape(col), justify="right" if numeric else "left")
    for row in section.rows:
        table.add_row(*(escape(cell(row.get(c))) for c in section.columns))
    return table


def to_html(section: Section) -> str:
    """The section as an HTML fragment (a heading, its table in a box that scrolls
    sideways when wide, its notes); numbers right-aligned (class `num`)."""
    e = html.escape
    first = section.rows[0] if section.rows else {}
    num = {c for c in section.columns if isinstance(first.get(c), int | float | Decimal)}

    def tag(name: str, c: str, text: str) -> str:
        cls = ' class="num"' if c in num else ""
        return f"<{name}{cls}>{e(text)}</{name}>"

    head = "".join(tag("th", c, c) for c in section.columns)
    body = (
        "".join(
            "<tr>" + "".join(tag("td", c, cell(r.get(c))) for c in section.columns) + "</tr>"
            for r in section.rows
        )
        or f'<tr><td colspan="{max(1, len(section.columns))}">none in this window</td></tr>'
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in section.notes)
    return (
        f'<h2>{e(section.title)}</h2><div class="wide"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>" + (f"<ul>{notes}</ul>" if notes else "")
    )


def sections_dict(sections: Sequence[Section]) -> dict[str, Any]:
    return {s.key: s.as_dict() for s in sections}
