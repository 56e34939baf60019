"""The ledger's database: `open_ledger(url)` gives an engine whose schema is at the latest
migration (Alembic, `accounting/migrations/`). SQLite file by default, PostgreSQL in
production; engines come from `bridge.db.make_engine` (WAL, busy timeout, psycopg 3).

Only the tables in `accounting.schema` belong to the ledger; it keeps its own Alembic
version table, so it may share a database with the lease store.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from bridge.db import make_engine

#: the ledger's own Alembic version table (it may share a database with the lease store)
VERSION_TABLE = "ledger_alembic_version"
#: a SQLite file in the working directory
DEFAULT_LEDGER_URL = "sqlite:///stb-ledger.db"


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "accounting:migrations")
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the ledger schema to `revision`."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def open_ledger(url: str = DEFAULT_LEDGER_URL, *, migrate: bool = True) -> Engine:
    """An engine on the ledger at `url`, migrated to the latest schema unless `migrate` is
    False (then an out-of-date schema is an error)."""
    engine = make_engine(url)
    if migrate:
        if current_revision(engine) != head_revision():
            upgrade(engine)
    elif current_revision(engine) != head_revision():
        raise RuntimeError(
            f"the ledger at {url} is at revision {current_revision(engine)}, "
            f"not {head_revision()}: run `stb accounting migrate`"
        )
    return engine
