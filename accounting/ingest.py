"""Ingest: source records, inventory and serving samples into the ledger.

- `ingest_records`: sacct runs -> ledger rows, idempotent by source record: a record whose
  digest (see `attribution.digest`) is unchanged is skipped; a changed one has its rows
  replaced. One transaction for the whole call: a bad record (IngestError names it) or a
  change to a closed month without `restate` rolls everything back. With `restate`, each
  closed month a record changes is logged in `restatement` with the reason. Afterwards the
  idle rows (capacity minus allocation) of every hour the call touched are recomputed, and
  the daily roll-up (`rollup`) takes every row written and removed, in the same transaction.
- `ingest_documents`: the same for the records of documents (e.g. sacct JSON files) that
  worker processes read, parse and prepare while this process does the database part.
- the node inventory (`accounting.inventory`) is recorded in the ingest's transaction.
- `record_serving`: Triton's per-model compute counters, as scraped (duplicates ignored).

Records stream through in chunks (`progress` is called per chunk), so a million records
never sit in memory as rows. Each chunk is first prepared without the database
(`prepare.prepare_records`: digests, attribution, the rows encoded for the writer), then
booked (`_Book.chunk`: the stored digests looked up, changed records' rows replaced). New
rows are written in bulk inside the ingest's one transaction: binary COPY on PostgreSQL, one
plain executemany per chunk and table on SQLite, on a thread of their own while the next
chunk is prepared (every other statement waits for that write); `bulk=False` writes them
with SQLAlchemy inserts, the reference the tests compare with.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_context
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
)
from accounting.buckets import HOUR, floor_hour, hours, month_of, utc
from accounting.capacity import RunAlloc, capacity_entries, event_capacity
from accounting.errors import ClosedPeriodError, IngestError, LedgerError
from accounting.inventory import Inventory, record_spans
from accounting.prepare import (
    COPY_HEADER,
    COPY_TRAILER,
    ENCODERS,
    HOUR_MS,
    REFERENCE,
    SACCT,
    DayCell,
    Prepared,
    default_workers,
    hour_at,
    init_worker,
    prepare_document,
    prepare_records,
    time_at,
    unwrap,
)
from accounting.rollup import DayDelta
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
from accounting.slurm_events import clusters_with_events, load_events, node_attrs, store_events
from bridge.db import write_transaction
from bridge.slurm.model import AccountingRecord, SlurmEvent

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]
SPANS = NodeSpan.__table__  # type: ignore[attr-defined]
SAMPLES = ServingSample.__table__  # type: ignore[attr-defined]
PERIODS = Period.__table__  # type: ignore[attr-defined]

T = TypeVar("T")
D = TypeVar("D")


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
    events: Sequence[SlurmEvent] | None = None,
) -> IngestSummary:
    """Book `records`; recompute idle for the hours they touch and for [since, until).
    `inventory`, when given, is recorded in the same transaction (first), so a failed
    ingest leaves no capacity change behind either; so are slurmdbd's `events` (the
    capacity and down lines of a cluster that has them, `accounting.capacity`). `bulk`
    writes the new rows with COPY (PostgreSQL) or one plain executemany per chunk (SQLite)
    in that same transaction; False: through SQLAlchemy's insert, row dicts (the reference
    the tests compare with)."""

    def chunks(mode: str, now: datetime, closed: frozenset[str]) -> Generator[Prepared]:
        for chunk in batched(records, chunk_size):
            yield prepare_records(chunk, ctx, mode, now, closed)

    return _ingest(
        engine, chunks, ctx, since=since, until=until, restate=restate, reason=reason,
        progress=progress, now=now, inventory=inventory, bulk=bulk, events=events,
    )  # fmt: skip


def ingest_documents(
    engine: Engine,
    documents: Iterable[D],
    read: Callable[[D], Sequence[AccountingRecord]],
    ctx: Context,
    *,
    workers: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    restate: bool = False,
    reason: str = "",
    progress: Callable[[int], None] | None = None,
    chunk_size: int = 2000,
    now: datetime | None = None,
    inventory: Inventory | None = None,
    events: Sequence[SlurmEvent] | None = None,
) -> IngestSummary:
    """`ingest_records` of the records `read(document)` gives for each document, in
    order, with the reading (e.g. parsing a sacct JSON file) and the pure part of the
    ingest (digests, attribution, the encoded rows) done in `workers` processes
    (`prepare.default_workers()` when None; 0: in this process) while this one does the
    database part. `read` and the documents must pickle (a module-level function; paths);
    the workers are started by "spawn", which imports the calling program's main module
    again: it must start nothing at import (`if __name__ == "__main__":`).
    The same ledger, summary and errors as `ingest_records` of the same records, in bulk;
    a document is a unit of work (its records are in memory at once)."""
    n = default_workers() if workers is None else workers

    def chunks(mode: str, now: datetime, closed: frozenset[str]) -> Generator[Prepared]:
        if n <= 0:
            for document in documents:
                for chunk in batched(read(document), chunk_size):
                    yield prepare_records(chunk, ctx, mode, now, closed)
            return
        with ProcessPoolExecutor(
            n, mp_context=get_context("spawn"), initializer=init_worker,
            initargs=(ctx, mode, now, closed),
        ) as pool:  # fmt: skip
            pending: deque[Future[Any]] = deque()
            docs = iter(documents)
            try:
                while True:
                    # keep every worker busy and one document ready
                    for document in docs:
                        pending.append(pool.submit(prepare_document, read, document, chunk_size))
                        if len(pending) > n:
                            break
                    if not pending:
                        return
                    yield from unwrap(pending.popleft().result())
            finally:
                for f in pending:
                    f.cancel()

    return _ingest(
        engine, chunks, ctx, since=since, until=until, restate=restate, reason=reason,
        progress=progress, now=now, inventory=inventory, bulk=True, events=events,
    )  # fmt: skip


def _ingest(
    engine: Engine,
    chunks: Callable[[str, datetime, frozenset[str]], Generator[Prepared]],
    ctx: Context,
    *,
    since: datetime | None,
    until: datetime | None,
    restate: bool,
    reason: str,
    progress: Callable[[int], None] | None,
    now: datetime | None,
    inventory: Inventory | None,
    bulk: bool,
    events: Sequence[SlurmEvent] | None = None,
) -> IngestSummary:
    if restate and not reason.strip():
        raise LedgerError("a restatement needs a reason")
    now = utc(now or datetime.now(UTC))
    started = now
    summary = IngestSummary()
    touched: set[datetime] = set()
    with write_transaction(engine) as conn:
        if inventory is not None:
            record_spans(conn, inventory)
        if events is not None:
            touched.update(store_events(conn, events, ctx.horizon or until or now))
        closed = set(conn.scalars(select(PERIODS.c.month)))
        dialect = conn.dialect.name
        mode = dialect if bulk and dialect in ENCODERS else REFERENCE
        days = DayDelta()
        book = _Book(conn, ctx, frozenset(closed), restate, reason, now, summary, touched, days)
        with (
            _Background() as writer,
            closing(chunks(mode, now, frozenset(closed))) as prepared_chunks,
        ):
            # The next chunk is prepared (read, parsed, attributed: here or in a worker)
            # while a thread writes this one's rows; every database access waits for that
            # write first. On an error the workers are stopped (`closing`) before it rises.
            for prepared in prepared_chunks:
                writer.wait()
                write = book.chunk(prepared, mode)
                if write is not None:
                    writer.submit(write)
                if progress:
                    progress(prepared.records)
            writer.wait()
        if since is not None and until is not None:
            touched.update(hours(since, until))
        horizon = ctx.horizon or until or now
        summary.idle_hours = _recompute_idle(conn, touched, closed, restate, horizon, summary, days)
        days.apply(conn)
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
class _Book:
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
        keys = p.keys
        if not keys:
            return None
        serving = _serving_for(conn, p.clusters, {p.job_ids[i] for i in p.serving}, ctx)
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
                again.add(rec, ctx, mode, self.now, self.closed, time_at(p.spans[i][1]), points)
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
            _check_closed(
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
            writes.append(_write_rows(conn, LEDGER, [p.rows[i] for i in changed], mode))
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
            writes.append(_write_rows(conn, SOURCES, [inserts], mode))
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


def _write_rows(
    conn: Connection, table: Any, parts: list[Any], mode: str
) -> Callable[[], None] | None:
    """Rows of the ledger or of the source records, as `prepare` encoded them for `mode`
    (each part: COPY tuples as bytes, or a list of row tuples): one binary COPY
    (PostgreSQL), one executemany (SQLite), or SQLAlchemy's insert (the reference, done
    now: None)."""
    columns = LEDGER_COLUMNS if table is LEDGER else SOURCE_COLUMNS
    if mode == "postgresql":
        driver: Any = conn.connection.driver_connection
        quote = conn.dialect.identifier_preparer.quote
        names = ", ".join(quote(c) for c in columns)
        sql = f"COPY {quote(table.name)} ({names}) FROM STDIN (FORMAT BINARY)"
        data = [piece for part in parts for piece in ([part] if isinstance(part, bytes) else part)]

        def copy_rows() -> None:
            with driver.cursor() as cur, cur.copy(sql) as copy:
                copy.write(COPY_HEADER)
                for piece in data:
                    copy.write(piece)
                copy.write(COPY_TRAILER)

        return copy_rows
    rows = [row for part in parts for row in part]
    return bulk_write(conn, table, columns, rows, mode == "sqlite", bound=True)


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


def _check_closed(
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


def _recompute_idle(
    conn: Connection,
    touched: set[datetime],
    closed: set[str],
    restate: bool,
    horizon: datetime,
    summary: IngestSummary,
    days: DayDelta,
) -> int:
    """Replace the capacity rows (idle, and the down lines of clusters with slurmdbd's
    events) of the touched hours (open months, or closed ones when restating) with what the
    capacity leaves after allocation (noted in `days`)."""
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
            ((c, p, t, g, utc(s), utc(e) if e else None) for c, p, t, g, s, e in spans), lo, end
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


def record_serving(engine: Engine, cluster: str, points: Iterable[ServingPoint]) -> int:
    """Store scraped compute counters; a point already stored is ignored. Returns the
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
            "requests": None if p.requests is None else float(p.requests),
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
