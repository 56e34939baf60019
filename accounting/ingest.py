"""Ingest: source records, inventory and serving samples into the ledger.

- `ingest_records`: sacct runs -> ledger rows, idempotent by source record: a record whose
  digest (see `attribution.digest`) is unchanged is skipped; a changed one has its rows
  replaced. One transaction for the whole call: a bad record (IngestError names it) or a
  change to a closed month without `restate` rolls everything back. With `restate`, each
  closed month a record changes is logged in `restatement` with the reason. Afterwards the
  idle rows (capacity minus allocation) of every hour the call touched are recomputed.
- `record_inventory`: the node inventory as `node_span` rows (a span closes when a node
  changes pool, GPU type or count, or leaves service).
- `record_serving`: Triton's per-model compute counters, as scraped (duplicates ignored).

Records stream through in chunks (`progress` is called per chunk), so a million records
never sit in memory as rows. New rows are written in bulk inside the ingest's one transaction:
COPY on PostgreSQL, one plain executemany per chunk and table on SQLite, on a thread of their
own while the next chunk is read and attributed (every other statement waits for that write);
`bulk=False` writes them with SQLAlchemy inserts, the reference the tests compare with.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Connection,
    Date,
    DateTime,
    Engine,
    Float,
    Integer,
    String,
    any_,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import TypeDecorator

from accounting.attribution import (
    Context,
    Entry,
    EntryTuple,
    ServingPoint,
    capacity_ms,
    comment_tags,
    deferred_reason,
    digest,
    idle_entries,
    job_entry_tuples,
    record_end,
)
from accounting.buckets import HOUR, hours, month_of, utc
from accounting.errors import ClosedPeriodError, IngestError, LedgerError
from accounting.schema import (
    CAPACITY_SOURCE,
    IngestRun,
    LedgerRow,
    NodeSpan,
    Period,
    Restatement,
    ServingSample,
    SourceRecord,
)
from bridge.db import WRITE_OPTION
from bridge.slurm.model import AccountingRecord

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]
SPANS = NodeSpan.__table__  # type: ignore[attr-defined]
SAMPLES = ServingSample.__table__  # type: ignore[attr-defined]
PERIODS = Period.__table__  # type: ignore[attr-defined]
SACCT = "sacct"

T = TypeVar("T")


@dataclass
class IngestSummary:
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


def batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


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


def write_transaction(engine: Engine) -> Any:
    """A transaction that takes the write lock first (BEGIN IMMEDIATE on SQLite)."""
    return engine.execution_options(**{WRITE_OPTION: True}).begin()


def ingest_records(
    engine: Engine,
    records: Iterable[AccountingRecord],
    ctx: Context,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    restate: bool = False,
    reason: str = "",
    progress: Callable[[int], None] | None = None,
    chunk_size: int = 2000,
    now: datetime | None = None,
    inventory: Inventory | None = None,
    bulk: bool = True,
) -> IngestSummary:
    """Book `records`; recompute idle for the hours they touch and for [since, until).
    `inventory`, when given, is recorded in the same transaction (first), so a failed
    ingest leaves no capacity change behind either. `bulk` writes the new rows with COPY
    (PostgreSQL) or one plain executemany per chunk (SQLite) in that same transaction;
    False: through SQLAlchemy's insert, row dicts (the reference the tests compare with)."""
    if restate and not reason.strip():
        raise LedgerError("a restatement needs a reason")
    now = utc(now or datetime.now(UTC))
    started = now
    summary = IngestSummary()
    touched: set[datetime] = set()
    with write_transaction(engine) as conn:
        if inventory is not None:
            _record_inventory(conn, inventory)
        closed = set(conn.scalars(select(PERIODS.c.month)))
        with _Background() as writer:
            # The next chunk is read (parsed) while a thread writes this one's rows; every
            # database access waits for that write first.
            bound_for = conn.dialect if bulk and conn.dialect.name == "sqlite" else None
            for chunk in batched(records, chunk_size):
                prepared = _prepare_chunk(chunk, ctx, summary, early=bulk, bound_for=bound_for)
                writer.wait()
                write = _ingest_chunk(
                    conn, prepared, ctx, closed, restate, reason, now, summary, touched, bulk=bulk
                )
                if write is not None:
                    writer.submit(write)
                if progress:
                    progress(len(chunk))
            writer.wait()
        if since is not None and until is not None:
            touched.update(hours(since, until))
        horizon = ctx.horizon or until or now
        summary.idle_hours = _recompute_idle(conn, touched, closed, restate, horizon, summary)
        conn.execute(
            insert(IngestRun.__table__),  # type: ignore[attr-defined]
            {
                "started_at": started,
                "finished_at": datetime.now(UTC),
                "since": since,
                "until": until,
                "records": summary.records,
                "changed": summary.new + summary.changed,
                "deferred": len(summary.deferred),
                "restated": len(summary.restated),
            },
        )
    return summary


