"""Utilization by pool counts the down lines as capacity, never as allocation: a pool
whose nodes were down half the time and idle the rest is 0% utilized, with the whole
capacity as its denominator (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from accounting.attribution import Entry
from accounting.report import Window, utilization
from tests.db.helpers import fresh_ledger
from tests.unit.helpers import insert_entries

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
MS_H = 3_600_000


def _entry(workload: str, team: str, ms: int, pool: str = "training") -> Entry:
    return Entry(
        bucket=T0, cluster="lab", pool=pool, partition="", workload=workload, account="",
        team=team, user="", model="", gpu_type="h100", qos="", lease="", gpu_ms=ms,
    )  # fmt: skip


def test_down_time_is_capacity_not_allocation(database_url: str, tmp_path: Path) -> None:
    engine = fresh_ledger(database_url, tmp_path, "util")
    insert_entries(
        engine,
        [_entry("down", "(down)", 4 * MS_H), _entry("idle", "(idle)", 4 * MS_H),
         _entry("training", "t", 2 * MS_H, "elastic"),
         _entry("idle", "(idle)", 6 * MS_H, "elastic")],
    )  # fmt: skip
    rows = {r["pool"]: r for r in utilization(engine, Window(T0, T0 + timedelta(hours=1), "h"))}
    assert rows["training"]["allocated_gpu_hours"] == 0
    assert rows["training"]["capacity_gpu_hours"] == 8 and rows["training"]["utilization"] == 0
    assert rows["elastic"]["utilization"] == 0.25
    engine.dispose()
