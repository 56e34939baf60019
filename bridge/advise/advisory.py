"""The advisory pass (`stb daemon --advise`): observe and decide exactly as the active
daemon does, record each decision it would have carried out, and act on nothing.

Called by `stb daemon --advise` every `tick_s` (`bridge.daemon.service`, the same
scheduler, tick thread, exporter and health as the active daemon) and by tests with an
injected clock and observer. Each pass, `run_once(now)`:

1. Observe: the same `Observer` as the reconciler's (Slurm's nodes, jobs and
   reservations; each Triton server's readiness, models and metrics). A Slurm error ends
   the pass `failed`, as it does the reconciler's.
2. Sync the shadow leases (`bridge.advise.shadow`): each lend the advisory would have
   made moves through the lease states on the simulator's timing.
3. The pools an operator holds (`stb drain POOL`, read only): their shadows are returned
   and nothing is lent from them, as the reconciler does.
4. Decide: `bridge.daemon.reconciler.policy_snapshot` on the observation with the shadows
   made real (`ShadowBook.observation`), then the pure `decide(snapshot, config, now)`:
   the very functions the reconciler calls.
5. Advise: a lend becomes a shadow lease, a return ends one, a baseline is noted once;
   each is an `advice` row with the snapshot's key figures (`key_figures`).
6. Record: the advice, each model's signal of the tick (`advice_sample`: the arrivals
   `stb advise report` replays) and the changed shadows, in one transaction
   (`bridge.leases.advice.AdviceStore`). A database that does not answer is a transient
   error: the rows wait in memory and go with the next tick's; rows it refuses (an
   integrity or data error) are a permanent one: they are dropped, and said so.

It never writes to Slurm or Triton (no adapter call but the observer's reads), never
touches the lease store, the operator requests or the leader row, and publishes no
routing.

Where the advice can differ from what the active daemon would do:

- A lent replica that never serves lowers no latency. Once a shadow serves, the policy
  counts its capacity (as it would a real replica), but the p99, mean latency and pending
  it reads are those of the fleet without it: a sustained breach can add one more lend
  (the p99 backstop, after `scale_out_cooldown_s`) that the active daemon, whose lent
  replica would have brought the p99 down, would not make; and the calm that a return
  waits for comes when the load falls by itself, which can be later than after a real
  lend. Each advice row counts the shadows serving when it was decided
  (`shadow_serving`): with none, the decision saw exactly what the active daemon would
  have seen.
- The request rate is Triton's answers per second: under overload the queue grows and
  the rate read is what the replicas answered, not what arrived. The active daemon reads
  the same, until its lend adds capacity.
- Timing is the simulator's (bench medians), not this site's: a shadow serves
  `preempt_start_s + triton_ready_s` (or `slurm_start_s + triton_ready_s` on a free
  node) after its lend, and the measured lead time per pool the forecast uses comes from
  those numbers.
- Nothing is fenced or requeued: a drain-mode shadow starts when its node happens to be
  free of jobs, while the real fence would have stopped new jobs landing there; the jobs
  a preempt-mode shadow would have requeued keep running (they carry the would-be requeue
  in the policy's view: one more restart, resubmitted then, counted in the hour's
  preemption budget), and the elastic work that would have waited is not delayed.
- Operator requests (`stb lend`, `stb return`) are not taken: the active daemon would
  have carried them out and its later decisions would see those leases.
- After a restart the shadows come back from the database, the lead-time estimates start
  again from `lend_lead_s` (as the daemon's do), and a baseline is advised again. The
  models' load times are those stored in the database when it starts (a daemon's measures,
  `bridge.leases.loads`): the advisory measures none itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError

from bridge.advise.shadow import ShadowBook, ShadowLease
from bridge.cli_text import first_line
from bridge.config import BridgeConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observation import Observation
from bridge.daemon.reconciler import LendMemory, carry_out, policy_snapshot
from bridge.daemon.report import StepError, TickReport
from bridge.leases.advice import Advice, AdviceSample, AdviceStore, ShadowLeaseRow
from bridge.leases.loads import LoadStore
from bridge.leases.requests import PoolHold
from bridge.lifecycle import LeaseState, StepTimes
from bridge.policy import LeaseView, Lend, Place, Return, Snapshot, StartBaseline, decide
from bridge.policy.nodes import LENDABLE, choose_nodes
from bridge.policy.typed import choose_typed, lend_key

log = logging.getLogger(__name__)

S = LeaseState
#: rows kept in memory while the database refuses them (then the oldest samples go)
MAX_PENDING_SAMPLES = 200_000


class Observes(Protocol):
    """What the advisory needs of `bridge.daemon.observe.Observer`."""

    def observe(self, now: float) -> Observation: ...

    def close(self) -> None: ...


def key_figures(snap: Snapshot, config: BridgeConfig, now: float) -> dict[str, Any]:
    """The snapshot's key figures, as recorded with each advice: per model its latest p99,
    rate and pending requests and the ready replicas that hold it (shadows included, as
    the policy counted them); per pool its free nodes (usable, no job, no Triton, not
    lent, not reserved) and its lendable ones (what `choose_nodes` would take for a
    capacity deficit now: idle, or busy elastic within the preemption budget); where some
    model is lent by GPU type (MIG slices), per type and pool the nodes a lend of one
    replica of it could take now (`choose_typed`), as `lendable_by_type`."""
    models: dict[str, dict[str, float | int | None]] = {}
    for name in snap.models:
        history = snap.history.get(name, ())
        last = history[-1] if history else None
        models[name] = {
            "p99_ms": _round(last.p99_ms if last else None),
            "rate": _round(last.request_rate if last else None),
            "pending": _round(last.pending if last else None),
            "replicas": sum(1 for r in snap.replicas if name in r.models),
        }
    leased = {lease.node for lease in snap.leases}
    lendable = {n.name for n in choose_nodes(snap, config, now, len(snap.nodes))}
    pools: dict[str, dict[str, int]] = {}
    for name, pool in config.pools.items():
        mine = [n for n in snap.nodes if n.pool == name]
        free = sum(
            1
            for n in mine
            if n.usable
            and not n.reserved
            and not n.has_triton
            and not n.jobs
            and n.name not in leased
        )
        pools[name] = {
            "nodes": len(mine),
            "free": free,
            "lendable": sum(1 for n in mine if n.name in lendable)
            if pool.lend_mode in LENDABLE
            else 0,
        }
    out: dict[str, Any] = {"models": models, "pools": pools}
    keys = {key for m in snap.models if (key := lend_key(snap.models, [m])) is not None}
    if keys:
        by_type: dict[str, dict[str, int]] = {}
        for gpu_type, gpus in sorted(keys):
            if gpu_type in by_type:
                continue  # (replicas of two sizes of one type: the smaller's lend counts)
            counts = by_type[gpu_type] = {}
            for n in choose_typed(snap, config, now, len(snap.nodes), gpu_type=gpu_type, gpus=gpus):
                counts[n.pool] = counts.get(n.pool, 0) + 1
        out["lendable_by_type"] = by_type
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def shadow_row(lease: ShadowLease) -> ShadowLeaseRow:
    return ShadowLeaseRow(
        id=lease.id,
        node=lease.node,
        pool=lease.view.pool,
        lend_mode=lease.view.lend_mode,
        models=list(lease.view.models),
        state=lease.state.value,
        created_at=datetime.fromtimestamp(lease.view.created_at, UTC),
        updated_at=datetime.fromtimestamp(lease.updated_at, UTC),
        reason=lease.view.reason,
        running_at=lease.running_at,
        ready_at=lease.ready_at,
        gone_at=lease.gone_at,
        victims=list(lease.victims),
    )


def shadow_of(row: ShadowLeaseRow) -> ShadowLease:
    return ShadowLease(
        LeaseView(
            row.id,
            row.node,
            row.pool,
            row.lend_mode,
            LeaseState(row.state),
            tuple(row.models),
            row.created_at.timestamp(),
            row.updated_at.timestamp(),
            reason=row.reason,
        ),
        row.running_at,
        row.ready_at,
        row.gone_at,
        tuple(row.victims),
    )


class Advisor:
    """The advisory pass; `run_once(now)` is its tick (see the module docstring)."""

    def __init__(
        self,
        config: BridgeConfig,
        observer: Observes,
        store: AdviceStore | None = None,
        metrics: BridgeMetrics | None = None,
        holds: Callable[[], Mapping[str, PoolHold]] | None = None,
        timing: StepTimes | None = None,
        now: datetime | None = None,
    ) -> None:
        self.config = config
        self.observer = observer
        self.store = store
        self.metrics = metrics or BridgeMetrics(advisory=True)
        self.holds = holds
        self.memory = LendMemory(
            config.policy.return_dwell_max_s, _load_times(store), config.policy.seasonal_days
        )
        remember = max(3600.0, config.policy.preempt_guard_s)
        rows: list[ShadowLeaseRow] = []
        next_id = 1
        if store is not None:
            start = (now or datetime.now(UTC)) - timedelta(seconds=remember)
            rows = store.shadows(start)
            next_id = store.next_shadow_id()
        self.book = ShadowBook.restore(
            [shadow_of(r) for r in rows],
            next_id,
            timing=timing,
            requeue_victims=config.leases.requeue_victims,
            remember_s=remember,
        )
        #: the last pass's observation as the advisory saw it (shadows made real)
        self.last_observation: Observation | None = None
        self.last_snapshot: Snapshot | None = None
        self._advice: list[Advice] = []
        self._samples: list[AdviceSample] = []
        self._shadows: dict[int, ShadowLeaseRow] = {}

    @property
    def pending_rows(self) -> int:
        """Rows not yet in the database (it refused the last write)."""
        return len(self._advice) + len(self._samples) + len(self._shadows)

    def run_once(self, now: datetime | None = None) -> TickReport:
        now = now or datetime.now(UTC)
        report = TickReport(now, active=False)

        def slo() -> Mapping[str, float]:
            seen = self.last_observation
            return {m: c.slo_p99_ms for m, c in seen.models.scaled.items()} if seen else {}

        # no fresh view of Slurm, or the holds unread: nothing is decided
        return carry_out(report, lambda: self._pass(now, report), self.metrics, slo)

    def _pass(self, now: datetime, report: TickReport) -> None:
        t = now.timestamp()
        obs = self.observer.observe(t)
        holds = self.holds() if self.holds is not None else {}
        book = self.book
        # a baseline server holds every model the repository has (this tick's)
        book.baseline_models = obs.models.served
        report.events += [m.line() for m in book.sync(obs, t)]
        returns: list[Return] = []
        for lease in list(book.leases.values()):
            pool = lease.view.pool
            hold = holds.get(pool)
            if hold is not None and lease.state not in (S.DRAINING, S.RELEASING, S.FAILED):
                returns.append(Return(lease.id, f"pool {pool} held by {hold.held_by}"))
        returned = [(r, self._return(r, t, report)) for r in returns]
        view = book.observation(obs)
        self.last_observation = view
        snap = policy_snapshot(
            view,
            self.config,
            book.open_records(),
            self.memory,
            book.preemptions_since(t - 3600.0),
            frozenset(holds),
        )
        self.last_snapshot = snap
        figures = key_figures(snap, self.config, t)
        serving = book.serving()
        actions = decide(snap, self.config, t)
        report.actions = [*returns, *actions]
        advice = [self._advice_of(r, lease, now, figures, serving) for r, lease in returned]
        for action in actions:
            row = self._advise(action, view, snap, now, report)
            if row is not None:
                row.figures, row.shadow_serving = figures, serving
                advice.append(row)
        for row in advice:
            report.events.append(_line(row))
        self._record(advice, _samples(obs, now), report)
        report.p99_ms = {m: (h[-1].p99_ms if h else None) for m, h in obs.history.items()}
        report.shadow_states = book.states()

    # ---- advise -------------------------------------------------------------------

    def _advise(
        self,
        action: object,
        view: Observation,
        snap: Snapshot,
        now: datetime,
        report: TickReport,
    ) -> Advice | None:
        t = now.timestamp()
        if isinstance(action, Lend):
            lease, moves = self.book.lend(action, view, t)
            self.memory.lent(action.models, t)
            report.events += [m.line() for m in moves]
            return Advice(
                at=now,
                kind="lend",
                node=action.node,
                pool=action.pool,
                lend_mode=action.lend_mode,
                models=list(action.models),
                reason=action.reason,
                shadow_lease=lease.id,
            )
        if isinstance(action, Return):
            shadow = self._return(action, t, report)
            return self._advice_of(action, shadow, now, {}, 0) if shadow is not None else None
        if isinstance(action, Place):
            placed = self.book.place(action.lease_id, action.models)
            if placed is None:
                return None
            report.events.append(
                f"shadow {placed.id} on {placed.node}: place {','.join(action.models)}"
            )
            self.memory.lent(action.models, t)
            return Advice(
                at=now,
                kind="place",
                node=placed.node,
                pool=placed.view.pool,
                lend_mode=placed.view.lend_mode,
                models=list(action.models),
                reason=action.reason,
                shadow_lease=placed.id,
            )
        if isinstance(action, StartBaseline):
            if not self.book.baseline(action.node, t):
                return None
            pool = next((n.pool for n in snap.nodes if n.name == action.node), "")
            return Advice(at=now, kind="baseline", node=action.node, pool=pool,
                          lend_mode="reserved", reason=action.reason)  # fmt: skip
        return None

    def _return(self, action: Return, t: float, report: TickReport) -> ShadowLease | None:
        lease = self.book.leases.get(action.lease_id)
        if lease is None:
            return None
        move = self.book.return_(action.lease_id, action.reason, t)
        if move is not None:
            report.events.append(move.line())
            self.memory.returned(lease.view.models, t)
        return lease

    def _advice_of(
        self,
        action: Return,
        lease: ShadowLease | None,
        now: datetime,
        figures: dict[str, Any],
        serving: int,
    ) -> Advice:
        return Advice(
            at=now,
            kind="return",
            node=lease.node if lease else "",
            pool=lease.view.pool if lease else "",
            lend_mode=lease.view.lend_mode if lease else "",
            models=list(lease.view.models) if lease else [],
            reason=action.reason,
            shadow_lease=action.lease_id,
            shadow_serving=serving,
            figures=figures,
        )

    # ---- record -------------------------------------------------------------------

    def _record(
        self, advice: Sequence[Advice], samples: Sequence[AdviceSample], report: TickReport
    ) -> None:
        """This tick's rows, with any the database refused before, in one transaction."""
        self._advice += advice
        self._samples += samples
        for lease in self.book.take_changed():
            self._shadows[lease.id] = shadow_row(lease)
        if self.store is None:
            self._advice.clear()
            self._samples.clear()
            self._shadows.clear()
            return
        try:
            self.store.write_tick(self._advice, self._samples, list(self._shadows.values()))
        except (IntegrityError, DataError) as exc:  # refused for good: retrying cannot help
            report.errors.append(StepError("record", "permanent", first_line(exc)))
            log.error("advice rows refused by the database, dropped: %s", first_line(exc))
        except SQLAlchemyError as exc:  # the database is away: kept for the next tick's write
            report.errors.append(StepError("record", "transient", first_line(exc)))
            if len(self._samples) > MAX_PENDING_SAMPLES:
                dropped = len(self._samples) - MAX_PENDING_SAMPLES
                del self._samples[:dropped]
                log.warning("advice database down: %d oldest samples dropped", dropped)
            return
        self._advice.clear()
        self._samples.clear()
        self._shadows.clear()


