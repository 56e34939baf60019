"""A gang lease's other nodes: a replica that spans nodes is one Slurm job with `-N n`
and one lease; `lease.node` is the node its server runs on (the job's batch host, the
one routing sends requests to) and `lease.members` the others (a JSON list; NULL, every
lease before: one node).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.add_column(sa.Column("members", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lease") as batch:
        batch.drop_column("members")
