"""One control pass, `run_once(now)`: observe -> sync -> operator requests -> decide ->
act -> rollouts -> route, each a separate step, every outcome in the returned `TickReport`.

Called by `stb daemon` every `tick_s` (APScheduler, on the tick's own thread) and directly
by tests with an injected clock. Each pass:
1. Read the open leases once (the lease store is not read again for decisions).
2. Observe: one `Observation` (Slurm nodes, jobs and reservations; Triton servers and
   metrics; each model's SLO and bounds, the model repository's with the TOML's
   overrides, read again each pass: a model published since the last pass is scaled in
   this one). Without it the pass stops: nothing acts on a stale view.
3. Sync: the pure planner (`bridge.daemon.planner.plan`) says what each lease needs from
   what Slurm and Triton report (job running, server ready, job gone, drain finished,
   deadline passed); the actuator carries it out. Then the placements under way: each
   serving replica made to hold its lease's models (`bridge.daemon.placer`). Then what no
   lease holds: tagged Triton jobs to adopt or cancel, bridge fences to lift. After a
   crash this is what makes the bridge whole again: nothing stays fenced and forgotten.
4. Operator requests (`stb lend`, `stb return`, `stb place`) through the same steps, each answered
   once: one taken again after a failover (its first daemon died before recording the
   outcome) is answered from the lease its lend made or the move its return made. The
   leases of pools an operator holds (`stb drain POOL`) are returned, and those pools
   lend nothing.
5. Decide: the pure policy on the observation and the leases as they are now, and the
   requests the activator holds for models at zero (`waiting`).
6. Act: lend (a lease, then its Triton job), return (out of routing first), place (the
   lease's models recorded, the dropped ones out of routing, the gained ones loaded),
   baselines.
7. Rollouts: each open model rollout one move further (`bridge.daemon.rollouts`).
8. Route: publish the ready replicas (baselines and serving leases), with the rollouts'
   traffic splits as stored.

With `[batch] enabled`, the policy's view takes the batch route's load (nginx's batch
access log) off the models' rates, and step 5 also decides the batch route's gate
(`bridge.policy.batch`) from that view and the policy's actions; a gate that closes is
published at once, before the pass's lends are carried out.

A standby (another daemon leads: `bridge.leases.leader`) runs only steps 1, 2 and 8 and
the metrics: it never acts. A pass whose write is fenced (this instance was deposed)
stops there. The advisory pass (`stb daemon --advise`, `bridge.advise.advisory`) builds
the policy's view with the same `policy_snapshot` and `LendMemory`, over shadow leases.

Errors are data (`bridge.daemon.report`): an adapter error is a `StepError` and the pass
goes on; a permanent one fails its lease with the adapter's words, a transient one is
retried with backoff. A pass that cannot observe Slurm or reach the lease database ends
with outcome `failed`. Metrics come from the report, after the pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from bridge.audit.trail import AuditError, Trail, daemon, outcome_of
from bridge.cli_text import first_line
from bridge.config import BridgeConfig
from bridge.daemon import planner
from bridge.daemon.actuator import Actuator, Router, record_of
from bridge.daemon.batchroute import BatchRoute
from bridge.daemon.loadtimes import LoadTimes
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observation import Observation, snapshot
from bridge.daemon.observe import Observer
from bridge.daemon.placer import Placer
from bridge.daemon.planner import LeaseRecord, Settings, Step, SubmitBaseline
from bridge.daemon.report import StepError, TickReport
from bridge.daemon.rollouts import RolloutDriver
from bridge.daemon.seasons import SeasonKeeper
from bridge.daemon.staging import Stager
from bridge.daemon.wakes import Wakes
from bridge.fleet import mode as fleet_mode
from bridge.leases.audit import AuditStore
from bridge.leases.errors import LeaseError
from bridge.leases.fleet import FleetStore
from bridge.leases.leader import Fenced
from bridge.leases.loads import LoadStore
from bridge.leases.rates import RateStore
from bridge.leases.requests import OperatorRequest, PoolHold, RequestQueue, lease_key
from bridge.leases.store import LeaseStore
from bridge.leases.weights import WeightStore
from bridge.lifecycle import LeaseState
from bridge.policy import Lend, Place, Return, StartBaseline, decide
from bridge.policy.batch import CLOSED, GateState
from bridge.policy.forecast import next_lead
from bridge.policy.returns import PeakLog, ReturnLog
from bridge.policy.seasonal import SeasonLog
from bridge.policy.snapshot import ModelSample, Snapshot
from bridge.policy.timing import slowest_load
from bridge.routing.errors import RoutingError
from bridge.slurm.errors import SlurmError
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.protocol import TritonInstance

log = logging.getLogger(__name__)

S = LeaseState


class LendMemory:
    """What the policy remembers of past lends from one pass to the next, kept by the pass
    that decides (the reconciler over its leases, the advisory pass over its shadow
    leases: `bridge.advise.advisory`). Kept in memory: after a restart the returns come
    back from the lease store (`recall`, the reconciler's first active pass), the
    cooldown anchors from the open leases, and the lead times start again from
    `lend_lead_s`; the rate peaks start empty. The models' load times are the deciding
    pass's (`bridge.daemon.loadtimes`, persisted: the reconciler's come back at start)."""

    def __init__(
        self,
        peaks_s: float = 3600.0,
        load_s: dict[str, float] | None = None,
        season_days: int = 0,
    ) -> None:
        """`peaks_s`: how long the models' rate peaks are kept (the policy's
        `return_dwell_max_s`); `load_s`: per model, its load time (read, kept up to date
        by its owner; None: none known); `season_days`: days of rate history the seasonal
        forecast reads (the policy's `seasonal_days`; 0: none kept)."""
        #: per model, when a lend carrying it was last made (scale-out cooldown anchor)
        self.last_lend_at: dict[str, float] = {}
        #: per pool, the running estimate of seconds from a lend to its replica serving
        self.lend_s: dict[str, float] = {}
        #: per pool, the same estimate of the slowest known load of those lends' models
        #: (the load `lend_s` holds: `bridge.policy.timing`)
        self.lend_load_s: dict[str, float] = {}
        self.load_s: dict[str, float] = {} if load_s is None else load_s
        #: per model, its returns and the lends after them; its rate's per-minute peaks
        #: (`bridge.policy.returns`: the return dwell learned from what returns cost)
        self.returns = ReturnLog()
        self.peaks = PeakLog(peaks_s)
        #: per model, its rate's 5-minute means by time of day (`bridge.policy.seasonal`)
        self.seasons = SeasonLog(season_days) if season_days > 0 else None
        self._timed: set[int] = set()
        self._waited: set[int] = set()

    def lent(self, models: Sequence[str], at: float) -> None:
        """A lend carrying `models` was made at `at` (epoch seconds)."""
        for m in models:
            self.last_lend_at[m] = at
        self.returns.lent(models, at)

    def returned(self, models: Sequence[str], at: float) -> None:
        """A lease holding `models` was given back at `at` (by the policy or an operator)."""
        self.returns.returned(models, at)

    def track(self, history: Mapping[str, Sequence[ModelSample]]) -> None:
        """Each model's newest sample into its rate peaks and seasons (a pass's
        observation)."""
        seasons = self.seasons
        newest = None
        for model, samples in history.items():
            if samples:
                last = samples[-1]
                self.peaks.add(model, last.at, last.request_rate)
                if seasons is not None:
                    seasons.add(model, last.at, last.request_rate)
                    newest = last.at if newest is None else max(newest, last.at)
        self.peaks.forget(history)
        if seasons is not None and newest is not None:
            seasons.expire(newest)

    def recall(self, lends: Iterable[tuple[float, Sequence[str], float | None]]) -> None:
        """After a restart (or a failover): recent leases' lends and returns (created at,
        models, began its return at or None: `LeaseStore.lends_since`), replayed in time
        order into the returns' memory, so that the dwell learned before the restart
        holds. Cooldown anchors come from the open leases (`anchor`); lead times are
        measured again."""
        events: list[tuple[float, bool, Sequence[str]]] = []
        for created, models, returned in lends:
            events.append((created, True, models))
            if returned is not None:
                events.append((returned, False, models))
        for at, lent, models in sorted(events, key=lambda e: e[0]):
            if lent:
                self.returns.lent(models, at)
            else:
                self.returns.returned(models, at)

    def anchor(self, leases: Sequence[LeaseRecord]) -> None:
        """The scale-out cooldown runs from when a lend's replica began serving (or from
        the lend while it is on its way): a new replica is judged by the p99 it brings."""
        for lease in leases:
            anchor = lease.updated_at if lease.state == S.SERVING else lease.created_at
            for m in lease.models:
                self.last_lend_at[m] = max(self.last_lend_at.get(m, 0.0), anchor)

    def measure(self, leases: Sequence[LeaseRecord], snap: Snapshot) -> None:
        """The running estimate, per pool, of seconds from a lend to its replica serving
        (the forecast's lead time). A drain lend that waited for its node's jobs says
        nothing about actuation and is left out."""
        for view in snap.leases:
            if view.waiting:
                self._waited.add(view.lease_id)
        for lease in leases:
            if lease.state != S.SERVING or lease.id in self._timed:
                continue
            self._timed.add(lease.id)
            if lease.id in self._waited:
                continue
            took = max(0.0, lease.updated_at - lease.created_at)
            self.lend_s[lease.pool] = next_lead(self.lend_s.get(lease.pool), took)
            held = slowest_load(self.load_s, lease.models)
            self.lend_load_s[lease.pool] = next_lead(self.lend_load_s.get(lease.pool), held)
        live = {lease.id for lease in leases}
        self._timed &= live
        self._waited &= live


def policy_snapshot(
    obs: Observation,
    config: BridgeConfig,
    leases: Sequence[LeaseRecord],
    memory: LendMemory,
    preemptions_last_hour: int,
    held: frozenset[str],
) -> Snapshot:
    """The policy's view of this pass: the observation, the open leases (their cooldown
    anchors and lead times folded into `memory`), the hour's preemptions and the held
    pools. The one place the reconciler and the advisory pass build what `decide` reads."""
    memory.anchor(leases)
    memory.track(obs.history)
    snap = snapshot(
        obs,
        config,
        leases,
        memory.last_lend_at,
        memory.lend_s,
        preemptions_last_hour,
        held,
        returns=memory.returns.view(),
        peaks=memory.peaks.view(),
        load_s=memory.load_s,
        lend_load_s=memory.lend_load_s,
        seasons=memory.seasons,
    )
    memory.measure(leases, snap)
    return snap


class Reconciler:
    def __init__(
        self,
        config: BridgeConfig,
        slurm: SlurmProtocol,
        store: LeaseStore,
        observer: Observer,
        triton_for: Callable[[str], TritonInstance],
        router: Router | None = None,
        metrics: BridgeMetrics | None = None,
        requests: RequestQueue | None = None,
        forget_triton: Callable[[str], None] | None = None,
        is_active: Callable[[], bool] | None = None,
        rollouts: RolloutDriver | None = None,
        loads: LoadStore | None = None,
        waiting: Callable[[], Mapping[str, int]] | None = None,
        audit: Trail | None = None,
    ) -> None:
        """`loads`: where the models' load times are kept (None: beside `store`'s leases,
        on its engine); `waiting`: per model served from zero, the requests the activator
        holds or turned away since it was last asked (`bridge.http.activator.Activator.
        demand`; None: no activator); `audit`: the trail its lends, returns and operator
        requests are recorded in (None: beside `store`, behind its fence, as
        `daemon@host`)."""
        self.config = config
        #: where each lend, return and operator request carried out is recorded
        self.audit = audit or Trail(AuditStore.beside(store), daemon())
        #: the fleet's mode as `stb fleet mode` switched it (read each active pass)
        self.fleet = FleetStore.beside(store)
        #: the activator's waiting requests per model (read once per active pass)
        self.waiting = waiting
        #: carries the models' gradual rollouts one move a pass (None: no rollouts)
        self.rollouts = rollouts
        #: whether this instance may act (the leader); a standby only observes
        self.is_active = is_active or (lambda: True)
        self.slurm = slurm
        self.store = store
        self.observer = observer
        self.metrics = metrics or BridgeMetrics()
        self.requests = requests
        self.settings = Settings.of(config)
        self.actuator = Actuator(config, slurm, store, triton_for, router, forget_triton)
        self.actuator.adopted = lambda node, job: self.audit.within(
            "adopt", f"node {node}", f"Triton job {job}"
        )
        #: what the policy remembers of past lends (cooldown anchors, lend lead times)
        #: the models' load times, measured on every start (`bridge.daemon.loadtimes`)
        self.loads = LoadTimes(loads if loads is not None else LoadStore.beside(store))
        self.memory = LendMemory(
            config.policy.return_dwell_max_s, self.loads.load_s, config.policy.seasonal_days
        )
        #: the models' rate history, written as it closes and read back at start
        self.seasons = SeasonKeeper(self.memory.seasons, RateStore.beside(store))
        #: carries out model placements (`Place`, `stb place`) and finishes those under way
        self.placer = Placer(
            self.actuator, store, self.settings, self._gained, loaded=self.loads.placed
        )
        #: keeps the lendable nodes' weight caches staged (None: no `[weights] cache_root`)
        self.stager = (
            Stager(config, slurm, WeightStore.beside(store))
            if config.weights.cache_root is not None
            else None
        )
        self._recalled = False
        #: requests for models at zero held at a standby's activator (`bridge.daemon.wakes`)
        self.wakes = Wakes(self.metrics.instance)
        #: the last pass's observation (for tools and tests that want the same view)
        self.last_observation: Observation | None = None
        #: the last active pass's policy view (what `decide` read)
        self.last_snapshot: Snapshot | None = None
        #: the batch route's log and gate (None: `[batch]` off)
        self.batch = BatchRoute(config.batch.access_log.resolve()) if config.batch.enabled else None

    @property
    def batch_gate(self) -> GateState:
        """The batch route's gate as the last pass decided it (closed with `[batch]` off)."""
        return self.batch.gate if self.batch is not None else CLOSED

    @property
    def last_lend_at(self) -> dict[str, float]:
        """Per model, when a lend carrying it was last made (scale-out cooldown anchor)."""
        return self.memory.last_lend_at

    def _gained(self, models: Sequence[str], at: float) -> None:
        """A placement gave a replica `models` at `at`: their scale-out cooldown runs from
        it, as from a lend's."""
        for m in models:
            self.memory.last_lend_at[m] = at

    @property
    def lend_s(self) -> dict[str, float]:
        """Per pool, seconds from a lend to its replica serving (`LendMemory.measure`)."""
        return self.memory.lend_s

    # ---- the pass ------------------------------------------------------------------

    def run_once(self, now: datetime | None = None) -> TickReport:
        now = now or datetime.now(UTC)
        report = TickReport(now)
        report.active = self.is_active()

        def body() -> None:
            if report.active:
                self._pass(now, report)
            else:
                self._standby_pass(now, report)

        def slo() -> Mapping[str, float]:
            seen = self.last_observation
            facts = seen.models if seen is not None else self.observer.models()
            return {m: c.slo_p99_ms for m, c in facts.scaled.items()}

        return carry_out(report, body, self.metrics, slo)

    def _pass(self, now: datetime, report: TickReport) -> None:
        if not self._recalled:  # the first active pass: what was learned before it
            since = now - timedelta(seconds=self.config.policy.return_dwell_max_s)
            self.memory.recall(
                (lease.created_at.timestamp(), lease.models, back.timestamp() if back else None)
                for lease, back in self.store.lends_since(since)
            )
            self.loads.recall()
            self.seasons.recall(now)
            self._recalled = True
        leases = [record_of(lease) for lease in self.store.open_leases()]
        obs = self.observer.observe(now.timestamp())
        self.last_observation = obs
        act = self.actuator
        act.begin(obs, leases)
        t = now.timestamp()
        for step in planner.plan(obs, leases, t, self.settings, act.not_before()):
            act.run(step, now, report)
        self.loads.started(act.open_leases(), self.store, now)
        self.placer.sync(obs, now, report)
        self._orphans(obs, now, report)
        site = self.requests.holds() if self.requests is not None else {}
        fleet = self.fleet.current()  # the fleet's mode (`stb fleet mode`): its holds
        holds = {**fleet_mode.holds(fleet, self.config), **site}
        self._operator_requests(obs, now, report, holds)
        held = self._return_held(holds, obs, now, report)
        preempted = act.preemptions_since(t - 3600.0)
        # the batch route's load off the models' rates: the policy sizes for online load
        seen = self.batch.online(obs, t, report) if self.batch is not None else obs

        def view(held_pools: frozenset[str]) -> Snapshot:
            snap = policy_snapshot(
                seen, self.config, act.open_leases(), self.memory, preempted, held_pools
            )
            if self.stager is not None:  # the nodes' weight caches, as of the last plan
                snap = self.stager.onto(snap, self.loads.local_load_s)
            if waiting is not None:
                snap = replace(snap, waiting=waiting)
            return snap

        waiting = self.wakes.waiting(self.waiting)  # held requests: lends from zero
        snap = view(held)
        self.last_snapshot = snap
        self.seasons.write(now)
        config = fleet_mode.configured(fleet, self.config)
        report.actions = decide(snap, config, t)
        if self.batch is not None and self.batch.decide(snap, config, t, report, self.actuator):
            self._route(report)  # a gate that closes is published before the pass acts
        if fleet is not None and fleet.mode == "advisory":  # what shared would do, said
            shared = view(frozenset(site))
            report.events.extend(fleet_mode.advice(decide(shared, config, t)))
        for action in report.actions:
            self._act(action, obs, now, report)
        if self.stager is not None:
            self.stager.tick(snap, act.open_leases(), now, report)
        if self.rollouts is not None:
            self.rollouts.tick(obs, _slo_of(obs), now, report, lambda: self._publish(report))
        self._route(report)
        open_after = act.open_leases()
        _summarise(report, open_after, obs)
        report.retries = {lid: b.errors for lid, b in act.backoff.items() if b.errors}
        report.stuck = {
            lease.id: f"{lease.state.value}: {lease.reason}"
            for lease in open_after
            if planner.is_stuck(lease, self.settings, t)
        }

    def _standby_pass(self, now: datetime, report: TickReport) -> None:
        """A standby's pass: the same observation, routing and metrics as the leader's,
        and nothing else: no lease moves, no request taken, no Slurm or Triton call that
        changes anything. Requests its activator holds for models at zero are passed to
        the leader as wake requests (`bridge.daemon.wakes`)."""
        leases = [record_of(lease) for lease in self.store.open_leases()]
        obs = self.observer.observe(now.timestamp())
        self.last_observation = obs
        self.actuator.begin(obs, leases)
        self._route(report)
        if self.waiting is not None and self.requests is not None:
            self.wakes.send(self.waiting(), self.requests, now, report)
        _summarise(report, leases, obs)

    def _route(self, report: TickReport) -> None:
        try:
            self._publish(report)
        except RoutingError as exc:  # the old routes keep serving
            report.error("route", exc)

    def _publish(self, report: TickReport) -> None:
        """Routing as the pass sees it, with the rollouts' splits as stored now; raises
        RoutingError (a rollout's move waits for its routing)."""
        splits = self.rollouts.splits() if self.rollouts is not None else None
        self.actuator.route(report, splits=splits)

    def _orphans(self, obs: Observation, now: datetime, report: TickReport) -> None:
        act = self.actuator
        ids = planner.lease_refs_to_check(obs, act.open_leases())
        closed = {}
        for lease_id in sorted(ids):  # tagged jobs of no open lease: rare, a read each
            try:
                closed[lease_id] = record_of(self.store.get(lease_id)).ref
            except LeaseError:
                continue
        # the fences this pass already lifted are gone, though the observation lists them
        obs = replace(obs, reservations=obs.reservations - act.unfenced)
        for step in planner.plan_orphans(obs, act.open_leases(), closed, self.config):
            act.run(step, now, report)

    # ---- operator requests --------------------------------------------------------

    def _operator_requests(
        self,
        obs: Observation,
        now: datetime,
        report: TickReport,
        holds: Mapping[str, PoolHold],
    ) -> None:
        """Carry out `stb lend` / `stb return` / `stb place` requests through the same
        steps; a lend from a held pool is refused."""
        if self.requests is None:
            return
        for req in self.requests.pending():
            assert req.id is not None
            errors_before = len(report.errors)
            if req.kind == "lend" and req.node:
                outcome = self._operator_lend(req, req.node, obs, now, report, holds)
            elif req.kind == "return" and req.lease_id is not None:
                outcome = self._return(Return(req.lease_id, req.reason), obs, now, report)
            elif req.kind == "place" and req.lease_id is not None:
                place = Place(req.lease_id, tuple(req.models), req.reason)
                outcome = self.placer.place(place, obs, now, report)
            elif req.kind == "wake" and len(req.models) == 1:
                outcome = self.wakes.take(req)
            else:
                outcome = f"refused: malformed {req.kind!r} request"
            new_errors = report.errors[errors_before:]
            if new_errors and not outcome.startswith(("refused", "failed")):
                last = new_errors[-1]
                if last.kind == "transient":  # the lease goes on; its step is retried
                    outcome = f"{outcome} (retrying: {last.message})"
                else:
                    outcome = f"failed: {last.message} ({outcome})"
            # a standby's wake is no operator's action; the others' outcomes are recorded
            # with them (the lend or return itself was recorded where it was made)
            audit = None
            if req.kind != "wake":
                what = f"node {req.node}" if req.kind == "lend" else f"lease {req.lease_id}"
                audit = self.audit.within(
                    "request.done",
                    f"request {req.id}",
                    f"{req.kind} {what}: {outcome}",
                    outcome_of(outcome),
                )
            self.requests.finish(req.id, now, outcome, audit)
            report.events.append(f"operator request {req.id} ({req.kind}): {outcome}")

    def _operator_lend(
        self,
        req: OperatorRequest,
        node: str,
        obs: Observation,
        now: datetime,
        report: TickReport,
        holds: Mapping[str, PoolHold],
    ) -> str:
        """An operator's lend, its lease keyed by the request (`lease_key`). A request
        whose lease exists was carried out by a daemon that died before recording the
        outcome: it is answered from that lease (`planner.replayed_lend`), not refused as
        a lend of a lent node, and nothing is lent twice."""
        assert req.id is not None
        key = lease_key(req.id)
        made = self.store.by_request_key(key)
        if made is not None:
            lease = record_of(made)
            moves = self._moves(lease.id) if lease.state == S.RETURNED else ()
            return planner.replayed_lend(lease, moves)
        checked = planner.check_operator_lend(
            node, req.models, obs, self.actuator.open_leases(), self.config
        )
        if isinstance(checked, str):
            return checked
        pool, mode, models = checked
        if pool in holds:
            by = holds[pool].held_by
            undo = "stb fleet mode shared" if by.startswith("fleet mode") else f"stb resume {pool}"
            return f"refused: pool {pool} is held by {by} ({undo})"
        typed = planner.operator_typed(node, models, mode, obs)
        if isinstance(typed, str):
            return typed
        leases = self.actuator.open_leases()
        if typed is not None:  # GPUs of one type (MIG slices): free ones, no gang
            gpu_type, slices = typed
            lend = Lend(node, pool, mode, models, req.reason, slices, (), gpu_type)
        else:
            members = planner.operator_gang(node, models, obs, leases, self.config)
            if isinstance(members, str):
                return members
            gpus = (
                None
                if members
                else planner.operator_lend_gpus(node, models, mode, obs, self.config)
            )
            lend = Lend(node, pool, mode, models, req.reason, gpus, members)
        # a node other leases hold is shared only by leases of some of its GPUs
        shared = planner.shared_node_refusal(node, lend.gpus, mode, lend.gpu_type, obs, leases)
        return shared or self._lend(lend, obs, now, report, key)

    def _moves(self, lease_id: int) -> list[tuple[LeaseState, str]]:
        """The lease's history as the planner's answers read it: (state entered, reason)."""
        return [(e.to_state, e.reason) for e in self.store.history(lease_id)]

    def _return_held(
        self, holds: Mapping[str, PoolHold], obs: Observation, now: datetime, report: TickReport
    ) -> frozenset[str]:
        """Return the leases of the pools an operator holds (`stb drain`); those pools."""
        for lease in self.actuator.open_leases():
            hold = holds.get(lease.pool)
            if hold is None or lease.state in (S.DRAINING, S.RELEASING, S.FAILED, S.RETURNED):
                continue
            why = f"pool {lease.pool} held by {hold.held_by}"
            outcome = self._return(Return(lease.id, why), obs, now, report)
            report.events.append(f"{why}: {outcome}")
        return frozenset(holds)

    # ---- act ----------------------------------------------------------------------

    def _act(self, action: object, obs: Observation, now: datetime, report: TickReport) -> None:
        if isinstance(action, Lend):
            self._lend(action, obs, now, report)
        elif isinstance(action, Return):
            self._return(action, obs, now, report)
        elif isinstance(action, Place):
            outcome = self.placer.place(action, obs, now, report)
            if outcome.startswith("refused"):
                report.events.append(f"place lease {action.lease_id}: {outcome}")
        elif isinstance(action, StartBaseline):
            self.actuator.run(Step(None, (SubmitBaseline(action.node),)), now, report)

    def _audit(self, action: str, target: str, text: str, report: TickReport) -> None:
        """Record what this pass tried and could not write beside a fact (a lend the
        store refused); one that cannot be written is the pass's `audit` error, a fenced
        one stops it. What it did is recorded in the write that does it."""
        try:
            self.audit.record_text(action, target, text)
        except AuditError as exc:
            report.error("audit", exc)

    def _lend(
        self,
        action: Lend,
        obs: Observation,
        now: datetime,
        report: TickReport,
        key: str | None = None,
    ) -> str:
        """Lend (a lease under `key`, default the action's key at `now`, then its first
        step); the outcome's text. The lease is recorded in the audit trail as it is
        written (a lend taken again is not recorded twice), a refused one on its own."""
        target = f"node {','.join(action.nodes)}"
        try:
            lease = self.actuator.create(
                action.node,
                action.pool,
                action.lend_mode,
                action.models,
                key or f"{action.key}@{now.isoformat()}",
                now,
                action.reason,
                action.gpus,
                action.members,
                self.audit.within("lend", target, action.reason),
                action.gpu_type,
            )
        except LeaseError as exc:
            report.error("lend", exc)
            self._audit("lend", target, f"failed: {exc} ({action.reason})", report)
            return f"failed: {exc}"
        share = "" if action.gpus is None else f", {action.gpus} GPU(s)"
        share += "" if action.gpu_type is None else f" of type {action.gpu_type}"
        report.events.append(
            f"lease {lease.id} {','.join(action.nodes)}: requested ({action.lend_mode}{share}, "
            f"models {','.join(action.models)}: {action.reason})"
        )
        report.lent.append(action.pool)
        self.memory.lent(action.models, now.timestamp())
        step = planner.plan_lease(lease, obs, now.timestamp(), self.settings)
        if step is not None:
            self.actuator.run(step, now, report)
        after = self.actuator.leases[lease.id]
        if after.state in (S.FAILED, S.RETURNED):
            return f"failed: lease {lease.id}: {after.reason}"
        return f"lease {lease.id} lending {','.join(action.nodes)}"

    def _return(self, action: Return, obs: Observation, now: datetime, report: TickReport) -> str:
        lease = self.actuator.leases.get(action.lease_id)
        if lease is None:
            try:
                lease = record_of(self.store.get(action.lease_id))
            except LeaseError as exc:
                return f"refused: {exc}"
        step = planner.plan_return(lease, action.reason, obs)
        if step is None:  # leaving or gone: by this very return, taken again after a failover?
            again = planner.replayed_return(lease, self._moves(lease.id), action.reason)
            if again is not None:
                return again
            if lease.state == S.RETURNED:
                return f"refused: lease {lease.id} is already returned"
            return f"lease {lease.id} is already {lease.state.value}"
        audit = self.audit.within("return", f"lease {lease.id}", action.reason)
        self.actuator.run(step, now, report, audit)
        self.memory.returned(lease.models, now.timestamp())
        return f"lease {lease.id} returning"


def _slo_of(obs: Observation) -> Callable[[str], float | None]:
    scaled = obs.models.scaled

    def slo(model: str) -> float | None:
        return scaled[model].slo_p99_ms if model in scaled else None

    return slo


def _summarise(report: TickReport, leases: Sequence[LeaseRecord], obs: Observation) -> None:
    """The open leases by state and each model's latest p99, for the metrics."""
    states: dict[str, int] = {}
    for lease in leases:
        states[lease.state.value] = states.get(lease.state.value, 0) + 1
    report.lease_states = states
    report.p99_ms = {m: (h[-1].p99_ms if h else None) for m, h in obs.history.items()}


def carry_out(
    report: TickReport,
    body: Callable[[], None],
    metrics: BridgeMetrics,
    slo: Callable[[], Mapping[str, float]],
) -> TickReport:
    """One pass's body as the reconciler and the advisory pass both run it: an error that
    stops the pass (deposed, no fresh view of Slurm, the database) recorded as data and
    the pass failed; the errors logged, the pass timed and counted with each model's SLO."""
    started = time.monotonic()
    try:
        body()
    except Fenced as exc:  # deposed mid-pass: the rest is the new leader's
        report.errors.append(StepError("leader", "transient", str(exc)))
        report.failed = True
    except SlurmError as exc:  # only observe lets one through: no fresh view of Slurm
        report.error("observe", exc)
        report.failed = True
    except SQLAlchemyError as exc:  # the database: nothing can be recorded (or read)
        report.errors.append(StepError("store", "transient", first_line(exc)))
        report.failed = True
    report.seconds = time.monotonic() - started
    for err in report.errors:
        log.warning("%s", err.line())
    metrics.record(report, slo())
    return report


__all__ = ["LendMemory", "Reconciler", "TickReport", "carry_out", "policy_snapshot"]
