"""The ledger's tables (sqlmodel). Changed only through Alembic migrations
(`accounting/migrations/`); `tests/db/test_ledger_migrations.py` checks that the migrations
build exactly these tables.

- `LedgerRow`: GPU-milliseconds of one hour bucket for one combination of keys, from one
  source record (a sacct run) or from the capacity (`source = "capacity"`: idle).
- `LedgerDay`: the ledger summed per UTC day over every key but the user and the source (a
  roll-up kept by every write of `ledger_row`, in the same transaction): day- and
  month-wide reports by the other keys read it instead of every hourly row.
- `SourceRecord`: one ingested source record and the digest of what it said; re-ingesting
  an unchanged record is a no-op, a changed one replaces its rows.
- `NodeSpan`: the node inventory over time (capacity), one row per stretch a node kept its
  pool, GPU type and GPU count.
- `ServingSample`: Triton's cumulative per-model-version compute time, successful
  requests and (an LLM's) prompt and generated tokens per instance, as the daemon scraped
  them; splits a serving job among its models and gives the unit economics
  (`accounting.economics`).
- `Rate`: price per GPU-hour by GPU type (optionally pool, QOS) over a date range.
- `Period`: a closed month; `Restatement`: each change made to a closed month, and why.
- `IngestRun`: one line per ingest (what it read and changed).
- `GpuUsage`: what the GPU sampler measured per job and node (used vs allocated).
- `SlurmEventRow`: slurmdbd's events (cluster registrations, node down/drain/fail): the
  capacity and the down lines (`accounting.capacity`).
- `Budget`: a team's budget per month (`accounting.budget`).
- `BatchRequests`: the batch route's answered requests per hour, model and batch job
  (the daemon's count of nginx's batch access log) and `BatchLogCursor`, how far into that
  log they are counted; `BatchJob`: the batch-inference jobs sacct named (their account
  and user). Together they book batch work's share of serving time to the batch job's
  team (`accounting.batchshare`).

Integers for GPU time (exact sums); Numeric for money (Decimal, never float).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    Float,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from bridge.db import UTCDateTime

#: what a ledger row's GPU time was used for
WORKLOADS = ("training", "elastic", "inference", "batch-inference", "staging", "idle")
#: the workload of batch inference jobs: elastic jobs that send requests to the served
#: models on the batch route (job_submit.lua tags `--comment=stb:batch` on an elastic
#: partition `stb:workload=batch-inference`); booked to the job's own team
BATCH_INFERENCE = "batch-inference"
#: the workload of the bridge's staging jobs (weights copied into a node's cache): overhead
#: of serving (`accounting.attribution.is_staging`)
STAGING = "staging"
#: the model column of a serving job's unattributed remainder
UNATTRIBUTED = "(unattributed)"
#: the source of idle rows (capacity minus allocation)
CAPACITY_SOURCE = "capacity"
#: the team column of idle rows (no one used that capacity)
IDLE_TEAM = "(idle)"
#: the down lines of the capacity (slurmdbd's node events, `accounting.capacity`), in the
#: order they take capacity left after allocation; with idle, no one's use
DOWN_WORKLOADS = ("down", "drained", "fenced", "planned_down")
CAPACITY_WORKLOADS = ("idle", *DOWN_WORKLOADS)
#: the team column of down lines (`user` says who set the node down)
DOWN_TEAM = "(down)"
#: the account and team of batch work's share of serving time whose job the ledger does
#: not know as a batch-inference job (or that named no job): no team's
UNKNOWN_BATCH_JOB = "(unknown batch job)"


def _s(length: int, *, index: bool = False, nullable: bool = False) -> Column:  # type: ignore[type-arg]
    return Column(String(length), nullable=nullable, index=index)


class LedgerRow(SQLModel, table=True):
    __tablename__ = "ledger_row"
    #: by hour and pool: hourly reports and the idle recompute; by source: a changed
    #: record's rows (every index costs each ingested row its upkeep: migration 0006)
    __table_args__ = (Index("ix_ledger_row_bucket_pool", "bucket", "pool"),)

    id: int | None = Field(
        default=None,
        sa_column=Column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    )
    #: start of the UTC hour
    bucket: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    day: date = Field(sa_column=Column(Date, nullable=False))
    #: 'YYYY-MM', the accounting period
    month: str = Field(sa_column=_s(7))
    cluster: str = Field(sa_column=_s(64))
    pool: str = Field(sa_column=_s(64))
    partition: str = Field(sa_column=_s(64))
    workload: str = Field(sa_column=_s(16))
    account: str = Field(sa_column=_s(128))
    team: str = Field(sa_column=_s(128))
    user_name: str = Field(sa_column=_s(128))
    model: str = Field(sa_column=_s(255))
    gpu_type: str = Field(sa_column=_s(64))
    qos: str = Field(sa_column=_s(64))
    #: the lease a lent node's serving time came under ("" when none)
    lease: str = Field(sa_column=_s(64))
    #: the source record's key, or "capacity" for idle rows
    source: str = Field(sa_column=_s(255, index=True))
    gpu_ms: int = Field(sa_column=Column(BigInteger, nullable=False))


#: the key columns of `ledger_day` (with `day`, its unique cell)
DAY_KEYS = (
    "cluster", "pool", "partition", "workload", "account", "team", "model", "gpu_type", "qos",
    "lease",
)  # fmt: skip


class LedgerDay(SQLModel, table=True):
    """`ledger_row` summed per day and `DAY_KEYS` (not per user, source or hour); a cell
    whose sum comes to zero is removed. Written only by `accounting.rollup`."""

    __tablename__ = "ledger_day"
    __table_args__ = (UniqueConstraint("day", *DAY_KEYS, name="uq_ledger_day_cell"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    day: date = Field(sa_column=Column(Date, nullable=False))
    month: str = Field(sa_column=_s(7))
    cluster: str = Field(sa_column=_s(64))
    pool: str = Field(sa_column=_s(64))
    partition: str = Field(sa_column=_s(64))
    workload: str = Field(sa_column=_s(16))
    account: str = Field(sa_column=_s(128))
    team: str = Field(sa_column=_s(128))
    model: str = Field(sa_column=_s(255))
    gpu_type: str = Field(sa_column=_s(64))
    qos: str = Field(sa_column=_s(64))
    lease: str = Field(sa_column=_s(64))
    gpu_ms: int = Field(sa_column=Column(BigInteger, nullable=False))


class SourceRecord(SQLModel, table=True):
    __tablename__ = "source_record"
    __table_args__ = (UniqueConstraint("kind", "key", name="uq_source_record_kind_key"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    kind: str = Field(sa_column=_s(16))
    #: cluster:job_id:start epoch (one run of one job)
    key: str = Field(sa_column=_s(255))
    digest: str = Field(sa_column=_s(64))
    job_id: str = Field(sa_column=_s(64))
    state: str = Field(sa_column=_s(32))
    start: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    end: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    gpu_ms: int = Field(sa_column=Column(BigInteger, nullable=False))
    first_ingested_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    last_changed_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class NodeSpan(SQLModel, table=True):
    __tablename__ = "node_span"
    __table_args__ = (Index("ix_node_span_node", "cluster", "node"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    node: str = Field(sa_column=_s(255))
    pool: str = Field(sa_column=_s(64))
    gpu_type: str = Field(sa_column=_s(64))
    gpus: int = Field(sa_column=Column(Integer, nullable=False))
    start: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    #: None while the node is still in service as recorded
    end: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))


class ServingSample(SQLModel, table=True):
    __tablename__ = "serving_sample"
    __table_args__ = (
        UniqueConstraint(
            "cluster", "job_id", "instance", "model", "version", "at", name="uq_serving_sample"
        ),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    #: the Triton server's Slurm job id
    job_id: str = Field(sa_column=_s(64))
    #: host:port of the instance
    instance: str = Field(sa_column=_s(255))
    model: str = Field(sa_column=_s(255))
    #: the model version the counters are Triton's for ("" in samples stored before 0005)
    version: str = Field(
        default="", sa_column=Column(String(64), nullable=False, server_default="")
    )
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    #: cumulative compute time (input + infer + output) since the model loaded, microseconds
    compute_us: float = Field(sa_column=Column(Float, nullable=False))
    #: cumulative successful requests (`nv_inference_request_success`) since the model
    #: loaded; None where Triton did not report it (and in samples stored before 0005)
    requests: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    #: cumulative prompt (input) and generated (output) tokens of an LLM since the model
    #: loaded (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total` or the TensorRT-LLM
    #: backend's equivalents); None for a model that counts no tokens (and before 0007)
    prompt_tokens: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    generation_tokens: float | None = Field(default=None, sa_column=Column(Float, nullable=True))


class Rate(SQLModel, table=True):
    __tablename__ = "rate"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    gpu_type: str = Field(sa_column=_s(64))
    #: None: any pool
    pool: str | None = Field(default=None, sa_column=_s(64, nullable=True))
    #: None: any QOS
    qos: str | None = Field(default=None, sa_column=_s(64, nullable=True))
    valid_from: date = Field(sa_column=Column(Date, nullable=False))
    #: exclusive; None: open-ended
    valid_to: date | None = Field(default=None, sa_column=Column(Date, nullable=True))
    #: money per GPU-hour
    price: Decimal = Field(sa_column=Column(Numeric(18, 6), nullable=False))
    currency: str = Field(sa_column=_s(3))
    note: str = Field(default="", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class Period(SQLModel, table=True):
    __tablename__ = "period"

    month: str = Field(sa_column=Column(String(7), primary_key=True))
    closed_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    note: str = Field(default="", sa_column=Column(Text, nullable=False))


class Restatement(SQLModel, table=True):
    __tablename__ = "restatement"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    month: str = Field(sa_column=_s(7))
    source: str = Field(sa_column=_s(255))
    old_gpu_ms: int = Field(sa_column=Column(BigInteger, nullable=False))
    new_gpu_ms: int = Field(sa_column=Column(BigInteger, nullable=False))
    reason: str = Field(sa_column=Column(Text, nullable=False))


class IngestRun(SQLModel, table=True):
    __tablename__ = "ingest_run"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    started_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    finished_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    since: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    until: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    records: int = Field(sa_column=Column(Integer, nullable=False))
    changed: int = Field(sa_column=Column(Integer, nullable=False))
    deferred: int = Field(sa_column=Column(Integer, nullable=False))
    restated: int = Field(sa_column=Column(Integer, nullable=False))


class GpuUsage(SQLModel, table=True):
    """What the GPU sampler (slurm_plugins/gpu_sampler.py) measured for one job on one
    node: how busy its allocated GPUs were (used vs allocated)."""

    __tablename__ = "gpu_usage"
    __table_args__ = (UniqueConstraint("cluster", "job_id", "node", "start", name="uq_gpu_usage"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    job_id: str = Field(sa_column=_s(64, index=True))
    node: str = Field(sa_column=_s(255))
    start: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    end: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    gpus: int = Field(sa_column=Column(Integer, nullable=False))
    samples: int = Field(sa_column=Column(Integer, nullable=False))
    #: None: no reading (the sampler ran but read nothing)
    mean_util_pct: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    max_mem_bytes: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))


class SlurmEventRow(SQLModel, table=True):
    """One event slurmdbd recorded (`sacctmgr show event`), as the ledger last read it:
    the cluster's registered nodes over time (`node` empty) and each node's down, drain
    and fail stretches; capacity and the down lines come from these
    (`accounting.capacity`)."""

    __tablename__ = "slurm_event"
    __table_args__ = (UniqueConstraint("cluster", "node", "start", name="uq_slurm_event"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    #: "" for a cluster event
    node: str = Field(sa_column=_s(255))
    #: a cluster event's node list (a Slurm hostlist); the node for a node event
    nodes: str = Field(sa_column=Column(Text, nullable=False))
    start: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    #: None while the event is open
    end: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    state_raw: int = Field(sa_column=Column(BigInteger, nullable=False))
    state: str = Field(sa_column=_s(64))
    user_name: str = Field(sa_column=_s(128))
    reason: str = Field(sa_column=Column(Text, nullable=False))
    gpus: int = Field(sa_column=Column(Integer, nullable=False))


class Budget(SQLModel, table=True):
    """A team's budget per period (`accounting.budget`); one row per team and period."""

    __tablename__ = "budget"
    __table_args__ = (UniqueConstraint("team", "period", name="uq_budget_team_period"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    team: str = Field(sa_column=_s(128))
    #: "month"
    period: str = Field(sa_column=_s(16))
    #: "gpu-hours" or "currency"
    unit: str = Field(sa_column=_s(16))
    amount: Decimal = Field(sa_column=Column(Numeric(18, 6), nullable=False))
    #: ISO code of a money budget, "" for GPU-hours
    currency: str = Field(sa_column=_s(3))
    #: Slurm enforces it (GrpTRESMins on `slurm_account`)
    enforce: bool = Field(sa_column=Column(Boolean, nullable=False))
    slurm_account: str = Field(sa_column=_s(128))
    note: str = Field(default="", sa_column=Column(Text, nullable=False))
    set_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    set_by: str = Field(sa_column=_s(128))


class BatchRequests(SQLModel, table=True):
    """The batch route's requests answered (status 200) in one hour, for one model, from
    one batch job, as the daemon counted them in nginx's batch access log
    (`accounting.batchcounts`); added to as the log is read."""

    __tablename__ = "batch_requests"
    __table_args__ = (
        UniqueConstraint("cluster", "bucket", "model", "job_id", name="uq_batch_requests"),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    #: start of the UTC hour the requests were logged in
    bucket: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    model: str = Field(sa_column=_s(255))
    #: the batch job's Slurm id as its client named it (`123` or an array task's
    #: `123_4`); "" where the request named none
    job_id: str = Field(sa_column=_s(64))
    requests: int = Field(sa_column=Column(BigInteger, nullable=False))


class BatchLogCursor(SQLModel, table=True):
    """How far into a batch access log its requests are in `batch_requests`: written in
    the same transaction as the counts, so a daemon that restarts goes on from there."""

    __tablename__ = "batch_log_cursor"

    #: the log's path as the daemon reads it
    log: str = Field(sa_column=Column(String(1024), primary_key=True))
    inode: int = Field(sa_column=Column(BigInteger, nullable=False))
    #: bytes of the log counted (up to the end of its last complete line)
    offset: int = Field(sa_column=Column(BigInteger, nullable=False))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class BatchJob(SQLModel, table=True):
    """A batch-inference job sacct named (any state, GPUs or none: a client usually asks
    for none, so it has no ledger rows of its own): whose batch requests are whose."""

    __tablename__ = "batch_job"
    __table_args__ = (UniqueConstraint("cluster", "job_id", name="uq_batch_job"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    cluster: str = Field(sa_column=_s(64))
    job_id: str = Field(sa_column=_s(64))
    account: str = Field(sa_column=_s(128))
    user_name: str = Field(sa_column=_s(128))


#: the tables the ledger's migrations own
LEDGER_TABLES = frozenset(
    t.__tablename__
    for t in (
        LedgerRow,
        LedgerDay,
        SourceRecord,
        NodeSpan,
        ServingSample,
        Rate,
        Period,
        Restatement,
        IngestRun,
        GpuUsage,
        SlurmEventRow,
        Budget,
        BatchRequests,
        BatchLogCursor,
        BatchJob,
    )
)
