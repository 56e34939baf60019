"""The event loop: simulated time, ticks of the bridge, and the real policy.

`Engine(setup).run()` plays one policy over the whole horizon. Between ticks it processes
the fleet's events in time order (job arrivals, ends, requeues becoming eligible, Triton
jobs starting and ending); at each tick, in the reconciler's order:

1. the latency model advances every replica group over the tick just ended and each
   model gets the `ModelSample` the observe step would have read (`bridge.sim.serving`);
2. passive sync: each open lease takes at most one step of the daemon's own per-state
   sync (`bridge.policy.leasesync`, the planner's), on the world the simulated fleet
   shows it (`ModelledLease.world`: its Triton job runs, is ready and is gone at the
   times the events set; a tick drains it), carried out here (`_carry_out`: routing in
   and out, cancels); the simulated world is never late, so it runs without deadlines;
3. `bridge.policy.decide` runs on a `Snapshot` of the simulated world;
4. its actions are carried out on the simulated Slurm with timings measured on the lab
   (`Timing`); a return is the sync's own `return_step`; a place (model placement) takes
   the models its lease's replica drops out of its replica group at once, and routes the
   models it gains on the first tick their load (`Timing.load_s`) is over (`_loaded`;
   meanwhile the replica's view holds the models it kept: the lease is mid-placement).
   A lend takes whole nodes, or with `Setup.granularity` "gpu" the GPUs of its replica
   (`bridge.sim.lending`: where, and which jobs go); a replica that spans nodes is a gang
   of whole nodes in both, or refused when no gang is free (all or nothing). A partial
   lease's replica serves on its own GPUs (`Serving.servers`: one execution per GPU it
   holds, not per GPU of its node), and the policy sees it so (`ReplicaView.gpus`,
   `LeaseView.gpus` and `lent_gpus` its GPUs), as the daemon's observation shows it.

Ticks at which decide can only answer "nothing" skip the call (`_quiet`: no lease to
abandon or return, no lend possible); the tests check that this changes no decision. Most
such ticks are proven quiet by `bridge.sim.quiet` without running `assess` at all
(`Setup.prove_quiet`; `Setup.check_quiet` runs assess on them too and fails if it would
act; not in GPU-granular runs, whose partial leases' replicas the proof, which keys every
replica by the node's GPUs, does not model: there assess runs on every tick). The rest
is incremental: replica groups' layout, lease views and the free-GPU index are kept up
to date rather than rebuilt each tick; results are those of the plain loop
(`tests/unit/test_sim_golden.py` compares them with a recording made before). The
hot paths (a job's arrival, start and end; the latency model's tick) are written out
rather than layered (a job that comes alone at its instant, with no job waiting, is
started without entering the queue: `Fleet.start_alone`; the latency model's tick is
kept as plain numbers; samples and views are made by `bridge.sim.views`): the shortcuts
are each compared with the plain code in `tests/unit/test_sim_speed.py`.
Slurm schedules when events arrive (a pass per instant with events), the bridge acts on
ticks only, so routing changes, and with them the latency model's replica groups, happen
on ticks. The run's inputs are `bridge.sim.setup`'s (named here too), its counts and
result `bridge.sim.tally`'s.
"""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from bridge.config import ModelConfig
from bridge.lifecycle import LeaseState, check
from bridge.modelfacts import toml_models
from bridge.policy import (
    Action,
    LeaseView,
    Lend,
    NodeView,
    Place,
    ReplicaView,
    Return,
    Snapshot,
    StartBaseline,
    assess,
    decide,
    history_depth,
)
from bridge.policy.forecast import next_lead
from bridge.policy.gang import lend_gpus, nodes_per_replica
from bridge.policy.leasesync import (
    LeaseWorld,
    modelled_settings,
    return_step,
    sync_lease,
)
from bridge.policy.returns import PeakLog, ReturnLog
from bridge.policy.seasonal import SeasonLog
from bridge.policy.snapshot import shares_node
from bridge.policy.steps import Cancel, RouteIn, RouteOut, Step
from bridge.policy.timing import pool_slowest
from bridge.sim.cluster import Claim, Cluster, SimLease
from bridge.sim.fleet import SimNode
from bridge.sim.lending import Rules, check_granularity, place_gang
from bridge.sim.quiet import LeaseFacts, QuietProof
from bridge.sim.result import Decision, PolicyResult
from bridge.sim.serving import Serving
from bridge.sim.setup import Setup, Timing
from bridge.sim.tally import Tally
from bridge.sim.views import job_view as _job_view
from bridge.sim.views import node_view as _node_view

