"""The batch route's answered requests in the ledger's database, as the daemon counts them
in nginx's batch access log (`bridge.daemon.batchroute`), and the batch-inference jobs
sacct names (`accounting.book`, at each ingest). The serving split reads both back
(`accounting.batchshare`) to book batch work's share of serving time to the batch job's
team.

- `record_batch`: per (hour, model, job) the requests answered, added to what is stored,
  and the log's position after them (`batch_log_cursor`), in one transaction: a daemon
  that stops between reading the log and writing loses nothing (it reads again from the
  stored position) and counts nothing twice (the counts and the position move together).
- `batch_cursor`: where a log's counting stands (None: never counted).
- `record_batch_jobs`: the batch-inference jobs of an ingest, by (cluster, job id); a job
  seen again takes its newest account and user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from accounting.buckets import floor_hour, utc
from accounting.errors import LedgerError
from accounting.schema import BatchJob, BatchLogCursor, BatchRequests
from bridge.db import write_transaction

BATCH = BatchRequests.__table__  # type: ignore[attr-defined]
CURSORS = BatchLogCursor.__table__  # type: ignore[attr-defined]
JOBS = BatchJob.__table__  # type: ignore[attr-defined]

#: (hour bucket, model, job id) of answered batch requests -> how many
Tally = Mapping[tuple[datetime, str, str], int]


def _insert(dialect: str, table: Any) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise LedgerError(f"unsupported database {dialect}")  # pragma: no cover


def record_batch(
    engine: Engine,
    cluster: str,
    log: str,
    tally: Tally,
    cursor: tuple[int, int],
    now: datetime,
) -> int:
    """Add `tally` to the stored counts and set `log`'s position to `cursor` (inode, byte
    offset), in one transaction. Returns the requests added."""
    rows: list[dict[str, Any]] = []
    for (bucket, model, job), n in sorted(tally.items()):
        if n < 0:
            raise LedgerError(f"negative batch request count {n} for {model} job {job!r}")
        if bucket != floor_hour(utc(bucket)):
            raise LedgerError(f"batch requests' bucket {bucket} is not the start of an hour")
        if n:
            row = {"cluster": cluster, "bucket": utc(bucket), "model": model, "job_id": job}
            rows.append({**row, "requests": n})
    dialect = engine.dialect.name
    inode, offset = cursor
    with write_transaction(engine) as conn:
        if rows:
            stmt = _insert(dialect, BATCH)
            stmt = stmt.on_conflict_do_update(
                index_elements=["cluster", "bucket", "model", "job_id"],
                set_={"requests": BATCH.c.requests + stmt.excluded.requests},
            )
            conn.execute(stmt, rows)
        stmt = _insert(dialect, CURSORS).values(
            log=log, inode=inode, offset=offset, updated_at=utc(now)
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["log"],
                set_={"inode": inode, "offset": offset, "updated_at": utc(now)},
            )
        )
    return sum(int(r["requests"]) for r in rows)


def batch_cursor(engine: Engine, log: str) -> tuple[int, int] | None:
    """(inode, byte offset) up to which `log` is counted; None when it never was."""
    with engine.connect() as conn:
        got = conn.execute(
            select(CURSORS.c.inode, CURSORS.c.offset).where(CURSORS.c.log == log)
        ).first()
    return None if got is None else (int(got[0]), int(got[1]))


def record_batch_jobs(conn: Connection, jobs: Iterable[tuple[str, str, str, str]]) -> None:
    """Store (cluster, job id, account, user) of batch-inference jobs, inside the caller's
    transaction (the ingest's); a job already stored takes the newest account and user."""
    rows = {
        (c, j): {"cluster": c, "job_id": j, "account": a, "user_name": u} for c, j, a, u in jobs
    }
    if not rows:
        return
    stmt = _insert(conn.dialect.name, JOBS)
    stmt = stmt.on_conflict_do_update(
        index_elements=["cluster", "job_id"],
        set_={"account": stmt.excluded.account, "user_name": stmt.excluded.user_name},
    )
    conn.execute(stmt, [rows[k] for k in sorted(rows)])


def prune_batch(engine: Engine, before: datetime) -> int:
    """Drop batch request counts of hours before `before`; returns how many rows."""
    with write_transaction(engine) as conn:
        return conn.execute(delete(BATCH).where(BATCH.c.bucket < utc(before))).rowcount or 0
