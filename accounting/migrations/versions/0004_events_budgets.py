"""slurmdbd's events (capacity and down time from Slurm's own records) and team budgets.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 02:00:00
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
        "slurm_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state_raw", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "node", "start", name="uq_slurm_event"),
    )
    op.create_table(
        "budget",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("period", sa.String(length=16), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("amount", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("enforce", sa.Boolean(), nullable=False),
        sa.Column("slurm_account", sa.String(length=128), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("set_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team", "period", name="uq_budget_team_period"),
    )


def downgrade() -> None:
    op.drop_table("budget")
    op.drop_table("slurm_event")
