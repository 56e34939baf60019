"""Alembic environment of the ledger: runs on the connection `accounting.db` hands it
(`config.attributes["connection"]`), with its own version table so the ledger can share a
database with the lease store."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from accounting.db import VERSION_TABLE
from accounting.schema import LEDGER_TABLES


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Only the ledger's tables: SQLModel's metadata also holds the lease store's."""
    table = getattr(obj, "table", obj) if type_ != "table" else obj
    return getattr(table, "name", name) in LEDGER_TABLES


connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    version_table=VERSION_TABLE,
    include_object=include_object,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
