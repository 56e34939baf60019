"""Model rate history: each model's request rate as 5-minute means, the seasonal
forecast's memory (`bridge.leases.rates`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_rate",
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model", "bucket_start"),
    )


def downgrade() -> None:
    op.drop_table("model_rate")
