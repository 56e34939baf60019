"""Triton's per-model counters (compute time, requests, an LLM's tokens) in the ledger's
database: the daemon's scrapes stored as serving samples (`record_serving`, a point
already stored ignored) and old ones dropped (`prune_serving`). The ingest reads them back
to split a serving job's GPU time over its models (`accounting.book`); the serving figures
read them too (`accounting.serving`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete
from sqlalchemy.dialects import postgresql, sqlite

from accounting.attribution import ServingPoint
from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.tables import SAMPLES
from bridge.db import write_transaction


def record_serving(engine: Engine, cluster: str, points: Iterable[ServingPoint]) -> int:
    """Store scraped counters; a point already stored is ignored. Returns the
    number of points offered."""
    rows = [
        {
            "cluster": cluster,
            "job_id": p.job_id,
            "instance": p.instance,
            "model": p.model,
            "version": p.version,
            "at": utc(p.at),
            "compute_us": float(p.compute_us),
            "requests": _float(p.requests),
            "prompt_tokens": _float(p.prompt_tokens),
            "generation_tokens": _float(p.generation_tokens),
        }
        for p in points
    ]
    if not rows:
        return 0
    dialect = engine.dialect.name
    stmt: Any
    if dialect == "postgresql":
        stmt = postgresql.insert(SAMPLES).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite.insert(SAMPLES).on_conflict_do_nothing()
    else:  # pragma: no cover - the two supported backends are above
        raise LedgerError(f"unsupported database {dialect}")
    with write_transaction(engine) as conn:
        conn.execute(stmt, rows)
    return len(rows)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def prune_serving(engine: Engine, before: datetime) -> int:
    """Drop serving samples older than `before`; returns how many."""
    with write_transaction(engine) as conn:
        return conn.execute(delete(SAMPLES).where(SAMPLES.c.at < utc(before))).rowcount or 0
