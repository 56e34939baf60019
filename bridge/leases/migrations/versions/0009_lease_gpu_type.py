"""The GRES type a lease's GPUs are of: a lend of MIG slices asks its Triton job for
`--gres=gpu:<type>:k` (`[models.NAME] gpu_type`, such as `h100_1g.10gb`); NULL, every
lease before: any GPU (`gpus`) or the whole node.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 03:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.drop_column("gpu_type")