def _samples(obs: Observation, now: datetime) -> list[AdviceSample]:
    """Each model's sample of this tick (the observer's newest), with its real replicas."""
    out = []
    for model, history in obs.history.items():
        if not history or history[-1].at != obs.at:
            continue
        s = history[-1]
        replicas = sum(1 for srv in obs.servers if srv.ready and model in srv.models)
        out.append(
            AdviceSample(
                at=now,
                model=model,
                request_rate=s.request_rate,
                p99_ms=s.p99_ms,
                mean_ms=s.mean_ms,
                compute_ms=s.compute_ms,
                pending=s.pending,
                replicas=replicas,
            )
        )
    return out


def _line(row: Advice) -> str:
    what = f"{row.kind} {row.node}"
    if row.kind == "lend":
        what += f" ({row.pool}, {row.lend_mode}) for {','.join(row.models)}"
    shadow = f" [shadow lease {row.shadow_lease}]" if row.shadow_lease is not None else ""
    return f"advice: {what}: {row.reason}{shadow}"


def _load_times(store: AdviceStore | None) -> dict[str, float]:
    """The models' load times stored in the advisory's database (none without one, or
    when it cannot be read: the lead time then counts no load)."""
    if store is None:
        return {}
    try:
        return LoadStore.beside(store).latest()
    except SQLAlchemyError as exc:
        log.warning("model load times not read: %s", first_line(exc))
        return {}


__all__ = ["Advisor", "key_figures", "shadow_of", "shadow_row"]
