"""The fleet's mode (issue 33's migration path): one row per switch between separate,
advisory and shared, with who, why, a gradual step's lend cap and the figures measured
at the switch (`bridge.leases.fleet`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_switch",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("max_lent_nodes", sa.Integer(), nullable=True),
        sa.Column("who", sa.String(length=255), nullable=False),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("baseline", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_fleet_switch_at", "fleet_switch", ["at"])


def downgrade() -> None:
    op.drop_index("ix_fleet_switch_at", table_name="fleet_switch")
    op.drop_table("fleet_switch")
