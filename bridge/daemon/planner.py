"""The sync planner: what each open lease needs next, from one observation. Pure.

`plan(obs, leases, now, settings, not_before)` folds in what Slurm and Triton say (a job
running, a server ready, a job gone) and returns `Step`s: the commands a lease needs
(submit its Triton job, cancel it, unload its models, lift its fence, put it in or out of
routing) and the move its state makes once they have all succeeded. `plan_orphans`
handles what no open lease holds (tagged Triton jobs to adopt or cancel, bridge fences to
lift); `plan_return` gives a lease back; `replayed_lend` and `replayed_return` answer an
operator request taken again after a failover from the work its first attempt did. The
actuator (`bridge.daemon.actuator`) carries steps out through the adapters; errors come
back as data, and a lease whose command failed permanently is failed by the actuator with
the adapter's words.

No I/O, no clock: `now` is a parameter (epoch seconds), so every case is a unit test with
literal inputs (tests/unit/test_planner.py).

Deadlines (`deadline`): a lease that stays in one state longer than its deadline is failed
("stuck in <state> ..."), except `failed`, which cannot fail again (it is reported as
stuck, for a person). `draining` first waits up to `drain_timeout_s` for in-flight
requests, then unloads and cancels; its deadline catches an unload that never succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bridge.config import BridgeConfig, pool_of
from bridge.daemon.observation import RESERVATION_PREFIX, Observation
from bridge.lifecycle import LeaseState
from bridge.slurm.model import Job, LeaseRef, lease_of

S = LeaseState
#: a reservation of a drain-mode lend lasts this much past the bounded drain wait
RESERVATION_SLACK_S = 7 * 24 * 3600
#: Slurm's reasons for a pending job that will not run without a person
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser", "launch failed requeued held", "BadConstraints")


def reservation_name(lease_id: int) -> str:
    return f"{RESERVATION_PREFIX}{lease_id}"


@dataclass(frozen=True)
class LeaseRecord:
    """What the planner knows of a lease (a plain copy of the stored row)."""

    id: int
    node: str
    pool: str
    lend_mode: str
    state: LeaseState
    models: tuple[str, ...]
    slurm_job_id: str | None
    created_at: float
    #: when it entered its current state
    updated_at: float
    reason: str = ""

    @property
    def ref(self) -> LeaseRef:
        """How the lease's Triton job names it (see `lease_tag`)."""
        return self.id, int(self.created_at)


# ---- commands: what the actuator does through an adapter ---------------------------------


@dataclass(frozen=True)
class Fence:
    """Create the drain-mode reservation that holds `node` for the lease."""

    step = "fence"
    reservation: str
    node: str
    duration_s: int


@dataclass(frozen=True)
class Submit:
    """Submit the lease's Triton job on its node; its job id goes into the move."""

    step = "submit"
    node: str
    models: tuple[str, ...]
    ref: LeaseRef
    pool: str
    reservation: str | None


@dataclass(frozen=True)
class Requeue:
    """Requeue the jobs running on a preempt-mode lend's node, right after its Triton job
    is submitted there: Slurm's own requeue (the job gets SIGTERM and KillWait to
    checkpoint, then runs again), without waiting for slurmctld's periodic preemption
    pass (18-33 s on the lab, 3.8 s this way)."""

    step = "requeue"
    node: str
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class SubmitBaseline:
    """Submit a reserved node's baseline Triton job (no lease)."""

    step = "baseline"
    node: str


@dataclass(frozen=True)
class Cancel:
    step = "cancel"
    job_id: str


@dataclass(frozen=True)
class Unload:
    """Unload the lease's models from its server, then forget the bridge's connection."""

    step = "unload"
    address: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Unfence:
    """Delete a bridge reservation."""

    step = "unfence"
    reservation: str


@dataclass(frozen=True)
class Resume:
    """Resume a node the bridge drained (an `stb:` drain reason) that no lease holds."""

    step = "unfence"
    node: str


@dataclass(frozen=True)
class RouteIn:
    """Publish routing with the lease's replica in it (before it counts as serving)."""

    step = "route"
    lease_id: int


@dataclass(frozen=True)
class RouteOut:
    """Publish routing without the lease's replica (before it drains)."""

    step = "route"
    lease_id: int


