"""One control pass, `run_once(now)`: observe -> passive sync -> decide -> act -> route.

Called by `stb daemon` every `tick_s` (APScheduler) and directly by tests with an
injected clock. Each pass:
1. Observe: a `Snapshot` from Slurm, the Triton servers and the open leases.
2. Passive sync: move every open lease forward by what Slurm and Triton say (job running,
   server ready, job gone, request drain finished), adopt tagged Triton jobs that have no
   lease, cancel Triton jobs of finished leases, and lift bridge fences (reservations
   `stb-lease-*`, `stb:` drains) that no open lease holds. After a crash this is what
   makes the bridge whole again: nothing stays fenced and forgotten.
3. Decide: the pure policy on the refreshed snapshot.
4. Act: lend (a lease, then its Triton job), return (out of routing first), baselines.
5. Route: publish the ready replicas (baselines and serving leases).

Every step is idempotent: a lease's state says what is done, Slurm jobs carry the lease
id in their comment, so a retry after a crash finds the work and does not repeat it.
Errors are caught per lease and per action, recorded in the tick report and on the
lease when permanent; the pass itself never dies half-way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from bridge.config import BridgeConfig
from bridge.daemon import launcher
from bridge.daemon.exporter import BridgeMetrics
from bridge.daemon.observe import Observer, TritonServer, pool_of
from bridge.leases.errors import LeaseError
from bridge.leases.models import Lease, LendMode
from bridge.leases.requests import RequestQueue
from bridge.leases.states import LeaseState
from bridge.leases.store import LeaseStore
from bridge.policy import Action, Lend, Return, StartBaseline, decide
from bridge.policy.snapshot import LeaseView, Snapshot
from bridge.routing.errors import RoutingError
from bridge.routing.table import BASELINE, MetricsTarget, RoutingTable
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import Job
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.errors import TritonError
from bridge.triton.metrics import parse_page
from bridge.triton.protocol import TritonInstance

log = logging.getLogger(__name__)

S = LeaseState
RESERVATION_PREFIX = "stb-lease-"
#: seconds a draining replica may wait for its in-flight requests before it is unloaded
DRAIN_DEADLINE_S = 30.0
METRICS_PORT = 8002


class Router(Protocol):
    """What the reconciler needs from routing (`bridge.routing.RoutingPublisher`): make
    `table` what clients reach, in effect when the call returns."""

    def publish(self, table: RoutingTable) -> object: ...


@dataclass
class TickReport:
    at: datetime
    actions: list[Action] = field(default_factory=list)
    #: "lease 3 n3: starting -> serving (Triton ready)" lines, in order
    events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _ref(lease: Lease) -> launcher.LeaseRef:
    """How the lease's Triton job names it (see `launcher.lease_tag`)."""
    assert lease.id is not None
    return lease.id, int(lease.created_at.timestamp())


def reservation_name(lease_id: int) -> str:
    return f"{RESERVATION_PREFIX}{lease_id}"


