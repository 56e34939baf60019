"""The simulated cluster of one run: simulated time, Slurm's side of it and the bridge's
Triton jobs on it. Arrivals and events are processed in time order (job arrivals and
ends, requeues becoming eligible, Triton jobs starting and ending), and Slurm schedules
when events arrive (a pass per instant with events: `bridge.sim.fleet`); a Triton job
starts on its node after the lab's measured delay (a preempt-mode lend's node has its
jobs requeued then; a drain-mode lend's job waits until its node is free), its server is
ready `triton_ready_s` later (plus its models' load, from its node's weight cache or the
shared repository: `bridge.sim.weights`), and it ends `cancel_s` after its cancel.

A lease holds whole nodes (node-granular: its node, and for a replica that spans nodes
the gang's others, `SimLease.more`) or some GPUs of nodes (GPU-granular:
`SimLease.claims`, `bridge.sim.lending`): a claim takes the node's free GPUs at the
lend, and the rest from the jobs `bridge.policy.victims.choose_victims` picks when the
Triton job starts (preempt) or as the node's jobs end (drain); the node's other GPUs keep
running batch work. Work lost to a requeue is counted by `Fleet.preempt` in both.

`Cluster` is the engine's base (`bridge.sim.engine.Engine`, which adds the bridge: its
ticks, leases and policy); `SimLease` is a simulated lease, its modelled times those of
its Triton job here. The hot loop (`_advance`: a job's arrival, start and end) is
written out rather than layered; `tests/unit/test_sim_speed.py` compares its shortcuts
with the plain code.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from bridge.lifecycle import LeaseState
from bridge.policy import LeaseView, NodeView
from bridge.policy.leasesync import ModelledLease
from bridge.policy.victims import choose_victims
from bridge.sim.fleet import Fleet, JobRun, SimNode
from bridge.sim.setup import Setup
from bridge.sim.views import job_view, node_view
from bridge.sim.weights import NodeCaches


@dataclass(eq=False, slots=True)
class Claim:
    """GPU-granular: the GPUs of one node a lease holds (`gpus`), of which `claimed` are
    taken from the node's free GPUs so far; `served` once its Triton job runs on them."""

    node: SimNode
    gpus: int
    claimed: int = 0
    served: bool = False

    @property
    def owed(self) -> int:
        """GPUs still held by the node's jobs."""
        return self.gpus - self.claimed


@dataclass(eq=False)
class SimLease(ModelledLease):
    """A simulated lease: its view and modelled times (`ModelledLease`), and its node. It
    is born `submitted` (`born`): the simulated act step records the lend and submits
    its Triton job in the same instant (the reconciler's requested -> submitted, which
    takes no simulated time). It then changes state only through `Engine._move`, which
    checks each move against `bridge.lifecycle.TRANSITIONS`."""

    node: SimNode = field(kw_only=True)
    #: a drain lease's Triton job has been given its start (the node became free)
    queued: bool = field(default=False, kw_only=True)
    #: a drain lease found its node busy when it was made (it waited for the jobs)
    waited: bool = field(default=False, kw_only=True)
    #: the seconds its models' load took on its node (from its cache or the shared
    #: repository: `bridge.sim.weights`), set when its Triton job runs
    held_load_s: float = field(default=0.0, kw_only=True)
    #: node-granular, a replica that spans nodes: the gang's nodes besides `node`
    more: tuple[SimNode, ...] = field(default=(), kw_only=True)
    #: GPU-granular: the GPUs it holds, per node (`node` the first's); empty: whole nodes
    claims: tuple[Claim, ...] = field(default=(), kw_only=True)

    @property
    def nodes(self) -> tuple[SimNode, ...]:
        """Every node it holds GPUs of."""
        if self.claims:
            return tuple(c.node for c in self.claims)
        return (self.node, *self.more)

    def gpus(self) -> int:
        """The GPUs it holds (or will): its claims', or its nodes' whole."""
        if self.claims:
            return sum(c.gpus for c in self.claims)
        return sum(n.gpus for n in self.nodes)

    def partial_gpus(self) -> int | None:
        """The GPUs its replica holds when they are some of one node's (a partial lease,
        `Lend.gpus`); None when it holds nodes whole (a gang's claims are whole nodes)."""
        claims = self.claims
        if len(claims) == 1 and claims[0].gpus < claims[0].node.gpus:
            return claims[0].gpus
        return None

    def owes(self) -> bool:
        """Its Triton job cannot run yet: some GPUs it needs are held by jobs."""
        if self.claims:
            return any(c.owed for c in self.claims)
        return any(n.jobs for n in self.nodes)

    @classmethod
    def born(
        cls,
        lease_id: int,
        node: SimNode,
        pool: str,
        lend_mode: str,
        models: tuple[str, ...],
        now: float,
        gpus: int = 1,
    ) -> SimLease:
        """A lend made at `now`, its Triton job submitted (`sim-<id>`)."""
        view = LeaseView(
            lease_id,
            node.name,
            pool,
            lend_mode,
            LeaseState.SUBMITTED,
            models,
            now,
            now,
            slurm_job_id=f"sim-{lease_id}",
            gpus=gpus,
        )
        return cls(view, node=node)

    @property
    def lease_id(self) -> int:
        """`id`, by the name the tracing engine (`bridge.sim.labcheck`) reads."""
        return self.view.id