@dataclass
class _Prepared:
    """A chunk's records to book, their keys, and what needs no database: the digest and
    entries of each record that needs no serving samples (None for one that does). An
    IngestError is kept, to be raised only if the record turns out to be changed."""

    ready: list[AccountingRecord]
    keys: list[str]
    #: per record: None, or (digest, entries or the error, its ledger rows)
    early: list[tuple[str, list[EntryTuple] | IngestError, list[tuple[Any, ...]]] | None]
    serving_ids: set[str]
    #: the dialect the rows' bucket and day are bound for (None: Python values)
    bound_for: Any


def _prepare_chunk(
    chunk: Sequence[AccountingRecord],
    ctx: Context,
    summary: IngestSummary,
    *,
    early: bool,
    bound_for: Any = None,
) -> _Prepared:
    """The chunk's pure part, done before the previous chunk's write is waited for (with
    `early`: digests, entries and rows too)."""
    summary.records += len(chunk)
    ready = []
    for rec in chunk:
        why = deferred_reason(rec)
        if why:
            summary.deferred.append((rec.key, why))
        elif rec.start is None or rec.gpus == 0 or record_end(rec, ctx.horizon) is None:
            summary.skipped += 1
        else:
            ready.append(rec)
    keys = [r.key for r in ready]  # a property (an f-string): once per record
    serving_ids = {r.job_id for r in ready if _serves(r, ctx)}
    pre: list[tuple[str, list[EntryTuple] | IngestError, list[tuple[Any, ...]]] | None] = []
    for rec, key in zip(ready, keys, strict=True):
        if not early or rec.job_id in serving_ids:
            pre.append(None)
            continue
        try:
            entries = job_entry_tuples(rec, ctx)
        except IngestError as exc:
            pre.append((digest(rec, ctx), exc, []))
            continue
        pre.append((digest(rec, ctx), entries, _rows_of(entries, key, bound_for)))
    return _Prepared(ready, keys, pre, serving_ids, bound_for)


def _rows_of(entries: list[EntryTuple], source: str, bound_for: Any) -> list[tuple[Any, ...]]:
    """A record's ledger rows (`LEDGER_COLUMNS` order) from its entries."""
    cells = _bucket_cells(bound_for)
    rows = []
    for e in entries:
        b = e[0]
        cell = cells.get(b)
        if cell is None:
            cell = _bucket_cell(cells, b, bound_for)
        rows.append((*cell, *e[1:12], source, e[12]))
    return rows


def _serves(rec: AccountingRecord, ctx: Context) -> bool:
    """A serving job (whose rows depend on its serving samples)."""
    tagged = comment_tags(rec.comment)
    return tagged.get("workload", ctx.workload_of_partition.get(rec.partition)) == "inference"


