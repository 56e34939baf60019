"""Plain report formats: a rich table, CSV and JSON. The HTML and XLSX formats, which need
charts and a spreadsheet library, are in `accounting.html` and `accounting.xlsx`.

All formats show the same numbers: `Report.as_dict()` is the one source (JSON is exactly
it; CSV is its lines; the table adds a total row).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from accounting.rates import money
from accounting.report import Report
from accounting.section import Section, sections_dict

FORMATS = ("table", "csv", "json", "xlsx", "html")


def to_json(report: Report, sections: Sequence[Section] = ()) -> str:
    """The report's dict; with sections, under `sections` by their keys."""
    out = report.as_dict()
    if sections:
        out["sections"] = sections_dict(sections)
    return json.dumps(out, indent=2) + "\n"


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    cols = report.columns()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for line in report.lines:
        writer.writerow(line.as_dict())
    return buf.getvalue()


def to_table(report: Report) -> Table:
    cur = f" ({report.currency})" if report.currency else ""
    title = f"GPU-hours {report.window.label}" + (
        f", by {', '.join(report.by)}" if report.by else ""
    )
    # the ledger's names (teams, models, notes naming `[accounting]`) are no markup
    table = Table(title=escape(title), caption=escape("; ".join(report.notes)) or None)
    for col in report.columns():
        right = col in ("gpu_hours", "cost")
        head = escape(col + (cur if col == "cost" else ""))
        table.add_column(head, justify="right" if right else "left")
    for line in report.lines:
        d = line.as_dict()
        table.add_row(*(escape(_cell(col, d.get(col))) for col in report.columns()))
    total = ["total"] + [""] * (len(report.columns()) - 1)
    total[report.columns().index("gpu_hours")] = f"{report.total_gpu_ms / 3_600_000:,.3f}"
    if report.total_cost is not None:
        total[-1] = f"{money(report.total_cost):,}"
    table.add_section()
    table.add_row(*total, style="bold")
    return table


def _cell(col: str, value: object) -> str:
    if col == "gpu_hours" and isinstance(value, float):
        return f"{value:,.3f}"
    if value is None:
        return ""
    return str(value) if value != "" else "-"
