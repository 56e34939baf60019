"""The per-state sync of one lease: given a lease in state S and what the world shows of
its node, its Triton job and its server (a `LeaseWorld`), its next `Step` (the commands
it needs, then the move its state makes) and why. `return_step` gives a lease back. Pure:
the one copy of these rules, called by

- the daemon's planner (`bridge.daemon.planner.plan_lease`, `plan_return`), on the world
  it reads from the tick's `Observation` (Slurm's nodes, jobs and reservations, Triton's
  answers);
- the advisory's shadow book (`bridge.advise.shadow`) and the simulator
  (`bridge.sim.engine`), on the world of a `ModelledLease`: its Triton job runs, is
  ready and is gone at the times their timing model sets, and a tick drains it.

Each caller carries the step out with its own actuator (Slurm, Triton and routing; the
shadow's modelled times; the simulated fleet). No I/O, no clock: `now` is a parameter
(epoch seconds); the planner's literal-input tests (tests/unit/test_planner.py) cover
every rule.

Deadlines (`deadline`): a lease that stays in one state longer than its deadline is failed
("stuck in <state> ..."), except `failed`, which cannot fail again (it is reported as
stuck, for a person). `draining` first waits up to `drain_timeout_s` for in-flight
requests, then unloads and cancels; its deadline catches an unload that never succeeds.
The modelled worlds run `modelled_settings()`: no deadline, for their world is never late
(it does what its timing says) and they model no failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from bridge.config import BridgeConfig
from bridge.lifecycle import LeaseState
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import (
    Cancel,
    Command,
    Fence,
    Move,
    Requeue,
    RouteIn,
    RouteOut,
    Step,
    Submit,
    Unfence,
    Unload,
)

S = LeaseState
#: a reservation of a drain-mode lend lasts this much past the bounded drain wait
RESERVATION_SLACK_S = 7 * 24 * 3600
#: Slurm's reasons for a pending job that will not run without a person
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser", "launch failed requeued held", "BadConstraints")
_NO_REFUSAL: Mapping[str, str] = MappingProxyType({})
_NOTHING_PENDING: Mapping[str, float] = MappingProxyType({})


# ---- what the world shows of one lease ---------------------------------------------------


class SeenJob(Protocol):
    """A lease's Triton job as Slurm lists it (`bridge.slurm.model.Job` is one)."""

    @property
    def job_id(self) -> str: ...

    #: RUNNING, PENDING, COMPLETING, ...
    @property
    def state(self) -> str: ...

    #: why it pends (Slurm's reason; "None" when it runs)
    @property
    def reason(self) -> str: ...


class SeenServer(Protocol):
    """What the lease's Triton server answered (`bridge.daemon.observation.TritonServer`
    is one)."""

    @property
    def address(self) -> str: ...

    @property
    def ready(self) -> bool: ...

    #: the models it holds READY
    @property
    def models(self) -> tuple[str, ...]: ...

    #: models it failed to load, with Triton's reason
    @property
    def unavailable(self) -> Mapping[str, str]: ...

    #: requests in flight per model: queued, and an LLM's streams being generated (a
    #: decoupled model's open stream is in no Triton queue gauge); a drain waits for both
    @property
    def pending(self) -> Mapping[str, float]: ...

    #: seconds it has gone without answering as ready
    @property
    def unanswered_s(self) -> float: ...


@dataclass(frozen=True)
class LeaseWorld:
    """What the world shows of one lease at one pass."""

    #: Slurm lists its node (every node of a gang)
    node_listed: bool
    #: its Triton job (None: there is none, or it is gone)
    job: SeenJob | None = None
    #: that job's server (None: it has not answered)
    server: SeenServer | None = None
    #: the name of its drain-mode fence (a Slurm reservation), and whether it exists
    reservation: str = ""
    fenced: bool = False
    #: the jobs a preempt-mode submit requeues, sorted: those running on its node, or for
    #: a partial lend those whose GPUs it needs (`bridge.policy.victims.choose_victims`)
    victims: tuple[str, ...] = ()


# ---- settings and deadlines ----------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The deadlines and waits the sync needs, in seconds."""

    requested_deadline_s: float = 120
    submitted_deadline_s: float = 600
    starting_deadline_s: float = 300
    releasing_deadline_s: float = 300
    drain_timeout_s: float = 300
    drain_wait_s: float = 120
    #: a serving replica that stops answering (its job still running) is failed after this
    unanswered_grace_s: float = 15
    #: a preempt-mode lend requeues its node's jobs itself (`[leases] requeue_victims`)
    requeue_victims: bool = True
    #: the jobs a partial lend may not requeue (`bridge.policy.victims.guarded`):
    #: `[policy] preempt_guard_s` and `max_requeues_per_job`
    preempt_guard_s: float = 900
    max_requeues_per_job: int = 2

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
            preempt_guard_s=config.policy.preempt_guard_s,
            max_requeues_per_job=config.policy.max_requeues_per_job,
        )


