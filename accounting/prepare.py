"""The pure half of a bulk ingest: a chunk of sacct records -> what the database half needs.

`ingest.ingest_records` calls `prepare_records` on each chunk in its own process;
`ingest.ingest_documents` runs `prepare_document` (read and parse a document, then
`prepare_records` on its chunks) in worker processes, so that on two cores the next
documents are parsed and attributed while the main process does the database work.
No database, no clock; plain, picklable data in and out (a bad record's IngestError as
its (key, problem), raised by the ingest only if the record is changed).

Per ready record (`Ready`): its digest, its ledger rows already encoded for the bulk
writer (binary COPY tuples for PostgreSQL, bound tuples for SQLite's executemany), the
hours they cover, their GPU-ms, their cells of the daily roll-up, and for a serving job the
record itself (its rows are made again in the main process when it has serving samples).
The rows are those of `attribution.job_entry_tuples` without serving samples: the digest
and rows of a record with no samples stored.
"""

from __future__ import annotations

import gc
import os
import pickle
import struct
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy.dialects import sqlite

from accounting.allocation import holds_gpus
from accounting.attribution import (
    Context,
    EntryTuple,
    _bucket,
    comment_tags,
    deferred_reason,
    digest,
    job_entry_tuples,
    record_end,
    record_workload,
)
from accounting.batchshare import BatchUse
from accounting.errors import IngestError
from accounting.schema import BATCH_INFERENCE, LedgerRow
from bridge.slurm.model import AccountingRecord
from bridge.slurm.sacct import parse_sacct_json

#: a cell of the daily roll-up: (day, cluster, pool, partition, workload, account, team,
#: model, gpu_type, qos, lease)
DayCell = tuple[date, str, str, str, str, str, str, str, str, str, str]


