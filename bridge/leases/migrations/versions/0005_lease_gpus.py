"""A lease's GPUs: how many of its node's GPUs a partial lend holds (`lease.gpus`; NULL,
every lease before: the whole node).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.drop_column("gpus")
