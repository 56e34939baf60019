"""The actuator: carries out the planner's steps through the adapters and the lease store,
and reports what happened as data.

Called by the reconciler, one pass at a time. For each `Step` it runs the commands in
order; when all succeed it applies the step's move through `LeaseStore.set_status` (the one
place that changes a lease). When a command fails, the adapter's error becomes a
`StepError` in the tick report:
- transient (controller or server not answering, nginx restarting): the lease's step is
  retried on a later tick after a bounded exponential backoff (`[leases] retry_base_s`,
  `retry_max_s`), counted per lease;
- permanent (Slurm rejected the job, Triton refused the model): the lease moves to
  `failed` with the adapter's words as its reason; the planner then cleans it up to
  `returned`, and the policy may lend another node.
A database error is not caught: without its lease store the pass cannot go on (the
reconciler reports the tick as failed).

It keeps, for the pass, the current copy of every open lease (read once per pass by the
reconciler), so routing and the policy see the moves made earlier in the same pass.
Routing leaves out each model a serving lease's server holds that its lease no longer
lists (a placement's dropped models, `bridge.daemon.placement.withheld`), and remembers
since when (`withheld_since`: a dropped model is unloaded only after that).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bridge.config import BridgeConfig
from bridge.daemon import launcher
from bridge.daemon.observation import Observation, replica_gpus
from bridge.daemon.placement import withheld
from bridge.daemon.planner import LeaseRecord
from bridge.daemon.report import TickReport
from bridge.leases.errors import LeaseError
from bridge.leases.models import Lease
from bridge.leases.requests import Audit
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.policy import steps
from bridge.policy.capacity import weight
from bridge.routing.errors import RoutingError
from bridge.routing.table import BASELINE, BatchGate, MetricsTarget, RoutingTable, Split
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import TOP_PRIORITY, JobSpec, ReservationSpec, lease_of
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.errors import TritonError
from bridge.triton.ports import metrics_address, slot_of
from bridge.triton.protocol import TritonInstance
from bridge.weights import overlay

S = LeaseState
#: every error an adapter (or the launcher, or a refused store write) raises as data
ADAPTER_ERRORS: tuple[type[BaseException], ...] = (
    SlurmError,
    TritonError,
    RoutingError,
    LeaseError,
    launcher.LauncherError,
)


class Router(Protocol):
    """What the actuator needs from routing (`bridge.routing.RoutingPublisher`): make
    `table` what clients reach, in effect when the call returns."""

    def publish(self, table: RoutingTable) -> object: ...


def record_of(lease: Lease) -> LeaseRecord:
    """The planner's copy of a stored lease."""
    assert lease.id is not None
    return LeaseRecord(
        lease.id,
        lease.node,
        lease.pool,
        lease.lend_mode.value,
        LeaseState(lease.state),
        tuple(lease.models),
        lease.created_at.timestamp(),
        lease.updated_at.timestamp(),
        lease.slurm_job_id,
        lease.reason,
        lent_gpus=lease.gpus,
        members=tuple(lease.members or ()),
        gpu_type=lease.gpu_type,
        slot=lease.slot,
    )


@dataclass
class Backoff:
    errors: int = 0
    not_before: float = 0.0


