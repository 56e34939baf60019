"""The ledger's database: `open_ledger(url)` gives an engine whose schema is at the latest
migration (Alembic, `accounting/migrations/`). SQLite file by default, PostgreSQL in
production; engines come from `bridge.db.make_engine` (WAL, busy timeout, psycopg 3).

Only the tables in `accounting.schema` belong to the ledger; it keeps its own Alembic
version table, so it may share a database with the lease store. Every create, upgrade and
downgrade runs under the database's schema lock (`bridge.db.schema_lock`), the one the
bridge's own tables take: processes starting together on a new database make the ledger
once.
"""

from __future__ import annotations

from sqlalchemy import Engine

from bridge.db import Migrations, SchemaChange, make_engine

#: the ledger's own Alembic version table (it may share a database with the lease store)
VERSION_TABLE = "ledger_alembic_version"
#: a SQLite file in the working directory
DEFAULT_LEDGER_URL = "sqlite:///stb-ledger.db"

LEDGER = Migrations(
    what="the ledger",
    script_location="accounting:migrations",
    version_table=VERSION_TABLE,
)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the ledger schema to `revision`, under the schema lock."""
    LEDGER.migrate(engine, revision)


def downgrade(engine: Engine, revision: str) -> None:
    LEDGER.migrate(engine, revision, down=True)


def ensure(engine: Engine, *, upgrade: bool = True) -> SchemaChange:
    """Create the ledger at head, or (with `upgrade`) upgrade it; without `upgrade`, an
    older schema is refused (`bridge.db.SchemaError`, naming `stb db upgrade`). A revision
    this code does not know is refused either way."""
    return LEDGER.ensure(engine, upgrade=upgrade)


def current_revision(engine: Engine) -> str | None:
    return LEDGER.current_of(engine)


def head_revision() -> str | None:
    return LEDGER.head()


def open_ledger(url: str = DEFAULT_LEDGER_URL, *, migrate: bool = True) -> Engine:
    """An engine on the ledger at `url`, created or migrated to the latest schema; with
    `migrate` False (the daemon) a new ledger is created but an older schema is refused
    (`bridge.db.SchemaError`) rather than upgraded."""
    engine = make_engine(url)
    ensure(engine, upgrade=migrate)
    return engine
