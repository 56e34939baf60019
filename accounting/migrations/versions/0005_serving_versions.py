"""Serving samples per model version, with Triton's successful-request counter (the unit
economics: GPU-seconds and cost per request per model and version).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 04:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_OLD = ("cluster", "job_id", "instance", "model", "at")
_NEW = ("cluster", "job_id", "instance", "model", "version", "at")


def upgrade() -> None:
    # batch mode: SQLite rebuilds the table to change its unique constraint
    with op.batch_alter_table("serving_sample") as batch:
        batch.add_column(
            sa.Column("version", sa.String(length=64), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("requests", sa.Float(), nullable=True))
        batch.drop_constraint("uq_serving_sample", type_="unique")
        batch.create_unique_constraint("uq_serving_sample", list(_NEW))


def downgrade() -> None:
    with op.batch_alter_table("serving_sample") as batch:
        batch.drop_constraint("uq_serving_sample", type_="unique")
        batch.drop_column("requests")
        batch.drop_column("version")
        batch.create_unique_constraint("uq_serving_sample", list(_OLD))
