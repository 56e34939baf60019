"""Immutable records of what Slurm says: nodes, partitions, jobs, reservations and
accounting runs; and of what the bridge asks of it: a job to submit (`JobSpec`), a
reservation to create (`ReservationSpec`), the jobs to list (`JobFilter`). Shared by every
backend; times are timezone-aware UTC."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypedDict

#: Prefix of every drain reason and reservation name the bridge sets, so the reconciler
#: can tell its own fences from an administrator's.
BRIDGE_TAG = "stb:"
#: The comment tag of every Triton job the bridge runs (a server, baseline or lent): how the
#: daemon finds its servers and the ledger books serving time.
TRITON_TAG = "stb:triton"
#: The comment tag of a Triton job the bridge runs as a model's baseline replica.
BASELINE_TAG = "stb:baseline"
#: The comment tag of a job that copies model weights into a node's cache
#: (`bridge.slurm.staging`); its name starts with `STAGING_NAME_PREFIX`.
STAGING_TAG = "stb:staging"
STAGING_NAME_PREFIX = "stb-staging"
#: The comment tag of a lent Triton job: `stb:lease=<lease id>.<creation epoch seconds>`.
LEASE_TAG_PREFIX = "stb:lease="
#: How a job reports a checkpoint: `stb:ckpt=<epoch seconds>` in its comment, e.g.
#: `scontrol update JobId=$SLURM_JOB_ID Comment=stb:ckpt=$(date +%s)` after each save.
CHECKPOINT_TAG = "stb:ckpt="
#: `JobSpec.priority` for the highest priority an administrator may set (`sbatch
#: --priority=TOP`), and the number Slurm stores for it (NO_VAL - 1, which slurmctld keeps
#: as the job's priority; the API backends send the number where they take no word)
TOP_PRIORITY = "TOP"
TOP_PRIORITY_VALUE = 0xFFFFFFFD

#: a lease as its Triton job's tag names it: (lease id, creation time in epoch seconds).
#: The time makes the tag unique even if lease ids restart (a new database).
LeaseRef = tuple[int, int]


def drain_reason(reason: str) -> str:
    """A drain reason the bridge sets: `reason` with `BRIDGE_TAG` in front (once)."""
    return reason if reason.startswith(BRIDGE_TAG) else f"{BRIDGE_TAG} {reason}"


def lease_tag(ref: LeaseRef) -> str:
    return f"{LEASE_TAG_PREFIX}{ref[0]}.{ref[1]}"


def lease_of(tags: Sequence[str]) -> LeaseRef | None:
    """The lease a Triton job's tags name, if any."""
    for tag in tags:
        if tag.startswith(LEASE_TAG_PREFIX):
            lease_id, _, created = tag[len(LEASE_TAG_PREFIX) :].partition(".")
            if lease_id.isdigit() and created.isdigit():
                return int(lease_id), int(created)
    return None


def checkpoint_of(tags: Sequence[str]) -> float | None:
    """When a job last reported a checkpoint (its tags), or None (see CHECKPOINT_TAG)."""
    for tag in tags:
        if tag.startswith(CHECKPOINT_TAG):
            try:
                return float(tag[len(CHECKPOINT_TAG) :])
            except ValueError:
                return None
    return None


def staged_version(name: str) -> tuple[str, int] | None:
    """The model and version a staging job's name names (`stb-staging-<model>-<version>`,
    `bridge.slurm.staging.staging_name`); None for any other name."""
    head = STAGING_NAME_PREFIX + "-"
    if not name.startswith(head):
        return None
    model, _, version = name[len(head) :].rpartition("-")
    if not model or not version.isdigit():
        return None
    return model, int(version)


@dataclass(frozen=True)
class Node:
    name: str
    addr: str
    partitions: tuple[str, ...]
    #: base state in lower case: idle, mixed, allocated, down, unknown, ...
    state: str
    #: flags in upper case: DRAIN, COMPLETING, RESERVED, NOT_RESPONDING, ...
    flags: frozenset[str]
    reason: str
    gpu_type: str | None
    gpus: int
    gpus_alloc: int
    #: the node's configured gres as Slurm shows it (`gpu:h100:4`,
    #: `gpu:h100_4g.40gb:1,gpu:h100_1g.10gb:2`): the ledger's capacity per GPU type reads
    #: every type, where `gpu_type` is the first; "" where the source gives none
    gres: str = ""
    #: the TRES its running jobs hold as Slurm shows it (`cpu=2,gres/gpu=2,
    #: gres/gpu:h100_4g.40gb=1,...`): the GPUs of each type in use, where `gpus_alloc` is
    #: their count (`bridge.slurm.slices.free_gpu_types`); "" where the source gives none
    alloc_tres: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def fenced_by_bridge(self) -> bool:
        return self.drained and self.reason.startswith(BRIDGE_TAG)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    priority_tier: int
    preempt_mode: str
    allow_accounts: tuple[str, ...] | None  # None: all accounts
    grace_time_s: int
    state: str
    default: bool


