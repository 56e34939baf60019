"""Revision 0001 of the bridge's tables, frozen: what `create_schema` made with
`create_all` before the bridge had migrations (leases and their events, operator requests,
pool holds, the advisory record, rollouts, and on PostgreSQL the leader row).

Revision 0001 creates these tables; a database that has some of them and no version table
was made before the migrations, and is checked against them column by column before it
is stamped 0001 (`bridge.leases.schema`). Never edit them: a change to a table is a new
revision. Column types are the DDL the models emit (`UTCDateTime` is a timezone-aware
DateTime; the lease states are VARCHAR(16), not database enums)."""

from __future__ import annotations

import sqlalchemy as sa

REVISION = "0001"

METADATA = sa.MetaData()
_T = sa.DateTime(timezone=True)


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.Integer(), primary_key=True)


sa.Table(
    "lease",
    METADATA,
    _id(),
    sa.Column("node", sa.String(255), nullable=False, index=True),
    sa.Column("pool", sa.String(64), nullable=False),
    sa.Column("lend_mode", sa.String(16), nullable=False),
    sa.Column("models", sa.JSON(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("slurm_job_id", sa.String(64), nullable=True, index=True),
    sa.Column("request_key", sa.String(255), nullable=False, unique=True),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("created_at", _T, nullable=False),
    sa.Column("updated_at", _T, nullable=False),
    sa.Index(
        "uq_lease_open_node",
        "node",
        unique=True,
        sqlite_where=sa.text("state <> 'returned'"),
        postgresql_where=sa.text("state <> 'returned'"),
    ),
)
sa.Table(
    "lease_event",
    METADATA,
    _id(),
    sa.Column("lease_id", sa.Integer(), sa.ForeignKey("lease.id"), nullable=False, index=True),
    sa.Column("from_state", sa.String(16), nullable=True),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("at", _T, nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("detail", sa.Text(), nullable=True),
)
sa.Table(
    "operator_request",
    METADATA,
    _id(),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("node", sa.String(255), nullable=True),
    sa.Column("models", sa.JSON(), nullable=False),
    sa.Column("lease_id", sa.Integer(), nullable=True),
    sa.Column("requested_by", sa.String(255), nullable=False),
    sa.Column("created_at", _T, nullable=False),
    sa.Column("done_at", _T, nullable=True),
    sa.Column("outcome", sa.Text(), nullable=False),
)
sa.Table(
    "pool_hold",
    METADATA,
    _id(),
    sa.Column("pool", sa.String(128), nullable=False, index=True),
    sa.Column("held_by", sa.String(255), nullable=False),
    sa.Column("held_at", _T, nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("released_by", sa.String(255), nullable=True),
    sa.Column("released_at", _T, nullable=True),
)
sa.Table(
    "advice",
    METADATA,
    _id(),
    sa.Column("at", _T, nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("pool", sa.String(64), nullable=False),
    sa.Column("lend_mode", sa.String(16), nullable=False),
    sa.Column("models", sa.JSON(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("shadow_lease", sa.Integer(), nullable=True),
    sa.Column("shadow_serving", sa.Integer(), nullable=False),
    sa.Column("figures", sa.JSON(), nullable=False),
)
sa.Table(
    "advice_sample",
    METADATA,
    _id(),
    sa.Column("at", _T, nullable=False, index=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("request_rate", sa.Float(), nullable=True),
    sa.Column("p99_ms", sa.Float(), nullable=True),
    sa.Column("mean_ms", sa.Float(), nullable=True),
    sa.Column("compute_ms", sa.Float(), nullable=True),
    sa.Column("pending", sa.Float(), nullable=True),
    sa.Column("replicas", sa.Integer(), nullable=False),
)
sa.Table(
    "shadow_lease",
    METADATA,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("pool", sa.String(64), nullable=False),
    sa.Column("lend_mode", sa.String(16), nullable=False),
    sa.Column("models", sa.JSON(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("created_at", _T, nullable=False, index=True),
    sa.Column("updated_at", _T, nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("running_at", sa.Float(), nullable=True),
    sa.Column("ready_at", sa.Float(), nullable=True),
    sa.Column("gone_at", sa.Float(), nullable=True),
    sa.Column("victims", sa.JSON(), nullable=False),
)
sa.Table(
    "rollout",
    METADATA,
    _id(),
    sa.Column("model", sa.String(255), nullable=False, index=True),
    sa.Column("old_version", sa.Integer(), nullable=False),
    sa.Column("new_version", sa.Integer(), nullable=False),
    sa.Column("plan", sa.Text(), nullable=False),
    sa.Column("hold_s", sa.Float(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("step", sa.Integer(), nullable=False),
    sa.Column("step_started_at", _T, nullable=True),
    sa.Column("created_at", _T, nullable=False),
    sa.Column("updated_at", _T, nullable=False),
    sa.Column("who", sa.Text(), nullable=False),
    sa.Column("why", sa.Text(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Index(
        "ux_rollout_open_model",
        "model",
        unique=True,
        sqlite_where=sa.text("state NOT IN ('promoted', 'rolled_back')"),
        postgresql_where=sa.text("state NOT IN ('promoted', 'rolled_back')"),
    ),
)
sa.Table(
    "rollout_event",
    METADATA,
    _id(),
    sa.Column("rollout_id", sa.Integer(), nullable=False, index=True),
    sa.Column("at", _T, nullable=False),
    sa.Column("from_state", sa.String(16), nullable=False),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("step", sa.Integer(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("figures", sa.JSON(), nullable=False),
)
#: PostgreSQL only: SQLite keeps the single-host file lock (`bridge.leases.leader`)
LEADER = sa.Table(
    "stb_leader",
    METADATA,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("epoch", sa.Integer(), nullable=False),
    sa.Column("expires_at", _T, nullable=False),
    sa.Column("acquired_at", _T, nullable=False),
)


def tables(dialect: str) -> list[sa.Table]:
    """Revision 0001's tables on `dialect` ("postgresql", "sqlite"), in creation order."""
    return [t for t in METADATA.sorted_tables if t is not LEADER or dialect == "postgresql"]
