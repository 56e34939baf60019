"""Database plumbing shared by the lease store and the GPU-hour ledger: one
`make_engine(url)` for SQLite and PostgreSQL, and `UTCDateTime`, the column type of every
stored time.

Called by the daemon, the CLI, `accounting` (through the configured database URLs) and the
tests.
SQLite, the embedded default, gets what a multi-threaded daemon needs: connections usable
from any thread (`check_same_thread=False`), WAL (readers never wait for the writer),
foreign keys on, a 30 s busy timeout, and write transactions that start with
`BEGIN IMMEDIATE`, so a read-check-write in `LeaseStore` holds SQLite's write lock from its
first read (the SQLite counterpart of PostgreSQL's `SELECT ... FOR UPDATE`). PostgreSQL URLs
use psycopg 3.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Engine, create_engine, event
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.pool import StaticPool
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session

#: a SQLite file in the working directory; the same default as `bridge.config`
DEFAULT_DATABASE_URL = "sqlite:///stb-bridge.db"

#: execution option that marks a write transaction (BEGIN IMMEDIATE on SQLite)
WRITE_OPTION = "stb_write"


def make_engine(url: str | URL = DEFAULT_DATABASE_URL, *, echo: bool = False) -> Engine:
    """An engine for `url`; `postgresql://` means psycopg 3. A SQLite file's parent
    folder is created if missing."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() != "sqlite":
        # A database that does not answer must fail the daemon's pass within seconds, not
        # hang it: connect_timeout bounds each new connection (the URL may set its own).
        args = {} if "connect_timeout" in parsed.query else {"connect_timeout": 5}
        return create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args=args)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30.0}}
    database = parsed.database or ""
    if database in ("", ":memory:"):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database, not one per thread
    elif not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, echo=echo, **kwargs)
    configure_sqlite(engine)
    return engine


#: run at the start of every write transaction; raises to refuse it (the leader's fence)
Fence = Callable[[Session], None]


class Transactions:
    """The sessions of a store on one engine: `_read()` (a session whose rows stay usable
    after it closes) and `_write()` (one transaction, BEGIN IMMEDIATE on SQLite, committed
    on success and rolled back on any exception; refused unless `fence` lets it through)."""

    def __init__(self, engine: Engine, fence: Fence | None = None) -> None:
        configure_sqlite(engine)
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        #: the daemon's leader fence (`bridge.leases.leader`): a deposed instance writes
        #: nothing
        self._fence = fence

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            if self._fence is not None:
                self._fence(session)
            yield session


def configure_sqlite(engine: Engine) -> None:
    """Install the SQLite connection settings on `engine` (idempotent; a no-op elsewhere).
    Takes effect for connections opened afterwards."""
    if engine.dialect.name != "sqlite" or event.contains(engine, "connect", _on_connect):
        return
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not pysqlite, emit BEGIN (pysqlite's own handling defers it and
    # cannot say IMMEDIATE); then set the pragmas outside any transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def _on_begin(connection: Any) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend. Refuses naive datetimes on write
    (a naive time is ambiguous); on read, a naive value (SQLite) is UTC by construction."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: stored times must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