@dataclass(frozen=True)
class Job:
    job_id: str  # "123", "123_4" for an array task, "123_[2-4%2]" for a pending array
    name: str
    partition: str
    account: str
    user: str
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str
    nodes: tuple[str, ...]
    comment: str
    gpus: int
    restarts: int
    submit_time: datetime | None
    start_time: datetime | None
    #: nodes the job asked for (`--nodelist`); where a pending job will run
    requested_nodes: tuple[str, ...] = ()
    #: when the current run ends at the latest: Slurm's end time of a started job with a
    #: time limit (its start plus the limit, moved on by a suspension or a new limit;
    #: the real end once it ended); None while pending (Slurm's is a guess then) and
    #: without a time limit, ended or not (Slurm says the start plus a year while it
    #: runs: `bridge.slurm.parse.run_end`)
    end_time: datetime | None = None
    #: the TRES it was allocated as Slurm shows them (`cpu=1,...,gres/gpu=1,
    #: gres/gpu:h100_1g.10gb=1`): which GPU types (MIG slices) it holds, even where it
    #: asked for any GPU (`bridge.slurm.slices.gpu_types_of`); "" where the source gives
    #: none, or while it pends
    alloc_tres: str = ""

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(t for t in self.comment.split(",") if t.startswith("stb:"))


@dataclass(frozen=True)
class JobSpec:
    """What `submit` sends to sbatch. Either `script` (a file) or `wrap` (a command)."""

    partition: str
    account: str
    script: str | None = None
    wrap: str | None = None
    name: str | None = None
    comment: str | None = None
    nodelist: tuple[str, ...] = ()
    #: nodes the job spans (`--nodes=n`, one task each: a gang's `-N n`); None: the
    #: script's own (one, for the Triton script)
    nodes: int | None = None
    gpus_per_node: int | None = None
    #: the GPU type the GPUs are of (`--gres=gpu:<type>:k`: a MIG slice type such as
    #: `h100_1g.10gb`, or a whole GPU's); None: any GPU (`--gres=gpu:k`)
    gpu_type: str | None = None
    exclusive: bool = False
    requeue: bool | None = None
    reservation: str | None = None
    output: str | None = None
    time_limit_min: int | None = None
    #: Slurm QOS (None: the association's default)
    qos: str | None = None
    #: sbatch --nice: lowers the job's priority by this much (None: not given)
    nice: int | None = None
    #: sbatch --priority: the job's priority set outright, a number or `TOP_PRIORITY`
    #: (the highest an administrator may set); only a Slurm operator or administrator
    #: may set it, and Slurm keeps it as set (no multifactor recalculation). None: Slurm's
    priority: int | str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.script is None) == (self.wrap is None):
            raise ValueError("JobSpec needs exactly one of script= or wrap=")
        if self.nodes is not None and self.nodes < 1:
            raise ValueError(f"JobSpec nodes must be >= 1, got {self.nodes}")
        if self.gpu_type is not None and (
            self.gpus_per_node is None or not self.gpu_type or ":" in self.gpu_type
        ):
            raise ValueError(
                f"JobSpec gpu_type {self.gpu_type!r} needs gpus_per_node and a GRES type "
                "name (no ':')"
            )
        if isinstance(self.priority, str):
            if self.priority != TOP_PRIORITY:
                raise ValueError(f"JobSpec priority must be a number or {TOP_PRIORITY!r}")
        elif self.priority is not None and not 0 <= self.priority <= TOP_PRIORITY_VALUE:
            raise ValueError(
                f"JobSpec priority must be in [0, {TOP_PRIORITY_VALUE}], got {self.priority}"
            )
        for key in self.env:
            if not key or "=" in key or "," in key:
                raise ValueError(f"JobSpec env name {key!r} is not a valid variable name")
        for key, value in self.env.items():
            if "," in value:
                raise ValueError(f"JobSpec env {key} holds a ',' which sbatch cannot export")

    @property
    def gres(self) -> str:
        """Its GPUs as sbatch's `--gres` takes them: `gpu:k`, or `gpu:<type>:k`."""
        kind = "gpu" if self.gpu_type is None else f"gpu:{self.gpu_type}"
        return f"{kind}:{self.gpus_per_node}"


