"""The database half of an ingest, one prepared chunk at a time (`Book.chunk`), and the
summary it fills (`IngestSummary`).

For a chunk that `accounting.prepare` made ready: the stored digests of its records are
looked up (an unchanged record is skipped), a serving job's rows are made again with its
stored serving samples and the batch route's work in its hours (`accounting.batchshare`;
the chunk's batch-inference jobs are stored first, `batch_job`), a change to a closed
month is refused or, with restate, logged (`check_closed`), and the changed records' old
rows are removed and their new ones handed to the bulk writer (`accounting.bulk`). Called
by `accounting.ingest`, inside its one transaction.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, any_, bindparam, delete, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY

from accounting.attribution import Context, EntryTuple, ServingPoint
from accounting.batchcounts import record_batch_jobs
from accounting.batchshare import BatchUse, read_batch_use
from accounting.buckets import month_of, utc
from accounting.bulk import write_rows
from accounting.errors import ClosedPeriodError, IngestError
from accounting.prepare import HOUR_MS, SACCT, Prepared, hour_at, time_at
from accounting.rollup import DayDelta
from accounting.schema import Restatement
from accounting.tables import LEDGER, SAMPLES, SOURCES, batched


@dataclass
class IngestSummary:
    """What one ingest did, record by record and row by row (`line`: in one sentence)."""

    records: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    #: never started or held no GPU: nothing to book
    skipped: int = 0
    #: (key, why) of records left for a later ingest
    deferred: list[tuple[str, str]] = field(default_factory=list)
    #: closed months changed (with restate)
    restated: list[str] = field(default_factory=list)
    rows_written: int = 0
    idle_hours: int = 0
    #: (cluster, pool, gpu_type, hour) -> GPU-ms allocated beyond the recorded capacity
    overbooked: dict[tuple[str, str, str, datetime], int] = field(default_factory=dict)
    #: GPU usage records new or changed (when a spool folder is read)
    usage_records: int = 0

    def line(self) -> str:
        return (
            f"{self.records} records: {self.new} new, {self.changed} changed, "
            f"{self.unchanged} unchanged, {self.skipped} without GPU time, "
            f"{len(self.deferred)} deferred; {self.rows_written} rows written; "
            f"idle recomputed for {self.idle_hours} hours"
            + (f"; {self.usage_records} GPU usage records" if self.usage_records else "")
        )


@dataclass
class Book:
    """The database half of an ingest, one prepared chunk at a time (see `chunk`)."""

    conn: Connection
    ctx: Context
    closed: frozenset[str]
    restate: bool
    reason: str
    now: datetime
    summary: IngestSummary
    touched: set[datetime]
    days: DayDelta

    def chunk(self, p: Prepared, mode: str) -> Callable[[], None] | None:
        """Book one prepared chunk: look up its records' digests, replace the rows of
        the changed ones. On the bulk paths the new rows' writes are returned, to run
        before the transaction's next statement; otherwise they are done here."""
        conn, ctx, summary = self.conn, self.ctx, self.summary
        summary.records += p.records
        summary.skipped += p.skipped
        summary.deferred += p.deferred
        if p.batch_jobs:  # before the serving jobs' rows, which name them
            record_batch_jobs(conn, p.batch_jobs)
        keys = p.keys
        if not keys:
            return None
        serving = _serving_for(conn, p.clusters, {p.job_ids[i] for i in p.serving}, ctx)
        batch = _batch_for(conn, p, serving, ctx)
        existing = {
            key: (rid, dig)
            for rid, key, dig in conn.execute(
                select(SOURCES.c.id, SOURCES.c.key, SOURCES.c.digest).where(
                    SOURCES.c.kind == SACCT, _key_match(conn, keys)
                )
            )
        }
        for i, rec in list(p.serving.items()):
            points = serving.get(rec.job_id)
            if points:  # its rows depend on its samples: made again with them
                again = Prepared()
                end = time_at(p.spans[i][1])
                use = batch.within(time_at(p.spans[i][0]), end) if batch else None
                again.add(rec, ctx, mode, self.now, self.closed, end, points, use)
                p.replace(i, again)
        changed: list[int] = []
        seen: set[str] = set()
        digests = p.digests
        for i, key in enumerate(keys):
            if key in seen:  # the same run listed twice in one read: the later wins
                changed = [j for j in changed if keys[j] != key]
            seen.add(key)
            old = existing.get(key)
            if old is not None and old[1] == digests[i]:
                summary.unchanged += 1
                continue
            if i in p.errors:
                raise IngestError(key, p.errors[i])
            changed.append(i)
        if not changed:
            return None
        old_keys = [keys[i] for i in changed if keys[i] in existing]
        if self.closed:
            check_closed(
                conn, [(keys[i], p.entries.get(i, [])) for i in changed], old_keys, self.closed,
                self.restate, self.reason, self.now, summary,
            )  # fmt: skip
        touched = self.touched
        if old_keys:
            for part in batched(old_keys, 500):
                old_hours = conn.execute(
                    select(LEDGER.c.bucket).where(LEDGER.c.source.in_(part)).distinct()
                )
                touched.update(utc(h) for (h,) in old_hours)
                self.days.remove_sources(conn, part)
                conn.execute(delete(LEDGER).where(LEDGER.c.source.in_(part)))
        cells, delta = p.cells, self.days.cells
        nrows = 0
        for i in changed:
            nrows += p.nrows[i]
            lo, hi = p.hours[i]
            touched.update(map(hour_at, range(lo, hi, HOUR_MS)))
            days = p.days[i]
            for j in range(0, len(days), 2):
                delta[cells[days[j]]] += days[j + 1]
        writes = []
        if nrows:
            writes.append(write_rows(conn, LEDGER, [p.rows[i] for i in changed], mode))
        summary.rows_written += nrows
        inserts = [p.sources[i] for i in changed if keys[i] not in existing]
        updates = [
            {
                "_id": existing[keys[i]][0], "digest": digests[i], "job_id": p.job_ids[i],
                "state": p.states[i], "start": time_at(p.spans[i][0]),
                "end": time_at(p.spans[i][1]), "gpu_ms": p.gpu_ms[i],
                "last_changed_at": self.now,
            }
            for i in changed
            if keys[i] in existing
        ]  # fmt: skip
        # One COPY or executemany each, not a statement per record.
        if inserts:
            writes.append(write_rows(conn, SOURCES, [inserts], mode))
        if updates:
            stmt = update(SOURCES).where(SOURCES.c.id == bindparam("_id"))
            conn.execute(stmt, updates)
        summary.new += len(inserts)
        summary.changed += len(updates)
        pending = [w for w in writes if w is not None]
        if not pending:
            return None

        def write() -> None:
            for w in pending:
                w()

        return write