@dataclass(frozen=True)
class Adopt:
    """Record a lease for a tagged Triton job that no lease holds (a lend whose record was
    lost), as submitted with that job."""

    step = "adopt"
    job_id: str
    node: str
    pool: str
    lend_mode: str


Command = (
    Fence
    | Submit
    | Requeue
    | SubmitBaseline
    | Cancel
    | Unload
    | Unfence
    | Resume
    | RouteIn
    | RouteOut
    | Adopt
)


@dataclass(frozen=True)
class Move:
    """A state change of a lease: `old` is the state the plan was made from (the store
    refuses the move if another writer got there first)."""

    lease_id: int
    old: LeaseState
    new: LeaseState
    reason: str
    slurm_job_id: str | None = None


@dataclass(frozen=True)
class Step:
    """Commands, in order, then the move they lead to (None: no move yet). `lease_id` is
    None for steps no lease holds (orphans, baselines). `note` is a line for the tick's
    events when the step carries no move."""

    lease_id: int | None
    commands: tuple[Command, ...] = ()
    move: Move | None = None
    note: str = ""
    #: a failure of this step fails the lease (False for routing steps, whose failure
    #: says nothing about the lease)
    fails_lease: bool = True


@dataclass(frozen=True)
class Settings:
    """The deadlines and waits the planner needs, in seconds."""

    requested_deadline_s: float = 120
    submitted_deadline_s: float = 600
    starting_deadline_s: float = 300
    releasing_deadline_s: float = 300
    drain_timeout_s: float = 30
    drain_wait_s: float = 120
    #: a serving replica that stops answering (its job still running) is failed after this
    unanswered_grace_s: float = 15
    #: a preempt-mode lend requeues its node's jobs itself (`[leases] requeue_victims`)
    requeue_victims: bool = True

    @classmethod
    def of(cls, config: BridgeConfig) -> Settings:
        leases = config.leases
        return cls(
            requested_deadline_s=leases.requested_deadline_s,
            submitted_deadline_s=leases.submitted_deadline_s,
            starting_deadline_s=config.triton.ready_timeout_s,
            releasing_deadline_s=leases.releasing_deadline_s,
            drain_timeout_s=leases.drain_timeout_s,
            drain_wait_s=config.policy.drain_wait_s,
            unanswered_grace_s=leases.unanswered_grace_s,
            requeue_victims=leases.requeue_victims,
        )


def deadline(lease: LeaseRecord, settings: Settings) -> float | None:
    """Seconds the lease may stay in its state, or None (no deadline)."""
    if lease.state == S.REQUESTED:
        return settings.requested_deadline_s
    if lease.state == S.SUBMITTED:
        if lease.lend_mode == "drain":
            return max(settings.submitted_deadline_s, settings.drain_wait_s + 60)
        return settings.submitted_deadline_s
    if lease.state == S.STARTING:
        return settings.starting_deadline_s
    if lease.state == S.DRAINING:  # the wait for requests, then an unload that must end
        return settings.drain_timeout_s + settings.releasing_deadline_s
    if lease.state in (S.RELEASING, S.FAILED):
        return settings.releasing_deadline_s
    return None


def is_stuck(lease: LeaseRecord, settings: Settings, now: float) -> bool:
    """Past its state's deadline (a `failed` lease whose cleanup does not finish)."""
    limit = deadline(lease, settings)
    return limit is not None and now - lease.updated_at > limit


def _job_of(lease: LeaseRecord, jobs: Mapping[str, Job]) -> Job | None:
    if lease.slurm_job_id:
        return jobs.get(lease.slurm_job_id)
    return next((j for j in jobs.values() if lease_of(j.tags) == lease.ref), None)


def _unfence(lease: LeaseRecord, obs: Observation) -> tuple[Command, ...]:
    name = reservation_name(lease.id)
    return (Unfence(name),) if lease.lend_mode == "drain" and name in obs.reservations else ()


def _fail(lease: LeaseRecord, reason: str) -> Step:
    return Step(lease.id, move=Move(lease.id, lease.state, S.FAILED, reason))


def _held(job: Job) -> bool:
    return job.state == "PENDING" and any(r.lower() in job.reason.lower() for r in HELD_REASONS)


