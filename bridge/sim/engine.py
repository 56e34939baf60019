"""The event loop: simulated time, ticks of the bridge, and the real policy.

`Engine(setup).run()` plays one policy over the whole horizon. Between ticks it processes
the fleet's events in time order (job arrivals, ends, requeues becoming eligible, Triton
jobs starting and ending); at each tick, in the reconciler's order:

1. the latency model advances every replica group over the tick just ended and each
   model gets the `ModelSample` the observe step would have read (Triton's 60 s p99, the
   tick's mean latency, request rate, pending requests);
2. passive sync moves each open lease forward by at most one state, as
   `bridge.daemon.reconciler` does (submitted -> starting when its Triton job runs,
   starting -> serving when Triton is ready, draining -> releasing, releasing -> returned
   when the job is gone);
3. `bridge.policy.decide` runs on a `Snapshot` of the simulated world;
4. its actions are carried out on the simulated Slurm with timings measured on the lab
   (`Timing`).

Ticks at which decide can only answer "nothing" skip the call (`_quiet`: no lease to
abandon or return, no lend possible); the tests check that this changes no decision. Most
such ticks are proven quiet by `bridge.sim.quiet` without running `assess` at all
(`Setup.prove_quiet`; `Setup.check_quiet` runs assess on them too and fails if it would
act). The rest is incremental: replica groups' layout, lease views and the free-GPU
index are kept up to date rather than rebuilt each tick; results are those of the plain
loop (`tests/unit/test_sim_golden.py` compares them with a recording made before). The
hot paths (a job's arrival, start and end; the latency model's tick) are written out
rather than layered (a job that comes alone at its instant, with no job waiting, is
started without entering the queue: `Fleet.start_alone`; the latency model's tick is
kept as plain numbers; samples and views are made by `bridge.sim.views`): the shortcuts
are each compared with the plain code in `tests/unit/test_sim_speed.py`.
Slurm schedules when events arrive (a pass per instant with events), the bridge acts on
ticks only, so routing changes, and with them the latency model's replica groups, happen
on ticks.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from bridge.config import BridgeConfig, ModelConfig
from bridge.lifecycle import LeaseState, StepTimes, check
from bridge.modelfacts import toml_models
from bridge.policy import (
    Action,
    LeaseView,
    Lend,
    ModelSample,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
    StartBaseline,
    assess,
    decide,
    history_depth,
)
from bridge.policy.forecast import next_lead
from bridge.sim import latency
from bridge.sim.fleet import Fleet, JobRun, SimNode
from bridge.sim.quiet import LeaseFacts, QuietProof
from bridge.sim.result import Decision, ModelOutcome, PolicyResult, QueueOutcome
from bridge.sim.views import job_view as _job_view
from bridge.sim.views import model_sample as _model_sample
from bridge.sim.views import node_view as _node_view
from bridge.sim.workload import ArrivalSeries, SimJob

#: Triton's latency summaries (prometheus-cpp): observations of the last 60 s, kept in 5
#: buckets that rotate every 12 s, so a quantile covers the last 48 to 60 s and old
#: requests leave it in 12 s steps (as the lab shows)
WINDOW_S = 60.0
AGE_BUCKETS = 5
#: the time series kept for the report, sampled every `series_step_s`
SERIES = (
    "requests_per_s",
    "worst_p99_over_slo",
    "replicas",
    "lent_nodes",
    "gpus_training",
    "gpus_elastic",
    "gpus_inference",
    "gpus_idle",
    "pending_training",
    "pending_elastic",
)


@dataclass(frozen=True)
class Timing:
    """Seconds each step takes: by default the lab's measured `bridge.lifecycle.StepTimes`
    (each field's meaning there). A site's own, from its bridge's lease history:
    `bridge.sim.inputs.timing_from_leases`."""

    slurm_start_s: float = StepTimes.slurm_start_s
    preempt_start_s: float = StepTimes.preempt_start_s
    triton_ready_s: float = StepTimes.triton_ready_s
    cancel_s: float = StepTimes.cancel_s
    #: a requeued job may start again after this long (Slurm's fixed requeue delay)
    requeue_delay_s: float = 121.0
    #: per model, the seconds loading it adds after `triton_ready_s` (its weights: a
    #: site's large models); a lent replica is ready once its slowest model is. Empty by
    #: default: the lab's small models load within `triton_ready_s`
    model_load_s: Mapping[str, float] = field(default_factory=dict, hash=False)

    def load_s(self, models: Sequence[str]) -> float:
        """The extra seconds a replica holding `models` takes to be ready."""
        loads = self.model_load_s
        return max((loads.get(m, 0.0) for m in models), default=0.0) if loads else 0.0


@dataclass
class Setup:
    """Everything one policy's run needs. `config` is the policy's bridge configuration
    (its pools name which simulated pools the policy may lend from)."""

    name: str
    description: str
    config: BridgeConfig
    nodes: list[SimNode]
    jobs: Sequence[SimJob]
    arrivals: ArrivalSeries
    #: per model, service time of one request on one instance (seconds)
    service_s: Mapping[str, float]
    horizon_s: float
    timing: Timing = field(default_factory=Timing)
    #: squared coefficient of variation of service times (0: deterministic)
    service_cv2: float = 0.0
    series_step_s: float = 300.0
    #: keep at most this many decisions in the result
    max_decisions: int = 10_000
    #: call decide at every tick (slow; proves the quiet-tick shortcut in tests)
    always_decide: bool = False
    #: prove ticks quiet without running `assess` where it can (`bridge.sim.quiet`);
    #: False runs `assess` at every tick (the bench's baseline; the same results)
    prove_quiet: bool = True
    #: run `assess` on the ticks proven quiet as well and fail if it would act (tests)
    check_quiet: bool = False
    #: parallel model instances on one replica; None: one per GPU of the node
    replica_servers: int | None = None
    #: elastic jobs checkpoint every this many seconds of run time and report it (the
    #: bridge's `stb:ckpt=` tag); a requeued run resumes there. None: no checkpoints
    checkpoint_s: float | None = None
    #: the models the policy scales, with their effective SLO and bounds (the daemon's:
    #: `bridge.modelfacts.merge_models` of a repository and the TOML); None: the TOML's
    #: `[models]` alone (`toml_models`)
    models: Mapping[str, ModelConfig] | None = None


@dataclass(eq=False)
class SimLease:
    """A simulated lease. It is born `submitted`: the simulated act step records the lend
    and submits its Triton job in the same instant (the reconciler's requested ->
    submitted, which takes no simulated time). It then changes state only through
    `Engine._move`, which checks each move against `bridge.lifecycle.TRANSITIONS`."""

    lease_id: int
    node: SimNode
    pool: str
    lend_mode: str
    models: tuple[str, ...]
    created_at: float
    state: LeaseState = LeaseState.SUBMITTED
    updated_at: float = 0.0
    #: when its Triton job runs / is ready / is gone (None: not yet known)
    running_at: float | None = None
    ready_at: float | None = None
    gone_at: float | None = None
    #: a drain lease's Triton job has been given its start (the node became free)
    queued: bool = False
    #: a drain lease found its node busy when it was made (it waited for the jobs)
    waited: bool = False

    def view(self, gpus: int) -> LeaseView:
        return LeaseView(
            self.lease_id,
            self.node.name,
            self.pool,
            self.lend_mode,
            self.state,
            self.models,
            self.created_at,
            self.updated_at if self.state == LeaseState.SERVING else None,
            gpus,
            self.lend_mode == "drain" and self.running_at is None and bool(self.node.jobs),
        )


@dataclass(eq=False)
class Group:
    """Ready replicas holding the same models: they see the same load."""

    models: tuple[str, ...]
    nodes: int = 0
    backlog_s: float = 0.0
    #: the ticks in Triton's summary window, oldest first: their (quantile
    #: `wait_quantile()`, requests), their requests alone and their end times. A tick
    #: leaves all three once the window has rotated past it (`_window_start`; it never
    #: comes back)
    window: deque[tuple[float, float]] = field(default_factory=deque)
    window_n: deque[float] = field(default_factory=deque)
    window_at: deque[float] = field(default_factory=deque)
    extra_p99_s: float | None = None
    #: the last tick's state (`latency.TickState`'s delay_lo_s, delay_hi_s, wait_p and
    #: wait_rate), its `mean_extra()` and `share_within(budget)` by budget
    state: tuple[float, float, float, float] | None = None
    mean_extra: float = 0.0
    within: dict[float, float] = field(default_factory=dict)
    #: when its first replica came up (the summaries' rotation runs from there)
    born: float = 0.0
    #: requests queued on one of its nodes at the last tick's end
    pending: float = 0.0


class Engine:
    def __init__(self, setup: Setup) -> None:
        self.s = setup
        cfg = setup.config
        self.tick_s = cfg.tick_s
        #: the models the policy scales (the snapshot's `models`)
        self.specs: dict[str, ModelConfig] = (
            dict(setup.models) if setup.models is not None else toml_models(cfg)
        )
        self.models = list(self.specs)
        unknown = [m for m in self.models if m not in setup.arrivals.rates]
        if unknown:
            raise ValueError(f"no arrivals for models {', '.join(unknown)}")
        missing = [m for m in self.models if m not in setup.service_s]
        if missing:
            raise ValueError(f"no service time for models {', '.join(missing)}")
        self.ticks = math.ceil(setup.horizon_s / self.tick_s)
        self.rates = {m: _per_tick(setup.arrivals, m, self.tick_s, self.ticks) for m in self.models}
        self.window_ticks = max(1, round(WINDOW_S / self.tick_s))
        self._rate_series = [self.rates[m] for m in self.models]
        runs = {
            j.job_id: JobRun(j, j.kind, j.submit_s, submitted_at=j.submit_s) for j in setup.jobs
        }
        #: the run's own nodes (a Setup can be run again: its nodes are only a plan)
        self.nodes = [SimNode(n.index, n.name, n.pool, n.partition, n.gpus) for n in setup.nodes]
        partitions = {n.partition for n in self.nodes if n.partition}
        for run in runs.values():
            if run.partition not in partitions:
                raise ValueError(f"job {run.job.job_id}: no {run.partition} nodes in the fleet")
        self.by_name = {n.name: n for n in self.nodes}
        self.arrival_order = sorted(runs.values(), key=lambda r: (r.job.submit_s, r.job.job_id))
        self.next_arrival = 0
        #: their submit times, and inf after the last
        self.arrival_times = [r.job.submit_s for r in self.arrival_order] + [math.inf]
        #: the event heap: (when, seq, kind, payload), or (when, seq, run, run number) for
        #: a job's end (`_pass`)
        self.events: list[tuple[float, int, object, object]] = []
        #: the events' order among those of one instant
        self.seq = itertools.count(1)
        self.now = 0.0
        self.leases: dict[int, SimLease] = {}
        #: drain-mode leases, by id, that may still need their Triton job's start
        self.drain_pending: dict[int, SimLease] = {}
        #: ids of the open leases that `_sync` may move (any not serving)
        self.unsettled: set[int] = set()
        #: lease id -> ((state, updated_at, waiting), its LeaseView) (`_lease_view`)
        self._lease_views: dict[int, tuple[tuple[LeaseState, float, bool], LeaseView]] = {}
        self.next_lease = 1
        self.last_lend_at: dict[str, float] = {}
        depth = history_depth(cfg)
        self.history: dict[str, deque[ModelSample]] = {m: deque(maxlen=depth) for m in self.models}
        self.rate_window: dict[str, deque[float]] = {
            m: deque(maxlen=self.window_ticks) for m in self.models
        }
        self.groups: dict[tuple[str, ...], Group] = {}
        #: `_lay_out()` of the groups as they are (None: to be made again)
        self._layout: (
            tuple[
                list[tuple[Group, list[tuple[int, int, float]]]],
                list[list[tuple[float, Group]]],
            ]
            | None
        ) = None
        reserved = {p for p, pc in cfg.pools.items() if pc.lend_mode == "reserved"}
        self.baseline = tuple(sorted(self.models))
        for node in self.nodes:
            if node.pool in reserved:
                node.triton = True
        self.fleet = Fleet(
            self.nodes, runs, setup.timing.requeue_delay_s, checkpoint_s=setup.checkpoint_s
        )
        #: parallel model instances on one replica (one per GPU)
        self.node_gpus = max((n.gpus for n in self.nodes), default=1)
        self.replica_gpus = setup.replica_servers or self.node_gpus
        #: GPU-seconds the replicas spent serving
        self.inference_used_s = 0.0
        for node in self.nodes:
            if node.pool in reserved:
                self._join(self.baseline, 1)
        self.replica_views: list[ReplicaView] = [
            ReplicaView(n.name, self.baseline, gpus=self.replica_gpus)
            for n in self.nodes
            if n.pool in reserved
        ]
        #: bumped at each change of `replica_views` (the quiet proof's structure key)
        self.replica_version = 0
        #: ticks proven quiet without running assess
        self.proven = 0
        self.proof = (
            QuietProof(
                cfg, self.models, self.rates, self.tick_s, depth, self.replica_gpus, self.specs
            )
            if setup.prove_quiet and not setup.always_decide
            else None
        )
        #: NodeViews of the nodes in the policy's pools, rebuilt only when a node changes
        self.policy_nodes = [n for n in self.nodes if n.pool in cfg.pools]
        self.view_at = {n.index: i for i, n in enumerate(self.policy_nodes)}
        self.views: list[NodeView] = [self._node_view(n) for n in self.policy_nodes]
        self.stale: set[int] = set()
        self.dirty_sched = True
        out = {m: ModelOutcome(self.specs[m].slo_p99_ms) for m in self.models}
        self.outcome = out
        self.minute = {m: [0.0, 0.0] for m in self.models}
        #: what `_serve` reads of each model, in model order: SLO (ms), service time (s and
        #: ms), SLO budget beyond the service time (s), outcome, minute tally, history, rates
        self._per_model = [
            (
                self.specs[m].slo_p99_ms,
                setup.service_s[m],
                setup.service_s[m] * 1000.0,
                self.specs[m].slo_p99_ms / 1000.0 - setup.service_s[m],
                out[m],
                self.minute[m],
                self.history[m],
                self.rate_window[m],
            )
            for m in self.models
        ]
        self.decisions: list[Decision] = []
        self.lends = 0
        self.returns = 0
        self.lends_by_pool: dict[str, int] = {}
        #: per pool, the running estimate of lend-to-serving seconds (as the daemon keeps)
        self.lend_s: dict[str, float] = {}
        #: when the bridge requeued each victim (the last hour's are the budget's)
        self.victims: deque[float] = deque()
        self.decide_calls = 0
        #: (old, new) -> how many times a lease made that move in this run
        self.moves: Counter[tuple[LeaseState, LeaseState]] = Counter()
        self.series: dict[str, list[float]] = {k: [] for k in SERIES}
        self._tick_requests = 0.0
        self._tick_worst = 0.0

    # ---- events ----------------------------------------------------------------------

    def _at(self, when: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, payload))

    def _advance(self, until: float) -> None:
        """Process arrivals and events up to `until` (inclusive). Slurm schedules on
        events: a pass runs once the events of one instant are all in. (The hot loop of a
        run: a job's end is handled here rather than in `_event`; the pass's flag
        `dirty_sched` is kept in a local meanwhile, and the pass is `_schedule` written
        out.)"""
        events, arrivals, order = self.events, self.arrival_times, self.arrival_order
        fleet, stale, heappop, heappush = self.fleet, self.stale, heapq.heappop, heapq.heappush
        submit, start_alone, end = fleet.submit, fleet.start_alone, fleet.end
        inf, run_type, seq = math.inf, JobRun, self.seq
        nxt = self.next_arrival
        t_arr = arrivals[nxt]
        dirty = self.dirty_sched
        now = self.now  # (kept equal to self.now, which the calls below read)
        while True:
            t_event = events[0][0] if events else inf
            t = t_arr if t_arr < t_event else t_event
            fresh = t > now  # (a new instant)
            if fresh and dirty:
                dirty = False
                if fleet.waiting:  # (else the pass would start nothing)
                    self._pass(now)
            if t > until:
                break
            if fresh:
                now = self.now = t
            if t_arr <= t_event:
                run = order[nxt]
                nxt += 1
                t_next = arrivals[nxt]
                if fresh and t_next > t < t_event and start_alone(run, now):
                    # alone at its instant, no job waiting: the instant's pass is its
                    # start (`_pass`, made here: no submit, no pass)
                    stale.update(run.nodes)
                    done = now + (run.job.duration_s - run.done_s)
                    heappush(events, (done, next(seq), run, run.run))
                else:
                    submit(run)
                    dirty = True
                t_arr = t_next
                continue
            _, _, what, detail = heappop(events)
            if what.__class__ is run_type:  # a job's end: (when, seq, its run, run number)
                run = what
                if run.run == detail and run.started_at is not None:
                    stale.update(run.nodes)  # the nodes' indexes (`_touch`)
                    end(run, now)
                    dirty = True
                    if self.drain_pending:
                        self._drain_ready()
            else:
                self.dirty_sched = dirty
                self._event(cast(str, what), detail)
                dirty = self.dirty_sched
        self.next_arrival = nxt
        self.dirty_sched = dirty
        self._schedule()
        self.now = until

    def _event(self, kind: str, payload: object) -> None:
        if kind == "eligible":
            self.dirty_sched = True
        elif kind == "triton_run":
            lease = payload
            assert isinstance(lease, SimLease)
            if lease.state != LeaseState.SUBMITTED or lease.running_at is not None:
                return
            node = lease.node
            for run in list(self.fleet.running_on(node)):
                self._touch(self.fleet.preempt(run, self.now))
                self.victims.append(self.now)
                self._at(self.now + self.s.timing.requeue_delay_s, "eligible", None)
            self.fleet.take(node, self.now)
            self._touch([node])
            lease.running_at = self.now
            timing = self.s.timing
            lease.ready_at = self.now + timing.triton_ready_s + timing.load_s(lease.models)
            self.dirty_sched = True
        elif kind == "triton_gone":
            lease = payload
            assert isinstance(lease, SimLease)
            if lease.node.triton:
                self.fleet.give_back(lease.node, self.now)
                self._touch([lease.node])
                self.dirty_sched = True

    def _drain_ready(self) -> None:
        """Drain-mode leases whose node just became free start their Triton job. Only the
        drain leases not yet given their start are looked at (in lease order); one that
        never will be (queued, cancelled, past submitted) leaves that list."""
        gone = []
        for lease_id, lease in self.drain_pending.items():
            if lease.state != LeaseState.SUBMITTED or lease.running_at is not None or lease.queued:
                gone.append(lease_id)
                continue
            if not lease.node.jobs:
                lease.queued = True
                gone.append(lease_id)
                self._at(self.now + self.s.timing.slurm_start_s, "triton_run", lease)
        for lease_id in gone:
            del self.drain_pending[lease_id]

    def _schedule(self) -> None:
        if not self.dirty_sched:
            return
        self.dirty_sched = False
        if self.fleet.waiting:  # (else the pass would start nothing)
            self._pass(self.now)

    def _pass(self, now: float) -> None:
        """A scheduling pass at `now`; each job it starts gets its end event, kept in the
        heap as (when, seq, run, run number) (the other events: (when, seq, kind,
        payload))."""
        stale, events, seq, push = self.stale, self.events, self.seq, heapq.heappush
        for run in self.fleet.schedule(now):
            stale.update(run.nodes)  # the nodes' indexes (`_touch`)
            push(events, (now + (run.job.duration_s - run.done_s), next(seq), run, run.run))

    def _touch(self, nodes: Sequence[SimNode]) -> None:
        for node in nodes:
            self.stale.add(node.index)

    # ---- replica groups and the latency model ----------------------------------------

    def _join(self, models: tuple[str, ...], n: int) -> None:
        group = self.groups.get(models)
        if group is None:
            size = self.window_ticks + 1
            group = self.groups[models] = Group(
                models,
                window=deque(maxlen=size),
                window_n=deque(maxlen=size),
                window_at=deque(maxlen=size),
                born=self.now,
            )
        if n > 0 and group.nodes > 0:  # a fresh replica starts with an empty queue
            group.backlog_s *= group.nodes / (group.nodes + n)
        group.nodes += n
        if group.nodes <= 0:
            del self.groups[models]
        self._layout = None

    def _lay_out(
        self,
    ) -> tuple[list[tuple[Group, list[tuple[int, int, float]]]], list[list[tuple[float, Group]]]]:
        """What `_serve` needs of the groups, which change only at `_join`: per group its
        models' (index, replicas, service time), per model its (share of its traffic,
        group)."""
        replicas = dict.fromkeys(self.models, 0)
        for group in self.groups.values():
            for m in group.models:
                if m in replicas:
                    replicas[m] += group.nodes
        index = {m: i for i, m in enumerate(self.models)}
        per_group: list[tuple[Group, list[tuple[int, int, float]]]] = []
        per_model: list[list[tuple[float, Group]]] = [[] for _ in self.models]
        for group in self.groups.values():
            parts: list[tuple[int, int, float]] = []
            for m in group.models:
                r = replicas.get(m, 0)
                if r:
                    parts.append((index[m], r, self.s.service_s[m]))
                    per_model[index[m]].append((group.nodes / r, group))
            per_group.append((group, parts))
        return per_group, per_model

    def _serve(self, k: int) -> None:
        """The latency model over tick k (from k*tick to (k+1)*tick) and the samples."""
        dt = self.tick_s
        now = (k + 1) * dt
        if self._layout is None:
            self._layout = self._lay_out()
        per_group, per_model_at = self._layout
        rates = [series[k] for series in self._rate_series]
        cv2 = self.s.service_cv2
        servers = self.replica_gpus
        advance, wait_quantile = latency.advance, latency.wait_quantile
        for group, members in per_group:
            node_rate = 0.0
            node_load = 0.0
            for i, r, service in members:
                share = rates[i] / r
                node_rate += share
                node_load += share * service
            # `latency.step`, as plain numbers
            lo = group.backlog_s
            hi, p, tail, queued = advance(servers, node_load, node_rate, lo, dt, cv2)
            group.backlog_s = hi
            busy = min(node_load, servers) / servers
            self.inference_used_s += busy * self.node_gpus * group.nodes * dt
            window, window_n, window_at = group.window, group.window_n, group.window_at
            requests = node_rate * dt
            window.append((wait_quantile(lo, hi, p, tail), requests))
            window_n.append(requests)
            window_at.append(now)
            group.state = (lo, hi, p, tail)
            group.mean_extra = (lo + hi) / 2.0 + (p / tail if tail > 0 else 0.0)  # `mean_extra`
            group.within.clear()
            group.pending = queued
            start = _window_start(group.born, now)
            while window_at[0] <= start:  # (the newest tick is always in)
                window_at.popleft()
                window_n.popleft()
                window.popleft()
            group.extra_p99_s = _window_quantile(window, window_n)
        requests_total = 0.0
        worst = 0.0
        proof = self.proof
        samples: list[ModelSample] = []
        for (slo_ms, s_m, compute_ms, budget, out, minute, history, rate_window), lam, parts in zip(
            self._per_model, rates, per_model_at, strict=True
        ):
            rate_window.append(lam)
            n = lam * dt
            requests_total += lam
            p99: float | None = None
            mean: float | None = None
            if not parts:  # no replica: every request fails
                within = 0.0
                out.requests += n
                out.within_slo += n * within
                minute[0] += n
                minute[1] += n * within
                if n > 0:
                    worst = math.inf
                sample = _model_sample(now, None, None, None, None, None)
                history.append(sample)
                samples.append(sample)
                continue
            if len(parts) == 1:  # (most models: one group holds them all) the loop below
                share, group = parts[0]
                part = group.within.get(budget)
                if part is None:
                    assert group.state is not None
                    part = group.within[budget] = latency.share_within(*group.state, budget)
                within = 0.0 + share * part  # (`0.0 +`: the loop's sums, exactly)
                mean_s = 0.0 + share * (s_m + group.mean_extra)
                pending = 0.0 + group.pending
                if group.extra_p99_s is not None:
                    p99 = (s_m + group.extra_p99_s) * 1000.0
            else:
                pending = 0.0
                within = 0.0
                mean_s = 0.0
                for share, group in parts:
                    # the group's tick, once for all its models (of the same budget)
                    part = group.within.get(budget)
                    if part is None:
                        assert group.state is not None
                        part = group.within[budget] = latency.share_within(*group.state, budget)
                    within += share * part
                    mean_s += share * (s_m + group.mean_extra)
                    pending += group.pending
                    if group.extra_p99_s is not None:
                        q = (s_m + group.extra_p99_s) * 1000.0
                        if p99 is None or q > p99:  # (`max`, without the call)
                            p99 = q
            if lam > 0:
                mean = mean_s * 1000.0
            if p99 is not None and sum(rate_window) <= 0:
                p99 = None
            out.requests += n
            out.within_slo += n * within
            minute[0] += n
            minute[1] += n * within
            if p99 is not None and p99 / slo_ms > worst:
                worst = p99 / slo_ms
            sample = _model_sample(
                now, p99, lam, pending, mean, compute_ms if mean is not None else None
            )
            history.append(sample)
            samples.append(sample)
        if proof is not None:
            proof.observe_all(samples)
        self._tick_requests = requests_total
        self._tick_worst = worst
        if int(now // 60.0) != int((now - dt) // 60.0):
            for m in self.models:
                minute = self.minute[m]
                if minute[0] > 0:
                    out = self.outcome[m]
                    out.minutes += 1
                    if minute[1] >= latency.Q * minute[0] - 1e-9:
                        out.minutes_within += 1
                minute[0] = minute[1] = 0.0

    # ---- leases (the reconciler's passive sync and act) -------------------------------

    def _sync(self) -> None:
        now = self.now
        # serving leases do not move here: only the others, in lease order
        for lease in [self.leases[i] for i in sorted(self.unsettled)]:
            state = lease.state
            if state == LeaseState.SUBMITTED:
                if lease.running_at is not None and lease.running_at <= now:
                    self._move(lease, LeaseState.STARTING)
            elif state == LeaseState.STARTING:
                if lease.ready_at is not None and lease.ready_at <= now:
                    self._join(lease.models, 1)
                    self.replica_views.append(
                        ReplicaView(
                            lease.node.name, lease.models, lease.lease_id, self.replica_gpus
                        )
                    )
                    self.replica_version += 1
                    self._move(lease, LeaseState.SERVING)
                    if not lease.waited:  # a drain lend that waited for jobs: no actuation
                        took = now - lease.created_at
                        self.lend_s[lease.pool] = next_lead(self.lend_s.get(lease.pool), took)
            elif state == LeaseState.DRAINING:
                # no request is left after a tick (the lab's drain took 1.3 s)
                self._cancel(lease)
                self._move(lease, LeaseState.RELEASING)
            elif state == LeaseState.RELEASING and (lease.gone_at is None or lease.gone_at <= now):
                if lease.node.fenced:
                    self.fleet.unfence(lease.node, now)
                    self._touch([lease.node])
                    self.dirty_sched = True
                self._move(lease, LeaseState.RETURNED)
                del self.leases[lease.lease_id]
                self._lease_views.pop(lease.lease_id, None)
                self._touch([lease.node])

    def _move(self, lease: SimLease, state: LeaseState) -> None:
        """The one place a simulated lease changes state: a move the lifecycle table
        forbids raises `IllegalMove` (the simulator would be modelling a bridge that cannot
        exist); each move made is counted in `moves`."""
        old = lease.state
        check(old, state, lease_id=lease.lease_id)
        lease.state = state
        lease.updated_at = self.now
        self.moves[old, state] += 1
        if state in (LeaseState.RETURNED, LeaseState.SERVING):
            self.unsettled.discard(lease.lease_id)
        else:
            self.unsettled.add(lease.lease_id)
        if state == LeaseState.SERVING:
            for m in lease.models:
                self.last_lend_at[m] = max(self.last_lend_at.get(m, 0.0), self.now)

    def _cancel(self, lease: SimLease) -> None:
        if lease.running_at is not None:
            lease.gone_at = self.now + self.s.timing.cancel_s
            self._at(lease.gone_at, "triton_gone", lease)
        else:
            lease.gone_at = self.now
            lease.running_at = -1.0  # a pending job is simply cancelled: never runs

    def _act(self, action: Action) -> None:
        now = self.now
        if isinstance(action, Lend):
            node = self.by_name[action.node]
            lease = SimLease(
                self.next_lease,
                node,
                action.pool,
                action.lend_mode,
                action.models,
                now,
                updated_at=now,
            )
            self.next_lease += 1
            lease.waited = action.lend_mode == "drain" and bool(node.jobs)
            self.leases[lease.lease_id] = lease
            self.unsettled.add(lease.lease_id)
            if action.lend_mode == "drain":
                self.drain_pending[lease.lease_id] = lease
            for m in action.models:
                self.last_lend_at[m] = now
            self.fleet.fence(node, now)
            self._touch([node])
            self.lends += 1
            self.lends_by_pool[action.pool] = self.lends_by_pool.get(action.pool, 0) + 1
            timing = self.s.timing
            if action.lend_mode == "preempt":
                delay = timing.preempt_start_s if node.jobs else timing.slurm_start_s
                self._at(now + delay, "triton_run", lease)
            else:
                self._drain_ready()
        elif isinstance(action, Return):
            lease = self.leases[action.lease_id]
            self.returns += 1
            if lease.state == LeaseState.SERVING:
                self._join(lease.models, -1)
                self.replica_views = [r for r in self.replica_views if r.lease_id != lease.lease_id]
                self.replica_version += 1
                self._move(lease, LeaseState.DRAINING)
            elif lease.state in (LeaseState.SUBMITTED, LeaseState.STARTING):
                self._cancel(lease)
                self._move(lease, LeaseState.RELEASING)
        elif isinstance(action, StartBaseline):  # the sim starts with every baseline up
            raise AssertionError(f"baseline requested for {action.node}")
        if len(self.decisions) < self.s.max_decisions:
            kind = {Lend: "lend", Return: "return"}.get(type(action), "baseline")
            node_name = action.node if isinstance(action, (Lend, StartBaseline)) else ""
            models: tuple[str, ...] = action.models if isinstance(action, Lend) else ()
            if isinstance(action, Return):
                lease = self.leases[action.lease_id]
                node_name, models = lease.node.name, lease.models
            self.decisions.append(Decision(now, kind, node_name, models, action.reason))

    # ---- decide ----------------------------------------------------------------------

    def _quiet(self, k: int) -> bool:
        """True when decide can only return nothing: `bridge.policy.assess` (decide's own
        rules, which never read the nodes) on a snapshot without nodes finds nothing to
        return or lend, or `bridge.sim.quiet` proves that it would not (most ticks; then
        assess is not run). Reserved nodes always have their baseline here.
        `Setup.always_decide` runs without it and the tests compare the two."""
        proof = self.proof
        if proof is not None:

            def leases() -> list[LeaseFacts]:
                return [
                    (lease.lease_id, lease.lend_mode, lease.state, lease.models,
                     lease.created_at, lease.updated_at)
                    for lease in self.leases.values()
                ]  # fmt: skip

            structure = (
                self.replica_version,
                tuple(
                    (i, self.leases[i].state, self._lease_view(self.leases[i]).waiting)
                    for i in sorted(self.unsettled)
                )
                if self.unsettled
                else (),
            )
            if proof.holds(k, self.now, structure, leases, self.lend_s, lambda: self._snapshot(())):
                self.proven += 1
                if self.s.check_quiet:
                    plan = assess(self._snapshot(()), self.s.config, self.now)
                    assert not plan.acts, f"tick {k} proven quiet, but assess acts: {plan}"
                return True
        return not assess(self._snapshot(()), self.s.config, self.now).acts

    def _node_view(self, node: SimNode, leased: set[str] | None = None) -> NodeView:
        """`leased`: the names of the nodes with an open lease (None: looked up)."""
        every = self.s.checkpoint_s
        now, running = self.now, node.jobs
        jobs = []
        for job_id in sorted(running):  # `fleet.running_on(node)`
            r = running[job_id]
            job = r.job
            at = r.checkpoint_at(now, every) if every and job.kind == "elastic" else None
            if at is None and r.view_run == r.run:  # the view made for this run (a job
                jobs.append(r.view)  # on many nodes, or seen before)
                continue
            view = _job_view(
                job_id,
                job.gpus_per_node * job.nodes,
                r.started_at,
                r.restarts,
                r.submitted_at,
                at,
            )
            if at is None:
                r.view, r.view_run = view, r.run
            jobs.append(view)
        if leased is None:
            held = any(lease.node is node for lease in self.leases.values())
        else:
            held = node.name in leased
        return _node_view(node.name, node.pool, node.gpus, tuple(jobs), node.triton or held)

    def snapshot(self) -> Snapshot:
        if self.s.checkpoint_s:  # checkpoints move with time: a node with jobs is stale
            self.stale.update(n.index for n in self.policy_nodes if n.jobs)
        leased = {lease.node.name for lease in self.leases.values()}
        view_at, views, nodes = self.view_at, self.views, self.policy_nodes
        for index in self.stale:
            at = view_at.get(index)
            if at is not None:
                views[at] = self._node_view(nodes[at], leased)
        self.stale.clear()
        return self._snapshot(tuple(views))

    def _snapshot(self, nodes: tuple[NodeView, ...]) -> Snapshot:
        # `last_lend_at` holds, per model, the latest anchor (serving: since when; else its
        # creation) of any lease that carried it: kept up to date by `_act` (creation) and
        # `_move` (to serving), the only places an anchor changes
        while self.victims and self.now - self.victims[0] >= 3600.0:
            self.victims.popleft()
        return Snapshot(
            nodes,
            tuple(self.replica_views),
            {m: tuple(h) for m, h in self.history.items()},
            tuple(self._lease_view(lease) for lease in self.leases.values()),
            dict(self.last_lend_at),
            dict(self.lend_s),
            len(self.victims),
            self.specs,
        )

    def _lease_view(self, lease: SimLease) -> LeaseView:
        """`lease.view()`, made again only when what it shows changed."""
        waiting = lease.lend_mode == "drain" and lease.running_at is None and bool(lease.node.jobs)
        key = (lease.state, lease.updated_at, waiting)
        cached = self._lease_views.get(lease.lease_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        view = lease.view(self.replica_gpus)
        self._lease_views[lease.lease_id] = (key, view)
        return view

    # ---- the run ---------------------------------------------------------------------

    def run(self, progress: Callable[[float, float], None] | None = None) -> PolicyResult:
        """Play the whole horizon. Python's cyclic garbage collector is paused meanwhile:
        the run makes no reference cycles, but millions of objects live through it (the
        jobs), which each full collection would walk (a third of a long run's time)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if collecting:
                gc.enable()

    def _run(self, progress: Callable[[float, float], None] | None) -> PolicyResult:
        started = time.perf_counter()
        every = max(1, round(self.s.series_step_s / self.tick_s))
        hour = max(1, round(3600 / self.tick_s))
        always = self.s.always_decide
        for k in range(self.ticks):
            t_end = (k + 1) * self.tick_s
            self._advance(t_end)  # (it ends with a scheduling pass)
            self._serve(k)
            if self.unsettled:  # (`_sync` moves only these)
                self._sync()
            if always or not self._quiet(k):
                self.decide_calls += 1
                for action in decide(self.snapshot(), self.s.config, self.now):
                    self._act(action)
            if self.dirty_sched:
                self._schedule()
            if (k + 1) % every == 0:
                self._sample()
            if progress is not None and (k + 1) % hour == 0:
                progress(t_end, self.s.horizon_s)
        self.fleet.usage.accrue(self.now)
        return self._result(time.perf_counter() - started)

    def _sample(self) -> None:
        usage = self.fleet.usage.gpus
        totals = {
            use: sum(u[use] for u in usage.values())
            for use in ("training", "elastic", "inference", "idle")
        }
        totals["idle"] += sum(u["fenced"] for u in usage.values())
        values = {
            "requests_per_s": self._tick_requests,
            "worst_p99_over_slo": min(self._tick_worst, 99.0),
            "replicas": float(sum(g.nodes for g in self.groups.values())),
            "lent_nodes": float(len(self.leases)),
            "gpus_training": float(totals["training"]),
            "gpus_elastic": float(totals["elastic"]),
            "gpus_inference": float(totals["inference"]),
            "gpus_idle": float(totals["idle"]),
            "pending_training": float(self.fleet.pending_count("training")),
            "pending_elastic": float(self.fleet.pending_count("elastic")),
        }
        for key in SERIES:
            self.series[key].append(values[key])

    def _result(self, wall_s: float) -> PolicyResult:
        pools: dict[str, int] = {}
        for node in self.nodes:
            pools[node.pool] = pools.get(node.pool, 0) + 1
        gpu_hours = {
            pool: {use: s / 3600.0 for use, s in uses.items()}
            for pool, uses in self.fleet.usage.seconds.items()
        }
        of_kind: dict[str, list[JobRun]] = {kind: [] for kind in _KINDS}
        for run in self.fleet.runs.values():  # one pass over the runs, in their order
            mine = of_kind.get(run.job.kind)
            if mine is not None:
                mine.append(run)
        queues = {kind: _queue(of_kind[kind], self.now) for kind in _KINDS}
        return PolicyResult(
            policy=self.s.name,
            description=self.s.description,
            pools=pools,
            models=self.outcome,
            gpu_hours=gpu_hours,
            queues=queues,
            inference_used_gpu_hours=self.inference_used_s / 3600.0,
            preemptions=self.fleet.preemptions,
            gpu_hours_lost=self.fleet.lost_gpu_s / 3600.0,
            lends=self.lends,
            returns=self.returns,
            lends_by_pool=self.lends_by_pool,
            decisions=self.decisions,
            series=self.series,
            series_step_s=self.s.series_step_s,
            decide_calls=self.decide_calls,
            ticks=self.ticks,
            wall_s=wall_s,
        )


_KINDS = ("training", "elastic")


def _window_quantile(
    window: Sequence[tuple[float, float]], requests: Sequence[float]
) -> float | None:
    """`latency.window_quantile_of` of a group's window ((quantile, requests) of each
    tick, and the requests alone): most often the slowest tick alone holds the share of
    requests over the quantile, and this finds it without a Python loop."""
    total = sum(requests)  # (`window_quantile_of`'s sum: the same terms, in order)
    if total <= 0:
        return None
    top = max(window)  # the slowest tick, the most requests among equals
    if top[1] > 0 and top[1] >= (1.0 - latency.Q) * total:
        return top[0]
    return latency.window_quantile_of([(n, extra) for extra, n in window])


def _window_start(born: float, now: float) -> float:
    """The oldest observation time in a Triton summary at `now` (see AGE_BUCKETS)."""
    rotation = WINDOW_S / AGE_BUCKETS
    last = born + math.floor((now - born) / rotation) * rotation
    return last - (WINDOW_S - rotation)


def _per_tick(arrivals: ArrivalSeries, model: str, tick_s: float, ticks: int) -> list[float]:
    """The model's mean rate over each tick (the series' steps need not match ticks)."""
    rates = np.asarray(arrivals.rates[model], dtype=float)
    step = arrivals.step_s
    if math.isclose(step, tick_s):
        out = np.zeros(ticks)
        n = min(ticks, len(rates))
        out[:n] = rates[:n]
        return [float(x) for x in out]
    edges = np.arange(len(rates) + 1) * step
    cum = np.concatenate(([0.0], np.cumsum(rates * step)))
    at = np.arange(ticks + 1) * tick_s
    return [float(x) for x in np.diff(np.interp(at, edges, cum)) / tick_s]


def _queue(mine: Sequence[JobRun], now: float) -> QueueOutcome:
    """The queue outcome of one kind's runs (one pass over them: a month's run has
    millions; each mean and percentile reads one array)."""
    waits: list[float] = []
    completion: list[float] = []
    work: list[float] = []
    started = 0
    for r in mine:
        job = r.job
        waits.append(r.wait_s if r.wait_s is not None else now - job.submit_s)
        if r.first_started_at is not None:
            started += 1
        if r.ended_at is not None:
            completion.append((r.ended_at or now) - job.submit_s)
            work.append(job.gpus_per_node * job.nodes * job.duration_s)
    wait_at = np.asarray(waits, dtype=float)
    done_at = np.asarray(completion, dtype=float)
    return QueueOutcome(
        submitted=len(mine),
        started=started,
        finished=len(completion),
        wait_mean_s=float(np.mean(wait_at)) if waits else 0.0,
        wait_p95_s=float(np.percentile(wait_at, 95)) if waits else 0.0,
        completion_mean_s=float(np.mean(done_at)) if completion else 0.0,
        completion_p95_s=float(np.percentile(done_at, 95)) if completion else 0.0,
        gpu_hours_done=sum(work) / 3600.0,
    )
