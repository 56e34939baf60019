"""A titled table shown beside a report: the unit economics per model, the lending view,
the capacity plan, the budgets. One data shape (`Section`) for every format: the CLI's
rich table, the JSON report's `sections`, and the HTML page.

A section is built by its own module from the ledger (and, for the bridge's views, the
lease history); this module only holds and renders it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from markupsafe import Markup
from rich.markup import escape
from rich.table import Table

from bridge.page import render


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


def to_html(section: Section) -> Markup:
    """The section as an HTML fragment (`templates/section.html.j2`: a heading, its table
    in a box that scrolls sideways when wide, its notes); numbers right-aligned."""
    first = section.rows[0] if section.rows else {}
    columns = [(c, isinstance(first.get(c), int | float | Decimal)) for c in section.columns]
    return render(
        "accounting",
        "section.html.j2",
        title=section.title,
        columns=columns,
        rows=[[(cell(r.get(c)), numeric) for c, numeric in columns] for r in section.rows],
        notes=section.notes,
    )


def sections_dict(sections: Sequence[Section]) -> dict[str, Any]:
    return {s.key: s.as_dict() for s in sections}
