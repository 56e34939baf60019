"""Database plumbing shared by the lease store and the GPU-hour ledger: one
`make_engine(url)` for SQLite and PostgreSQL, `UTCDateTime`, the column type of every
stored time, and `Migrations`, an Alembic schema created or upgraded under the one
database lock (`schema_lock`).

Called by the daemon, the CLI, `accounting` (through the configured database URLs) and the
tests.
SQLite, the embedded default, gets what a multi-threaded daemon needs: connections usable
from any thread (`check_same_thread=False`), WAL (readers never wait for the writer),
foreign keys on, a 30 s busy timeout, and write transactions that start with
`BEGIN IMMEDIATE`, so a read-check-write in `LeaseStore` holds SQLite's write lock from its
first read (the SQLite counterpart of PostgreSQL's `SELECT ... FOR UPDATE`). PostgreSQL URLs
use psycopg 3.

Schemas: the bridge's tables (`bridge.leases.schema`) and the ledger's (`accounting.db`)
each have their Alembic migrations and version table, and may share a database. Every
create, adoption or upgrade of either runs in one transaction that holds `schema_lock`
(PostgreSQL: `pg_advisory_xact_lock(SCHEMA_LOCK_KEY)`; SQLite: the write lock of
`BEGIN IMMEDIATE`), so of many processes starting at once on a new database one creates
the tables and the others wait, then find them at head and do nothing.
`Migrations.ensure(upgrade=False)` is the daemon's way: a new database is created at
head, an older schema is refused with the command that upgrades it, a newer one with its
own message; nothing is changed by a refusal.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, DateTime, Engine, create_engine, event, text
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import OperationalError
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


def write_transaction(engine: Engine) -> Any:
    """A transaction that takes the write lock first (BEGIN IMMEDIATE on SQLite)."""
    return engine.execution_options(**{WRITE_OPTION: True}).begin()


#: run at the start of every write transaction; raises to refuse it (the leader's fence)
Fence = Callable[[Session], None]


class _Row(Protocol):
    """A stored row whose id the database gives on insert."""

    @property
    def id(self) -> int | None: ...


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

    @staticmethod
    def _insert(session: Session, row: _Row, first_event: Callable[[int], object]) -> None:
        """Insert `row` and, once the database has given it its id, the event that opens
        its history (`first_event(id)`), in `session`'s transaction."""
        session.add(row)
        session.flush()
        assert row.id is not None
        session.add(first_event(row.id))


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
        _journal_wal(cursor)
    finally:
        cursor.close()


#: how long a new connection retries switching a database to WAL while others hold it
WAL_SWITCH_WAIT_S = 30.0


