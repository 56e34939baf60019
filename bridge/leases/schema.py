"""The bridge's own tables in its database (leases and their events, operator requests,
pool holds, the advisory record, rollouts, the models' load times and rate history, the
catalogue of node-local weight copies, the audit trail, the fleet's mode, the leader
row): their Alembic migrations (`bridge/leases/migrations/`, version table
`bridge_alembic_version`, beside the ledger's `ledger_alembic_version`), always run under
the database's schema lock (`bridge.db.schema_lock`), so however many bridges start at
once on a new database the tables are made exactly once.

- `open_schema`: the daemon's. A new database is created at head; an older schema is
  refused with the command that upgrades it (`stb db upgrade`), a newer one with its own
  message; a refusal changes nothing. A daemon never upgrades a schema other hosts' daemons
  may be running on.
- `create_schema`: the one-shot commands' (`stb status`, `stb lend`, ...) and the tests':
  create, or upgrade to head.
- `upgrade`: `stb db upgrade`.

A database made by `create_all` before the migrations existed (the tables, no version
table) is adopted by either: its tables are checked column by column against revision
0001 (`migrations.baseline`), the ones it lacks are created, and it is stamped 0001; tables
that do not match are refused by name and left alone.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, inspect

from bridge.db import Migrations, SchemaChange, SchemaError, redacted
from bridge.leases import advice, audit, fleet, loads, rates, rollouts, weights
from bridge.leases.migrations import baseline

log = logging.getLogger(__name__)

BRIDGE = Migrations(
    what="the bridge's database",
    script_location="bridge.leases:migrations",
    version_table="bridge_alembic_version",
)

#: every table of the bridge at head (the leader row's on PostgreSQL only)
TABLES = frozenset(
    {"lease", "lease_event", "operator_request", "pool_hold", "stb_leader"}
    | set(advice.TABLES)
    | set(rollouts.TABLES)
    | set(loads.TABLES)
    | set(rates.TABLES)
    | set(weights.TABLES)
    | set(audit.TABLES)
    | set(fleet.TABLES)
)


def open_schema(engine: Engine) -> SchemaChange:
    """The daemon's check: create a new database at head, adopt one made before the
    migrations, and refuse (`SchemaError`) an older or newer schema."""
    return BRIDGE.ensure(engine, upgrade=False, adopt=_adopt)


def create_schema(engine: Engine) -> SchemaChange:
    """Create the bridge's tables, or upgrade them to head, under the schema lock."""
    return BRIDGE.ensure(engine, upgrade=True, adopt=_adopt)


def upgrade(engine: Engine) -> SchemaChange:
    """`stb db upgrade`: `create_schema`, said by its command's name."""
    return create_schema(engine)


def current_revision(engine: Engine) -> str | None:
    return BRIDGE.current_of(engine)


def head_revision() -> str:
    return BRIDGE.head()


def _adopt(conn: Connection) -> str | None:
    """Revision 0001 if `conn`'s database holds bridge tables made before the migrations
    and they are 0001's; None if it holds none (a new database); `SchemaError` naming each
    table whose columns differ."""
    inspector = inspect(conn)
    present = set(inspector.get_table_names())
    found = [t for t in baseline.tables(conn.dialect.name) if t.name in present]
    if not found:
        return None
    problems = []
    for table in found:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        want = {c.name for c in table.columns}
        if have != want:
            lacks = f"lacks {', '.join(sorted(want - have))}" if want - have else ""
            extra = f"has {', '.join(sorted(have - want))}" if have - want else ""
            problems.append(f"{table.name} {' and '.join(p for p in (lacks, extra) if p)}")
    if problems:
        raise SchemaError(
            f"{BRIDGE.what} at {redacted(conn.engine.url)} has tables from before its "
            f"migrations that are not revision {baseline.REVISION}'s "
            f"({'; '.join(problems)}): not adopting them; move them aside or restore a backup"
        )
    log.info(
        "%s: %d table(s) from before its migrations, as revision %s: stamping them",
        BRIDGE.what,
        len(found),
        baseline.REVISION,
    )
    return baseline.REVISION


__all__ = [
    "BRIDGE",
    "TABLES",
    "SchemaChange",
    "SchemaError",
    "create_schema",
    "current_revision",
    "head_revision",
    "open_schema",
    "upgrade",
]