def plan_lease(lease: LeaseRecord, obs: Observation, now: float, settings: Settings) -> Step | None:
    """The next step of one open lease, or None when it waits."""
    jobs = obs.triton_jobs()
    job = _job_of(lease, jobs)
    server = obs.server_of(job.job_id) if job else None
    state = lease.state
    limit = deadline(lease, settings)
    overdue = limit is not None and now - lease.updated_at > limit
    overdue_reason = (
        f"stuck in {state.value} for {now - lease.updated_at:.0f} s (deadline {limit:g} s)"
        if limit is not None
        else ""
    )

    if state == S.REQUESTED:
        if job is not None:  # submitted before a crash, not yet recorded
            return Step(
                lease.id,
                move=Move(lease.id, state, S.SUBMITTED, "found its Triton job", job.job_id),
            )
        if overdue:
            return _fail(lease, overdue_reason)
        if lease.node not in obs.nodes:
            return _fail(lease, f"node {lease.node} vanished from Slurm")
        return _submit_step(lease, obs, settings)
    if state == S.SUBMITTED:
        if job is None:
            return _fail(lease, "Triton job vanished before it ran")
        if job.state == "RUNNING":
            return Step(
                lease.id, move=Move(lease.id, state, S.STARTING, f"job {job.job_id} running")
            )
        if _held(job):
            return _fail(lease, f"Slurm holds Triton job {job.job_id}: {job.reason}")
        if lease.node not in obs.nodes:
            return _fail(lease, f"node {lease.node} vanished from Slurm")
        return _fail(lease, overdue_reason) if overdue else None
    if state == S.STARTING:
        if job is None:
            return _fail(lease, "Triton job ended while starting")
        if lease.node not in obs.nodes:
            return _fail(lease, f"node {lease.node} vanished from Slurm")
        if server is not None and server.ready:
            refused = {m: server.unavailable[m] for m in lease.models if m in server.unavailable}
            if refused:
                why = "; ".join(f"{m}: {r}" for m, r in sorted(refused.items()))
                return _fail(lease, f"Triton refused to load {why}")
            if set(lease.models) <= set(server.models):
                return Step(
                    lease.id,
                    (RouteIn(lease.id),),
                    Move(lease.id, state, S.SERVING, "Triton ready, in routing"),
                    fails_lease=False,
                )
        return _fail(lease, f"Triton not ready in time ({overdue_reason})") if overdue else None
    if state == S.SERVING:
        if job is None:
            return _fail(lease, "Triton job gone while serving")
        if lease.node not in obs.nodes:
            return _fail(lease, f"node {lease.node} vanished from Slurm")
        if server is None:
            return _fail(lease, f"Triton job {job.job_id} {job.state.lower()}, not serving")
        if not server.ready and server.unanswered_s >= settings.unanswered_grace_s:
            return _fail(
                lease, f"Triton server unanswered for {server.unanswered_s:.0f}s while serving"
            )
        return None
    if state == S.DRAINING:
        if job is None or server is None:
            return Step(
                lease.id, move=Move(lease.id, state, S.RELEASING, "server gone while draining")
            )
        if overdue:  # the unload keeps failing: fail it, and the failed path cancels
            return _fail(lease, overdue_reason)
        if not server.ready:  # it answers nothing: no request to wait for, nothing to unload
            return Step(
                lease.id,
                (Cancel(job.job_id),),
                Move(lease.id, state, S.RELEASING, "server not answering; job cancelled"),
            )
        pending = sum(server.pending.get(m, 0.0) for m in lease.models)
        if pending > 0 and now - lease.updated_at < settings.drain_timeout_s:
            return None
        why = "no request in flight" if pending == 0 else f"drain timeout, {pending:g} pending"
        return Step(
            lease.id,
            (Unload(server.address, lease.models), Cancel(job.job_id)),
            Move(lease.id, state, S.RELEASING, f"{why}; unloaded, job cancelled"),
        )
    if state == S.RELEASING:
        if job is None:
            return Step(
                lease.id,
                _unfence(lease, obs),
                Move(lease.id, state, S.RETURNED, "job gone, node back with Slurm"),
            )
        if overdue:
            return _fail(lease, f"{overdue_reason}; job {job.job_id} still {job.state}")
        return Step(lease.id, (Cancel(job.job_id),), note=f"cancelling job {job.job_id}")
    if state == S.FAILED:
        if job is not None:
            return Step(lease.id, (Cancel(job.job_id),), note=f"cancelling job {job.job_id}")
        return Step(
            lease.id,
            _unfence(lease, obs),
            Move(lease.id, state, S.RETURNED, "cleaned up after failure"),
        )
    return None


