"""Closed months: `close_period` closes one, after which an ingest may change it only as a
logged restatement (`accounting.book.check_closed`, with `restate` and a reason)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, insert, select

from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.tables import PERIODS
from bridge.db import write_transaction


def close_period(engine: Engine, month: str, note: str = "", now: datetime | None = None) -> None:
    """Close a month: later ingests may change it only as a logged restatement."""
    try:
        datetime.strptime(month, "%Y-%m")
    except ValueError as exc:
        raise LedgerError(f"not a month (YYYY-MM): {month!r}") from exc
    with write_transaction(engine) as conn:
        if conn.scalar(select(PERIODS.c.month).where(PERIODS.c.month == month)):
            raise LedgerError(f"period {month} is already closed")
        conn.execute(
            insert(PERIODS),
            {"month": month, "closed_at": utc(now or datetime.now(UTC)), "note": note},
        )
