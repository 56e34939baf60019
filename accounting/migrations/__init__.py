"""Alembic migrations of the ledger schema (`accounting.schema`); run by
`accounting.db.open_ledger` (upgrade to head) and checked by the migration test."""
