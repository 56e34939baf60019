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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from accounting.attribution import Context, ServingPoint
from accounting.db import open_ledger
from accounting.errors import IngestError
from accounting.ingest import ingest_records, record_serving
from accounting.inventory import NodeCapacity, record_inventory
from accounting.report import Window, build_report
from bridge.slurm.model import AccountingRecord
from tests.db.test_ledger_db import rec, snapshot

T0 = datetime(2026, 10, 31, 21, 17, 3, 250_000, tzinfo=UTC)  # before a month boundary
NOW = datetime(2026, 11, 2, tzinfo=UTC)
NODES = ("n1", "n2", "n3", "n4")
CTX = Context(
    pool_of_node={"n1": "training", "n2": "training", "n3": "elastic", "n4": "inference"},
    gpu_type_of_node=dict.fromkeys(NODES, "h100"),
    workload_of_partition={"train": "training", "elastic": "elastic", "infer": "inference"},
    team_of_account={"bridge": "platform"},
    team_of_model={"busy": "team-vision"},
    known_gpu_types=frozenset({"h100"}),
    horizon=T0 + timedelta(hours=5),
)


def _records(ended: bool) -> list[AccountingRecord]:
    h = timedelta(hours=1)
    running = rec("5", T0, T0 + 3 * h if ended else None, nodes=("n3",), partition="elastic",
                  state="COMPLETED" if ended else "RUNNING")  # fmt: skip
    return [
        rec("1", T0, T0 + 2 * h, nodes=("n1", "n2"), gpus=6),
        rec("2", T0 + timedelta(minutes=5), T0 + timedelta(minutes=50), account="bridge"),
        rec("3", None, None, gpus=0, state="CANCELLED"),
        running,
        rec(
            "7",
            T0,
            T0 + 4 * h,
            nodes=("n4",),
            gpus=1,
            partition="infer",
            account="bridge",
            comment="stb:triton",
        ),
        rec(
            "8",
            T0 + 3 * h,
            T0 + 4 * h,
            nodes=("n4",),
            gpus=2,
            partition="infer",
            comment="stb:triton,stb:workload=inference",
        ),
        rec("2", T0 + timedelta(minutes=5), T0 + timedelta(minutes=55), account="bridge"),
        *(
            rec(f"9_{k}", T0 + k * timedelta(minutes=7), T0 + k * h, nodes=(NODES[k % 3],))
            for k in range(1, 6)
        ),
    ]


def _points(later: bool) -> list[ServingPoint]:
    i = "10.0.0.4:8000"
    pts = [
        ServingPoint("7", i, "busy", T0 + timedelta(minutes=30), 600e6),
        ServingPoint("7", i, "busy", T0 + timedelta(minutes=95), 100e6),  # a reset
        ServingPoint("7", i, "echo", T0 + timedelta(minutes=150), 2_000e6),
    ]
    if later:
        pts.append(ServingPoint("7", i, "echo", T0 + timedelta(minutes=230), 2_900e6))
    return pts


def _run(engine: Engine, bulk: bool) -> tuple[dict[str, list[Any]], dict[str, int]]:
    record_inventory(
        engine, "lab", [NodeCapacity(n, CTX.pool_of_node[n], "h100", 8) for n in NODES],
        T0 + timedelta(hours=1), backfill_from=T0 - timedelta(hours=1),
    )  # fmt: skip
    summaries = []
    for k, (ended, later) in enumerate([(False, False), (True, True), (True, True)]):
        record_serving(engine, "", _points(later))
        s = ingest_records(
            engine, _records(ended), CTX, chunk_size=4, bulk=bulk, now=NOW + k * timedelta(hours=1)
        )
        summaries.append((s.new, s.changed, s.unchanged, s.skipped, s.rows_written, s.idle_hours))
    snap = snapshot(engine)
    snap["ingest_run"] = [r[:2] + r[3:] for r in snap["ingest_run"]]  # not finished_at
    report = build_report(engine, Window.parse("2026-11"), by=("team", "workload"))
    lines = {"/".join(line.keys.values()): line.gpu_ms for line in report.lines}
    return {**snap, "summaries": summaries}, lines


def _fresh(database_url: str, tmp_path: Path, name: str) -> Engine:
    """An empty ledger: a new SQLite file, or PostgreSQL's schema wiped (ids restart)."""
    if database_url.startswith("sqlite"):
        return open_ledger(f"sqlite:///{tmp_path / name}.db")
    libpq = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return open_ledger(database_url)


def test_bulk_ingest_writes_what_the_row_by_row_ingest_writes(
    database_url: str, tmp_path: Path
) -> None:
    engine = _fresh(database_url, tmp_path, "reference")
    want, want_report = _run(engine, bulk=False)
    engine.dispose()
    engine = _fresh(database_url, tmp_path, "bulk")
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
    engine = _fresh(database_url, tmp_path, "fail")
    take: Callable[[bool], list[AccountingRecord]] = _records
    ingest_records(engine, take(False)[:3], CTX, bulk=bulk, now=NOW)
    before = snapshot(engine)
    bad = rec("99", T0, T0 + timedelta(hours=1), gpu_type="a100")
    with pytest.raises(IngestError, match="unknown GPU type"):
        ingest_records(engine, [*take(True), bad], CTX, chunk_size=4, bulk=bulk, now=NOW)
    assert snapshot(engine) == before
    engine.dispose()