def modelled_settings(requeue_victims: bool = True) -> Settings:
    """The settings of a modelled world (the shadow book's, the simulator's): no deadline
    (see the module docstring)."""
    inf = math.inf
    return Settings(
        requested_deadline_s=inf,
        submitted_deadline_s=inf,
        starting_deadline_s=inf,
        releasing_deadline_s=inf,
        requeue_victims=requeue_victims,
    )


def deadline(lease: LeaseView, settings: Settings) -> float | None:
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


def is_stuck(lease: LeaseView, settings: Settings, now: float) -> bool:
    """Past its state's deadline (a `failed` lease whose cleanup does not finish)."""
    limit = deadline(lease, settings)
    return limit is not None and now - lease.updated_at > limit


# ---- the sync ------------------------------------------------------------------------


def _fail(lease: LeaseView, reason: str) -> Step:
    return Step(lease.id, move=Move(lease.id, lease.state, S.FAILED, reason))


def _held(job: SeenJob) -> bool:
    return job.state == "PENDING" and any(r.lower() in job.reason.lower() for r in HELD_REASONS)


def _unfence(lease: LeaseView, world: LeaseWorld) -> tuple[Command, ...]:
    return (Unfence(world.reservation),) if lease.lend_mode == "drain" and world.fenced else ()


def _stuck(lease: LeaseView, limit: float | None, now: float) -> str:
    """Why an overdue lease fails (`limit`: its deadline)."""
    spent = now - lease.updated_at
    return f"stuck in {lease.state.value} for {spent:.0f} s (deadline {limit:g} s)"


def _vanished(lease: LeaseView) -> Step:
    what = "node" if not lease.members else "a node of its gang"
    return _fail(lease, f"{what} {','.join(lease.nodes)} vanished from Slurm")


def sync_lease(lease: LeaseView, world: LeaseWorld, now: float, settings: Settings) -> Step | None:
    """The next step of one open lease, or None when it waits."""
    job, server = world.job, world.server
    state = lease.state
    limit = deadline(lease, settings)
    overdue = limit is not None and now - lease.updated_at > limit

    if state == S.REQUESTED:
        if job is not None:  # submitted before a crash, not yet recorded
            return Step(
                lease.id,
                move=Move(lease.id, state, S.SUBMITTED, "found its Triton job", job.job_id),
            )
        if overdue:
            return _fail(lease, _stuck(lease, limit, now))
        if not world.node_listed:
            return _vanished(lease)
        return _submit_step(lease, world, settings)
    if state == S.SUBMITTED:
        if job is None:
            return _fail(lease, "Triton job vanished before it ran")
        if job.state == "RUNNING":
            return Step(
                lease.id, move=Move(lease.id, state, S.STARTING, f"job {job.job_id} running")
            )
        if _held(job):
            return _fail(lease, f"Slurm holds Triton job {job.job_id}: {job.reason}")
        if not world.node_listed:
            return _vanished(lease)
        return _fail(lease, _stuck(lease, limit, now)) if overdue else None
    if state == S.STARTING:
        if job is None:
            return _fail(lease, "Triton job ended while starting")
        if not world.node_listed:
            return _vanished(lease)
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
        return (
            _fail(lease, f"Triton not ready in time ({_stuck(lease, limit, now)})")
            if overdue
            else None
        )
    if state == S.SERVING:
        if job is None:
            return _fail(lease, "Triton job gone while serving")
        if not world.node_listed:
            return _vanished(lease)
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
            return _fail(lease, _stuck(lease, limit, now))
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
                _unfence(lease, world),
                Move(lease.id, state, S.RETURNED, "job gone, node back with Slurm"),
            )
        if overdue:
            return _fail(lease, f"{_stuck(lease, limit, now)}; job {job.job_id} still {job.state}")
        return Step(lease.id, (Cancel(job.job_id),), note=f"cancelling job {job.job_id}")
    if state == S.FAILED:
        if job is not None:
            return Step(lease.id, (Cancel(job.job_id),), note=f"cancelling job {job.job_id}")
        return Step(
            lease.id,
            _unfence(lease, world),
            Move(lease.id, state, S.RETURNED, "cleaned up after failure"),
        )
    return None


