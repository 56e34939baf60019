"""The XLSX finance report (openpyxl). Sheet "report": a header row, one row per report
line (period and keys as text; GPU-hours, exact GPU-ms and cost as numbers, cost with two
decimals), a total row, and a bar chart of GPU-hours. Sheet "about": what the numbers
are (window, grouping, step, idle mode, currency, rounding, filters, notes).

Deterministic: the same report gives the same bytes (fixed document times and zip entry
times), so a file can be archived and compared.
"""

from __future__ import annotations

import io
import os
import zipfile
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from openpyxl import Workbook
from openpyxl.chart import BarChart, Reference
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter
from openpyxl.writer.excel import ExcelWriter

from accounting.errors import LedgerError
from accounting.rates import ROUNDING
from accounting.report import Report

#: the document and zip entry time of every file (what makes the bytes reproducible)
FIXED_TIME = datetime(1980, 1, 1)
FORMATS = {"gpu_hours": "#,##0.000", "gpu_ms": "0", "cost": "#,##0.00"}
#: a chart of more bars than this is not readable; the sheet is enough then
MAX_CHART_LINES = 60


def columns(report: Report) -> list[str]:
    """The report sheet's columns: the report's, with the exact `gpu_ms` after GPU-hours."""
    cols = report.columns()
    at = cols.index("gpu_hours") + 1
    return [*cols[:at], "gpu_ms", *cols[at:]]


def render_xlsx(report: Report, target: str | os.PathLike[str] | IO[bytes]) -> None:
    """Write the report as XLSX to a file path or a binary stream. A path that cannot be
    written is a LedgerError naming it (nothing else is left behind)."""
    data = _fixed_times(_workbook_bytes(_workbook(report)))
    if isinstance(target, str | os.PathLike):
        path = Path(target)
        try:
            path.write_bytes(data)
        except OSError as exc:
            raise LedgerError(
                f"cannot write the XLSX report to {path}: {exc.strerror or exc}"
            ) from exc
    else:
        target.write(data)


def _workbook(report: Report) -> Any:
    wb = Workbook()
    ws = wb.active
    ws.title = "report"
    cols = columns(report)
    ws.append(cols)
    for cell in ws[1]:
        cell.font = Font(bold=True)
    for line in report.lines:
        d = line.as_dict()
        ws.append([_value(c, d.get(c, "")) for c in cols])
    n_keys = len([c for c in cols if c not in FORMATS])
    total = report.as_dict()["total"]
    if n_keys:  # without key columns the single line is the total
        ws.append(["total", *[""] * (n_keys - 1), *[_value(c, total[c]) for c in cols[n_keys:]]])
        for cell in ws[ws.max_row]:
            cell.font = Font(bold=True)
    for i, col in enumerate(cols, start=1):
        letter = get_column_letter(i)
        width = max([len(col), *(len(str(c.value)) for c in ws[letter][1:])])
        ws.column_dimensions[letter].width = min(60, width + 2)
        for cell in ws[letter][1:]:
            if col in FORMATS:
                cell.number_format = FORMATS[col]
    ws.freeze_panes = "A2"
    if n_keys and 1 <= len(report.lines) <= MAX_CHART_LINES:
        _chart(ws, report, cols, n_keys)
    _about(wb.create_sheet("about"), report)
    wb.properties.creator = "stb"
    wb.properties.created = wb.properties.modified = FIXED_TIME
    return wb


def _value(col: str, value: Any) -> Any:
    if col == "cost" and value != "":
        return Decimal(value)
    return value


def _chart(ws: Any, report: Report, cols: list[str], n_keys: int) -> None:
    chart = BarChart()
    chart.type = "bar"
    chart.title = "GPU-hours"
    chart.legend = None
    hours = cols.index("gpu_hours") + 1
    last = len(report.lines) + 1
    chart.add_data(Reference(ws, min_col=hours, min_row=1, max_row=last), titles_from_data=True)
    chart.set_categories(Reference(ws, min_col=1, max_col=n_keys, min_row=2, max_row=last))
    chart.height = max(7.5, 0.5 * len(report.lines))
    chart.width = 18
    ws.add_chart(chart, f"{get_column_letter(len(cols) + 2)}2")


def _about(ws: Any, report: Report) -> None:
    w = report.window
    rows = [
        ("window", w.label),
        ("start (UTC)", w.start.isoformat()),
        ("end (UTC, exclusive)", w.end.isoformat()),
        ("grouped by", ", ".join(report.by) or "(nothing)"),
        ("step", report.step or "none (whole window)"),
        (
            "idle",
            "shared: idle cost moved onto each pool's users in proportion to use"
            if report.idle == "shared"
            else "line: idle capacity is its own line (team empty)",
        ),
        ("filters", ", ".join(f"{k}={v}" for k, v in report.filters.items()) or "none"),
        ("currency", report.currency or "none (no rates: GPU-hours only)"),
        ("rounding", ROUNDING if report.currency else "no money amounts"),
        ("gpu_hours", "gpu_ms / 3,600,000, rounded to 6 decimals; gpu_ms is exact"),
        *(("note", n) for n in report.notes),
    ]
    for key, value in rows:
        ws.append([key, value])
        ws.cell(ws.max_row, 1).font = Font(bold=True)
    ws.column_dimensions["A"].width = 22
    ws.column_dimensions["B"].width = 100


def _workbook_bytes(wb: Any) -> bytes:
    # ExcelWriter directly: openpyxl's save() stamps the document with the current time
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        ExcelWriter(wb, archive).save()
    return buf.getvalue()


def _fixed_times(data: bytes) -> bytes:
    """The same zip with every entry dated FIXED_TIME."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            entry = zipfile.ZipInfo(info.filename, date_time=FIXED_TIME.timetuple()[:6])
            entry.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(entry, src.read(info))
    return out.getvalue()
