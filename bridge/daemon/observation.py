"""The tick's view of the outside world as plain values: `Observation` (what Slurm,
Triton and the model repository said this tick), `TritonServer` (one running Triton job
and its server's answers), and `snapshot()`, the policy's view of an observation and the
open leases (each model's SLO and bounds: the repository's facts merged with the TOML's
overrides, `bridge.modelfacts`).

Pure: no I/O. Built by `bridge.daemon.observe.Observer`; read by the planner, the policy
(through `snapshot`), routing and `stb status`. Nothing reads the adapters any other way.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from bridge.config import BridgeConfig, pool_of
from bridge.lifecycle import LeaseState
from bridge.modelfacts import ModelFacts
from bridge.policy.returns import RatePeaks, ReturnHistory
from bridge.policy.snapshot import (
    JobView,
    LeaseView,
    ModelSample,
    NodeView,
    ReplicaView,
    Seasons,
    Snapshot,
)
from bridge.policy.tokens import TokenProfile
from bridge.slurm.model import TRITON_TAG, Job, Node, Reservation, checkpoint_of, lease_of
from bridge.slurm.parse import gpu_types_of
from bridge.slurm.slices import free_gpu_types

_UNUSABLE = ("down", "fail", "unknown", "future", "inval")
#: the bridge's own reservations (a drain-mode lend's fence) are named this way
RESERVATION_PREFIX = "stb-lease-"


@dataclass(frozen=True)
class TritonServer:
    """A Triton job Slurm runs, and what its server said this tick."""

    job: Job
    node: str
    address: str
    ready: bool
    #: models the server holds READY
    models: tuple[str, ...]
    #: requests in flight per model (from the metrics page; empty when not scraped):
    #: queued in Triton and, for an LLM, its streams being generated (`observe.in_flight`)
    pending: Mapping[str, float] = field(default_factory=dict)
    #: models the server tried and failed to load, with Triton's reason
    unavailable: Mapping[str, str] = field(default_factory=dict)
    #: per model it holds, the versions READY (a rollout routes its split only to
    #: replicas that hold the versions it sends requests to)
    versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: seconds the server has gone without answering as ready (0 when ready now; counted
    #: from this daemon's first unanswered ask when it never saw it ready)
    unanswered_s: float = 0.0


@dataclass(frozen=True)
class Observation:
    """Everything one tick knows about the outside world; the planner's and the policy's
    only input besides the leases. `at` is epoch seconds."""

    at: float
    nodes: Mapping[str, Node]
    #: jobs in an active state (running, pending, configuring, completing)
    jobs: tuple[Job, ...]
    #: names of the Slurm reservations that exist now
    reservations: frozenset[str]
    #: the running Triton jobs' servers
    servers: tuple[TritonServer, ...]
    #: per model, its recent samples, oldest first
    history: Mapping[str, tuple[ModelSample, ...]]
    #: the site's own reservations (not the bridge's fences), with nodes and times
    site_reservations: tuple[Reservation, ...] = ()
    #: every model's effective facts this tick (the repository merged with the TOML);
    #: the policy scales `models.scaled`
    models: ModelFacts = field(default_factory=ModelFacts)
    #: per LLM, its replica's measured token profile (`bridge.models.profile`)
    token_profiles: Mapping[str, TokenProfile] = field(default_factory=dict)

    def triton_jobs(self) -> dict[str, Job]:
        """The Triton jobs (tagged `stb:triton`) by job id."""
        return {j.job_id: j for j in self.jobs if TRITON_TAG in j.tags}

    def server_of(self, job_id: str | None) -> TritonServer | None:
        return next((s for s in self.servers if s.job.job_id == job_id), None)

    @cached_property
    def work(self) -> Mapping[str, tuple[Job, ...]]:
        """Per node, the running jobs that are not the bridge's (Triton): what a
        preemption would requeue, what a drain waits for."""
        out: dict[str, list[Job]] = {}
        for j in self.jobs:
            if TRITON_TAG not in j.tags and j.state == "RUNNING":
                for n in j.nodes:
                    out.setdefault(n, []).append(j)
        return {n: tuple(js) for n, js in out.items()}


def usable(node: Node) -> bool:
    """The bridge may lend the node: up, and not drained but by the bridge's own fence."""
    return not node.state.startswith(_UNUSABLE) and (not node.drained or node.fenced_by_bridge)