def _epoch(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


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
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.store = store
        self.observer = observer
        self.triton_for = triton_for
        self.router = router
        self.metrics = metrics or BridgeMetrics()
        self.requests = requests
        #: closes the bridge's own connection to a server before it is stopped
        self.forget_triton = forget_triton
        self.last_lend_at: dict[str, float] = {}

    # ---- the pass ------------------------------------------------------------------

    def run_once(self, now: datetime | None = None) -> TickReport:
        now = now or datetime.now(UTC)
        report = TickReport(now)
        started = time.monotonic()
        snapshot, servers = self._observe(now)
        self._sync(now, servers, report)
        self._operator_requests(now, servers, report)
        snapshot = replace(snapshot, leases=self._lease_views())
        report.actions = decide(snapshot, self.config, now.timestamp())
        for action in report.actions:
            self._act(action, now, servers, report)
        # A routing failure is in report.errors; the old routes keep serving.
        with contextlib.suppress(RoutingError):
            self._route(servers, report)
        report.seconds = time.monotonic() - started
        self.metrics.record_tick(
            report.seconds, [lease.state.value for lease in self.store.open_leases()]
        )
        for name, model in self.config.models.items():
            history = snapshot.history.get(name, ())
            self.metrics.record_model(
                name, history[-1].p99_ms if history else None, model.slo_p99_ms
            )
        return report

    def _observe(self, now: datetime) -> tuple[Snapshot, list[TritonServer]]:
        # The scale-out cooldown runs from when a lend's replica began serving (or from
        # the lend while it is on its way): a new replica is judged by the p99 it brings.
        for lease in self.store.open_leases():
            anchor = lease.updated_at if lease.state == S.SERVING else lease.created_at
            for m in lease.models:
                self.last_lend_at[m] = max(self.last_lend_at.get(m, 0.0), anchor.timestamp())
        return self.observer.observe(self._lease_views(), now.timestamp(), self.last_lend_at)

    def _lease_views(self) -> tuple[LeaseView, ...]:
        views = []
        for lease in self.store.open_leases():
            assert lease.id is not None
            views.append(
                LeaseView(
                    lease.id,
                    lease.node,
                    lease.pool,
                    lease.lend_mode.value,
                    lease.state.value,
                    tuple(lease.models),
                    lease.created_at.timestamp(),
                    # a lease's last status change is when it entered its current state
                    lease.updated_at.timestamp() if lease.state == S.SERVING else None,
                )
            )
        return tuple(views)

    def _move(
        self,
        lease: Lease,
        new: LeaseState,
        now: datetime,
        reason: str,
        report: TickReport,
        **fields: str,
    ) -> Lease:
        assert lease.id is not None
        moved = self.store.set_status(lease.id, new, now, reason, expected=lease.state, **fields)
        report.events.append(
            f"lease {lease.id} {lease.node}: {lease.state.value} -> {new.value} ({reason})"
        )
        if new == S.SERVING:
            self.metrics.lend_seconds.labels(lease.pool).observe(
                (now - lease.created_at).total_seconds()
            )
        elif new == S.RETURNED:
            outcome = {S.RELEASING: "returned", S.FAILED: "failed"}.get(lease.state, "abandoned")
            self.metrics.returns.labels(outcome).inc()
            self.metrics.return_seconds.observe((now - lease.created_at).total_seconds())
        return moved

    # ---- passive sync --------------------------------------------------------------

    def _sync(self, now: datetime, servers: Sequence[TritonServer], report: TickReport) -> None:
        jobs = {j.job_id: j for j in self.observer.last_jobs if launcher.TRITON_TAG in j.tags}
        by_job = {s.job.job_id: s for s in servers}
        open_ids: set[int] = set()
        for lease in self.store.open_leases():
            assert lease.id is not None
            open_ids.add(lease.id)
            try:
                self._sync_lease(lease, jobs, by_job, now, report)
            except (SlurmError, TritonError, LeaseError, RoutingError) as exc:
                report.errors.append(f"lease {lease.id}: {exc}")
                log.warning("lease %s: %s", lease.id, exc)
        self._adopt_and_clean(jobs, open_ids, now, report)

    def _job_of(self, lease: Lease, jobs: dict[str, Job]) -> Job | None:
        if lease.slurm_job_id:
            return jobs.get(lease.slurm_job_id)
        ref = _ref(lease)
        return next((j for j in jobs.values() if launcher.lease_of(j.tags) == ref), None)

    def _sync_lease(
        self,
        lease: Lease,
        jobs: dict[str, Job],
        by_job: dict[str, TritonServer],
        now: datetime,
        report: TickReport,
    ) -> None:
        assert lease.id is not None
        job = self._job_of(lease, jobs)
        state = lease.state
        if state == S.REQUESTED:
            if job is not None:  # submitted before a crash, not yet recorded
                self._move(
                    lease, S.SUBMITTED, now, "found its Triton job", report, slurm_job_id=job.job_id
                )
            else:
                self._submit(lease, now, report)
        elif state == S.SUBMITTED:
            if job is None:
                self._move(lease, S.FAILED, now, "Triton job vanished before it ran", report)
            elif job.state == "RUNNING":
                self._move(lease, S.STARTING, now, f"job {job.job_id} running", report)
        elif state == S.STARTING:
            server = by_job.get(job.job_id) if job else None
            if job is None:
                self._move(lease, S.FAILED, now, "Triton job ended while starting", report)
            elif server and server.ready and set(lease.models) <= set(server.models):
                self._route(list(by_job.values()), report, extra=lease.id)
                self._move(lease, S.SERVING, now, "Triton ready, in routing", report)
            elif (
                now.timestamp() - lease.updated_at.timestamp() > self.config.triton.ready_timeout_s
            ):
                self._move(lease, S.FAILED, now, "Triton not ready in time", report)
        elif state == S.SERVING:
            server = by_job.get(job.job_id) if job else None
            if job is None or server is None or not server.ready:
                self._move(lease, S.FAILED, now, "Triton job or server gone while serving", report)
        elif state == S.DRAINING:
            self._drain_step(lease, job, by_job, now, report)
        elif state == S.RELEASING:
            if job is None:
                self._unfence(lease)
                self._move(lease, S.RETURNED, now, "job gone, node back with Slurm", report)
            else:
                self.slurm.cancel(job.job_id)
        elif state == S.FAILED:
            if job is not None:
                self.slurm.cancel(job.job_id)
            else:
                self._unfence(lease)
                self._move(lease, S.RETURNED, now, "cleaned up after failure", report)

    def _submit(self, lease: Lease, now: datetime, report: TickReport) -> None:
        assert lease.id is not None
        node = self.observer.last_nodes.get(lease.node)
        gpus = node.gpus if node else 1
        pool = self.config.pools[lease.pool]
        reservation = None
        partition = None
        if lease.lend_mode == LendMode.DRAIN:
            # The gentle fence: a reservation holds the node for the bridge; running jobs
            # go on, nothing new starts there, and Triton starts when the node is free.
            reservation = reservation_name(lease.id)
            if not any(r.name == reservation for r in self.slurm.reservations()):
                self.slurm.create_reservation(
                    reservation,
                    [lease.node],
                    duration_s=int(self.config.policy.drain_wait_s + 7 * 24 * 3600),
                    users=["root"],
                    flags=("IGNORE_JOBS",),
                )
                report.events.append(
                    f"lease {lease.id} {lease.node}: fenced by reservation {reservation}"
                )
            partition = pool.partition
        spec = launcher.triton_job(
            self.config.triton,
            node=lease.node,
            models=lease.models,
            lease=_ref(lease),
            exclusive=True,
            gpus=gpus,
            partition=partition,
            reservation=reservation,
        )
        job_id = self.slurm.submit(spec)
        self._move(
            lease, S.SUBMITTED, now, f"Triton job {job_id} submitted", report, slurm_job_id=job_id
        )

    def _drain_step(
        self,
        lease: Lease,
        job: Job | None,
        by_job: dict[str, TritonServer],
        now: datetime,
        report: TickReport,
    ) -> None:
        assert lease.id is not None
        server = by_job.get(job.job_id) if job else None
        if job is None or server is None:
            self._move(lease, S.RELEASING, now, "server gone while draining", report)
            return
        client = self.triton_for(server.address)
        page = parse_page(client.metrics_text())
        pending = sum(
            s.pending_requests or 0 for k, s in page.models.items() if s.model in lease.models
        )
        since = lease.updated_at.timestamp()  # when it entered draining
        if pending > 0 and now.timestamp() - since < DRAIN_DEADLINE_S:
            return
        for model in lease.models:
            client.unload_model(model)
        if self.forget_triton is not None:
            self.forget_triton(server.address)
        self.slurm.cancel(job.job_id)
        why = "no request in flight" if pending == 0 else f"drain deadline, {pending:g} pending"
        self._move(lease, S.RELEASING, now, f"{why}; unloaded, job cancelled", report)

    def _unfence(self, lease: Lease) -> None:
        if lease.lend_mode == LendMode.DRAIN and lease.id is not None:
            self.slurm.delete_reservation(reservation_name(lease.id))

    def _adopt_and_clean(
        self, jobs: dict[str, Job], open_ids: set[int], now: datetime, report: TickReport
    ) -> None:
        open_leases = self.store.open_leases()
        open_refs = {_ref(lease) for lease in open_leases}
        open_jobs = {lease.slurm_job_id for lease in open_leases if lease.slurm_job_id}
        for job in jobs.values():
            ref = launcher.lease_of(job.tags)
            if ref is None or ref in open_refs or job.job_id in open_jobs:
                continue
            try:
                known: Lease | None = self.store.get(ref[0])
            except LeaseError:
                known = None
            if known is not None and _ref(known) == ref:
                # a finished lease's job is still there: a leak
                if job.state in ("RUNNING", "PENDING"):
                    self.slurm.cancel(job.job_id)
                    report.events.append(f"cancelled job {job.job_id} of finished lease {ref[0]}")
            elif job.state == "RUNNING" and len(job.nodes) == 1:
                node = self.observer.last_nodes.get(job.nodes[0])
                pool = next(
                    (
                        name
                        for name, p in self.config.pools.items()
                        if node and p.partition in node.partitions and p.lend_mode != "reserved"
                    ),
                    None,
                )
                if pool is None:
                    continue
                lease = self.store.create(
                    job.nodes[0],
                    pool,
                    self.config.pools[pool].lend_mode,
                    [],
                    f"adopt:{job.job_id}",
                    now,
                    reason="adopted",
                )
                lease = self._move(
                    lease,
                    S.SUBMITTED,
                    now,
                    f"adopted job {job.job_id}",
                    report,
                    slurm_job_id=job.job_id,
                )
        for resv in self.slurm.reservations():
            suffix = resv.name.removeprefix(RESERVATION_PREFIX)
            if (
                resv.name.startswith(RESERVATION_PREFIX)
                and suffix.isdigit()
                and int(suffix) not in open_ids
            ):
                self.slurm.delete_reservation(resv.name)
                report.events.append(f"lifted fence {resv.name}: no open lease holds it")
        for node in self.observer.last_nodes.values():
            if node.fenced_by_bridge and not any(
                lease.node == node.name for lease in self.store.open_leases()
            ):
                self.slurm.resume(node.name)
                report.events.append(f"resumed {node.name}: bridge drain with no lease")

    # ---- operator requests --------------------------------------------------------

    def _operator_requests(
        self, now: datetime, servers: Sequence[TritonServer], report: TickReport
    ) -> None:
        """Carry out `stb lend` / `stb return` requests through the same state machine."""
        if self.requests is None:
            return
        for req in self.requests.pending():
            assert req.id is not None
            try:
                if req.kind == "lend" and req.node:
                    outcome = self._operator_lend(req.node, req.models, now, report)
                elif req.kind == "return" and req.lease_id is not None:
                    lease = self.store.get(req.lease_id)
                    if lease.state == S.RETURNED:
                        outcome = f"refused: lease {req.lease_id} is already returned"
                    else:
                        self._return(Return(req.lease_id, "operator"), now, servers, report)
                        outcome = f"lease {req.lease_id} returning"
                else:
                    outcome = f"refused: malformed {req.kind!r} request"
            except (SlurmError, TritonError, LeaseError, RoutingError) as exc:
                outcome = f"failed: {exc}"
            self.requests.finish(req.id, now, outcome)
            report.events.append(f"operator request {req.id} ({req.kind}): {outcome}")

    def _operator_lend(
        self, node: str, models: Sequence[str], now: datetime, report: TickReport
    ) -> str:
        known = self.observer.last_nodes.get(node)
        if known is None:
            return f"refused: Slurm has no node {node!r}"
        pool = pool_of(known, self.config)
        if pool is None or self.config.pools[pool].lend_mode not in ("preempt", "drain"):
            return f"refused: {node} is in no lendable pool (pool {pool})"
        if any(lease.node == node for lease in self.store.open_leases()):
            return f"refused: {node} is already lent"
        unknown = sorted(set(models) - set(self.config.models))
        if unknown:
            return f"refused: unknown models {', '.join(unknown)}"
        chosen = tuple(models) or tuple(self.config.models)
        mode = self.config.pools[pool].lend_mode
        self._lend(Lend(node, pool, mode, chosen, "operator"), now, report)
        lease = self.store.by_node(node, open_only=True)
        return f"lease {lease[-1].id if lease else '?'} lending {node}"

    # ---- act ----------------------------------------------------------------------

    def _act(
        self, action: Action, now: datetime, servers: Sequence[TritonServer], report: TickReport
    ) -> None:
        try:
            if isinstance(action, Lend):
                self._lend(action, now, report)
            elif isinstance(action, Return):
                self._return(action, now, servers, report)
            elif isinstance(action, StartBaseline):
                spec = launcher.triton_job(self.config.triton, node=action.node)
                job_id = self.slurm.submit(spec)
                report.events.append(f"baseline Triton job {job_id} on {action.node}")
            self.metrics.decisions.labels(
                type(action).__name__.lower(), action.reason.split(":")[0][:40]
            ).inc()
        except (SlurmError, TritonError, LeaseError, RoutingError) as exc:
            report.errors.append(f"{action.key}: {exc}")
            log.warning("%s: %s", action.key, exc)

    def _lend(self, action: Lend, now: datetime, report: TickReport) -> None:
        lease = self.store.create(
            action.node,
            action.pool,
            action.lend_mode,
            list(action.models),
            f"{action.key}@{now.isoformat()}",
            now,
            reason=action.reason,
        )
        report.events.append(
            f"lease {lease.id} {action.node}: requested "
            f"({action.lend_mode}, models {','.join(action.models)}: "
            f"{action.reason})"
        )
        self.metrics.lends.labels(action.pool).inc()
        for m in action.models:
            self.last_lend_at[m] = now.timestamp()
        self._submit(lease, now, report)

    def _return(
        self, action: Return, now: datetime, servers: Sequence[TritonServer], report: TickReport
    ) -> None:
        lease = self.store.get(action.lease_id)
        if lease.state == S.SERVING:
            # Out of routing first: no new request reaches the replica, then drain.
            self._route(servers, report, exclude=lease.id)
            self._move(lease, S.DRAINING, now, f"return: {action.reason}", report)
        elif lease.state in (S.SUBMITTED, S.STARTING):
            if lease.slurm_job_id:
                self.slurm.cancel(lease.slurm_job_id)
            self._move(lease, S.RELEASING, now, f"return: {action.reason}", report)
        elif lease.state == S.REQUESTED:
            self._unfence(lease)
            self._move(lease, S.RETURNED, now, f"abandoned: {action.reason}", report)

    # ---- routing ------------------------------------------------------------------

    def _route(
        self,
        servers: Sequence[TritonServer],
        report: TickReport,
        *,
        extra: int | None = None,
        exclude: int | None = None,
    ) -> None:
        """Publish baselines and serving leases (plus `extra`, minus `exclude`)."""
        if self.router is None:
            return
        serving = {
            lease.slurm_job_id
            for lease in self.store.open_leases()
            if (lease.state == S.SERVING or lease.id == extra) and lease.id != exclude
        }
        # Every configured model has a route (none ready: nginx answers 503); a model
        # published to the repository and loaded on a replica is routed too.
        routes: dict[str, list[str]] = {m: [] for m in self.config.models}
        targets = []
        for s in servers:
            ref = launcher.lease_of(s.job.tags)
            if not s.ready or (ref is not None and s.job.job_id not in serving):
                continue
            for m in s.models:
                routes.setdefault(m, []).append(s.address)
            host = s.address.rsplit(":", 1)[0]
            targets.append(
                MetricsTarget(
                    f"{host}:{METRICS_PORT}",
                    s.node,
                    s.job.job_id,
                    str(ref[0]) if ref is not None else BASELINE,
                    tuple(s.models),
                )
            )
        try:
            self.router.publish(RoutingTable.build(routes, targets))
        except RoutingError as exc:
            report.errors.append(f"routing: {exc}")
            raise