def _submit_step(lease: LeaseView, world: LeaseWorld, settings: Settings) -> Step:
    commands: list[Command] = []
    reservation = None
    drain = lease.lend_mode == "drain"
    if drain and lease.lent_gpus is None:
        # The gentle fence: a reservation holds the node for the bridge; running jobs go
        # on, nothing new starts there, and Triton starts when the node is free.
        reservation = world.reservation
        if not world.fenced:
            duration = int(settings.drain_wait_s + RESERVATION_SLACK_S)
            commands.append(Fence(reservation, lease.node, duration, lease.members))
    # A drain-mode lend of some of the node's GPUs has no fence (Slurm reserves nodes and
    # cores, not GPUs): its job pends on the node at the top priority, and Slurm gives it
    # the GPUs the node's jobs free before any pending training job; nothing is killed.
    commands.append(
        Submit(
            lease.node,
            lease.models,
            lease.ref,
            lease.pool,
            reservation,
            lease.lent_gpus,
            lease.members,
            top=drain and lease.lent_gpus is not None,
            gpu_type=lease.gpu_type,
            slot=lease.slot,
        )
    )
    if lease.lend_mode == "preempt" and settings.requeue_victims and world.victims:
        commands.append(Requeue(lease.node, world.victims))
    return Step(lease.id, tuple(commands), Move(lease.id, S.REQUESTED, S.SUBMITTED, "submitted"))


def return_step(lease: LeaseView, reason: str, world: LeaseWorld) -> Step | None:
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
            _unfence(lease, world),
            Move(lease.id, lease.state, S.RETURNED, abandoned),
        )
    return None


def return_reasons(reason: str) -> tuple[str, str]:
    """The reasons of the moves `return_step(lease, reason, world)` makes: (drain or
    cancel, abandon). How a return taken again finds its first attempt's move."""
    return f"return: {reason}", f"abandoned: {reason}"


# ---- a modelled world ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelledJob:
    """A modelled lease's Triton job (a `SeenJob`)."""

    job_id: str
    state: str
    reason: str = "None"


@dataclass(frozen=True)
class ModelledServer:
    """A modelled lease's Triton server, ready with its models (a `SeenServer`): nothing
    is in flight on it at a pass (a tick drains it), and it has no address."""

    models: tuple[str, ...]
    # (the same for every modelled server: class attributes, not fields)
    address = ""
    ready = True
    unavailable = _NO_REFUSAL
    pending = _NOTHING_PENDING
    unanswered_s = 0.0


@dataclass(eq=False)
class ModelledLease:
    """A lease of a modelled world (the shadow book's, the simulator's): its view, and
    when its Triton job runs, is ready and is gone (None: not yet known). The owner
    replaces `view` at each move and sets the times as its timing model says."""

    view: LeaseView
    running_at: float | None = None
    ready_at: float | None = None
    gone_at: float | None = None

    @property
    def id(self) -> int:
        """The view's (as are `state` and `updated_at`)."""
        return self.view.id

    @property
    def state(self) -> LeaseState:
        return self.view.state

    @property
    def updated_at(self) -> float:
        return self.view.updated_at

    def runs(self, now: float) -> bool:
        """Its Triton job runs at `now`."""
        return self.running_at is not None and self.running_at <= now

    def world(self, now: float, node_listed: bool = True) -> LeaseWorld:
        """What the world shows of it at `now`: its Triton job from its submission until
        it is gone (pending until `running_at`), gone with its node too; its server
        ready from `ready_at`; no fence."""
        view = self.view
        gone = self.gone_at is not None and self.gone_at <= now
        if not node_listed or gone or view.state in (S.REQUESTED, S.RETURNED):
            return LeaseWorld(node_listed)
        job_id = view.slurm_job_id or f"modelled-{view.id}"
        if not self.runs(now):
            return LeaseWorld(True, ModelledJob(job_id, "PENDING", "Resources"))
        server = None
        if self.ready_at is not None and self.ready_at <= now:
            server = ModelledServer(view.models)
        return LeaseWorld(True, ModelledJob(job_id, "RUNNING"), server)


__all__ = [
    "HELD_REASONS",
    "RESERVATION_SLACK_S",
    "LeaseWorld",
    "ModelledJob",
    "ModelledLease",
    "ModelledServer",
    "SeenJob",
    "SeenServer",
    "Settings",
    "deadline",
    "is_stuck",
    "modelled_settings",
    "return_reasons",
    "return_step",
    "sync_lease",
]
