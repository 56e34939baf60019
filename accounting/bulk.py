"""The ledger's bulk writer: rows written in the open transaction as one binary COPY
(PostgreSQL) or one plain executemany of bound values (SQLite), else through SQLAlchemy's
insert (the reference the tests compare with).

`write_rows` writes what `accounting.prepare` encoded for a chunk (the ingest's path);
`insert_rows` / `bulk_write` write plain row tuples (also used by bench/accounting_ingest.py
for its write floor, with `bind_rows`). `Background` runs one such write at a time on a
thread of its own while the ingest prepares the next chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from sqlalchemy import BigInteger, Connection, Date, DateTime, Float, Integer, String, insert
from sqlalchemy.types import TypeDecorator

from accounting.errors import LedgerError
from accounting.prepare import COPY_HEADER, COPY_TRAILER
from accounting.tables import LEDGER

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


def write_rows(
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


class Background:
    """One write at a time on a thread of its own. The drivers leave the GIL while the
    database works (SQLite's steps, PostgreSQL's COPY round trips), so on two cores the
    next chunk's parsing runs meanwhile. The caller waits before the connection's next
    use; on an error, the write under way is waited for (not raised over) before the
    transaction rolls back."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future[None] | None = None

    def __enter__(self) -> Background:
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


def _bind_processor(type_: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """What SQLAlchemy applies to a value of `type_` bound on `dialect` (a TypeDecorator's
    process_bind_param, then its implementation's processor for that dialect)."""
    proc: Callable[[Any], Any] | None = type_.dialect_impl(dialect).bind_processor(dialect)
    return proc
