"""The immutable world the policy sees: nodes and their jobs, Triton replicas, each
model's recent latency samples and its effective SLO and bounds, and the open leases.
Built by the reconciler's observe step from the Slurm and Triton adapters, the model
repository (merged with the TOML's overrides) and the lease store; the policy imports
none of those. Times are UTC epoch seconds (floats)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from bridge.config import ModelConfig
from bridge.lifecycle import LeaseState
from bridge.policy.returns import RatePeaks, ReturnHistory
from bridge.policy.tokens import TokenProfile


class Seasons(Protocol):
    """The models' seasonal growth (`bridge.policy.seasonal.SeasonLog`): read by the
    forecast, changed only between passes by the pass that keeps it."""

    def growth(self, model: str, now: float, horizon_s: float) -> float | None: ...


@dataclass(frozen=True)
class JobView:
    job_id: str
    gpus: int
    #: when the current run started; None while pending
    started_at: float | None
    #: times Slurm requeued it; with `submitted_at` (reset at each requeue) it tells a
    #: recently preempted job
    restarts: int = 0
    submitted_at: float | None = None
    #: when the job last reported a checkpoint (`stb:ckpt=<epoch>` in its comment): a
    #: preemption loses only the work since then
    checkpoint_at: float | None = None
    #: when the running job ends at the latest (Slurm's end time: its start plus its time
    #: limit); None while pending, without a time limit, or not known
    ends_at: float | None = None
    #: its GPUs on the node it is seen on (a job on several nodes holds `gpus` in all;
    #: a requeue loses all, frees these here); None: all of `gpus` (one node)
    gpus_here: int | None = None
    #: its GPUs of each GRES type on the node it is seen on (MIG slices: `(("h100_1g.
    #: 10gb", 1),)`), sorted by type; () where its node's gres names no type
    gpu_types: tuple[tuple[str, int], ...] = ()

    @property
    def held_here(self) -> int:
        """The GPUs a requeue of it frees on the node it is seen on."""
        return self.gpus if self.gpus_here is None else self.gpus_here

    def held_of(self, gpu_type: str) -> int:
        """Its GPUs of `gpu_type` on the node it is seen on (0: none)."""
        return dict(self.gpu_types).get(gpu_type, 0)


@dataclass(frozen=True)
class NodeView:
    name: str
    #: the pool (configuration name) whose partition holds the node
    pool: str
    #: up and schedulable as far as Slurm is concerned (not down, failed, or drained by
    #: someone other than the bridge)
    usable: bool
    gpus: int
    #: running non-Triton jobs on the node
    jobs: tuple[JobView, ...] = ()
    #: a Triton job (baseline or lease) runs or is starting here
    has_triton: bool = False
    #: in a site reservation (maintenance, a team's) that is active or starts soon: never
    #: lent, however cheap
    reserved: bool = False
    #: the models whose weights the node's local cache holds complete and verified
    #: (issue 31: a lend of them loads from there, at `Snapshot.local_load_s`); empty:
    #: none, or a site without node-local caches
    cached: frozenset[str] = frozenset()
    #: GPUs of the node held by Triton jobs (baselines and leases, `stb:triton`) that
    #: Slurm has started (running, configuring, completing); a pending one bound for the
    #: node holds none yet (`has_triton` says it is coming)
    triton_gpus: int = 0
    #: its free GPUs of each GRES type its gres names (`bridge.slurm.slices.
    #: free_gpu_types`: a node of MIG slices, `(("h100_1g.10gb", 1), ...)`), sorted by
    #: type; () where its gres names no type. A lend of a model with a `gpu_type` takes
    #: only free GPUs of that type (`bridge.policy.typed.choose_typed`)
    free_types: tuple[tuple[str, int], ...] = ()

    def free_of(self, gpu_type: str) -> int:
        """Its free GPUs of `gpu_type` (0: none, or a type it does not have)."""
        return dict(self.free_types).get(gpu_type, 0)


@dataclass(frozen=True)
class ReplicaView:
    """A Triton server that is ready and in routing."""

    node: str
    #: the models ready and in routing on it: while a `Place` is carried out, those it
    #: kept and has loaded so far, its lease's `models` the set it is to hold (the policy
    #: reads a difference as a placement under way: `bridge.policy.placement`)
    models: tuple[str, ...]
    #: None for a baseline server on a reserved node
    lease_id: int | None = None
    #: GPUs of its node (the parallel executions of the models that share them)
    gpus: int = 1


@dataclass(frozen=True)
class ModelSample:
    """One tick's reading of a model's signal (aggregated over its replicas)."""

    at: float
    #: Triton's p99 over its 60 s window; None when nothing was measured
    p99_ms: float | None
    #: requests per second over the tick's window; None when there was no usable window
    request_rate: float | None
    pending: float | None = None
    #: mean latency over the tick's own window (counter deltas); None without requests
    mean_ms: float | None = None
    #: mean compute time per request over the tick's window (Triton's compute counters):
    #: the capacity model's service time; None without requests
    compute_ms: float | None = None
    #: an LLM's token signal (`bridge.triton.llm_metrics`), None when it reports none or
    #: nothing was measured: p99 time to first token and per output token (ms) over the
    #: tick's window, prompt and output tokens per second, streams being generated
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    prompt_tps: float | None = None
    output_tps: float | None = None
    running: float | None = None
    #: an LLM's prompt and output lengths (tokens) as equally weighted quantiles of
    #: every request its servers have seen since their load (the backend's length
    #: histograms, `vllm:request_prompt_tokens` and `vllm:request_generation_tokens`):
    #: the token capacity model's length distributions, the tail a window is too short
    #: to hold; None where the backend has no such histogram (then every request is
    #: taken at the mean lengths of the token rates)
    prompt_lengths: tuple[float, ...] | None = None
    output_lengths: tuple[float, ...] | None = None
    #: an LLM's means over the tick's window of its backend's own TTFT clock (the
    #: prefill, no queue wait) and of its token gaps (ms), and the requests it timed:
    #: what the token capacity model corrects its profile by
    #: (`bridge.policy.llm.calibrated`); None where the backend has no such histogram
    ttft_mean_ms: float | None = None
    tpot_mean_ms: float | None = None
    timed: float | None = None


@dataclass(frozen=True)
class LeaseView:
    """A lease as every pure part reads it: the one copy of a lease's fields outside the
    store's row (`bridge.leases.models.Lease`). The planner and its per-state sync
    (`bridge.daemon.planner`, `bridge.policy.leasesync`), the policy (`Snapshot.leases`),
    the advisory's shadow leases (`bridge.advise.shadow`) and the simulator's leases
    (`bridge.sim.engine`) all read this; those last two keep their modelled times beside
    it. Times are epoch seconds."""

    id: int
    node: str
    pool: str
    lend_mode: str
    #: a plain string naming a state is accepted and made a `LeaseState` (so a typo fails)
    state: LeaseState
    models: tuple[str, ...]
    created_at: float
    #: when it entered its current state; None (or not given): when it was made
    updated_at: float = math.nan
    #: its Triton job once submitted ("1234", or "1234_5" for an array task)
    slurm_job_id: str | None = None
    #: why it is in its current state (the reason of its last move)
    reason: str = ""
    #: GPUs of its node (the snapshot's, from the observation)
    gpus: int = 1
    #: its node still runs jobs it waits for (a drain-mode lend): not capacity soon
    waiting: bool = False
    #: GPUs of its node it holds (a partial lend: its Triton job's `--gres=gpu:k`, the
    #: node's other GPUs left to its jobs); None: the whole node
    lent_gpus: int | None = None
    #: a gang's other nodes (a replica that spans nodes: one Slurm job with `-N n`, its
    #: server on `node`, the job's batch host); () for a lease of one node
    members: tuple[str, ...] = ()
    #: the GRES type its `lent_gpus` are of (a lend of MIG slices: its Triton job's
    #: `--gres=gpu:<type>:k`, `[models.NAME] gpu_type`); None: any GPU
    gpu_type: str | None = None
    #: the port slot of its Triton job on `node` (`Lease.slot`): 0 but for a lease of
    #: some GPUs of a node it shares with others
    slot: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", LeaseState(self.state))
        object.__setattr__(self, "members", tuple(self.members))
        if self.updated_at is None or math.isnan(self.updated_at):
            object.__setattr__(self, "updated_at", self.created_at)

    @property
    def lease_id(self) -> int:
        """`id`, by the name the policy's rules read it."""
        return self.id

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the lease holds: `node` first, then a gang's `members`."""
        return (self.node, *self.members)

    @property
    def serving_since(self) -> float | None:
        """When it entered `serving`; None before."""
        return self.updated_at if self.state == LeaseState.SERVING else None

    @property
    def ref(self) -> tuple[int, int]:
        """How the lease's Triton job names it (`bridge.slurm.model.lease_tag`)."""
        return self.id, int(self.created_at)


