"""Database engines for the lease store: one `make_engine(url)` for SQLite and PostgreSQL.

Called by the daemon and the CLI (through the configured database URL) and by the tests.
SQLite, the embedded default, gets what a multi-threaded daemon needs: connections usable
from any thread (`check_same_thread=False`), WAL (readers never wait for the writer),
foreign keys on, a 30 s busy timeout, and write transactions that start with
`BEGIN IMMEDIATE`, so a read-check-write in `LeaseStore` holds SQLite's write lock from its
first read (the SQLite counterpart of PostgreSQL's `SELECT ... FOR UPDATE`). PostgreSQL URLs
use psycopg 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

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
        return create_engine(parsed, echo=echo, pool_pre_ping=True)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30.0}}
    database = parsed.database or ""
    if database in ("", ":memory:"):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database, not one per thread
    elif not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, echo=echo, **kwargs)
    configure_sqlite(engine)
    return engine


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
