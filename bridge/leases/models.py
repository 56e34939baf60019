"""The lease tables: `Lease` (one row per lent node) and `LeaseEvent` (its status history).

Written only by `store.LeaseStore`; read by the store, the reconciler and, later, the
GPU-hour ledger (which books serving time from the event log). Times are timezone-aware UTC
on the way in and on the way out (`UTCDateTime`: SQLite keeps no zone, so it is added back
on read). States and lend modes are stored as their lowercase string values in plain
VARCHAR columns, not database enums, so adding a state needs no type migration.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import JSON, Column, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy import Enum as SAEnum
from sqlmodel import Field, SQLModel

from bridge.db import UTCDateTime
from bridge.lifecycle import LeaseState


class LendMode(StrEnum):
    PREEMPT = "preempt"  # elastic pool: the Triton job preempts and requeues elastic jobs
    DRAIN = "drain"  # training pool: fence the node, lend it once free, never kill a job


def _str_enum(enum: type[StrEnum], length: int) -> SAEnum:
    return SAEnum(
        enum,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


def partial_unique(name: str, columns: str | tuple[str, ...], where: str) -> Index:
    """A unique index of `columns` among the rows for which `where` holds (SQL), partial
    on SQLite and PostgreSQL alike."""
    cols = (columns,) if isinstance(columns, str) else columns
    return Index(name, *cols, unique=True, sqlite_where=text(where), postgresql_where=text(where))


class Lease(SQLModel, table=True):
    """One node, some of its GPUs, or a gang of nodes lent to Triton. At most one open
    (not returned) lease per node, save leases of some of a node's GPUs by preemption,
    which may share it, each on a port slot of its own (`slot`): a partial unique index
    enforces one open lease per `node` and `slot` on SQLite and PostgreSQL, and the store
    checks the whole rule everywhere, a gang's `members` included."""

    __tablename__ = "lease"
    __table_args__ = (
        partial_unique("uq_lease_open_slot", ("node", "slot"), "state <> 'returned'").ddl_if(
            dialect=("sqlite", "postgresql")  # type: ignore[arg-type]  # a tuple is documented
        ),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    #: the Slurm node name, e.g. "n3"
    node: str = Field(sa_column=Column(String(255), nullable=False, index=True))
    #: the pool the node was taken from ("elastic", "training", ...)
    pool: str = Field(sa_column=Column(String(64), nullable=False))
    lend_mode: LendMode = Field(sa_column=Column(_str_enum(LendMode, 16), nullable=False))
    #: the models placed on the node (a JSON list of names)
    models: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    #: GPUs of the node the lease holds (its Triton job's `--gres=gpu:k`, the node's other
    #: GPUs left to its jobs); None: the whole node (`--exclusive`), as every lease before
    gpus: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    #: a gang's other nodes (a JSON list: a replica that spans nodes is one Slurm job with
    #: `-N n`, its server on `node`); None: the lease holds `node` alone, as every lease
    #: before. The open-lease-per-node rule covers them too (`LeaseStore.create`)
    members: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    #: the GRES type its `gpus` are of (a lend of MIG slices: its Triton job's
    #: `--gres=gpu:<type>:k`); None: any GPU, or the whole node, as every lease before
    gpu_type: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    #: the port slot of its Triton job on `node` (`bridge.triton.ports`): 0 but for a
    #: lease of some GPUs of a node another open lease shares, which takes the lowest free
    slot: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    state: LeaseState = Field(
        sa_column=Column(_str_enum(LeaseState, 16), nullable=False, index=True)
    )
    #: the Triton server's Slurm job id once submitted ("1234", or "1234_5" for arrays)
    slurm_job_id: str | None = Field(
        default=None, sa_column=Column(String(64), nullable=True, index=True)
    )
    #: the idempotency key of the lend: a retry with the same key returns this lease
    request_key: str = Field(sa_column=Column(String(255), nullable=False, unique=True))
    #: why the lease is in its current state (the reason of the last change)
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class LeaseEvent(SQLModel, table=True):
    """One status change of a lease, appended in the same transaction as the change. The
    first event of every lease records its creation (from_state NULL -> requested)."""

    __tablename__ = "lease_event"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    lease_id: int = Field(
        sa_column=Column(Integer, ForeignKey("lease.id"), nullable=False, index=True)
    )
    from_state: LeaseState | None = Field(
        default=None, sa_column=Column(_str_enum(LeaseState, 16), nullable=True)
    )
    to_state: LeaseState = Field(sa_column=Column(_str_enum(LeaseState, 16), nullable=False))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: free text: the caller's detail plus the fields the change set (e.g. slurm_job_id)
    detail: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