def _key_match(conn: Connection, keys: list[str]) -> Any:
    """`key IN (...)`; on PostgreSQL `key = ANY(array)`: inside one long ingest transaction
    the table's statistics stay those of an empty table, and once psycopg prepares the
    IN-list statement PostgreSQL's generic plan compares every row with every parameter
    (seconds per chunk past ~500,000 records, found by bench/accounting_ingest.py); the array form
    probes the (kind, key) index whatever the statistics."""
    if conn.dialect.name == "postgresql":
        return SOURCES.c.key == any_(bindparam("keys", keys, type_=ARRAY(String)))
    return SOURCES.c.key.in_(keys)


def _serving_for(
    conn: Connection, named: set[str], ids: set[str], ctx: Context
) -> dict[str, list[ServingPoint]]:
    """The serving samples of the chunk's serving jobs (`ids`; `named`: the clusters its
    records name), by job id."""
    out: dict[str, list[ServingPoint]] = defaultdict(list)
    if not ids:
        return out
    # The daemon stores samples under the configured cluster name, which may be empty.
    clusters = named | {ctx.cluster, ""}
    for part in batched(sorted(ids), 500):
        q = select(SAMPLES).where(SAMPLES.c.job_id.in_(part), SAMPLES.c.cluster.in_(clusters))
        for s in conn.execute(q):
            out[s.job_id].append(
                ServingPoint(
                    s.job_id, s.instance, s.model, utc(s.at), s.compute_us, s.version, s.requests
                )
            )
    return out


def _batch_for(
    conn: Connection, p: Prepared, serving: dict[str, list[ServingPoint]], ctx: Context
) -> BatchUse | None:
    """The batch route's work over the hours of the chunk's serving jobs that have
    samples (None: none of them has any)."""
    spans = [p.spans[i] for i, rec in p.serving.items() if serving.get(rec.job_id)]
    if not spans:
        return None
    clusters = sorted(p.clusters | {ctx.cluster, ""})
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    return read_batch_use(conn, clusters, time_at(start), time_at(end)) or None


def check_closed(
    conn: Connection,
    changed: Sequence[tuple[str, list[EntryTuple]]],
    old_keys: Sequence[str],
    closed: frozenset[str],
    restate: bool,
    reason: str,
    now: datetime,
    summary: IngestSummary,
) -> None:
    """Refuse (or, with restate, log) changes to closed months."""
    old: dict[tuple[str, str], Counter[tuple[Any, ...]]] = defaultdict(Counter)
    for part in batched(old_keys, 500):
        q = select(LEDGER).where(LEDGER.c.source.in_(part), LEDGER.c.month.in_(closed))
        for r in conn.execute(q):
            old[(r.source, r.month)][
                _cmp_key(r.bucket, r.pool, r.workload, r.team, r.model, r.gpu_ms)
            ] += 1
    new: dict[tuple[str, str], Counter[tuple[Any, ...]]] = defaultdict(Counter)
    for key, entries in changed:
        for e in entries:  # (bucket, cluster, pool, partition, workload, account, team, ...)
            m = month_of(e[0])
            if m in closed:
                new[(key, m)][_cmp_key(e[0], e[2], e[4], e[6], e[8], e[12])] += 1
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if not differ:
        return
    if not restate:
        key, month = differ[0]
        raise ClosedPeriodError(
            f"record {key} would change the closed period {month} "
            f"({len(differ)} change(s) in closed periods); nothing was written. "
            "Re-run with --restate --reason '...' to restate it."
        )
    for key, month in differ:
        conn.execute(
            insert(Restatement.__table__),  # type: ignore[attr-defined]
            {
                "at": now,
                "month": month,
                "source": key,
                "old_gpu_ms": sum(k[-1] * n for k, n in old.get((key, month), Counter()).items()),
                "new_gpu_ms": sum(k[-1] * n for k, n in new.get((key, month), Counter()).items()),
                "reason": reason,
            },
        )
        if month not in summary.restated:
            summary.restated.append(month)


def _cmp_key(bucket: datetime, *rest: Any) -> tuple[Any, ...]:
    return (utc(bucket), *rest)
