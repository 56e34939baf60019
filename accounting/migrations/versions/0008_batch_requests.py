"""Batch work's share of serving time: the batch route's answered requests per hour,
model and batch job (`batch_requests`), how far into the batch access log they are
counted (`batch_log_cursor`), and the batch-inference jobs sacct named (`batch_job`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00
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
        "batch_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "bucket", "model", "job_id", name="uq_batch_requests"),
    )
    op.create_table(
        "batch_log_cursor",
        sa.Column("log", sa.String(length=1024), nullable=False),
        sa.Column("inode", sa.BigInteger(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("log"),
    )
    op.create_table(
        "batch_job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "job_id", name="uq_batch_job"),
    )


def downgrade() -> None:
    op.drop_table("batch_job")
    op.drop_table("batch_log_cursor")
    op.drop_table("batch_requests")
