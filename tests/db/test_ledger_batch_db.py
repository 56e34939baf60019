"""Batch work's share of serving time on SQLite and the real PostgreSQL: the daemon's
counts added per (hour, model, job) with the batch log's position in one transaction
(`accounting.batchcounts`), the batch-inference jobs an ingest lists stored once, and the
ingest booking the batch share to the batch job's team, the parts summing to the
serving job, a re-ingest changing nothing; migration 0008 on a ledger at 0007."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from accounting.attribution import Context, ServingPoint
from accounting.batchcounts import BATCH, JOBS, batch_cursor, record_batch
from accounting.db import current_revision, open_ledger, upgrade
from accounting.ingest import ingest_records
from accounting.samples import record_serving
from accounting.schema import BATCH_INFERENCE, UNKNOWN_BATCH_JOB
from accounting.tables import LEDGER
from bridge.db import make_engine
from bridge.slurm.model import AccountingRecord

T0 = datetime(2026, 12, 4, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
CTX = Context(
    pool_of_node={"n4": "inference", "n3": "elastic"},
    gpu_type_of_node={"n4": "h100", "n3": "h100"},
    team_of_account={"nlp": "team-nlp"},
    team_of_model={"bert": "team-search"},
    cluster="lab",
    horizon=T0 + 2 * HOUR,
)
SERVING = AccountingRecord(
    cluster="lab", job_id="7", array_job_id=None, array_task_id=None, name="triton",
    partition="infer", account="bridge", user="stb", qos="normal", state="COMPLETED",
    submit=T0, start=T0, end=T0 + HOUR, elapsed_s=3600, nodes=("n4",), gpus=2,
    gpu_type="h100", comment="stb:triton", restarts=0,
)  # fmt: skip
CLIENT = replace(
    SERVING, job_id="40_1", array_job_id=40, array_task_id=1, name="batch-infer",
    partition="elastic", account="nlp", user="bob", nodes=("n3",), gpus=0,
    comment="stb:workload=batch-inference",
)  # fmt: skip


def test_batch_counts_and_the_split_on_each_database(database_url: str) -> None:
    engine = open_ledger(database_url)
    assert current_revision(engine) == "0008"
    record_batch(engine, "lab", "/var/log/b.log", {(T0, "bert", "40_1"): 30}, (5, 900), T0)
    record_batch(
        engine, "lab", "/var/log/b.log", {(T0, "bert", "40_1"): 10, (T0, "bert", ""): 20},
        (5, 1800), T0,
    )  # fmt: skip
    assert batch_cursor(engine, "/var/log/b.log") == (5, 1800)
    with engine.connect() as conn:
        got = dict(conn.execute(select(BATCH.c.job_id, BATCH.c.requests)).all())
    assert got == {"40_1": 40, "": 20}
    # bert: 120 requests, 3,600 s of compute in the hour (both GPUs half busy)
    record_serving(engine, "lab", [
        ServingPoint("7", "n4:8000", "bert", T0, 0.0, "1", 0.0),
        ServingPoint("7", "n4:8000", "bert", T0 + HOUR, 3.6e9, "1", 120.0),
    ])  # fmt: skip
    first = ingest_records(engine, [SERVING, CLIENT], CTX, now=T0 + 2 * HOUR)
    assert (first.new, first.skipped) == (1, 1)
    again = ingest_records(engine, [SERVING, CLIENT], CTX, now=T0 + 2 * HOUR)
    assert again.unchanged == 1 and again.rows_written == 0
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                LEDGER.c.workload, LEDGER.c.team, LEDGER.c.user_name, func.sum(LEDGER.c.gpu_ms)
            ).group_by(LEDGER.c.workload, LEDGER.c.team, LEDGER.c.user_name)
        ).all()
        jobs = conn.execute(select(JOBS.c.job_id, JOBS.c.account)).all()
    assert jobs == [("40_1", "nlp")]
    # 60 of 120 requests were batch: half of bert's 3,600,000 ms, 40:20
    assert {(w, t, u): int(ms) for w, t, u, ms in rows} == {
        ("inference", "team-search", "stb"): 1_800_000,
        (BATCH_INFERENCE, "team-nlp", "bob"): 1_200_000,
        (BATCH_INFERENCE, UNKNOWN_BATCH_JOB, ""): 600_000,
        ("inference", "bridge", "stb"): 3_600_000,  # (unattributed)
    }
    engine.dispose()


def test_migration_0008_upgrades_a_ledger_at_0007(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0007")
    engine.dispose()
    engine = open_ledger(database_url)
    assert current_revision(engine) == "0008"
    record_batch(engine, "lab", "/l", {(T0, "bert", "1"): 1}, (1, 10), T0)
    assert batch_cursor(engine, "/l") == (1, 10)
    engine.dispose()
