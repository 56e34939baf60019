"""The bulk ingest (COPY on PostgreSQL, one executemany per chunk on SQLite) writes exactly
the ledger the row-by-row reference (`bulk=False`: SQLAlchemy inserts of row dicts) writes,
on both backends (the `database_url` fixture): every row of every ledger table, ids
included, over a first ingest (multi-node, month-spanning, running, serving jobs with
samples, a record listed twice, one without GPU time), a second one where the running job
has ended and more samples arrived (rows replaced, source rows updated), and a third that
changes nothing; and the month report agrees. A bulk ingest that fails after a chunk went
in by COPY writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from accounting.errors import IngestError
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.report import Window, build_report
from accounting.samples import record_serving
from bridge.slurm.model import AccountingRecord
from tests.db.helpers import fresh_ledger, rec, snapshot
from tests.db.ledger_scenario import CTX, NODES, NOW, T0, points, records


def _run(engine: Engine, bulk: bool) -> tuple[dict[str, list[Any]], dict[str, int]]:
    record_inventory(
        engine, "lab", [NodeCapacity(n, CTX.pool_of_node[n], "h100", 8) for n in NODES],
        T0 + timedelta(hours=1), backfill_from=T0 - timedelta(hours=1),
    )  # fmt: skip
    summaries = []
    for k, (ended, later) in enumerate([(False, False), (True, True), (True, True)]):
        record_serving(engine, "", points(later))
        s = ingest_records(
            engine, records(ended), CTX, chunk_size=4, bulk=bulk, now=NOW + k * timedelta(hours=1)
        )
        summaries.append((s.new, s.changed, s.unchanged, s.skipped, s.rows_written, s.idle_hours))
    snap = snapshot(engine)
    snap["ingest_run"] = [r[:2] + r[3:] for r in snap["ingest_run"]]  # not finished_at
    report = build_report(engine, Window.parse("2026-11"), by=("team", "workload"))
    lines = {"/".join(line.keys.values()): line.gpu_ms for line in report.lines}
    return {**snap, "summaries": summaries}, lines


def test_bulk_ingest_writes_what_the_row_by_row_ingest_writes(
    database_url: str, tmp_path: Path
) -> None:
    engine = fresh_ledger(database_url, tmp_path, "reference")
    want, want_report = _run(engine, bulk=False)
    engine.dispose()
    engine = fresh_ledger(database_url, tmp_path, "bulk")
    got, got_report = _run(engine, bulk=True)
    engine.dispose()
    assert len(want["ledger_row"]) > 40 and want["summaries"][1][1] > 0  # rows, changes
    assert want["summaries"][2][0] == 0  # the third ingest books nothing new
    for table in want:
        assert got[table] == want[table], table
    assert got_report == want_report


@pytest.mark.parametrize("bulk", [True, False])
def test_a_bulk_ingest_failing_after_a_copied_chunk_writes_nothing(
    database_url: str, tmp_path: Path, bulk: bool
) -> None:
    engine = fresh_ledger(database_url, tmp_path, "fail")
    take: Callable[[bool], list[AccountingRecord]] = records
    ingest_records(engine, take(False)[:3], CTX, bulk=bulk, now=NOW)
    before = snapshot(engine)
    bad = rec("99", T0, T0 + timedelta(hours=1), gpu_type="a100")
    with pytest.raises(IngestError, match="unknown GPU type"):
        ingest_records(engine, [*take(True), bad], CTX, chunk_size=4, bulk=bulk, now=NOW)
    assert snapshot(engine) == before
    engine.dispose()
