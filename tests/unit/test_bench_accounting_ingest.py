"""Smoke test of bench/accounting_ingest.py: 3,000 records through sacct JSON files, the
parsers, the ledger (SQLite) and a month report, in subprocesses; the bench's own check
must pass and its last line is the RESULT line. And its check must notice a report that
disagrees with the records."""

from __future__ import annotations

import pytest

from accounting.schema import IDLE_TEAM
from tests.unit.helpers import load_bench


@pytest.mark.timeout(120)
def test_bench_accounting_ingest_small_run_checks_ok(capsys: pytest.CaptureFixture[str]) -> None:
    rc = load_bench("accounting_ingest").main(["--records", "3000", "--backends", "sqlite"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check: ok" in out
    assert "sqlite      ingest" in out and "parse-plain" in out
    assert out.splitlines()[-1].startswith("RESULT records=3000 ")


def test_bench_accounting_ingest_check_fails_on_a_wrong_report() -> None:
    bench = load_bench("accounting_ingest")
    tally = {"month_by_team": {"nlp": 3_600_000}, "booked": 1, "skipped": 0, "job_rows": 1}
    ingest = {"tally": tally, "summary": {"new": 1, "skipped": 0, "deferred": 0}}
    report = {
        "lines": {"nlp": 3_600_000, IDLE_TEAM: 10},
        "ledger_rows": 2,
        "idle_rows": 1,
        "source_rows": 1,
    }
    assert bench.check(tally, ingest, report) == []
    wrong = {**report, "lines": {"nlp": 3_599_999, IDLE_TEAM: 11}}
    assert any("report by team" in b for b in bench.check(tally, ingest, wrong))
