"""Alembic migrations of the bridge's own tables (`bridge.leases.schema`), with their own
version table (`bridge_alembic_version`) beside the ledger's; run by
`bridge.leases.schema` under the database's schema lock and checked by tests/db/test_schema.py.
`baseline` is revision 0001's frozen copy of the tables as `create_all` made them before
the migrations existed."""