def _submit_step(lease: LeaseRecord, obs: Observation, settings: Settings) -> Step:
    commands: list[Command] = []
    reservation = None
    if lease.lend_mode == "drain":
        # The gentle fence: a reservation holds the node for the bridge; running jobs go
        # on, nothing new starts there, and Triton starts when the node is free.
        reservation = reservation_name(lease.id)
        if reservation not in obs.reservations:
            duration = int(settings.drain_wait_s + RESERVATION_SLACK_S)
            commands.append(Fence(reservation, lease.node, duration))
    commands.append(Submit(lease.node, lease.models, lease.ref, lease.pool, reservation))
    if lease.lend_mode == "preempt" and settings.requeue_victims:
        victims = tuple(sorted(j.job_id for j in obs.work.get(lease.node, ())))
        if victims:
            commands.append(Requeue(lease.node, victims))
    return Step(lease.id, tuple(commands), Move(lease.id, S.REQUESTED, S.SUBMITTED, "submitted"))


def plan(
    obs: Observation,
    leases: Sequence[LeaseRecord],
    now: float,
    settings: Settings,
    not_before: Mapping[int, float] | None = None,
) -> list[Step]:
    """The steps of every open lease. A lease in retry backoff (`not_before[id] > now`)
    gets only moves that need no command (e.g. its job started) and its deadline."""
    waits = not_before or {}
    steps = []
    for lease in leases:
        if lease.state == S.RETURNED:
            continue
        step = plan_lease(lease, obs, now, settings)
        if step is None:
            continue
        if step.commands and waits.get(lease.id, 0.0) > now:
            continue
        steps.append(step)
    return steps


def plan_return(lease: LeaseRecord, reason: str, obs: Observation) -> Step | None:
    """Give a lease back: out of routing then drain (serving), cancel (on its way), or
    abandon (not yet submitted). None for a lease already leaving."""
    why, abandoned = return_reasons(reason)
    if lease.state == S.SERVING:
        return Step(
            lease.id,
            (RouteOut(lease.id),),
            Move(lease.id, lease.state, S.DRAINING, why),
            fails_lease=False,
        )
    if lease.state in (S.SUBMITTED, S.STARTING):
        cancel = (Cancel(lease.slurm_job_id),) if lease.slurm_job_id else ()
        return Step(lease.id, cancel, Move(lease.id, lease.state, S.RELEASING, why))
    if lease.state == S.REQUESTED:
        return Step(
            lease.id,
            _unfence(lease, obs),
            Move(lease.id, lease.state, S.RETURNED, abandoned),
        )
    return None


def return_reasons(reason: str) -> tuple[str, str]:
    """The reasons of the moves `plan_return(lease, reason, obs)` makes: (drain or
    cancel, abandon). How a return taken again finds its first attempt's move."""
    return f"return: {reason}", f"abandoned: {reason}"