#: the simulated world has no Slurm reservation: its fence is the fleet's, set at the lend
#: and lifted when the lease is returned (both lend modes)
_NO_FENCE = LeaseWorld(True)
#: the sync's settings here: no deadline (the simulated world is never late)
_SETTINGS = modelled_settings()


class Engine(Cluster):
    """One policy's run on the simulated cluster (see the module docstring)."""

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        cfg = setup.config
        self.tick_s = cfg.tick_s
        #: "node" or "gpu": what a lend takes (`bridge.sim.lending`)
        self.granularity = check_granularity(setup.granularity)
        #: the models the policy scales (the snapshot's `models`)
        self.specs: dict[str, ModelConfig] = (
            dict(setup.models) if setup.models is not None else toml_models(cfg)
        )
        self.models = list(self.specs)
        #: per LLM (a model with a token objective and a token workload), its replica's
        #: token profile: the snapshot's `token_profiles`, as the daemon reads them
        self.token_profiles = {
            m: tm.profile
            for m, tm in setup.tokens.items()
            if m in self.specs and self.specs[m].has_token_slo
        }
        unknown = [m for m in self.models if m not in setup.arrivals.rates]
        if unknown:
            raise ValueError(f"no arrivals for models {', '.join(unknown)}")
        missing = [m for m in self.models if m not in setup.service_s]
        if missing:
            raise ValueError(f"no service time for models {', '.join(missing)}")
        typed = [f"{m} ({s.gpu_type})" for m, s in self.specs.items() if s.gpu_type]
        if typed:  # its nodes have no GRES types: such a lend would never be made
            raise ValueError(
                "the simulator does not model GPU types or MIG slices; models with a "
                f"gpu_type: {', '.join(typed)} (leave gpu_type out to simulate them)"
            )
        self.ticks = math.ceil(setup.horizon_s / self.tick_s)
        super().__init__(setup)
        self.leases: dict[int, SimLease] = {}
        #: ids of the open leases that `_sync` may move (any not serving)
        self.unsettled: set[int] = set()
        self.next_lease = 1
        self.last_lend_at: dict[str, float] = {}
        #: the models' returns and rate peaks, as the daemon's LendMemory keeps them
        self.returns = ReturnLog()
        self.peaks = PeakLog(cfg.policy.return_dwell_max_s)
        #: the models' bucket means by time of day (the seasonal forecast); None: off
        days = cfg.policy.seasonal_days
        self.seasons = SeasonLog(days) if days > 0 else None
        depth = history_depth(cfg)
        self.baseline = tuple(sorted(self.models))
        #: parallel model instances on one replica (one per GPU)
        node_gpus = max((n.gpus for n in self.nodes), default=1)
        self.replica_gpus = setup.replica_servers or node_gpus
        #: the replica groups, the latency model and each model's outcome and samples
        self.serving = Serving(setup, self.specs, self.ticks, depth, node_gpus, self.replica_gpus)
        self.history = self.serving.history
        for _ in self.reserved_nodes:
            self.serving.join(self.baseline, 1, self.now)
        self.replica_views: list[ReplicaView] = [
            ReplicaView(n.name, self.baseline, gpus=self.replica_gpus) for n in self.reserved_nodes
        ]
        #: bumped at each change of `replica_views` (the quiet proof's structure key)
        self.replica_version = 0
        #: ticks proven quiet without running assess
        self.proven = 0
        self.proof = (
            QuietProof(
                cfg,
                self.models,
                self.serving.rates,
                self.tick_s,
                depth,
                self.replica_gpus,
                self.specs,
                setup.timing.model_load_s,
                llms={m: setup.tokens[m] for m in self.token_profiles},
            )
            if setup.prove_quiet and not setup.always_decide and self.granularity == "node"
            else None
        )
        #: NodeViews of the nodes in the policy's pools, rebuilt only when a node changes
        self.policy_nodes = [n for n in self.nodes if n.pool in cfg.pools]
        self.view_at = {n.index: i for i, n in enumerate(self.policy_nodes)}
        self.views: list[NodeView] = [self._node_view(n) for n in self.policy_nodes]
        #: `views` as a tuple, made again when a view changes (`_nodes`)
        self.node_views = tuple(self.views)
        self.tally = Tally()
        #: per pool, the running estimate of lend-to-serving seconds (as the daemon keeps)
        self.lend_s: dict[str, float] = {}
        #: per pool, the slowest load of the models of the lends timed into `lend_s`
        self.lend_load_s: dict[str, float] = {}
        #: per model, its load time as the daemon would have measured it (`--load-s`)
        self.load_s = dict(setup.timing.model_load_s)
        #: per model, its load time from a node's cache (the snapshots' `local_load_s`;
        #: empty without caches)
        self.local_load_s = dict(setup.timing.local_load_s) if self.caches is not None else {}
        #: (old, new) -> how many times a lease made that move in this run
        self.moves: Counter[tuple[LeaseState, LeaseState]] = Counter()
        #: leases mid-placement: id -> (when its gained models are loaded, the models its
        #: replica holds meanwhile)
        self.loading: dict[int, tuple[float, tuple[str, ...]]] = {}

    # ---- the replicas ------------------------------------------------------------------

    def _serve(self, k: int) -> None:
        """The latency model over tick k (`Serving.serve`); the quiet proof counts its
        samples."""
        samples = self.serving.serve(k)
        add = self.peaks.add
        for m, sample in zip(self.models, samples, strict=True):
            add(m, sample.at, sample.request_rate)
        if self.seasons is not None:
            season = self.seasons.add
            for m, sample in zip(self.models, samples, strict=True):
                season(m, sample.at, sample.request_rate)
        if self.proof is not None:
            self.proof.observe_all(samples)

    def _route(self, lease: SimLease, n: int) -> None:
        """The lease's replica into routing (n = 1) or out of it (n = -1)."""
        view = lease.view
        loading = self.loading.pop(view.id, None)  # (out mid-placement: what it holds)
        held = lease.partial_gpus()
        self.serving.join(view.models if loading is None else loading[1], n, self.now, held)
        if n > 0:
            replica = ReplicaView(view.node, view.models, view.id, self.serving.servers(held))
            self.replica_views.append(replica)
        else:
            self.replica_views = [r for r in self.replica_views if r.lease_id != view.id]
        self.replica_version += 1

    def _relayout(self, lease: SimLease, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """The lease's replica, in routing, moves from the group of `old` to that of `new`
        (its view holds `new`)."""
        held = lease.partial_gpus()
        if old:
            self.serving.join(old, -1, self.now, held)
        if new:
            self.serving.join(new, 1, self.now, held)
        view = lease.view
        replica = ReplicaView(view.node, new, view.id, self.serving.servers(held))
        self.replica_views = [replica if r.lease_id == view.id else r for r in self.replica_views]
        self.replica_version += 1

    def _place(self, lease: SimLease, models: tuple[str, ...]) -> None:
        """A `Place`: the models dropped leave the replica's group now, the lease's models
        become `models`, and the models gained serve once loaded (at once without a load
        time)."""
        old = lease.view.models
        kept = tuple(m for m in old if m in models)
        gained = [m for m in models if m not in old]
        lease.view = replace(lease.view, models=models)
        caches = self.caches
        if caches is None:
            load = self.s.timing.load_s(gained)
        else:
            load = caches.load_s(lease.node, gained, self.now)
            caches.served(lease.node, gained, self.now, self.now + load)
            self._touch([lease.node])
        if load > 0:
            self._relayout(lease, old, kept)
            self.loading[lease.view.id] = (self.now + load, kept)
        else:
            self._relayout(lease, old, models)

    def _loaded(self) -> None:
        """The leases mid-placement whose gained models are loaded serve them now."""
        now = self.now
        for lease_id, (at, kept) in list(self.loading.items()):
            if at <= now:
                del self.loading[lease_id]
                lease = self.leases[lease_id]
                self._relayout(lease, kept, lease.view.models)

    # ---- leases (the reconciler's passive sync and act) -------------------------------

    def _sync(self) -> None:
        """Each open lease not serving takes at most one step of the per-state sync, in
        lease order. (A serving lease's world does not change until it is given back: its
        job runs and its server is ready, so the sync would leave it as it is.)"""
        now = self.now
        for lease in [self.leases[i] for i in sorted(self.unsettled)]:
            step = sync_lease(lease.view, lease.world(now), now, _SETTINGS)
            if step is not None:
                self._carry_out(lease, step)

    def _carry_out(self, lease: SimLease, step: Step) -> None:
        """A step of the sync (or a return) on the simulated fleet: routing in and out, a
        cancel (once: a lease releasing is asked again until its job is gone); unloads
        take no time here. Then its move, and what it means for the fleet: a lend that
        did not wait for jobs times the lead to serving; a returned lease gives its node
        back."""
        for command in step.commands:
            if isinstance(command, RouteIn):
                self._route(lease, 1)
            elif isinstance(command, RouteOut):
                self._route(lease, -1)
            elif isinstance(command, Cancel) and lease.gone_at is None:
                self._cancel(lease)
        move = step.move
        if move is None:
            return
        self._move(lease, move.new)
        view = lease.view
        if move.new == LeaseState.SERVING and not lease.waited:
            took = self.now - view.created_at
            self.lend_s[view.pool] = next_lead(self.lend_s.get(view.pool), took)
            held = lease.held_load_s  # (from its node's cache or the shared repository)
            self.lend_load_s[view.pool] = next_lead(self.lend_load_s.get(view.pool), held)
        elif move.new == LeaseState.RETURNED:
            for node in lease.nodes:
                if node.fenced:
                    self.fleet.unfence(node, self.now)
                    self.dirty_sched = True
            if lease.claims:  # (claimed, its job never run: released here)
                self._release_claims(lease)
                self.dirty_sched = True
            del self.leases[view.id]
            self._touch(lease.nodes)

    def _move(self, lease: SimLease, state: LeaseState) -> None:
        """The one place a simulated lease changes state: a move the lifecycle table
        forbids raises `IllegalMove` (the simulator would be modelling a bridge that cannot
        exist); each move made is counted in `moves`."""
        view = lease.view
        old = view.state
        check(old, state, lease_id=view.id)
        lease.view = replace(view, state=state, updated_at=self.now)
        self.moves[old, state] += 1
        if state in (LeaseState.RETURNED, LeaseState.SERVING):
            self.unsettled.discard(view.id)
        else:
            self.unsettled.add(view.id)
        if state == LeaseState.SERVING:
            for m in view.models:
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
        tally = self.tally
        if isinstance(action, Lend):
            mode = action.lend_mode
            taken = self._taken(action)
            if taken is None:  # no room for its replica (a gang): nothing lent
                if len(tally.decisions) < self.s.max_decisions:
                    why = f"refused, no room for its replica in {action.pool}: {action.reason}"
                    tally.decisions.append(
                        Decision(now, "refused", action.node, action.models, why)
                    )
                return
            nodes, claims = taken
            node = nodes[0]
            lease = SimLease.born(
                self.next_lease, node, action.pool, mode, action.models, now, self.replica_gpus
            )
            lease.more, lease.claims = (nodes[1:], ()) if not claims else ((), claims)
            share = lease.partial_gpus()
            if share is not None:  # as the daemon sees a partial lease: its GPUs
                servers = self.serving.servers(share)
                lease.view = replace(lease.view, gpus=servers, lent_gpus=share)
            self.next_lease += 1
            lease.waited = mode == "drain" and lease.owes()
            self.leases[lease.id] = lease
            self.unsettled.add(lease.id)
            if mode == "drain":
                self.drain_pending[lease.id] = lease
            for m in action.models:
                self.last_lend_at[m] = now
            self.returns.lent(action.models, now)
            if claims:
                self._claim_free(lease)
            else:
                for held in nodes:
                    self.fleet.fence(held, now)
            self._touch(nodes)
            tally.lends += 1
            tally.lends_by_pool[action.pool] = tally.lends_by_pool.get(action.pool, 0) + 1
            timing = self.s.timing
            if mode == "preempt":
                delay = timing.preempt_start_s if lease.owes() else timing.slurm_start_s
                self._at(now + delay, "triton_run", lease)
            else:
                self._drain_ready()
        elif isinstance(action, Return):
            lease = self.leases[action.lease_id]
            tally.returns += 1
            self.returns.returned(lease.view.models, now)
            step = return_step(lease.view, action.reason, _NO_FENCE)
            if step is not None:
                self._carry_out(lease, step)
        elif isinstance(action, Place):
            lease = self.leases[action.lease_id]
            assert action.lease_id not in self.loading, f"placed again: {action}"
            need = lend_gpus(self.specs, action.models)
            if need is not None and need > lease.gpus():  # its replica would not fit
                if len(tally.decisions) < self.s.max_decisions:
                    why = f"refused, needs {need} GPUs, holds {lease.gpus()}: {action.reason}"
                    node_name = lease.view.node
                    tally.decisions.append(Decision(now, "refused", node_name, action.models, why))
                return
            self._place(lease, action.models)
        elif isinstance(action, StartBaseline):  # the sim starts with every baseline up
            raise AssertionError(f"baseline requested for {action.node}")
        if len(tally.decisions) < self.s.max_decisions:
            kind = {Lend: "lend", Return: "return", Place: "place"}.get(type(action), "baseline")
            node_name = action.node if isinstance(action, StartBaseline) else ""
            if isinstance(action, Lend):  # (GPU-granular: the node its GPUs are on)
                node_name = self.leases[self.next_lease - 1].view.node
            models: tuple[str, ...] = action.models if isinstance(action, (Lend, Place)) else ()
            if isinstance(action, Place):
                node_name = self.leases[action.lease_id].view.node
            if isinstance(action, Return):
                view = self.leases[action.lease_id].view
                node_name, models = view.node, view.models
            tally.decisions.append(Decision(now, kind, node_name, models, action.reason))

    def _taken(self, lend: Lend) -> tuple[tuple[SimNode, ...], tuple[Claim, ...]] | None:
        """What the lend takes. A replica that fits a node: the policy's choice, its node
        whole, or with `Lend.gpus` (a partial lend: `bridge.policy.nodes.choose_nodes`
        with `[policy] partial_lends`, GPU-granular runs) those GPUs of it, one claim. A
        replica that spans nodes, which the bridge does not lend yet: a gang of whole
        nodes placed here (`bridge.sim.lending.place_gang`), or None when none is free
        (all or nothing); None too for the policy's node when a gang placed earlier in
        the pass took it (the policy did not choose the gang's nodes), or when it holds
        leases a lend of some GPUs may not stand beside (`_beside`)."""
        node = self.by_name[lend.node]
        k = lend_gpus(self.specs, lend.models)
        n = 1 if k is None else nodes_per_replica(k, node.gpus)
        leased = {held.name for lease in self.leases.values() for held in lease.nodes}
        if n == 1:
            if node.name in leased and not self._beside(node, lend):
                return None
            return ((node,), ()) if lend.gpus is None else ((node,), (Claim(node, lend.gpus),))
        candidates = [
            self.victim_view(m)
            for m in self.nodes
            if m.pool == lend.pool and not m.triton and not m.fenced and m.name not in leased
        ]
        rules = Rules.of(self.s.config.policy, len(self.victims))
        preempt = lend.lend_mode == "preempt"
        gang = place_gang(candidates, n, self.now, rules, preempt=preempt, prefer=node.name)
        if gang is None:
            return None
        nodes = tuple(self.by_name[v.name] for v in gang)
        if self.granularity == "node":
            return nodes, ()
        return nodes, tuple(Claim(m, m.gpus) for m in nodes)

    def _beside(self, node: SimNode, lend: Lend) -> bool:
        """Whether `lend` (of some GPUs) may stand beside `node`'s leases, as the lease
        store lets it (`bridge.policy.snapshot.shares_node`, `[policy] shared_lends`):
        each of them holds some of its GPUs by preemption and serves on them, and the
        node has the lend's GPUs besides."""
        on = [lease for lease in self.leases.values() if node in lease.nodes]
        return (
            lend.gpus is not None
            and all(shares_node(lease.view) and lease.claims[0].served for lease in on)
            and lend.gpus <= node.gpus - sum(lease.gpus() for lease in on)
        )

    # ---- weight caches -----------------------------------------------------------------

    def _weights(self) -> None:
        """The nodes' caches this tick (`bridge.sim.weights`): copies that became usable
        change their nodes' views; the models' rates feed the forecast; the cache plan
        runs when due, on a snapshot with the nodes, and is carried out."""
        caches = self.caches
        assert caches is not None
        self.stale.update(caches.ready(self.now))
        if not caches.staging:
            return
        caches.observe(self.now, {m: h[-1].request_rate for m, h in self.history.items() if h})
        if caches.plan_due(self.now):
            self.stale.update(caches.plan(self.snapshot(), self.s.config, self.now, self.by_name))
            self.stale.update(caches.ready(self.now))

    # ---- decide ----------------------------------------------------------------------

    def _quiet(self, k: int) -> bool:
        """True when decide can only return nothing: `bridge.policy.assess` (decide's own
        rules, which never read the nodes) on a snapshot without nodes finds nothing to
        return or lend, or `bridge.sim.quiet` proves that it would not (most ticks; then
        assess is not run). Reserved nodes always have their baseline here.
        `Setup.always_decide` runs without it and the tests compare the two."""
        proof = self.proof
        # with weight caches the lead time reads the nodes (`bridge.policy.timing`): the
        # snapshots assess reads here hold them, and the proof is given each pool's load
        nodes = self._nodes() if self.caches is not None else ()
        by_pool = self._pool_slowest(nodes)
        if proof is not None and not self._season_ahead(proof, by_pool):

            def leases() -> list[LeaseFacts]:
                return [
                    (v.id, v.lend_mode, v.state, v.models, v.created_at, v.updated_at)
                    for v in (lease.view for lease in self.leases.values())
                ]

            structure = (
                self.replica_version,
                tuple(
                    (i, self.leases[i].view.state, self._lease_view(self.leases[i]).waiting)
                    for i in sorted(self.unsettled)
                )
                if self.unsettled
                else (),
            )
            if proof.holds(
                k,
                self.now,
                structure,
                leases,
                self.lend_s,
                lambda: self._snapshot(nodes),
                self.lend_load_s,
                by_pool,
            ):
                self.proven += 1
                if self.s.check_quiet:
                    plan = assess(self._snapshot(nodes), self.s.config, self.now)
                    assert not plan.acts, f"tick {k} proven quiet, but assess acts: {plan}"
                return True
        return not assess(self._snapshot(nodes), self.s.config, self.now).acts

    def _pool_slowest(self, nodes: tuple[NodeView, ...]) -> dict[str, float] | None:
        """Per lendable pool, the slowest load on the node a lend from it would take
        (`bridge.policy.timing.pool_slowest`); None without caches."""
        if self.caches is None:
            return None
        leased = self._leased()
        local = self.s.timing.local_load_s
        return pool_slowest(self.s.config, nodes, leased, self.models, self.load_s, local)

    def _season_ahead(self, proof: QuietProof, by_pool: dict[str, float] | None) -> bool:
        """Whether a model has a seasonal growth over the lead now: the quiet proof reads
        the trend alone, so such a tick is left to assess (`bridge.policy.seasonal`)."""
        seasons = self.seasons
        if seasons is None:
            return False
        horizon = proof.lead_s(self.lend_s, self.lend_load_s, by_pool)
        return any(seasons.growth(m, self.now, horizon) is not None for m in self.models)

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
                job.gpus_per_node if job.nodes > 1 else None,
            )
            if at is None:
                r.view, r.view_run = view, r.run
            jobs.append(view)
        if leased is None:
            held = any(node in lease.nodes for lease in self.leases.values())
        else:
            held = node.name in leased
        cached = frozenset() if self.caches is None else self.caches.cached(node, now)
        has_triton = node.triton or held
        return _node_view(
            node.name, node.pool, node.gpus, tuple(jobs), has_triton, cached, node.held
        )

    def _leased(self) -> set[str]:
        """The names of the nodes an open lease holds (whole, or GPUs of)."""
        return {node.name for lease in self.leases.values() for node in lease.nodes}

    def snapshot(self) -> Snapshot:
        return self._snapshot(self._nodes())

    def _nodes(self) -> tuple[NodeView, ...]:
        """The policy's nodes' views, those changed since the last call made again."""
        if self.s.checkpoint_s:  # checkpoints move with time: a node with jobs is stale
            self.stale.update(n.index for n in self.policy_nodes if n.jobs)
        if self.stale:
            leased = self._leased()
            view_at, views, nodes = self.view_at, self.views, self.policy_nodes
            for index in self.stale:
                at = view_at.get(index)
                if at is not None:
                    views[at] = self._node_view(nodes[at], leased)
            self.stale.clear()
            self.node_views = tuple(views)
        return self.node_views

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
            returns=self.returns.view(),
            peaks=self.peaks.view(),
            load_s=self.load_s,
            lend_load_s=dict(self.lend_load_s),
            seasons=self.seasons,
            token_profiles=self.token_profiles,
            local_load_s=self.local_load_s,
        )

    def _lease_view(self, lease: SimLease) -> LeaseView:
        """The lease's view as the policy reads it: with `waiting` as its node is now (a
        drain lend whose Triton job has not run while the node runs jobs)."""
        view = lease.view
        waiting = view.lend_mode == "drain" and lease.running_at is None and lease.owes()
        if view.waiting != waiting:
            view = lease.view = replace(view, waiting=waiting)
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
        warmup = self.s.warmup_s
        for k in range(self.ticks):
            t_end = (k + 1) * self.tick_s
            self._advance(t_end)  # (it ends with a scheduling pass)
            if warmup and t_end > warmup and self.tally.warm_at is None:
                self.tally.warm(self.serving)  # (the ticks before this one warmed up)
            self._serve(k)
            if self.unsettled:  # (`_sync` moves only these)
                self._sync()
            if self.loading:
                self._loaded()
            if self.caches is not None:
                self._weights()
            if always or not self._quiet(k):
                self.tally.decide_calls += 1
                for action in decide(self.snapshot(), self.s.config, self.now):
                    self._act(action)
            if self.dirty_sched:
                self._schedule()
            if (k + 1) % every == 0:
                self.tally.sample(self.fleet, self.serving, len(self.leases))
            if progress is not None and (k + 1) % hour == 0:
                progress(t_end, self.s.horizon_s)
        self.fleet.usage.accrue(self.now)
        wall_s = time.perf_counter() - started
        nodes, fleet, serving = self.nodes, self.fleet, self.serving
        return self.tally.result(self.s, nodes, fleet, serving, self.ticks, self.now, wall_s)


__all__ = ["Engine", "Setup", "SimLease", "Timing"]