@dataclass
class Prepared:
    """One chunk: its counts for the summary and, column by column (lists pickle fast),
    its ready records (started, with GPUs, partition and nodes known), in input order."""

    records: int = 0
    skipped: int = 0
    deferred: list[tuple[str, str]] = field(default_factory=list)
    #: the clusters the ready records name (`rec.cluster or ctx.cluster`)
    clusters: set[str] = field(default_factory=set)
    keys: list[str] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    #: start and end of each run, epoch microseconds (the end: `record_end`)
    spans: list[tuple[int, int]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    #: its ledger rows, encoded for the writer (`ENCODERS`), and how many
    rows: list[Any] = field(default_factory=list)
    nrows: list[int] = field(default_factory=list)
    #: [first, last + 1) hour of its rows, epoch ms (equal when it has none)
    hours: list[tuple[int, int]] = field(default_factory=list)
    gpu_ms: list[int] = field(default_factory=list)
    #: its source row as new, encoded for the writer (`SOURCE_ENCODERS`)
    sources: list[Any] = field(default_factory=list)
    #: its roll-up cells: (index in `cells`, GPU-ms, index, GPU-ms, ...)
    days: list[tuple[int, ...]] = field(default_factory=list)
    cells: list[DayCell] = field(default_factory=list)
    #: index -> why it cannot be booked (an IngestError's problem)
    errors: dict[int, str] = field(default_factory=dict)
    #: index -> the record of a serving job (its rows depend on its serving samples)
    serving: dict[int, AccountingRecord] = field(default_factory=dict)
    #: index -> its entries, when `closed` months were given and it touches one
    entries: dict[int, list[EntryTuple]] = field(default_factory=dict)
    #: (cluster, job id, account, user) of the chunk's batch-inference jobs, any state,
    #: GPUs or none (`accounting.batchcounts.record_batch_jobs`)
    batch_jobs: list[tuple[str, str, str, str]] = field(default_factory=list)
    _cell_index: dict[DayCell, int] = field(default_factory=dict, repr=False, compare=False)

    def add(
        self,
        rec: AccountingRecord,
        ctx: Context,
        mode: str,
        now: datetime,
        closed: frozenset[str],
        end: datetime,
        serving: Sequence[Any] = (),
        batch: BatchUse | None = None,
    ) -> None:
        """Prepare one ready record (`serving`: its samples, when the caller has them;
        `batch`: the batch route's work in its hours)."""
        assert rec.start is not None
        i = len(self.keys)
        key = rec.key
        self.keys.append(key)
        self.job_ids.append(rec.job_id)
        self.states.append(rec.state)
        start_us, end_us = _us(rec.start), _us(end)
        self.spans.append((start_us, end_us))
        dig = digest(rec, ctx, serving, batch)
        self.digests.append(dig)
        if _serves(rec, ctx):
            self.serving[i] = rec
        try:
            entries = job_entry_tuples(rec, ctx, serving, batch)
        except IngestError as exc:
            self.errors[i] = exc.problem
            entries = []
        self.rows.append(ENCODERS[mode](entries, key))
        self.nrows.append(len(entries))
        # every node's entries run over the same hours in order: the last is the latest
        first, last = (_hour(entries[0][0])[0], _hour(entries[-1][0])[0]) if entries else (0, -1)
        self.hours.append((first, last + HOUR_MS if entries else 0))
        gpu_ms = sum(e[12] for e in entries)
        self.gpu_ms.append(gpu_ms)
        self.sources.append(
            SOURCE_ENCODERS[mode](
                key, now, dig, rec.job_id, rec.state, rec.start, end, start_us, end_us, gpu_ms
            )
        )
        self.days.append(self._day_cells(entries))
        if closed and any(_month(e[0]) in closed for e in entries):
            self.entries[i] = entries

    def _day_cells(self, entries: Sequence[EntryTuple]) -> tuple[int, ...]:
        """The entries summed per roll-up cell (every key but the user, per day)."""
        sums: dict[DayCell, int] = {}
        for e in entries:
            cell = (_hour(e[0])[1], e[1], e[2], e[3], e[4], e[5], e[6], e[8], e[9], e[10], e[11])
            sums[cell] = sums.get(cell, 0) + e[12]
        index = self._index
        out: list[int] = []
        for cell, ms in sums.items():
            k = index.get(cell)
            if k is None:
                k = index[cell] = len(self.cells)
                self.cells.append(cell)
            out += (k, ms)
        return tuple(out)

    @property
    def _index(self) -> dict[DayCell, int]:
        """cell -> its index in `cells` (not pickled: made again where needed)."""
        if len(self._cell_index) != len(self.cells):
            self._cell_index = {c: k for k, c in enumerate(self.cells)}
        return self._cell_index

    def replace(self, i: int, other: Prepared) -> None:
        """Put `other`'s one record in place of record `i` (made again with its samples)."""
        assert len(other.keys) == 1
        for name in ("keys", "job_ids", "states", "spans", "digests", "rows", "nrows", "hours",
                     "gpu_ms", "sources"):  # fmt: skip
            getattr(self, name)[i] = getattr(other, name)[0]
        days = list(other.days[0])
        for j in range(0, len(days), 2):
            days[j] = self._cell_at(other.cells[days[j]])
        self.days[i] = tuple(days)
        for name in ("errors", "serving", "entries"):
            mine: dict[int, Any] = getattr(self, name)
            mine.pop(i, None)
            if 0 in getattr(other, name):
                mine[i] = getattr(other, name)[0]

    def _cell_at(self, cell: DayCell) -> int:
        index = self._index
        k = index.get(cell)
        if k is None:
            k = index[cell] = len(self.cells)
            self.cells.append(cell)
        return k

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cell_index": {}}


def prepare_records(
    chunk: Sequence[AccountingRecord],
    ctx: Context,
    mode: str,
    now: datetime,
    closed: frozenset[str] = frozenset(),
) -> Prepared:
    """The chunk's records sorted into deferred, without GPU time and ready; each ready
    one prepared for `mode` (`ENCODERS`); `now`: the ingest's time (new source rows)."""
    out = Prepared(records=len(chunk))
    for rec in chunk:
        if record_workload(rec, ctx, comment_tags(rec.comment)) == BATCH_INFERENCE:
            out.batch_jobs.append((rec.cluster or ctx.cluster, rec.job_id, rec.account, rec.user))
        why = deferred_reason(rec)
        if why:
            out.deferred.append((rec.key, why))
            continue
        end = record_end(rec, ctx.horizon)
        if rec.start is None or not holds_gpus(rec) or end is None:
            out.skipped += 1
            continue
        out.clusters.add(rec.cluster or ctx.cluster)
        out.add(rec, ctx, mode, now, closed, end)
    return out


def _serves(rec: AccountingRecord, ctx: Context) -> bool:
    """A serving job (whose rows depend on its serving samples)."""
    return record_workload(rec, ctx, comment_tags(rec.comment)) == "inference"


# --- the rows, encoded per database ---------------------------------------------------

HOUR_MS = 3_600_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: bucket -> (epoch ms, day, month, SQLite's bound bucket, SQLite's bound day, the COPY
#: prefix of a row in that hour); the hours repeat across records
_HOURS: dict[datetime, tuple[int, date, str, str, str, bytes]] = {}
#: PostgreSQL's epoch (timestamptz and date count from it)
_PG_EPOCH_US = 946_684_800_000_000
_PG_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()
_ONE_MS = timedelta(milliseconds=1)
#: the ledger's columns as a row holds them (`bulk.LEDGER_COLUMNS`)
_NFIELDS = 16


def _sqlite_binder(column: str) -> Callable[[Any], Any]:
    """How SQLAlchemy binds a value of the ledger's `column` on SQLite (its type's bind
    processors): the bulk rows hold exactly what the reference ingest writes."""
    type_ = LedgerRow.__table__.c[column].type  # type: ignore[attr-defined]
    dialect = sqlite.dialect()
    proc: Callable[[Any], Any] | None = type_.dialect_impl(dialect).bind_processor(dialect)
    assert proc is not None
    return proc


_SQLITE_BUCKET = _sqlite_binder("bucket")
_SQLITE_DAY = _sqlite_binder("day")
#: a source record's times (the same type as the ledger's bucket)
_SQLITE_TIME = _SQLITE_BUCKET


def _hour(bucket: datetime) -> tuple[int, date, str, str, str, bytes]:
    cell = _HOURS.get(bucket)
    if cell is None:
        if len(_HOURS) > 200_000:
            _HOURS.clear()
        ms = _ms(bucket)
        day, month = bucket.date(), bucket.strftime("%Y-%m")
        m = month.encode()
        prefix = struct.pack(
            f">hiqiii{len(m)}s",
            _NFIELDS, 8, ms * 1000 - _PG_EPOCH_US, 4, day.toordinal() - _PG_EPOCH_ORDINAL,
            len(m), m,
        )  # fmt: skip
        cell = (ms, day, month, _SQLITE_BUCKET(bucket), _SQLITE_DAY(day), prefix)
        _HOURS[bucket] = cell
    return cell


def _ms(bucket: datetime) -> int:
    return (bucket - _EPOCH) // _ONE_MS


def _month(bucket: datetime) -> str:
    return _hour(bucket)[2]


def sqlite_rows(entries: list[EntryTuple], source: str) -> list[tuple[Any, ...]]:
    """The rows as SQLite's executemany binds them (bucket and day as SQLAlchemy's text),
    in `bulk.LEDGER_COLUMNS` order."""
    rows = []
    for e in entries:
        h = _hour(e[0])
        rows.append((h[3], h[4], h[2], *e[1:12], source, e[12]))
    return rows


def copy_rows(entries: list[EntryTuple], source: str) -> bytes:
    """The rows as tuples of PostgreSQL's binary COPY format (no header or trailer), in
    `bulk.LEDGER_COLUMNS` order (timestamptz, date, varchar x 13, int8)."""
    parts = []
    src = _field(source)
    last: tuple[Any, ...] = ()
    middle = b""
    for e in entries:
        head = e[1:12]
        if head != last:
            known = _HEADS.get(head)
            if known is None:
                if len(_HEADS) > 100_000:
                    _HEADS.clear()
                known = _HEADS[head] = b"".join(_field(s) for s in head)
            middle = known + src
            last = head
        parts.append(_hour(e[0])[5] + middle + _GPU_MS.pack(8, e[12]))
    return b"".join(parts)


#: an entry's keys (cluster .. lease) -> their COPY fields (they repeat across records)
_HEADS: dict[tuple[Any, ...], bytes] = {}


_GPU_MS = struct.Struct(">iq")
_LEN = struct.Struct(">i")


def _field(text: str) -> bytes:
    b = text.encode()
    return _LEN.pack(len(b)) + b


#: COPY's binary header (signature, flags, header extension length) and trailer
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
COPY_TRAILER = struct.pack(">h", -1)


def value_rows(entries: list[EntryTuple], source: str) -> list[tuple[Any, ...]]:
    """The rows as Python values (the reference ingest's SQLAlchemy insert binds them)."""
    rows = []
    for e in entries:
        h = _hour(e[0])
        rows.append((e[0], h[1], h[2], *e[1:12], source, e[12]))
    return rows


#: the reference ingest's mode (SQLAlchemy inserts of row dicts, any database)
REFERENCE = "reference"
#: how the rows are encoded for each writer
ENCODERS: dict[str, Callable[[list[EntryTuple], str], Any]] = {
    "postgresql": copy_rows,
    "sqlite": sqlite_rows,
    REFERENCE: value_rows,
}


#: the kind of a sacct run's source record
SACCT = "sacct"


def _copy_time(us: int) -> bytes:
    return _TIME.pack(8, us - _PG_EPOCH_US)


def _copy_now(now: datetime) -> bytes:
    """`now` as a COPY field (the same for every row of an ingest: made once)."""
    if _NOW[0] is not now:
        _NOW[:] = [now, _copy_time(_us(now))]
    return _NOW[1]  # type: ignore[no-any-return]


_NOW: list[Any] = [None, b""]


_TIME = struct.Struct(">iq")
_SOURCE_FIELDS = struct.pack(">h", 10) + _field(SACCT)


def copy_source(
    key: str, now: datetime, dig: str, job_id: str, state: str, start: datetime,
    end: datetime, start_us: int, end_us: int, gpu_ms: int,
) -> bytes:  # fmt: skip
    """A new source row as a binary COPY tuple (`bulk.SOURCE_COLUMNS` order)."""
    at = _copy_now(now)
    return b"".join((
        _SOURCE_FIELDS, _field(key), at, _field(dig), _field(job_id), _field(state),
        _copy_time(start_us), _copy_time(end_us), _GPU_MS.pack(8, gpu_ms), at,
    ))  # fmt: skip


def sqlite_source(
    key: str, now: datetime, dig: str, job_id: str, state: str, start: datetime,
    end: datetime, start_us: int, end_us: int, gpu_ms: int,
) -> tuple[Any, ...]:  # fmt: skip
    """A new source row as SQLite's executemany binds it."""
    at = _SQLITE_TIME(now)
    return (SACCT, key, at, dig, job_id, state, _SQLITE_TIME(start), _SQLITE_TIME(end), gpu_ms, at)


def value_source(
    key: str, now: datetime, dig: str, job_id: str, state: str, start: datetime,
    end: datetime, start_us: int, end_us: int, gpu_ms: int,
) -> tuple[Any, ...]:  # fmt: skip
    """A new source row as Python values (the reference ingest)."""
    return (SACCT, key, now, dig, job_id, state, start, end, gpu_ms, now)


SOURCE_ENCODERS: dict[str, Callable[..., Any]] = {
    "postgresql": copy_source,
    "sqlite": sqlite_source,
    REFERENCE: value_source,
}


def _us(t: datetime) -> int:
    """Microseconds since the epoch, exactly."""
    return (t - _EPOCH) // _ONE_US


_ONE_US = timedelta(microseconds=1)


def time_at(us: int) -> datetime:
    """`_us` back to an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=us)


def hour_at(ms: int) -> datetime:
    """The hour bucket at epoch `ms` (the same object for the same hour)."""
    return _bucket(ms)


# --- in worker processes ---------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def init_worker(ctx: Context, mode: str, now: datetime, closed: frozenset[str]) -> None:
    """A worker process's setup (ProcessPoolExecutor's initializer): what
    `prepare_records` takes besides the records, once."""
    _WORKER.update(ctx=ctx, mode=mode, now=now, closed=closed)


def prepare_document(
    read: Callable[[Any], Sequence[AccountingRecord]], document: Any, chunk_size: int
) -> list[Prepared] | Failed:
    """In a worker: read one document (`read(document)`: e.g. read and parse a sacct JSON
    file) and prepare its records in chunks of `chunk_size`. An error comes back as
    `Failed` (`unwrap` raises it again in the caller, the same type and message)."""
    # The cyclic collector finds nothing here (records, tuples and bytes hold no cycles)
    # but would walk the document's hundreds of thousands of young objects again and again:
    # off while a document is read and prepared, 15% of the worker's time (bench/README).
    gc.disable()
    try:
        recs = list(read(document))
        ctx, mode, now, closed = (_WORKER[k] for k in ("ctx", "mode", "now", "closed"))
        return [
            prepare_records(recs[i : i + chunk_size], ctx, mode, now, closed)
            for i in range(0, len(recs), chunk_size)
        ]
    except Exception as exc:  # carried to the caller, raised there
        return Failed.of(exc)
    finally:
        gc.enable()


@dataclass
class Failed:
    """An exception from a worker, as data: many exception types (those whose __init__
    takes other arguments than their message) do not survive pickling as they are."""

    kind: type[BaseException]
    args: tuple[Any, ...]
    attrs: dict[str, Any]
    trace: str

    @staticmethod
    def of(exc: BaseException) -> Failed:
        attrs = {k: v for k, v in vars(exc).items() if _pickles(v)}
        trace = "".join(traceback.format_exception(exc))
        return Failed(type(exc), exc.args if _pickles(exc.args) else (str(exc),), attrs, trace)

    def exception(self) -> BaseException:
        exc = self.kind.__new__(self.kind)
        exc.args = self.args
        vars(exc).update(self.attrs)
        return exc


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # what does not pickle stays behind
        return False
    return True


def unwrap(result: list[Prepared] | Failed) -> list[Prepared]:
    """A worker's result, or its error raised here (the worker's traceback as a note)."""
    if isinstance(result, Failed):
        exc = result.exception()
        exc.add_note(f"in an ingest worker process:\n{result.trace}")
        raise exc
    return result


def read_sacct_file(path: str | os.PathLike[str]) -> list[AccountingRecord]:
    """A `read` for `ingest_documents`: one file of `sacct --json` output, parsed (its
    bytes go to the decoder as they are: no text copy of the whole file first)."""
    with open(path, "rb") as f:
        return parse_sacct_json(f.read())


#: the most worker processes `default_workers` gives: past two or three, the main
#: process's database work is the bound, and each worker holds a document (~170 MiB)
MAX_WORKERS = 4


def default_workers() -> int:
    """Worker processes for `ingest_documents`: one per CPU, at most `MAX_WORKERS`. Not
    one less for the main process: it mostly waits on the database (on 2 cores, a million
    records took 56 s with 2 workers, 69 s with 1 on PostgreSQL; 68 s and 92 s on SQLite:
    bench/README)."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))
