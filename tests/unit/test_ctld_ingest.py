"""A slurmctld disconnect through `ingest_window`: the ingest passes the job runs of the
disconnect's hours to `capacity.event_capacity`, so the gap's down time leaves out the GPUs
a job held in it, as slurmdbd's rollup does (as_mysql_rollup.c at slurm-22-05-8-1,
l. 1510-1534)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from accounting.agreement import changed_runs
from accounting.db import open_ledger
from accounting.tables import LEDGER
from bridge.ledger.feed import ingest_window
from bridge.slurm.model import AccountingRecord, SlurmEvent
from tests.unit.fakes import N3, N5, EventSlurm, make_config

T0 = datetime(2026, 11, 29, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)


def test_a_job_across_the_gap_is_not_down(tmp_path: Path) -> None:
    nodes = [replace(N5, gpu_type="h100"), replace(N3, gpu_type="h100")]  # 4 GPUs each
    job = AccountingRecord(
        cluster="stblab", job_id="7", array_job_id=None, array_task_id=None, name="x",
        partition="train", account="a", user="u", qos="normal", state="COMPLETED",
        submit=T0 - 40 * M, start=T0 - 30 * M, end=T0 + 50 * M, elapsed_s=80 * 60,
        nodes=("n5",), gpus=2, gpu_type="h100", comment="", restarts=0,
    )  # fmt: skip
    reg, disc = "Cluster Registered TRES", "slurmctld disconnect"
    events = [
        SlurmEvent("stblab", "", ("n3", "n5"), T0 - 2 * H, None, 0, "", "", reg, 8),
        SlurmEvent("stblab", "", (), T0 + 10 * M, T0 + 40 * M, 1, "", "", disc, 8),
    ]
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    now = T0 + 2 * H
    slurm = EventSlurm(nodes, [job], events)
    ingest_window(make_config(tmp_path), slurm, engine, T0 - H, now, now=now)  # type: ignore[arg-type]
    with engine.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.bucket, LEDGER.c.pool, LEDGER.c.workload, LEDGER.c.gpu_ms)
        ).all()
    at = {(p, w): ms for b, p, w, ms in rows if b.replace(tzinfo=UTC) == T0}
    # the gap (30 min): n5's 2 free GPUs and n3's 4 down; the job's 2 GPUs allocated
    assert at[("training", "down")] == 2 * 30 * 60_000
    assert at[("elastic", "down")] == 4 * 30 * 60_000
    assert at[("training", "training")] == 2 * 50 * 60_000
    # idle only outside the gap: n5 4 x 30 min less the job's 2 x 20 min; n3 4 x 30 min
    assert at[("training", "idle")] == (4 * 30 - 2 * 20) * 60_000
    assert at[("elastic", "idle")] == 4 * 30 * 60_000

    # the agreement check's changed runs of that hour: the job, its GPU-seconds in the hour
    runs = changed_runs(engine, "stblab", T0, ["a"])
    assert [(r.job_id, r.account, r.gpu_s) for r in runs] == [("7", "a", 2 * 50 * 60)]
    assert runs[0].start == job.start and runs[0].end == job.end
    assert changed_runs(engine, "stblab", T0, ["other"]) == []