class Actuator:
    def __init__(
        self,
        config: BridgeConfig,
        slurm: SlurmProtocol,
        store: LeaseStore,
        triton_for: Callable[[str], TritonInstance],
        router: Router | None = None,
        forget_triton: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.store = store
        self.triton_for = triton_for
        self.router = router
        #: closes the bridge's own connection to a server before it is stopped
        self.forget_triton = forget_triton
        #: the rollouts' traffic splits every publish carries (`bridge.daemon.rollouts`)
        self.splits: tuple[Split, ...] = ()
        #: the batch route's gate every publish carries (`bridge.policy.batch`, decided by
        #: the reconciler); None: no batch route (`[batch] enabled` off)
        self.batch: BatchGate | None = (
            BatchGate(False, config.batch.retry_after_s) if config.batch.enabled else None
        )
        #: what records an adoption in the new lease's write, given the node and the job
        #: (`bridge.audit.Trail.within`, set by the reconciler); None: nothing recorded
        self.adopted: Callable[[str, str], Audit] | None = None
        #: per lease: transient errors since its last good step, and when to retry
        self.backoff: dict[int, Backoff] = {}
        #: reservations deleted this pass (the pass's observation still lists them)
        self.unfenced: set[str] = set()
        #: the pass's copy of every lease it has seen, by id
        self.leases: dict[int, LeaseRecord] = {}
        self._obs: Observation | None = None
        #: when each job the bridge requeued was requeued (the hour's preemption budget;
        #: kept in memory: a restart forgets it, and Slurm's own MaxBatchRequeue stays)
        self.requeued: deque[float] = deque()
        #: (Triton job id, model) -> the observation time of the pass whose publish first
        #: left that model out of that server's routes (a placement's dropped model)
        self.withheld_since: dict[tuple[str, str], float] = {}

    # ---- the pass -----------------------------------------------------------------

    def begin(self, obs: Observation, leases: Iterable[LeaseRecord]) -> None:
        self._obs = obs
        self.leases = {lease.id: lease for lease in leases}
        self.unfenced.clear()
        for gone in set(self.backoff) - set(self.leases):
            del self.backoff[gone]

    def open_leases(self) -> list[LeaseRecord]:
        return sorted(
            (x for x in self.leases.values() if x.state != S.RETURNED), key=lambda x: x.id
        )

    def not_before(self) -> dict[int, float]:
        return {lid: b.not_before for lid, b in self.backoff.items()}

    def run(
        self, step: steps.Step, now: datetime, report: TickReport, audit: Audit | None = None
    ) -> bool:
        """Carry out one step; True when every command succeeded and its move was made.
        `audit` records the move in the same write, if it is made (a return's first)."""
        job_id: str | None = None
        for command in step.commands:
            try:
                result = self._execute(command, now, report)
            except ADAPTER_ERRORS as exc:
                self._failed(step, command.step, exc, now, report)
                return False
            if isinstance(command, steps.Submit):
                job_id = result
        if step.lease_id is not None and step.commands:
            self.backoff.pop(step.lease_id, None)
        if step.note:
            report.events.append(step.note)
        if step.move is not None:
            move = step.move
            if job_id is not None:
                move = steps.Move(
                    move.lease_id, move.old, move.new, f"Triton job {job_id} submitted", job_id
                )
            try:
                self.apply(move, now, report, audit)
            except LeaseError as exc:
                report.error("store", exc, move.lease_id)
                return False
        return True

    def _failed(
        self, step: steps.Step, what: str, exc: BaseException, now: datetime, report: TickReport
    ) -> None:
        err = report.error(what, exc, step.lease_id)
        lease = self.leases.get(step.lease_id) if step.lease_id is not None else None
        if lease is None:
            return
        if (
            err.kind == "permanent"
            and step.fails_lease
            and lease.state
            not in (
                S.FAILED,
                S.RETURNED,
            )
        ):
            move = steps.Move(lease.id, lease.state, S.FAILED, f"{what}: {exc}")
            try:
                self.apply(move, now, report)
            except LeaseError as store_exc:
                report.error("store", store_exc, lease.id)
            return
        if what == "route":  # local and idempotent: tried again on the very next tick
            return
        # transient, or nothing left to fail (a failed lease's cleanup refused): the lease's
        # step waits, longer after each error, and its deadline runs
        self.retry_later(lease.id, now)

    def retry_later(self, lease_id: int, now: datetime) -> None:
        """The lease's commands wait, longer after each error (`[leases] retry_base_s`,
        doubling up to `retry_max_s`)."""
        b = self.backoff.setdefault(lease_id, Backoff())
        b.errors += 1
        lc = self.config.leases
        wait = min(lc.retry_max_s, lc.retry_base_s * 2 ** (b.errors - 1))
        b.not_before = now.timestamp() + wait

    def apply(
        self, move: steps.Move, now: datetime, report: TickReport, audit: Audit | None = None
    ) -> LeaseRecord:
        """Make one move in the store (compare-and-set on the planned old state). A move
        to serving says where its models' weights were read from (`weight_sources`)."""
        fields = {"slurm_job_id": move.slurm_job_id} if move.slurm_job_id else {}
        before = self.leases.get(move.lease_id)
        reason = move.reason
        if move.new == S.SERVING and before is not None:
            said = self.weight_sources(move.slurm_job_id or before.slurm_job_id)
            reason = f"{reason}; {said}" if said else reason
        stored = self.store.set_status(
            move.lease_id, move.new, now, reason, expected=move.old, audit=audit, **fields
        )
        after = record_of(stored)
        self.leases[after.id] = after
        report.events.append(
            f"lease {after.id} {after.node}: {move.old.value} -> {move.new.value} ({reason})"
        )
        if move.new == S.SERVING:
            report.served.append((after.pool, now.timestamp() - after.created_at))
        elif move.new == S.RETURNED and before is not None:
            outcome = {S.RELEASING: "returned", S.FAILED: "failed"}.get(move.old, "abandoned")
            report.returned.append((after.pool, outcome, now.timestamp() - after.created_at))
        if move.new in (S.FAILED, S.RETURNED):
            self.backoff.pop(after.id, None)
        return after

    def weight_sources(self, job_id: str | None) -> str:
        """Where a lent Triton job read its models' weights (node-local copy or shared
        repository), as its log's `stb-weights:` lines say (`bridge.weights.overlay`), in
        the lease history's words; "" without a weight cache, a log folder, or the lines
        (the log not written yet, or not readable from here: a log folder local to each
        node)."""
        log_dir = self.config.triton.log_dir
        if self.config.weights.cache_root is None or log_dir is None or not job_id:
            return ""
        try:
            text = (log_dir / f"triton-{job_id}.log").read_text(errors="replace")
        except OSError:
            return ""
        return overlay.in_reason(overlay.sources(text))

    def create(
        self,
        node: str,
        pool: str,
        mode: str,
        models: tuple[str, ...],
        key: str,
        now: datetime,
        reason: str,
        gpus: int | None = None,
        members: tuple[str, ...] = (),
        audit: Audit | None = None,
        gpu_type: str | None = None,
        slot: int | None = None,
    ) -> LeaseRecord:
        """Record a lend (`LeaseStore.create`; `audit` records it in the same write)."""
        lease = record_of(
            self.store.create(
                node,
                pool,
                mode,
                list(models),
                key,
                now,
                reason=reason,
                gpus=gpus,
                members=members,
                audit=audit,
                gpu_type=gpu_type,
                slot=slot,
            )
        )
        self.leases[lease.id] = lease
        return lease

    # ---- commands -----------------------------------------------------------------

    def _execute(self, command: steps.Command, now: datetime, report: TickReport) -> str | None:
        match command:
            case steps.Fence(reservation, node, duration_s, members):
                self.slurm.create_reservation(
                    ReservationSpec(
                        reservation,
                        (node, *members),
                        duration_s=duration_s,
                        users=("root",),
                        flags=("IGNORE_JOBS",),
                    )
                )
                held = ",".join((node, *members))
                report.events.append(f"{held}: fenced by reservation {reservation}")
            case steps.Submit():
                return self.slurm.submit(self._lease_job(command))
            case steps.Requeue(node, job_ids):
                self._requeue(node, job_ids, now, report)
            case steps.SubmitBaseline(node):
                # the models served from zero are lent replicas' alone
                zero = self._obs.models.from_zero if self._obs is not None else ()
                job = launcher.triton_job(self.config.triton, node=node, skip=zero)
                job_id = self.slurm.submit(job)
                report.events.append(f"baseline Triton job {job_id} on {node}")
                return job_id
            case steps.Cancel(job_id):
                self.slurm.cancel(job_id)
            case steps.Unload(address, models):
                client = self.triton_for(address)
                for model in models:
                    client.unload_model(model)
                if self.forget_triton is not None:
                    self.forget_triton(address)
            case steps.Unfence(reservation):
                self.slurm.delete_reservation(reservation)
                self.unfenced.add(reservation)
            case steps.Resume(node):
                self.slurm.resume(node)
            case steps.RouteIn(lease_id):
                self.route(report, include=lease_id)
            case steps.RouteOut(lease_id):
                self.route(report, exclude=lease_id)
            case steps.Adopt(job_id, node, pool, mode, members, gpus):
                audit = None if self.adopted is None else self.adopted(node, job_id)
                orphan = self._obs.triton_jobs().get(job_id) if self._obs is not None else None
                tags = orphan.tags if orphan is not None else ()
                lease = self.create(
                    node,
                    pool,
                    mode,
                    (),
                    f"adopt:{job_id}",
                    now,
                    "adopted",
                    gpus=gpus,
                    members=members,
                    audit=audit,
                    slot=slot_of(tags),  # the ports its server listens on
                )
                self.apply(
                    steps.Move(lease.id, S.REQUESTED, S.SUBMITTED, f"adopted job {job_id}", job_id),
                    now,
                    report,
                )
        return None

    def _requeue(
        self, node: str, job_ids: tuple[str, ...], now: datetime, report: TickReport
    ) -> None:
        """Requeue a lend's victims. A victim that ended meanwhile is no failure (Slurm
        refuses to requeue it: the node is free anyway); a transient error fails the step,
        and slurmctld's own preemption pass still frees the node, later."""
        for job_id in job_ids:
            try:
                self.slurm.requeue(job_id)
            except SlurmError as exc:
                if exc.transient:
                    raise
                report.events.append(f"{node}: job {job_id} not requeued: {exc}")
                continue
            self.requeued.append(now.timestamp())
            report.events.append(f"{node}: requeued job {job_id} for the lend")

    def preemptions_since(self, since: float) -> int:
        """Jobs the bridge requeued at or after `since` (epoch seconds)."""
        while self.requeued and self.requeued[0] < since:
            self.requeued.popleft()
        return len(self.requeued)

    def _lease_job(self, submit: steps.Submit) -> JobSpec:
        assert self._obs is not None
        node = self._obs.nodes.get(submit.node)
        pool = self.config.pools[submit.pool]
        return launcher.triton_job(
            self.config.triton,
            node=submit.node,
            # a gang: one job on all its nodes (-N n), whole
            members=submit.members,
            models=submit.models,
            lease=submit.ref,
            # a partial lend shares the node with its other jobs: k GPUs, not --exclusive
            exclusive=submit.gpus is None,
            gpus=submit.gpus if submit.gpus is not None else node.gpus if node else 1,
            gpu_type=submit.gpu_type,
            # a node's other leases' servers listen on other ports (a shared node)
            slot=submit.slot,
            # a drain lend's job runs in its fence; a partial lend's in its pool's own
            # partition, where it preempts nothing: Slurm would pick its own victims (in
            # the lab it took the other job too), so the job waits for the GPUs of the
            # jobs this step requeues (`planner.victims_of`)
            partition=pool.partition if submit.reservation or submit.gpus is not None else None,
            reservation=submit.reservation,
            # a drain-mode partial lend's job pends on its node for the GPUs its jobs free:
            # at the top priority Slurm gives them to it before any pending training job
            priority=TOP_PRIORITY if submit.top else None,
            weights_cache=self.config.weights.cache_root,
            weights_verify=self.config.weights.verify,
        )

    # ---- routing ------------------------------------------------------------------

    def route(
        self,
        report: TickReport,
        *,
        include: int | None = None,
        exclude: int | None = None,
        splits: Iterable[Split] | None = None,
    ) -> None:
        """Publish baselines and serving leases (plus `include`, minus `exclude`), with
        the rollouts' `splits` (None: those of the last publish)."""
        if splits is not None:
            self.splits = tuple(splits)
        if self._obs is None:
            return
        servers = {s.job.job_id: s.models for s in self._obs.servers if s.ready}
        held_back = withheld(self.leases.values(), servers)
        if self.router is None:
            self._withheld(held_back)
            return
        serving = {
            lease.slurm_job_id
            for lease in self.leases.values()
            if (lease.state == S.SERVING or lease.id == include) and lease.id != exclude
        }
        # Every model the repository holds has a route (none ready: nginx answers 503);
        # a model loaded on a replica is routed too.
        routes: dict[str, list[str]] = {m: [] for m in self._obs.models.served}
        # each replica weighed as the capacity model splits a model's requests
        gpus = replica_gpus(self._obs, self.leases.values())
        scaled = self._obs.models.scaled
        weights: dict[str, dict[str, int]] = {}
        split_of = {sp.model: sp for sp in self.splits}
        targets = []
        for s in self._obs.servers:
            ref = lease_of(s.job.tags)
            if not s.ready or (ref is not None and s.job.job_id not in serving):
                continue
            for m in s.models:
                if (s.job.job_id, m) in held_back:
                    continue
                split = split_of.get(m)
                if split is None or _serves_split(s.versions.get(m, ()), split):
                    routes.setdefault(m, []).append(s.address)
                    own = scaled.get(m)
                    instances = own.instances if own is not None else None
                    weights.setdefault(m, {})[s.address] = weight(
                        gpus.get(s.job.job_id, 1), instances
                    )
            host = s.address.rsplit(":", 1)[0]
            targets.append(
                MetricsTarget(
                    metrics_address(host, s.job.tags),
                    s.node,
                    s.job.job_id,
                    str(ref[0]) if ref is not None else BASELINE,
                    tuple(s.models),
                )
            )
        # a model served from zero with no ready replica is routed to the activator
        zero = self._obs.models.from_zero
        self.router.publish(
            RoutingTable.build(routes, targets, self.splits, zero, self.batch, weights)
        )
        self._withheld(held_back)

    def _withheld(self, pairs: frozenset[tuple[str, str]]) -> None:
        """Routing as published leaves `pairs` out: since this pass, for the new ones."""
        assert self._obs is not None
        at = self._obs.at
        self.withheld_since = {p: self.withheld_since.get(p, at) for p in pairs}


def _serves_split(versions: Iterable[str], split: Split) -> bool:
    """Whether a replica holding `versions` of a split model can take its requests: those
    the split sends (old, new or both by its share)."""
    held = set(versions)
    wanted = {str(split.old)} if split.percent <= 0 else set()
    if split.percent >= 100:
        wanted = {str(split.new)}
    elif split.percent > 0:
        wanted = {str(split.old), str(split.new)}
    return wanted <= held


__all__ = ["ADAPTER_ERRORS", "Actuator", "Backoff", "Router", "record_of"]