def _ingest_chunk(
    conn: Connection,
    prepared: _Prepared,
    ctx: Context,
    closed: set[str],
    restate: bool,
    reason: str,
    now: datetime,
    summary: IngestSummary,
    touched: set[datetime],
    *,
    bulk: bool = False,
) -> Callable[[], None] | None:
    """Book one prepared chunk. With `bulk` (PostgreSQL, SQLite) the new rows' writes are
    returned, to run before the transaction's next statement; otherwise they are done
    here."""
    ready, keys = prepared.ready, prepared.keys
    if not ready:
        return None
    serving = _serving_for(conn, ready, prepared.serving_ids, ctx)
    existing = {
        key: (rid, dig)
        for rid, key, dig in conn.execute(
            select(SOURCES.c.id, SOURCES.c.key, SOURCES.c.digest).where(
                SOURCES.c.kind == SACCT, _key_match(conn, keys)
            )
        )
    }
    changed: list[tuple[AccountingRecord, str, list[EntryTuple]]] = []
    changed_keys: list[str] = []
    early_rows: dict[str, list[tuple[Any, ...]]] = {}
    bound_for = prepared.bound_for
    seen: set[str] = set()
    for rec, key, pre in zip(ready, keys, prepared.early, strict=True):
        if key in seen:  # the same run listed twice in one read: the later wins
            kept = [i for i, k in enumerate(changed_keys) if k != key]
            changed = [changed[i] for i in kept]
            changed_keys = [changed_keys[i] for i in kept]
        seen.add(key)
        if pre is None:
            points = serving.get(rec.job_id, ())
            dig = digest(rec, ctx, points)
        else:
            dig = pre[0]
        old = existing.get(key)
        if old is not None and old[1] == dig:
            summary.unchanged += 1
            continue
        if pre is None:
            entries = job_entry_tuples(rec, ctx, points)
            early_rows.pop(key, None)
        elif isinstance(pre[1], IngestError):
            raise pre[1]
        else:
            entries, early_rows[key] = pre[1], pre[2]
        changed.append((rec, dig, entries))
        changed_keys.append(key)
    if not changed:
        return None
    old_keys = [key for key in changed_keys if key in existing]
    if closed:
        _check_closed(conn, changed, old_keys, closed, restate, reason, now, summary)
    if old_keys:
        for part in batched(old_keys, 500):
            old_hours = conn.execute(
                select(LEDGER.c.bucket).where(LEDGER.c.source.in_(part)).distinct()
            )
            touched.update(utc(h) for (h,) in old_hours)
            conn.execute(delete(LEDGER).where(LEDGER.c.source.in_(part)))
    # On SQLite's bulk path the rows carry their bucket and day as bound (text), made once
    # per hour; elsewhere as Python values.
    bound = bulk and conn.dialect.name == "sqlite"
    rows: list[tuple[Any, ...]] = []
    for (_, _, entries), source in zip(changed, changed_keys, strict=True):
        made = early_rows.get(source)
        rows += made if made is not None else _rows_of(entries, source, bound_for)
        touched.update(e[0] for e in entries)
    writes = []
    if rows:
        writes.append(bulk_write(conn, LEDGER, LEDGER_COLUMNS, rows, bulk, bound=bound))
    summary.rows_written += len(rows)
    inserts: list[tuple[Any, ...]] = []
    updates = []
    for (rec, dig, entries), key in zip(changed, changed_keys, strict=True):
        end = record_end(rec, ctx.horizon)
        gpu_ms = sum(e[12] for e in entries)
        if key in existing:
            updates.append(
                {
                    "_id": existing[key][0], "digest": dig, "job_id": rec.job_id,
                    "state": rec.state, "start": rec.start, "end": end, "gpu_ms": gpu_ms,
                    "last_changed_at": now,
                }
            )  # fmt: skip
        else:
            inserts.append(
                (SACCT, key, now, dig, rec.job_id, rec.state, rec.start, end, gpu_ms, now)
            )
    # One executemany (or COPY) each, not a statement per record.
    if inserts:
        writes.append(bulk_write(conn, SOURCES, SOURCE_COLUMNS, inserts, bulk))
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


