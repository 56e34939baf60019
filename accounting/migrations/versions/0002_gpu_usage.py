"""GPU usage: what the GPU sampler (slurm_plugins/gpu_sampler.py) measured per job and node.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 17:36:38.696518
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
        "gpu_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("mean_util_pct", sa.Float(), nullable=True),
        sa.Column("max_mem_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "job_id", "node", "start", name="uq_gpu_usage"),
    )
    with op.batch_alter_table("gpu_usage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_usage_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gpu_usage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_usage_job_id"))

    op.drop_table("gpu_usage")