def _journal_wal(cursor: Any) -> None:
    """Put the database in WAL mode (persistent in the file: once set, later connections
    find it so). Of several connections opening a new file at once, the switch needs the
    file to itself and may answer "database is locked" without waiting the busy timeout
    (seen once in CI's db tier under load), or keep the old mode: retried until
    `WAL_SWITCH_WAIT_S`, then the error is raised."""
    deadline = time.monotonic() + WAL_SWITCH_WAIT_S
    delay = 0.005
    while True:
        try:
            (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
            if str(mode).lower() in ("wal", "memory"):  # memory: an in-memory database
                return
            (mode,) = cursor.execute("PRAGMA journal_mode=WAL").fetchone()
            if str(mode).lower() == "wal":
                return
            refused: Exception = sqlite3.OperationalError(
                f"PRAGMA journal_mode=WAL left the database in {mode} mode"
            )
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            refused = exc
        if time.monotonic() + delay > deadline:
            raise refused
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


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


# ---- schemas: Alembic under one database lock ---------------------------------------

#: the PostgreSQL advisory lock every schema change of the bridge and the ledger takes
#: (b"stb-ddl" and a zero byte, read as a big-endian integer: pg_locks shows it as
#: classid 1937006125, objid 1684294656)
SCHEMA_LOCK_KEY = int.from_bytes(b"stb-ddl\0", "big")
#: how long a starter waits for another's schema change before giving up, seconds (a
#: migration of a large ledger may take minutes; SQLite waits its 30 s busy timeout)
SCHEMA_LOCK_WAIT_S = 300.0


class SchemaError(RuntimeError):
    """A database's schema is not the one this code needs, and nothing was changed: it is
    older (the message names the command that upgrades it), newer than this code, or not
    what its migrations would have made. One line, naming the database and revisions."""


def redacted(url: URL | str) -> str:
    """A database URL without its password, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


@contextmanager
def schema_lock(engine: Engine, wait_s: float = SCHEMA_LOCK_WAIT_S) -> Iterator[Connection]:
    """One transaction on `engine` holding the database's schema lock to its end
    (committed on success, rolled back on any exception): on PostgreSQL the transaction
    advisory lock `SCHEMA_LOCK_KEY`, waited for at most `wait_s` (then `SchemaError`); on
    SQLite a write transaction (`BEGIN IMMEDIATE`: one writer per file, waited for up to
    the busy timeout). The lock ends with the transaction, also when its process dies."""
    configure_sqlite(engine)
    with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
        if conn.dialect.name == "postgresql":
            before = conn.execute(text("SELECT current_setting('lock_timeout')")).scalar()
            conn.execute(
                text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": f"{wait_s * 1000:.0f}"}
            )
            try:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                    raise
                raise SchemaError(
                    f"{redacted(engine.url)}: another process has held the schema lock "
                    f"(pg_advisory_xact_lock({SCHEMA_LOCK_KEY})) for over {wait_s:g} s; "
                    "a migration in progress? Look for it in pg_locks and pg_stat_activity"
                ) from exc
            conn.execute(text("SELECT set_config('lock_timeout', :v, true)"), {"v": before})
        yield conn


#: one Alembic migration at a time in this process (`Migrations._run`)
_ALEMBIC = threading.Lock()

#: looks at a database with no version table and says which revision its tables already
#: are (None: none of them exist, a new database); raises `SchemaError` if they match none
Adopt = Callable[[Connection], str | None]


@dataclass(frozen=True)
class Migrations:
    """One Alembic-managed schema: its migration scripts, its own version table (so two
    schemas may share a database), and what messages call it."""

    #: what messages call it: "the bridge's database", "the ledger"
    what: str
    #: Alembic's script_location, "package:folder"
    script_location: str
    version_table: str
    #: named in the refusal of an older schema
    upgrade_command: str = "stb db upgrade"

    def config(self, connection: Connection | None = None) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", self.script_location)
        if connection is not None:
            cfg.attributes["connection"] = connection
        return cfg

    def head(self) -> str:
        head = _scripts(self.script_location).get_current_head()
        assert head is not None, f"{self.script_location} has no revision"
        return head

    def knows(self, revision: str) -> bool:
        return revision in _revisions(self.script_location)

    def current(self, conn: Connection) -> str | None:
        """The revision `conn`'s database is at (None: no version table or row)."""
        ctx = MigrationContext.configure(conn, opts={"version_table": self.version_table})
        return ctx.get_current_revision()

    def current_of(self, engine: Engine) -> str | None:
        with engine.connect() as conn:
            return self.current(conn)

    def migrate(self, engine: Engine, revision: str = "head", *, down: bool = False) -> None:
        """Upgrade (or with `down`, downgrade) to `revision`, under the schema lock."""
        with schema_lock(engine) as conn:
            self._run(conn, revision, down=down)

    def _run(self, conn: Connection, revision: str, *, down: bool = False) -> None:
        # Alembic joins the transaction `conn` is in (it begins none of its own), so the
        # migration commits or rolls back with the lock. Its `op` and `context` are
        # process-wide proxies: two threads migrating at once would run on each other's
        # connections, so one migration at a time per process (taken after the database
        # lock, and nothing waits on a database while holding it but the migration).
        with _ALEMBIC:
            (command.downgrade if down else command.upgrade)(self.config(conn), revision)

    def ensure(self, engine: Engine, *, upgrade: bool, adopt: Adopt | None = None) -> SchemaChange:
        """Bring the schema to head under the schema lock, or refuse. A new database is
        created at head. An older schema is upgraded with `upgrade`, else refused
        (`SchemaError` naming `upgrade_command`); a revision these migrations do not know
        (a newer release's) is refused either way. With no version table, `adopt` may
        recognise tables made before the migrations existed: they are stamped with its
        revision (creating the tables of that revision they lack) and then judged like
        any schema at that revision. A refusal changes nothing, an adoption included: it
        is the same transaction."""
        head = self.head()
        where = f"{self.what} at {redacted(engine.url)}"
        with engine.connect() as conn:  # at head: no lock (on SQLite it waits for writers)
            if self.current(conn) == head:
                return SchemaChange(head, None, head)
        with schema_lock(engine) as conn:
            found = self.current(conn)
            adopted = None
            if found is None and adopt is not None:
                adopted = adopt(conn)
                if adopted is not None:
                    self._run(conn, adopted)
            at = found or adopted
            if at is not None and at != head and not self.knows(at):
                raise SchemaError(
                    f"{where} is at schema revision {at}, which this stb does not know "
                    f"(its newest is {head}): a newer release made it; run that release, "
                    "or upgrade stb on this host"
                )
            if at is not None and at != head and not upgrade:
                raise SchemaError(
                    f"{where} is at schema revision {at}; this stb needs {head}: "
                    f"run `{self.upgrade_command}`"
                )
            if at != head:
                self._run(conn, "head")
            return SchemaChange(found, adopted, head)


@dataclass(frozen=True)
class SchemaChange:
    """What `Migrations.ensure` found and left."""

    #: the revision recorded before (None: no version table, a new or adopted database)
    found: str | None
    #: the revision tables from before the migrations were stamped with, if any
    adopted: str | None
    #: the revision now (head)
    now: str

    def line(self) -> str:
        if self.adopted is not None:
            start = f"tables from before its migrations adopted as {self.adopted}"
            return start if self.adopted == self.now else f"{start}, upgraded to {self.now}"
        if self.found is None:
            return f"created at {self.now}"
        if self.found == self.now:
            return f"at {self.now}, nothing to do"
        return f"upgraded {self.found} -> {self.now}"


@cache
def _scripts(script_location: str) -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", script_location)
    return ScriptDirectory.from_config(cfg)


@cache
def _revisions(script_location: str) -> frozenset[str]:
    return frozenset(s.revision for s in _scripts(script_location).walk_revisions())