def held_nodes(leases: Iterable[LeaseView]) -> set[str]:
    """Every node the `leases` hold, gangs' members included."""
    return {n for lease in leases for n in lease.nodes}


def shares_node(lease: LeaseView) -> bool:
    """Whether other leases may share `lease`'s node: it holds some of its GPUs by
    preemption and is no gang, as every lease already there must (the rule the lease
    store keeps, `bridge.leases.store`; the operator's lend and `[policy] shared_lends`
    read it here)."""
    return lease.lent_gpus is not None and not lease.members and lease.lend_mode == "preempt"


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    replicas: tuple[ReplicaView, ...]
    #: per model, the recent samples, oldest first (the reconciler keeps enough of them
    #: for the longest consecutive-evaluation count)
    history: Mapping[str, tuple[ModelSample, ...]]
    #: leases not yet returned
    leases: tuple[LeaseView, ...]
    #: per model, the time of the last lend that carried it (from the lease history)
    last_lend_at: Mapping[str, float] = field(default_factory=dict)
    #: per pool, the measured seconds from a lend to its replica serving (a running
    #: estimate from the lease history); a pool without one uses `policy.lend_lead_s`
    lend_s: Mapping[str, float] = field(default_factory=dict)
    #: victims the bridge requeued in the last hour (the preemption budget)
    preemptions_last_hour: int = 0
    #: the models the policy scales, with their effective SLO and bounds
    #: (`bridge.modelfacts.merge_models`); a model not here is never lent for
    models: Mapping[str, ModelConfig] = field(default_factory=dict)
    #: per model, its recent returns and the lends after them (`bridge.policy.returns`)
    returns: Mapping[str, ReturnHistory] = field(default_factory=dict)
    #: per model, its request rate's per-minute peaks (the return's rate over a long dwell)
    peaks: Mapping[str, RatePeaks] = field(default_factory=dict)
    #: per model, its measured load time in seconds from the shared model repository (a
    #: placement's `load_model`, a lend's start on a node without its weights); a model
    #: not here has none measured (`bridge.policy.timing`)
    load_s: Mapping[str, float] = field(default_factory=dict)
    #: per pool, the slowest known load of the models of the lends measured into `lend_s`
    #: (the load `lend_s` already holds)
    lend_load_s: Mapping[str, float] = field(default_factory=dict)
    #: the models' rate at this time of day on earlier days (`bridge.policy.seasonal`);
    #: None: no season known (`[policy] seasonal_days = 0`, or a pass that keeps none)
    seasons: Seasons | None = None
    #: per LLM (a model with a token objective), its replica's measured token profile
    #: (`bridge.models.profile`); an LLM not here is sized by its measured TTFT/TPOT alone
    token_profiles: Mapping[str, TokenProfile] = field(default_factory=dict)
    #: per model, its measured load time in seconds from a node's local weight cache
    #: (a start on a node whose `NodeView.cached` holds it); a model not here loads at
    #: its `load_s` wherever it starts (`bridge.policy.timing`)
    local_load_s: Mapping[str, float] = field(default_factory=dict)
    #: per model served from zero (`min_replicas` 0), the requests the activator holds
    #: (or turned away since the last pass) for want of a ready replica: the demand a
    #: lend "from zero" answers (`bridge.policy.decide`); a model not here has none
    waiting: Mapping[str, int] = field(default_factory=dict)