class JobFilter(TypedDict, total=False):
    """Which jobs `jobs` lists: with the comment `tag` (e.g. "stb:triton"), on `node`, in
    `partition`, in one of `states` (Slurm state names, any case); a filter left out, or
    None: any."""

    tag: str | None
    node: str | None
    partition: str | None
    states: Iterable[str] | None


@dataclass(frozen=True)
class ReservationSpec:
    """What `create_reservation` asks for: `nodes` reserved from now for `duration_s`
    seconds for `users`, with Slurm's reservation `flags`."""

    name: str
    nodes: tuple[str, ...]
    duration_s: int
    users: tuple[str, ...]
    flags: tuple[str, ...] = ("MAINT", "IGNORE_JOBS")


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    start: datetime | None
    end: datetime | None
    flags: frozenset[str]
    users: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class AccountingRecord:
    """One run of one job allocation as slurmdbd booked it (a requeued job has one
    record per run)."""

    cluster: str
    job_id: str
    array_job_id: int | None
    array_task_id: int | None
    name: str
    partition: str
    account: str
    user: str
    qos: str
    state: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None  # None while running
    elapsed_s: int
    nodes: tuple[str, ...]
    gpus: int  # gres/gpu allocated, typed and untyped counted once
    gpu_type: str | None
    #: the job's comment, then (comma) its administrator comment, where job_submit.lua
    #: tags the workload: "stb:triton,stb:workload=inference"
    comment: str
    restarts: int
    #: when the run became eligible to start (sacct's `time.eligible`): later than
    #: `submit` for a job held by `--begin` or a dependency, reset at each requeue; None
    #: when not known, or never eligible (held). The simulator replays a job from here
    #: (`bridge.sim.inputs`); the ledger does not read it
    eligible: datetime | None = None
    #: the gres entries of the run's allocated TRES as sacct gives them
    #: (`gres/gpu=1,gres/gpu:h100_1g.10gb=1`): what the ledger books a MIG slice or shards
    #: by (`bridge.slurm.slices`); "" where the source gives none (a count alone)
    gpu_tres: str = ""

    @property
    def key(self) -> str:
        """Unique per run: cluster, job id and start time."""
        start = int(self.start.timestamp()) if self.start else 0
        return f"{self.cluster}:{self.job_id}:{start}"

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * self.elapsed_s


#: `StateRaw` bits of a node event (slurm.h): the base state is the low four bits
NODE_STATE_BASE = 0x000F
NODE_STATE_DOWN = 0x0001
NODE_STATE_FUTURE = 0x0006
NODE_STATE_CLOUD = 0x0080
NODE_STATE_DRAIN = 0x0200
NODE_STATE_POWERED_DOWN = 0x1000
NODE_STATE_FAIL = 0x2000
NODE_STATE_MAINT = 0x8000


@dataclass(frozen=True)
class SlurmEvent:
    """One event slurmdbd recorded (`sacctmgr show event`).

    A cluster event (`node` empty) says the cluster registered `gpus` GPUs on `nodes` from
    `start` to `end` (state_raw 0), or, with TrackSlurmctldDown, that slurmctld was
    disconnected (state_raw DOWN). A node event says one node was down, drained, failed or
    powered down from `start` to `end`, set by `user` with `reason`; `gpus` is the node's
    gres/gpu. `end` is None while the event is open."""

    cluster: str
    node: str
    nodes: tuple[str, ...]
    start: datetime
    end: datetime | None
    state_raw: int
    state: str
    user: str
    reason: str
    gpus: int

    @property
    def is_cluster(self) -> bool:
        return not self.node

    @property
    def is_registration(self) -> bool:
        """A "Cluster Registered TRES" event: the cluster's nodes existed for its span.
        slurmdbd inserts it with no state (as_mysql_cluster.c at slurm-22-05-8-1, l. 1736-1742)
        and looks for it by `state=0` (l. 1655-1658)."""
        return not self.node and self.state_raw == 0

    @property
    def is_disconnect(self) -> bool:
        """A "slurmctld disconnect" event (TrackSlurmctldDown=yes in slurmdbd.conf): slurmctld
        was not connected to slurmdbd for its span. slurmdbd inserts it with node name "",
        no cluster nodes, state NODE_STATE_DOWN and the cluster's TRES (as_mysql_cluster.c
        at slurm-22-05-8-1, l. 1618-1622); the rollup takes any cluster event with a state
        for one (as_mysql_rollup.c l. 937-952), MAINT ones aside (l. 886-890)."""
        return not self.node and self.state_raw != 0 and not self.state_raw & NODE_STATE_MAINT