class _Background:
    """One write at a time on a thread of its own. The drivers leave the GIL while the
    database works (SQLite's steps, PostgreSQL's COPY round trips), so on two cores the
    next chunk's parsing runs meanwhile. The caller waits before the connection's next
    use; on an error, the write under way is waited for (not raised over) before the
    transaction rolls back."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future[None] | None = None

    def __enter__(self) -> _Background:
        return self

    def submit(self, fn: Callable[[], None]) -> None:
        self.wait()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="stb-ledger-write")
        self.pending = self.pool.submit(fn)

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None:
                self.wait()
            elif self.pending is not None:
                futures_wait([self.pending])
                self.pending = None
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)


#: the columns of a ledger row tuple, in order
LEDGER_COLUMNS = (
    "bucket", "day", "month", "cluster", "pool", "partition", "workload", "account", "team",
    "user_name", "model", "gpu_type", "qos", "lease", "source", "gpu_ms",
)  # fmt: skip
#: the columns of a new source record tuple, in order
SOURCE_COLUMNS = (
    "kind", "key", "first_ingested_at", "digest", "job_id", "state", "start", "end", "gpu_ms",
    "last_changed_at",
)  # fmt: skip
#: per dialect (None: Python values), bucket -> (bucket, day, month) as a row holds them
_BUCKET_CELLS: dict[str | None, dict[datetime, tuple[Any, Any, str]]] = {}


def _bucket_cells(dialect: Any) -> dict[datetime, tuple[Any, Any, str]]:
    return _BUCKET_CELLS.setdefault(dialect.name if dialect is not None else None, {})


def _bucket_cell(
    cells: dict[datetime, tuple[Any, Any, str]], bucket: datetime, dialect: Any
) -> tuple[Any, Any, str]:
    """A bucket's (bucket, day, month) as `_row` writes them, bound for `dialect` when
    given; cached: the hours repeat across records."""
    if len(cells) > 200_000:
        cells.clear()
    day, month = bucket.date(), bucket.strftime("%Y-%m")
    if dialect is None:
        cell: tuple[Any, Any, str] = (bucket, day, month)
    else:
        to_bucket = _bind_processor(LEDGER.c.bucket.type, dialect)
        to_day = _bind_processor(LEDGER.c.day.type, dialect)
        cell = (
            to_bucket(bucket) if to_bucket else bucket,
            to_day(day) if to_day else day,
            month,
        )
    cells[bucket] = cell
    return cell


def insert_rows(
    conn: Connection,
    table: Any,
    columns: Sequence[str],
    rows: list[tuple[Any, ...]],
    bulk: bool,
    *,
    bound: bool = False,
) -> None:
    """Insert `rows` (tuples in `columns` order) in the open transaction: COPY on
    PostgreSQL, a plain executemany of bound values on SQLite when `bulk` (`bound`: the
    rows hold them already); else (and on other databases) SQLAlchemy's insert of row
    dicts, the reference."""
    write = bulk_write(conn, table, columns, rows, bulk, bound=bound)
    if write is not None:
        write()


def bulk_write(
    conn: Connection,
    table: Any,
    columns: Sequence[str],
    rows: list[tuple[Any, ...]],
    bulk: bool,
    *,
    bound: bool = False,
) -> Callable[[], None] | None:
    """`insert_rows`: on the bulk paths the write itself, to run later (on the driver's
    connection, in the open transaction); otherwise the rows are inserted now (None)."""
    dialect = conn.dialect
    driver: Any = conn.connection.driver_connection
    quote = dialect.identifier_preparer.quote
    if bulk and dialect.name == "postgresql":
        names = ", ".join(quote(c) for c in columns)
        sql = f"COPY {quote(table.name)} ({names}) FROM STDIN (FORMAT BINARY)"
        types = [_pg_copy_type(table.c[c].type) for c in columns]

        def copy_rows() -> None:
            with driver.cursor() as cur, cur.copy(sql) as copy:
                copy.set_types(types)
                for row in rows:
                    copy.write_row(row)

        return copy_rows
    if bulk and dialect.name == "sqlite":
        sql = _sqlite_insert(conn, table, columns)
        values = rows if bound else bind_rows(conn, table, columns, rows)

        def execute_many() -> None:
            cur = driver.cursor()
            try:
                cur.executemany(sql, values)
            finally:
                cur.close()

        return execute_many
    conn.execute(insert(table), [dict(zip(columns, row, strict=True)) for row in rows])
    return None


def _pg_copy_type(type_: Any) -> str:
    """The PostgreSQL type a binary COPY sends a column's values as."""
    impl = type_.impl if isinstance(type_, TypeDecorator) else type_
    for kind, name in _PG_COPY_TYPES:
        if isinstance(impl, kind):
            return name
    raise LedgerError(f"no COPY type for {type_!r}")  # pragma: no cover - schema types only


#: SQLAlchemy type -> PostgreSQL type of a binary COPY (the most specific first)
_PG_COPY_TYPES: tuple[tuple[type[Any], str], ...] = (
    (DateTime, "timestamptz"),
    (Date, "date"),
    (String, "varchar"),
    (BigInteger, "int8"),
    (Integer, "int4"),
    (Float, "float8"),
)


def _sqlite_insert(conn: Connection, table: Any, columns: Sequence[str]) -> str:
    quote = conn.dialect.identifier_preparer.quote
    names = ", ".join(quote(c) for c in columns)
    return f"INSERT INTO {quote(table.name)} ({names}) VALUES ({', '.join('?' * len(columns))})"


