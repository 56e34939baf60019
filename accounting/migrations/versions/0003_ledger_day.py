"""The daily roll-up of the ledger (`ledger_day`), filled from the rows already there.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 01:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: the roll-up's key columns (accounting.schema.DAY_KEYS as of this revision)
KEYS = (
    "cluster", "pool", "partition", "workload", "account", "team", "model", "gpu_type", "qos",
    "lease",
)  # fmt: skip
_LENGTH = {"workload": 16, "account": 128, "team": 128, "model": 255}


def upgrade() -> None:
    op.create_table(
        "ledger_day",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        *(sa.Column(k, sa.String(length=_LENGTH.get(k, 64)), nullable=False) for k in KEYS),
        sa.Column("gpu_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("day", *KEYS, name="uq_ledger_day_cell"),
    )
    cols = ", ".join(("day", "month", *KEYS))
    op.execute(
        f"INSERT INTO ledger_day ({cols}, gpu_ms) "
        f"SELECT {cols}, SUM(gpu_ms) FROM ledger_row GROUP BY {cols}"
    )


def downgrade() -> None:
    op.drop_table("ledger_day")
