"""Model load times: each model's measured loads (a placement's `load_model`, a lend's
Triton start), the lend lead time's per-model part (`bridge.leases.loads`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 10:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_load",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("model_load", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_load_model"), ["model"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("model_load", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_load_model"))

    op.drop_table("model_load")