def bind_rows(
    conn: Connection, table: Any, columns: Sequence[str], rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """The rows as SQLAlchemy binds them on SQLite (its column types' bind processors:
    UTC datetimes as naive text, dates as text), converted once per distinct value; on
    other databases as they are (COPY adapts them)."""
    if conn.dialect.name != "sqlite":
        return rows
    procs = [
        (i, proc)
        for i, c in enumerate(columns)
        if (proc := _bind_processor(table.c[c].type, conn.dialect)) is not None
    ]
    if not procs:
        return rows
    memo: list[dict[Any, Any]] = [{} for _ in procs]
    out = []
    for row in rows:
        values = list(row)
        for (i, proc), seen in zip(procs, memo, strict=True):
            v = values[i]
            if v is not None:
                try:
                    values[i] = seen[v]
                except KeyError:
                    values[i] = seen[v] = proc(v)
        out.append(tuple(values))
    return out


def _key_match(conn: Connection, keys: list[str]) -> Any:
    """`key IN (...)`; on PostgreSQL `key = ANY(array)`: inside one long ingest transaction
    the table's statistics stay those of an empty table, and once psycopg prepares the
    IN-list statement PostgreSQL's generic plan compares every row with every parameter
    (seconds per chunk past ~500,000 records, found by bench/ledger.py); the array form
    probes the (kind, key) index whatever the statistics."""
    if conn.dialect.name == "postgresql":
        return SOURCES.c.key == any_(bindparam("keys", keys, type_=ARRAY(String)))
    return SOURCES.c.key.in_(keys)


def _serving_for(
    conn: Connection, records: Sequence[AccountingRecord], ids: set[str], ctx: Context
) -> dict[str, list[ServingPoint]]:
    """The serving samples of the chunk's serving jobs (`ids`), by job id."""
    out: dict[str, list[ServingPoint]] = defaultdict(list)
    if not ids:
        return out
    # The daemon stores samples under the configured cluster name, which may be empty.
    clusters = {r.cluster or ctx.cluster for r in records} | {ctx.cluster, ""}
    for part in batched(sorted(ids), 500):
        q = select(SAMPLES).where(SAMPLES.c.job_id.in_(part), SAMPLES.c.cluster.in_(clusters))
        for s in conn.execute(q):
            out[s.job_id].append(
                ServingPoint(s.job_id, s.instance, s.model, utc(s.at), s.compute_us)
            )
    return out


def _check_closed(
    conn: Connection,
    changed: Sequence[tuple[AccountingRecord, str, list[EntryTuple]]],
    old_keys: Sequence[str],
    closed: set[str],
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
    for rec, _, entries in changed:
        for e in entries:  # (bucket, cluster, pool, partition, workload, account, team, ...)
            m = month_of(e[0])
            if m in closed:
                new[(rec.key, m)][_cmp_key(e[0], e[2], e[4], e[6], e[8], e[12])] += 1
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


def _recompute_idle(
    conn: Connection,
    touched: set[datetime],
    closed: set[str],
    restate: bool,
    horizon: datetime,
    summary: IngestSummary,
) -> int:
    """Replace the idle rows of the touched hours (open months, or closed ones when
    restating) with capacity minus allocation."""
    todo = sorted(h for h in touched if restate or month_of(h) not in closed)
    if not todo:
        return 0
    for group in _runs(todo):
        lo, hi = group[0], group[-1] + HOUR
        spans = conn.execute(
            select(
                SPANS.c.cluster,
                SPANS.c.pool,
                SPANS.c.gpu_type,
                SPANS.c.gpus,
                SPANS.c.start,
                SPANS.c.end,
            ).where(SPANS.c.start < hi, (SPANS.c.end.is_(None)) | (SPANS.c.end > lo))
        ).all()
        cap = capacity_ms(
            ((c, p, t, g, utc(s), utc(e) if e else None) for c, p, t, g, s, e in spans),
            lo,
            min(hi, max(horizon, lo)),
        )
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
        entries, over = idle_entries(cap, alloc)
        summary.overbooked.update(over)
        want = {(e.cluster, e.pool, e.gpu_type, e.bucket): e for e in entries}
        have = {
            (c, p, t, utc(b)): (rid, int(ms))
            for rid, c, p, t, b, ms in conn.execute(
                select(
                    LEDGER.c.id, LEDGER.c.cluster, LEDGER.c.pool, LEDGER.c.gpu_type,
                    LEDGER.c.bucket, LEDGER.c.gpu_ms,
                ).where(
                    LEDGER.c.source == CAPACITY_SOURCE, LEDGER.c.bucket >= lo, LEDGER.c.bucket < hi
                )
            )
        }  # fmt: skip
        # Write only what differs: re-ingesting an unchanged window leaves every row as it was.
        stale = [
            rid for cell, (rid, ms) in have.items() if cell not in want or want[cell].gpu_ms != ms
        ]
        for part in batched(stale, 500):
            conn.execute(delete(LEDGER).where(LEDGER.c.id.in_(part)))
        fresh = [
            _row(e, CAPACITY_SOURCE)
            for cell, e in want.items()
            if cell not in have or have[cell][1] != e.gpu_ms
        ]
        if fresh:
            conn.execute(insert(LEDGER), fresh)
            summary.rows_written += len(fresh)
    return len(todo)


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


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node in service: its pool, GPU type and GPU count."""

    node: str
    pool: str
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class Inventory:
    """The nodes in service at `at`, to record with an ingest (see `record_inventory`)."""

    cluster: str
    nodes: Sequence[NodeCapacity]
    at: datetime
    backfill_from: datetime | None = None


def record_inventory(
    engine: Engine,
    cluster: str,
    nodes: Iterable[NodeCapacity],
    at: datetime,
    *,
    backfill_from: datetime | None = None,
) -> int:
    """Record the inventory seen at `at`; returns the spans opened or closed. A node seen
    for the first time is taken to have been there since `backfill_from` (when given and
    earlier): the first ingest of a window then has the window's capacity."""
    with write_transaction(engine) as conn:
        return _record_inventory(conn, Inventory(cluster, list(nodes), at, backfill_from))


def _record_inventory(conn: Connection, inv: Inventory) -> int:
    at = utc(inv.at)
    first = min(utc(inv.backfill_from), at) if inv.backfill_from else at
    cluster = inv.cluster
    changes = 0
    open_spans = {
        r.node: r
        for r in conn.execute(
            select(SPANS).where(SPANS.c.cluster == cluster, SPANS.c.end.is_(None))
        )
    }
    known = set(conn.scalars(select(SPANS.c.node).where(SPANS.c.cluster == cluster).distinct()))
    seen = set()
    for n in inv.nodes:
        if n.gpus < 0:
            raise LedgerError(f"node {n.node}: negative GPU count {n.gpus}")
        seen.add(n.node)
        cur = open_spans.get(n.node)
        if cur is not None and (cur.pool, cur.gpu_type, cur.gpus) == (n.pool, n.gpu_type, n.gpus):
            continue
        if cur is not None:
            conn.execute(update(SPANS).where(SPANS.c.id == cur.id).values(end=at))
            changes += 1
        conn.execute(
            insert(SPANS).values(
                cluster=cluster, node=n.node, pool=n.pool, gpu_type=n.gpu_type, gpus=n.gpus,
                start=first if n.node not in known else at, end=None,
            )
        )  # fmt: skip
        changes += 1
    for name, cur in open_spans.items():
        if name not in seen:
            conn.execute(update(SPANS).where(SPANS.c.id == cur.id).values(end=at))
            changes += 1
    return changes


def record_serving(engine: Engine, cluster: str, points: Iterable[ServingPoint]) -> int:
    """Store scraped compute counters; a point already stored is ignored. Returns the
    number of points offered."""
    rows = [
        {
            "cluster": cluster,
            "job_id": p.job_id,
            "instance": p.instance,
            "model": p.model,
            "at": utc(p.at),
            "compute_us": float(p.compute_us),
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


def prune_serving(engine: Engine, before: datetime) -> int:
    """Drop serving samples older than `before`; returns how many."""
    with write_transaction(engine) as conn:
        return conn.execute(delete(SAMPLES).where(SAMPLES.c.at < utc(before))).rowcount or 0


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


def _bind_processor(type_: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """What SQLAlchemy applies to a value of `type_` bound on `dialect` (a TypeDecorator's
    process_bind_param, then its implementation's processor for that dialect)."""
    proc: Callable[[Any], Any] | None = type_.dialect_impl(dialect).bind_processor(dialect)
    return proc
