"""The catalogue of node-local weight copies: per node and model version, its path, size,
digest, state, staged and verified times, and staging job (`bridge.leases.weights`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 02:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "weight_copy",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("staged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "model", "version", name="ux_weight_copy"),
    )
    op.create_index("ix_weight_copy_node", "weight_copy", ["node"])


def downgrade() -> None:
    op.drop_index("ix_weight_copy_node", table_name="weight_copy")
    op.drop_table("weight_copy")
