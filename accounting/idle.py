"""The capacity rows of the ledger: after the allocations of an ingest are booked, the
idle rows (capacity minus allocation) of every hour it touched are recomputed, and for a
cluster with slurmdbd's events its down lines too (`recompute_idle`), each change noted
in the daily roll-up. `runs_in_disconnects` gives the job runs a slurmctld disconnect
covers (read by the sreport agreement too, `accounting.agreement`).

The capacity comes from the node inventory (`node_span`) or, where a cluster has them,
from slurmdbd's events (`accounting.capacity.event_capacity`). Only rows that differ are
rewritten: re-ingesting an unchanged window leaves every row as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select

from accounting.attribution import Entry, capacity_ms
from accounting.book import IngestSummary
from accounting.buckets import HOUR, floor_hour, month_of, utc
from accounting.capacity import RunAlloc, capacity_entries, event_capacity
from accounting.prepare import SACCT, DayCell
from accounting.rollup import DayDelta
from accounting.schema import CAPACITY_SOURCE
from accounting.slurm_events import clusters_with_events, load_events, node_attrs
from accounting.tables import LEDGER, SOURCES, SPANS, batched
from bridge.slurm.model import SlurmEvent


def _row(e: Entry, source: str) -> dict[str, Any]:
    return {
        "bucket": e.bucket,
        "day": e.bucket.date(),
        "month": e.bucket.strftime("%Y-%m"),
        "cluster": e.cluster,
        "pool": e.pool,
        "partition": e.partition,
        "workload": e.workload,
        "account": e.account,
        "team": e.team,
        "user_name": e.user,
        "model": e.model,
        "gpu_type": e.gpu_type,
        "qos": e.qos,
        "lease": e.lease,
        "source": source,
        "gpu_ms": e.gpu_ms,
    }


def recompute_idle(
    conn: Connection,
    touched: set[datetime],
    closed: set[str],
    restate: bool,
    horizon: datetime,
    summary: IngestSummary,
    days: DayDelta,
    unit: Callable[[str], Fraction] | None = None,
) -> int:
    """Replace the capacity rows (idle, and the down lines of clusters with slurmdbd's
    events) of the touched hours (open months, or closed ones when restating) with what the
    capacity leaves after allocation (noted in `days`). `unit` (`capacity.units_of`): the
    GPUs one unit of a GPU type is, a MIG slice's fraction (None: every type 1)."""
    todo = sorted(h for h in touched if restate or month_of(h) not in closed)
    if not todo:
        return 0
    by_events = sorted(clusters_with_events(conn))
    for group in _runs(todo):
        lo, hi = group[0], group[-1] + HOUR
        end = min(hi, max(horizon, lo))
        spans = conn.execute(
            select(
                SPANS.c.cluster,
                SPANS.c.pool,
                SPANS.c.gpu_type,
                SPANS.c.gpus,
                SPANS.c.start,
                SPANS.c.end,
            ).where(
                SPANS.c.start < hi,
                (SPANS.c.end.is_(None)) | (SPANS.c.end > lo),
                SPANS.c.cluster.not_in(by_events),
            )
        ).all()
        cap = capacity_ms(
            ((c, p, t, g, utc(s), utc(e) if e else None) for c, p, t, g, s, e in spans),
            lo,
            end,
            unit,
        )
        down: dict[tuple[tuple[str, str, str, datetime], str, str], int] = {}
        if by_events:
            events = load_events(conn, by_events, lo, hi)
            runs = runs_in_disconnects(conn, events, lo, hi)
            for cluster in by_events:
                ev_cap, ev_down = event_capacity(
                    [e for e in events if e.cluster == cluster],
                    node_attrs(conn, cluster),
                    lo,
                    end,
                    [r for r in runs if r.cell[0] == cluster],
                    unit=unit,
                )
                cap.update(ev_cap)
                down.update(ev_down)
        alloc = {
            (c, p, t, utc(b)): int(ms)
            for c, p, t, b, ms in conn.execute(
                select(
                    LEDGER.c.cluster,
                    LEDGER.c.pool,
                    LEDGER.c.gpu_type,
                    LEDGER.c.bucket,
                    func.sum(LEDGER.c.gpu_ms),
                )
                .where(
                    LEDGER.c.bucket >= lo, LEDGER.c.bucket < hi, LEDGER.c.source != CAPACITY_SOURCE
                )
                .group_by(LEDGER.c.cluster, LEDGER.c.pool, LEDGER.c.gpu_type, LEDGER.c.bucket)
            )
        }
        entries, over = capacity_entries(cap, alloc, down)
        summary.overbooked.update(over)
        want = {(e.cluster, e.pool, e.gpu_type, e.bucket, e.workload, e.user): e for e in entries}
        have = {
            (c, p, t, utc(b), w, u): (rid, int(ms), team)
            for rid, c, p, t, b, w, u, team, ms in conn.execute(
                select(
                    LEDGER.c.id, LEDGER.c.cluster, LEDGER.c.pool, LEDGER.c.gpu_type,
                    LEDGER.c.bucket, LEDGER.c.workload, LEDGER.c.user_name, LEDGER.c.team,
                    LEDGER.c.gpu_ms,
                ).where(
                    LEDGER.c.source == CAPACITY_SOURCE, LEDGER.c.bucket >= lo, LEDGER.c.bucket < hi
                )
            )
        }  # fmt: skip
        # Write only what differs: re-ingesting an unchanged window leaves every row as it was.
        stale = {
            cell: (rid, ms, team)
            for cell, (rid, ms, team) in have.items()
            if cell not in want or want[cell].gpu_ms != ms
        }
        for part in batched([rid for rid, _, _ in stale.values()], 500):
            conn.execute(delete(LEDGER).where(LEDGER.c.id.in_(part)))
        fresh = {
            cell: e for cell, e in want.items() if cell not in have or have[cell][1] != e.gpu_ms
        }
        days.add_cells(
            ((_capacity_cell(*cell, team), ms) for cell, (_, ms, team) in stale.items()), -1
        )
        days.add_cells((_capacity_cell(*cell, e.team), e.gpu_ms) for cell, e in fresh.items())
        if fresh:
            conn.execute(insert(LEDGER), [_row(e, CAPACITY_SOURCE) for e in fresh.values()])
            summary.rows_written += len(fresh)
    return len(todo)


