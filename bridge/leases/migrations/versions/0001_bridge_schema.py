"""The bridge's tables as `create_all` made them before the bridge had migrations:
leases and their events, operator requests, pool holds, the advisory record, rollouts,
the leader row on PostgreSQL (`bridge.leases.migrations.baseline`, frozen).

Tables that already exist are left as they are (checkfirst): a database made before the
migrations, checked by `bridge.leases.schema`, is stamped 0001 by this revision, which
creates only the tables it lacks.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-01 12:00:00
"""

from __future__ import annotations

from alembic import op

from bridge.leases.migrations import baseline

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    baseline.METADATA.create_all(bind, tables=baseline.tables(bind.dialect.name), checkfirst=True)


def downgrade() -> None:
    bind = op.get_bind()
    baseline.METADATA.drop_all(bind, tables=baseline.tables(bind.dialect.name), checkfirst=True)