def plan_orphans(
    obs: Observation,
    leases: Sequence[LeaseRecord],
    closed: Mapping[int, LeaseRef],
    config: BridgeConfig,
) -> list[Step]:
    """What no open lease holds: a tagged Triton job of a closed lease still queued or
    running (a leak: cancel it); a running tagged job of a lease the database never saw
    (adopt it); a bridge reservation or drain no open lease holds (lift it). `closed`
    maps lease ids of the tagged jobs' refs that are not open to the stored lease's ref."""
    open_leases = [lease for lease in leases if lease.state != S.RETURNED]
    open_refs = {lease.ref for lease in open_leases}
    open_jobs = {lease.slurm_job_id for lease in open_leases if lease.slurm_job_id}
    open_ids = {lease.id for lease in open_leases}
    open_nodes = {lease.node for lease in open_leases}
    steps: list[Step] = []
    for job in obs.triton_jobs().values():
        ref = lease_of(job.tags)
        if ref is None or ref in open_refs or job.job_id in open_jobs:
            continue
        if closed.get(ref[0]) == ref:
            if job.state in ("RUNNING", "PENDING"):
                steps.append(
                    Step(
                        None,
                        (Cancel(job.job_id),),
                        note=f"cancel job {job.job_id} of finished lease {ref[0]}",
                    )
                )
        elif job.state == "RUNNING" and len(job.nodes) == 1:
            node = obs.nodes.get(job.nodes[0])
            pool = pool_of(node, config) if node else None
            if pool is None or config.pools[pool].lend_mode == "reserved":
                continue
            mode = config.pools[pool].lend_mode
            steps.append(Step(None, (Adopt(job.job_id, job.nodes[0], pool, mode),)))
    for name in sorted(obs.reservations):
        suffix = name.removeprefix(RESERVATION_PREFIX)
        if name.startswith(RESERVATION_PREFIX) and suffix.isdigit() and int(suffix) not in open_ids:
            steps.append(
                Step(None, (Unfence(name),), note=f"lifted fence {name}: no open lease holds it")
            )
    for node in obs.nodes.values():
        if node.fenced_by_bridge and node.name not in open_nodes:
            steps.append(
                Step(
                    None, (Resume(node.name),), note=f"resumed {node.name}: bridge drain, no lease"
                )
            )
    return steps


def lease_refs_to_check(obs: Observation, leases: Sequence[LeaseRecord]) -> set[int]:
    """Lease ids named by tagged Triton jobs that no open lease holds: the actuator looks
    these up in the store (one query) before `plan_orphans`."""
    open_refs = {lease.ref for lease in leases if lease.state != S.RETURNED}
    ids = set()
    for job in obs.triton_jobs().values():
        ref = lease_of(job.tags)
        if ref is not None and ref not in open_refs:
            ids.add(ref[0])
    return ids


def check_operator_lend(
    node: str,
    models: Sequence[str],
    obs: Observation,
    leases: Sequence[LeaseRecord],
    config: BridgeConfig,
) -> tuple[str, str, tuple[str, ...]] | str:
    """An operator's lend, validated: (pool, lend mode, models), or the refusal's text.
    The models are those of this tick's facts (default: every model the repository
    holds)."""
    known = obs.nodes.get(node)
    if known is None:
        return f"refused: Slurm has no node {node!r}"
    pool = pool_of(known, config)
    if pool is None or config.pools[pool].lend_mode not in ("preempt", "drain"):
        return f"refused: {node} is in no lendable pool (pool {pool})"
    if any(lease.node == node and lease.state != S.RETURNED for lease in leases):
        return f"refused: {node} is already lent"
    unknown = sorted(set(models) - set(obs.models.names))
    if unknown:
        return f"refused: unknown models {', '.join(unknown)}"
    return pool, config.pools[pool].lend_mode, tuple(models) or obs.models.served


# ---- operator requests taken again -----------------------------------------------------
# After a failover the new leader takes again a request that the old one carried out but
# did not record (killed in between). The request's work is found in the store (the lease
# its lend made, keyed by the request; the move its return made, named by it) and the
# request is answered as its first attempt would have been: done once, never refused as
# someone else's work.

#: a lease's history as the answers below read it: (state entered, reason), oldest first
Moves = Sequence[tuple[LeaseState, str]]


def replayed_lend(made: LeaseRecord, moves: Moves) -> str:
    """The outcome of an operator lend whose lease `made` (found by the request's key)
    exists already: that lease's, never a refusal ("already lent": it is the request's
    own) and never a second lease. `moves` is the lease's history; it is read only for a
    returned lease, to tell a lend that failed from one returned since it served."""
    if made.state == S.FAILED:
        return f"failed: lease {made.id}: {made.reason}"
    failed = [why for state, why in moves if state == S.FAILED]
    if made.state == S.RETURNED and failed:
        return f"failed: lease {made.id}: {failed[-1]}"
    return f"lease {made.id} lending {made.node}"


def replayed_return(lease: LeaseRecord, moves: Moves, reason: str) -> str | None:
    """The outcome of a return with `reason` of a lease already leaving or returned, when
    a move in its history `moves` was this return's own (`return_reasons`): its first
    attempt's answer. None when no move is (the return is someone else's, answered as
    such: "already draining", "already returned")."""
    mine = set(return_reasons(reason))
    if any(why in mine for _, why in moves):
        return f"lease {lease.id} returning"
    return None