def runs_in_disconnects(
    conn: Connection, events: Sequence[SlurmEvent], lo: datetime, hi: datetime
) -> list[RunAlloc]:
    """The job runs' GPU-ms per cell in the hours of [lo, hi) a slurmctld disconnect
    covers, with each run's start and end (`capacity.RunAlloc`): what the disconnect's down
    time leaves out, as slurmdbd's rollup does. None without a disconnect."""
    buckets: set[datetime] = set()
    for ev in events:
        if ev.is_disconnect:
            h = max(floor_hour(ev.start), lo)
            stop = min(utc(ev.end), hi) if ev.end else hi
            while h < stop:
                buckets.add(h)
                h += HOUR
    if not buckets:
        return []
    rows = conn.execute(
        select(
            LEDGER.c.cluster, LEDGER.c.pool, LEDGER.c.gpu_type, LEDGER.c.bucket,
            SOURCES.c.start, SOURCES.c.end, func.sum(LEDGER.c.gpu_ms),
        )
        .join(SOURCES, SOURCES.c.key == LEDGER.c.source)
        .where(
            LEDGER.c.bucket.in_(sorted(buckets)),
            LEDGER.c.source != CAPACITY_SOURCE,
            SOURCES.c.kind == SACCT,
        )
        .group_by(
            LEDGER.c.cluster, LEDGER.c.pool, LEDGER.c.gpu_type, LEDGER.c.bucket,
            LEDGER.c.source, SOURCES.c.start, SOURCES.c.end,
        )
    ).all()  # fmt: skip
    return [
        RunAlloc((c, p, t, utc(b)), int(ms), utc(s), utc(e) if e else None)
        for c, p, t, b, s, e, ms in rows
        if s is not None
    ]


def _capacity_cell(
    cluster: str, pool: str, gpu_type: str, bucket: datetime, workload: str, _user: str, team: str
) -> DayCell:
    """The roll-up cell of a capacity row (`capacity.capacity_entries`' keys)."""
    return (utc(bucket).date(), cluster, pool, "", workload, "", team, "", gpu_type, "", "")


def _runs(sorted_hours: Sequence[datetime]) -> Iterator[list[datetime]]:
    """Consecutive runs of hours (so one query covers each run)."""
    run: list[datetime] = []
    for h in sorted_hours:
        if run and h - run[-1] != HOUR:
            yield run
            run = []
        run.append(h)
    if run:
        yield run