def _ts(job: Job, name: str) -> float | None:
    value = getattr(job, name)
    return value.timestamp() if value is not None else None


def _gpus_per_node(job: Job) -> int:
    """A job's GPUs on each of its nodes: Slurm counts a job's whole allocation
    (`gres/gpu=16` for two 8-GPU nodes), taken as spread evenly (rounded up)."""
    return -(-job.gpus // len(job.nodes)) if job.nodes else job.gpus


def job_views(obs: Observation, node: str, *, types: bool = False) -> tuple[JobView, ...]:
    """The policy's view of the running non-Triton jobs on `node`; with `types`, the GPUs
    of each type each holds (MIG slices: what a typed lend needs; else left out, their
    TRES strings not parsed)."""
    return tuple(
        JobView(
            j.job_id,
            j.gpus,
            _ts(j, "start_time"),
            j.restarts,
            _ts(j, "submit_time"),
            checkpoint_of(j.tags),
            ends_at=_ts(j, "end_time"),
            gpus_here=_gpus_per_node(j) if len(j.nodes) > 1 else None,
            gpu_types=_types_per_node(j) if types else (),
        )
        for j in obs.work.get(node, ())
    )


def free_types(node: Node) -> tuple[tuple[str, int], ...]:
    """`NodeView.free_types` of a node: its free GPUs by type, sorted by type."""
    return tuple(sorted(free_gpu_types(node.gres, node.alloc_tres).items()))


def _types_per_node(job: Job) -> tuple[tuple[str, int], ...]:
    """A job's GPUs of each type on each of its nodes (its allocated TRES over its nodes,
    taken as spread evenly, rounded up), sorted by type."""
    n = max(1, len(job.nodes))
    return tuple(sorted((t, -(-c // n)) for t, c in gpu_types_of(job.alloc_tres).items()))


def triton_gpus(obs: Observation) -> tuple[set[str], dict[str, int]]:
    """The nodes a Triton job runs on or is bound for (a pending one asked for its node:
    it is on its way there), and per node the GPUs Triton jobs Slurm has started hold
    (running, configuring, completing: GPUs allocated)."""
    bound: set[str] = set()
    held: dict[str, int] = {}
    for j in obs.jobs:
        if TRITON_TAG in j.tags:
            bound.update(j.nodes or j.requested_nodes)
            if j.state != "PENDING":
                for n in j.nodes:
                    held[n] = held.get(n, 0) + _gpus_per_node(j)
    return bound, held


def reserved_nodes(
    reservations: Sequence[Reservation], now: float, lookahead_s: float
) -> frozenset[str]:
    """Nodes of site reservations active now or starting within `lookahead_s`."""
    out: set[str] = set()
    for r in reservations:
        start = r.start.timestamp() if r.start is not None else None
        end = r.end.timestamp() if r.end is not None else None
        if end is not None and end <= now:
            continue
        if start is None or start <= now + lookahead_s:
            out.update(r.nodes)
    return frozenset(out)


def lease_gpus(obs: Observation, lease: LeaseView) -> int:
    """The GPUs a lease's replica holds (`LeaseView.gpus`): a partial lease's its own,
    a gang's all its nodes', else its node's (1 for a node not seen)."""
    if lease.lent_gpus:
        return lease.lent_gpus
    held = sum(obs.nodes[n].gpus for n in lease.nodes if n in obs.nodes)
    return held or 1


def replica_gpus(obs: Observation, leases: Iterable[LeaseView]) -> dict[str, int]:
    """The GPUs of each running Triton job's replica, by job id (`ReplicaView.gpus`, the
    actuator's routing weights): its open lease's (`lease_gpus`; leases that share a node
    each hold their own), else its node's (a baseline)."""
    by_id = {lease.lease_id: lease for lease in leases}
    gpus = {}
    for s in obs.servers:
        lease = by_id.get(ref[0]) if (ref := lease_of(s.job.tags)) is not None else None
        node = obs.nodes.get(s.node)
        gpus[s.job.job_id] = lease_gpus(obs, lease) if lease else node.gpus if node else 1
    return gpus


def replica_lease(server: TritonServer, open_ids: Collection[int]) -> int | None:
    """The open lease a server's job serves (its tag names it), None for a baseline."""
    ref = lease_of(server.job.tags)
    return ref[0] if ref is not None and ref[0] in open_ids else None


def snapshot(
    obs: Observation,
    config: BridgeConfig,
    leases: Sequence[LeaseView],
    last_lend_at: Mapping[str, float],
    lend_s: Mapping[str, float] | None = None,
    preemptions_last_hour: int = 0,
    held_pools: frozenset[str] = frozenset(),
    *,
    returns: Mapping[str, ReturnHistory] | None = None,
    peaks: Mapping[str, RatePeaks] | None = None,
    load_s: Mapping[str, float] | None = None,
    lend_load_s: Mapping[str, float] | None = None,
    seasons: Seasons | None = None,
) -> Snapshot:
    """The policy's view of an observation and the open leases. Pure. The nodes of
    `held_pools` (an operator's `stb drain`) are reserved: never lent. `returns` and
    `peaks`: the deciding pass's memory of the models' returns and rate peaks; `load_s`
    and `lend_load_s`: its models' load times and the load its pools' lend times hold
    (`bridge.policy.timing`); `seasons`: its models' rate by time of day
    (`bridge.policy.seasonal`)."""
    open_ids = {lease.lease_id for lease in leases}
    reserved = reserved_nodes(obs.site_reservations, obs.at, config.policy.reservation_lookahead_s)
    triton_bound, held = triton_gpus(obs)
    # GPU types (MIG slices) are read only where a model is lent by type: a site without
    # them parses no TRES string per node and job each pass
    typed = any(m.gpu_type for m in obs.models.scaled.values())
    views = []
    for node in obs.nodes.values():
        pool = pool_of(node, config)
        if pool is None:
            continue
        work = job_views(obs, node.name, types=typed)
        views.append(
            NodeView(
                node.name,
                pool,
                usable(node),
                node.gpus,
                work,
                has_triton=node.name in triton_bound,
                reserved=node.name in reserved or pool in held_pools,
                triton_gpus=held.get(node.name, 0),
                free_types=free_types(node) if typed else (),
            )
        )
    gpus = replica_gpus(obs, leases)
    replicas = tuple(
        ReplicaView(s.node, s.models, replica_lease(s, open_ids), gpus.get(s.job.job_id, 1))
        for s in obs.servers
        if s.ready and s.models
    )
    views_of_leases = tuple(
        replace(
            lease,
            gpus=lease_gpus(obs, lease),
            # a drain lend waits for its node's jobs; a partial one only for its own job to
            # start (the node's other jobs go on beside it)
            waiting=lease.lend_mode == "drain"
            and (
                lease.node in obs.work
                if lease.lent_gpus is None
                else lease.state in (LeaseState.REQUESTED, LeaseState.SUBMITTED)
            ),
        )
        for lease in leases
    )
    return Snapshot(
        tuple(views),
        replicas,
        obs.history,
        views_of_leases,
        dict(last_lend_at),
        dict(lend_s or {}),
        preemptions_last_hour,
        obs.models.scaled,
        returns=dict(returns or {}),
        peaks=dict(peaks or {}),
        load_s=dict(load_s or {}),
        lend_load_s=dict(lend_load_s or {}),
        seasons=seasons,
        token_profiles=dict(obs.token_profiles),
    )