class Cluster:
    """The simulated cluster: its nodes and jobs, the event heap, Slurm's passes and the
    bridge's Triton jobs (see the module docstring)."""

    def __init__(self, setup: Setup) -> None:
        self.s = setup
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
        reserved = {p for p, pc in setup.config.pools.items() if pc.lend_mode == "reserved"}
        #: the nodes of the reserved pools: their baseline Triton servers run from the start
        self.reserved_nodes = [n for n in self.nodes if n.pool in reserved]
        for node in self.reserved_nodes:
            node.triton = True
        self.fleet = Fleet(
            self.nodes, runs, setup.timing.requeue_delay_s, checkpoint_s=setup.checkpoint_s
        )
        #: the nodes' weight caches (`bridge.sim.weights`); None: every load is shared
        spec = setup.timing.cache()
        self.caches = (
            None
            if spec is None
            else NodeCaches(spec, setup.timing.model_load_s, setup.timing.local_load_s)
        )
        #: indexes of the nodes whose jobs changed since the policy's last view of them
        self.stale: set[int] = set()
        #: a scheduling pass is due
        self.dirty_sched = True
        #: drain-mode leases, by id, that may still need their Triton job's start
        self.drain_pending: dict[int, SimLease] = {}
        #: when each job was requeued by a Triton job's start (the preemption budget's)
        self.victims: deque[float] = deque()

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
            if lease.view.state != LeaseState.SUBMITTED or lease.running_at is not None:
                return
            node = lease.node
            if lease.claims:
                self._serve_claims(lease)
            else:
                for held in lease.nodes:
                    for run in list(self.fleet.running_on(held)):
                        self._requeue(run)
                    self.fleet.take(held, self.now)
                self._touch(lease.nodes)
            lease.running_at = self.now
            timing = self.s.timing
            models = lease.view.models
            caches = self.caches
            if caches is None:
                load = timing.load_s(models)
            else:
                load = caches.load_s(node, models, self.now)
            lease.held_load_s = load
            lease.ready_at = self.now + timing.triton_ready_s + load
            if caches is not None:
                caches.served(node, models, self.now, lease.ready_at)
            self.dirty_sched = True
        elif kind == "triton_gone":
            lease = payload
            assert isinstance(lease, SimLease)
            if lease.claims:
                self._release_claims(lease)
                self.dirty_sched = True
                return
            for node in lease.nodes:
                if node.triton:
                    self.fleet.give_back(node, self.now)
                    self._touch([node])
                    self.dirty_sched = True

    def _requeue(self, run: JobRun) -> None:
        """A Triton job's start requeues `run` (its work lost: `Fleet.preempt`)."""
        self._touch(self.fleet.preempt(run, self.now))
        self.victims.append(self.now)
        self._at(self.now + self.s.timing.requeue_delay_s, "eligible", None)

    # ---- GPU-granular leases -----------------------------------------------------------

    def _claim_free(self, lease: SimLease) -> None:
        """Each claim of the lease takes what it still owes of its node's free GPUs."""
        for claim in lease.claims:
            n = min(claim.owed, claim.node.free)
            if n > 0:
                self.fleet.claim(claim.node, n, self.now)
                claim.claimed += n
                self._touch([claim.node])

    def _serve_claims(self, lease: SimLease) -> None:
        """The lease's Triton job starts: what its claims still owe is freed by requeueing
        the jobs `choose_victims` picks on each node (the fewest GPUs of batch work; the
        policy's limits were applied when the node was chosen), and it runs on them."""
        self._claim_free(lease)
        for claim in lease.claims:
            if claim.owed:
                view = self.victim_view(claim.node)
                victims = choose_victims(view, claim.owed, self.now, triton_gpus=claim.node.held)
                assert victims is not None, f"{claim.node.name}: {claim.owed} GPUs not freed"
                for job_id in victims.jobs:
                    self._requeue(claim.node.jobs[job_id])
                self._claim_free(lease)
            assert not claim.owed, f"{claim.node.name}: {claim.owed} GPUs still owed"
            self.fleet.serve(claim.node, claim.gpus, self.now)
            claim.served = True
        self._touch(lease.nodes)

    def _release_claims(self, lease: SimLease) -> None:
        """The GPUs the lease holds are Slurm's again (its job gone, or never run)."""
        for claim in lease.claims:
            self.fleet.unclaim(claim.node, claim.claimed, self.now, served=claim.served)
            claim.claimed = 0
            claim.served = False
            self._touch([claim.node])

    def victim_view(self, node: SimNode) -> NodeView:
        """The node as `bridge.policy.victims` reads it: its running jobs, each with its
        GPUs on this node, and the GPUs leases hold there as `triton_gpus`."""
        every = self.s.checkpoint_s
        jobs = []
        for job_id in sorted(node.jobs):
            run = node.jobs[job_id]
            job = run.job
            at = run.checkpoint_at(self.now, every) if every and job.kind == "elastic" else None
            here = job.gpus_per_node if job.nodes > 1 else None
            jobs.append(
                job_view(
                    job_id,
                    job.gpus_per_node * job.nodes,
                    run.started_at,
                    run.restarts,
                    run.submitted_at,
                    at,
                    here,
                )
            )
        return node_view(
            node.name, node.pool, node.gpus, tuple(jobs), node.triton, triton_gpus=node.held
        )

    def _drain_ready(self) -> None:
        """Drain-mode leases whose node just became free start their Triton job. Only the
        drain leases not yet given their start are looked at (in lease order); one that
        never will be (queued, cancelled, past submitted) leaves that list."""
        gone = []
        for lease_id, lease in self.drain_pending.items():
            pending = lease.view.state == LeaseState.SUBMITTED and lease.running_at is None
            if not pending or lease.queued:
                gone.append(lease_id)
                continue
            if lease.claims:
                self._claim_free(lease)
            if not lease.owes():
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
