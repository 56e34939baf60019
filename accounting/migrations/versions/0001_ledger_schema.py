"""The ledger schema: ledger rows, source records, node spans, serving samples, rates,
periods, restatements and ingest runs (see accounting/schema.py).

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 16:40:37.449969
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ingest_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("deferred", sa.Integer(), nullable=False),
        sa.Column("restated", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "ledger_row",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=16), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("qos", sa.String(length=64), nullable=False),
        sa.Column("lease", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=255), nullable=False),
        sa.Column("gpu_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ledger_row", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_row_bucket_pool", ["bucket", "pool"], unique=False)
        batch_op.create_index("ix_ledger_row_month_team", ["month", "team"], unique=False)
        batch_op.create_index(batch_op.f("ix_ledger_row_source"), ["source"], unique=False)

    op.create_table(
        "node_span",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("node_span", schema=None) as batch_op:
        batch_op.create_index("ix_node_span_node", ["cluster", "node"], unique=False)

    op.create_table(
        "period",
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("month"),
    )
    op.create_table(
        "rate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("qos", sa.String(length=64), nullable=True),
        sa.Column("valid_from", sa.Date(), nullable=False),
        sa.Column("valid_to", sa.Date(), nullable=True),
        sa.Column("price", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "restatement",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("source", sa.String(length=255), nullable=False),
        sa.Column("old_gpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("new_gpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "serving_sample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("compute_us", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "cluster", "job_id", "instance", "model", "at", name="uq_serving_sample"
        ),
    )
    op.create_table(
        "source_record",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("first_ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kind", "key", name="uq_source_record_kind_key"),
    )


def downgrade() -> None:
    op.drop_table("source_record")
    op.drop_table("serving_sample")
    op.drop_table("restatement")
    op.drop_table("rate")
    op.drop_table("period")
    with op.batch_alter_table("node_span", schema=None) as batch_op:
        batch_op.drop_index("ix_node_span_node")

    op.drop_table("node_span")
    with op.batch_alter_table("ledger_row", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_row_source"))
        batch_op.drop_index("ix_ledger_row_month_team")
        batch_op.drop_index("ix_ledger_row_bucket_pool")

    op.drop_table("ledger_row")
    op.drop_table("ingest_run")
