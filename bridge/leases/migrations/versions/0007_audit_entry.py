"""The audit trail: one row per privileged action, each linked to the one before by its
hash (`bridge.leases.audit`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_entry",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("token", sa.String(length=128), nullable=True),
        sa.Column("unix_user", sa.String(length=128), nullable=True),
        sa.Column("slurm_job", sa.String(length=64), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("seq", name="ux_audit_entry_seq"),
    )
    op.create_index("ix_audit_entry_at", "audit_entry", ["at"])
    op.create_index("ix_audit_entry_action", "audit_entry", ["action"])
    op.create_index("ix_audit_entry_actor", "audit_entry", ["actor"])


def downgrade() -> None:
    op.drop_index("ix_audit_entry_actor", table_name="audit_entry")
    op.drop_index("ix_audit_entry_action", table_name="audit_entry")
    op.drop_index("ix_audit_entry_at", table_name="audit_entry")
    op.drop_table("audit_entry")
