"""Helpers shared by the database tests (not a test module): an accounting record in one
call, a whole-ledger snapshot for before/after comparisons, the table an alembic diff names,
the libpq form of a URL, and an empty ledger on the `database_url` fixture's backend.

`tests/db/ledger_scenario.py` holds the ingest scenario the bulk and roll-up tests share.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, select
from sqlalchemy.engine import URL, make_url
from sqlmodel import SQLModel

from accounting.db import open_ledger
from accounting.schema import LEDGER_TABLES
from bridge.slurm.model import AccountingRecord


def libpq(url: URL) -> str:
    """The URL as psycopg takes it (no SQLAlchemy '+driver' part)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def rec(
    job: str,
    start: datetime | None,
    end: datetime | None,
    *,
    nodes: tuple[str, ...] = ("n1",),
    gpus: int = 2,
    partition: str = "train",
    account: str = "team-nlp",
    gpu_type: str | None = "h100",
    comment: str = "",
    state: str = "COMPLETED",
) -> AccountingRecord:
    """One sacct record of cluster `lab` (user alice, qos normal, no restarts)."""
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="j",
        partition=partition, account=account, user="alice", qos="normal", state=state,
        submit=start, start=start, end=end,
        elapsed_s=int((end - start).total_seconds()) if start and end else 0,
        nodes=nodes, gpus=gpus, gpu_type=gpu_type, comment=comment, restarts=0,
    )  # fmt: skip


def snapshot(engine: Engine) -> dict[str, list[Any]]:
    """Every ledger table's rows, for before/after comparisons."""
    out = {}
    with engine.connect() as conn:
        for table in sorted(LEDGER_TABLES):
            t = SQLModel.metadata.tables[table]
            out[table] = [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key))]
    return out


def table_of(diff: Any) -> str | None:
    """The table one item of alembic's `compare_metadata` diff is about, if it names one."""
    item = diff[0] if isinstance(diff, list) else diff
    for part in item[1:]:
        name = getattr(part, "name", None) if not isinstance(part, str) else None
        table = getattr(part, "table", None)
        if table is not None:
            return str(table.name)
        if name:
            return str(name)
    return None


def fresh_ledger(database_url: str, tmp_path: Path, name: str) -> Engine:
    """An empty ledger: a new SQLite file, or PostgreSQL's schema wiped (ids restart)."""
    if database_url.startswith("sqlite"):
        return open_ledger(f"sqlite:///{tmp_path / name}.db")
    with psycopg.connect(libpq(make_url(database_url)), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return open_ledger(database_url)
