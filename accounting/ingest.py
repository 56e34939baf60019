"""Ingest: source records, inventory and slurmdbd's events into the ledger.

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

Records stream through in chunks (`progress` is called per chunk), so a million records
never sit in memory as rows. Each chunk is first prepared without the database
(`prepare.prepare_records`: digests, attribution, the rows encoded for the writer), then
booked (`accounting.book.Book.chunk`: the stored digests looked up, changed records' rows
replaced). New rows are written in bulk inside the ingest's one transaction
(`accounting.bulk`): binary COPY on PostgreSQL, one plain executemany per chunk and table
on SQLite, on a thread of their own while the next chunk is prepared (every other
statement waits for that write); `bulk=False` writes them with SQLAlchemy inserts, the
reference the tests compare with. Then the capacity rows are recomputed
(`accounting.idle`). What an ingest did comes back as `accounting.book.IngestSummary`.

Beside the ingest: Triton's serving samples are stored by `accounting.samples`, months
closed by `accounting.periods`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing
from datetime import UTC, datetime
from multiprocessing import get_context
from typing import Any, TypeVar

from sqlalchemy import Engine, insert, select

from accounting.attribution import Context
from accounting.book import Book, IngestSummary
from accounting.buckets import hours, utc
from accounting.bulk import Background
from accounting.capacity import units_of
from accounting.errors import LedgerError
from accounting.idle import recompute_idle
from accounting.inventory import Inventory, record_spans
from accounting.prepare import (
    ENCODERS,
    REFERENCE,
    Prepared,
    default_workers,
    init_worker,
    prepare_document,
    prepare_records,
    unwrap,
)
from accounting.rollup import DayDelta
from accounting.schema import IngestRun
from accounting.slurm_events import store_events
from accounting.tables import PERIODS, batched
from bridge.db import write_transaction
from bridge.slurm.model import AccountingRecord, SlurmEvent

D = TypeVar("D")


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
        book = Book(conn, ctx, frozenset(closed), restate, reason, now, summary, touched, days)
        with (
            Background() as writer,
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
        summary.idle_hours = recompute_idle(
            conn, touched, closed, restate, horizon, summary, days, units_of(ctx.slices)
        )
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
