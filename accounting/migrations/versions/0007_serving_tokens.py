"""Serving samples with an LLM's token counters: cumulative prompt and generated tokens
per model version and instance (the unit economics' cost per million input and output
tokens). Both nullable: a model that counts no tokens, and every sample stored before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("serving_sample") as batch:
        batch.add_column(sa.Column("prompt_tokens", sa.Float(), nullable=True))
        batch.add_column(sa.Column("generation_tokens", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("serving_sample") as batch:
        batch.drop_column("generation_tokens")
        batch.drop_column("prompt_tokens")
