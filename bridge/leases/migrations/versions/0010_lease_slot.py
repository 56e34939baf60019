"""A lease's port slot: a node may hold several open leases of some of its GPUs each
(preempt mode), each Triton job on ports of its own (`bridge.triton.ports`); 0, every
lease before. The open-lease rule moves from one per node to one per node and slot.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_OPEN = "state <> 'returned'"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    partial = dialect in ("sqlite", "postgresql")
    if partial:
        op.drop_index("uq_lease_open_node", table_name="lease")
    with op.batch_alter_table("lease") as batch:
        batch.add_column(sa.Column("slot", sa.Integer(), nullable=False, server_default="0"))
    if partial:
        op.create_index(
            "uq_lease_open_slot",
            "lease",
            ["node", "slot"],
            unique=True,
            sqlite_where=sa.text(_OPEN),
            postgresql_where=sa.text(_OPEN),
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    partial = dialect in ("sqlite", "postgresql")
    if partial:
        op.drop_index("uq_lease_open_slot", table_name="lease")
    with op.batch_alter_table("lease") as batch:
        batch.drop_column("slot")
    if partial:
        op.create_index(
            "uq_lease_open_node",
            "lease",
            ["node"],
            unique=True,
            sqlite_where=sa.text(_OPEN),
            postgresql_where=sa.text(_OPEN),
        )
