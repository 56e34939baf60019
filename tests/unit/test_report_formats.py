"""The finance report files: the XLSX holds the report's numbers (and is reproducible), the
HTML is one self-contained page (three inline SVG charts, nothing loaded from anywhere,
every text escaped).

The ledger is a small SQLite file: two pools of one 8-GPU node each, three teams over two
days (training, elastic and inference work), with rates."""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path

import pytest
from openpyxl import load_workbook
from sqlalchemy import Engine

from accounting.errors import LedgerError
from accounting.rates import ROUNDING, RateBook, list_rates
from accounting.report import Report, Window, build_report
from accounting.schema import IDLE_TEAM
from accounting.xlsx import columns, render_xlsx
from tests.unit.helpers import assert_refs_stay_inside
from tests.unit.report_ledger import END, TEAMS, WINDOW, build_ledger, render_page


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Engine, RateBook]:
    engine = build_ledger(tmp_path)
    return engine, RateBook(list_rates(engine))


@pytest.fixture
def report(ledger: tuple[Engine, RateBook]) -> Report:
    engine, book = ledger
    return build_report(engine, WINDOW, ("team", "workload"), step="day", rates=book)


def test_the_ledger_has_every_team_workload_and_idle(report: Report) -> None:
    teams = {line.keys["team"] for line in report.lines}
    workloads = {line.keys["workload"] for line in report.lines}
    assert teams == {*TEAMS, IDLE_TEAM}
    assert workloads == {"training", "elastic", "inference", "idle"}
    assert report.currency == "USD"


def test_xlsx_holds_the_reports_numbers(report: Report, tmp_path: Path) -> None:
    path = tmp_path / "r.xlsx"
    render_xlsx(report, path)
    wb = load_workbook(path)
    assert wb.sheetnames == ["report", "about"]
    rows = list(wb["report"].iter_rows(values_only=True))
    header, body, total = rows[0], rows[1:-1], rows[-1]
    cols = ["period", "team", "workload", "gpu_hours", "gpu_ms", "cost"]
    assert list(header) == columns(report) == cols
    expected = report.as_dict()
    assert len(body) == len(expected["lines"])
    for row, want in zip(body, expected["lines"], strict=True):
        got = dict(zip(header, row, strict=True))
        for key in ("period", "team", "workload", "gpu_ms"):
            assert (got[key] or "") == want[key]
        assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], abs=1e-9)
        assert isinstance(got["cost"], int | float)
        assert Decimal(str(got["cost"])) == Decimal(want["cost"])
    assert total[0] == "total"
    tot = dict(zip(header, total, strict=True))
    assert tot["gpu_ms"] == expected["total"]["gpu_ms"]
    assert tot["gpu_hours"] == pytest.approx(expected["total"]["gpu_hours"])
    assert Decimal(str(tot["cost"])) == Decimal(expected["total"]["cost"])
    cost_cells = [r[header.index("cost")] for r in wb["report"].iter_rows(min_row=2)]
    assert {c.number_format for c in cost_cells} == {"#,##0.00"}
    about = {k: v for k, v in wb["about"].iter_rows(values_only=True) if k != "note"}
    assert about["window"] == WINDOW.label
    assert about["currency"] == "USD"
    assert about["rounding"] == ROUNDING
    assert about["step"] == "day"


def test_xlsx_is_reproducible_and_writes_to_streams(report: Report) -> None:
    a, b = io.BytesIO(), io.BytesIO()
    render_xlsx(report, a)
    render_xlsx(report, b)
    assert a.getvalue() == b.getvalue()
    assert load_workbook(io.BytesIO(a.getvalue()))["report"].max_row == len(report.lines) + 2


def test_xlsx_bad_path_is_a_clear_error(report: Report, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "r.xlsx"
    with pytest.raises(LedgerError, match=r"cannot write the XLSX report to .*no-such-dir"):
        render_xlsx(report, missing)
    with pytest.raises(LedgerError, match="cannot write"):
        render_xlsx(report, tmp_path)  # a directory
    assert not missing.parent.exists()


def test_html_is_self_contained_with_three_charts(tmp_path: Path) -> None:
    page = render_page(tmp_path)
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 3 and page.count("</svg>") == 3
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert_refs_stay_inside(page)
    for team in ("alpha", "beta"):
        assert f"<td>{team}</td>" in page
    assert "<td>vision &amp; &lt;3d&gt;</td>" in page and "<3d>" not in page
    assert "Utilization by pool, per hour" in page  # a two-day window: hourly
    assert "Cost by team (USD)" in page
    assert ROUNDING in page
    assert "2026-03-02..2026-03-04" in page and END.isoformat() in page


def test_html_without_rates_charts_gpu_hours_and_says_so(tmp_path: Path) -> None:
    page = render_page(tmp_path, rates=False, window=Window.parse("2026-03"))
    assert page.count("<svg") == 3
    assert_refs_stay_inside(page)
    assert "GPU-hours by team (no rates)" in page
    assert "instead of cost" in page
    assert "Utilization by pool, per day" in page  # a month: daily
    assert "no rates defined: GPU-hours only" in page
