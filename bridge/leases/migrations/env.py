"""Alembic environment of the bridge's tables: runs on the connection
`bridge.db.Migrations` hands it (`config.attributes["connection"]`, already in the
transaction that holds the schema lock), with its own version table so the bridge can
share a database with the ledger. Autogenerate compares only the bridge's tables."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from bridge.leases import (  # noqa: F401 - their tables
    advice,
    audit,
    fleet,
    leader,
    loads,
    models,
    rates,
    requests,
    rollouts,
)
from bridge.leases.schema import BRIDGE, TABLES


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Only the bridge's tables: SQLModel's metadata also holds the ledger's."""
    table = getattr(obj, "table", obj) if type_ != "table" else obj
    return getattr(table, "name", name) in TABLES


connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    version_table=BRIDGE.version_table,
    include_object=include_object,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
