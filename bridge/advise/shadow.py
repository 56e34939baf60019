"""Shadow leases: the leases the advisory pass would have made, moved through the lease
states by the daemon's own per-state sync (`bridge.policy.leasesync`, the planner's) on
the timing the simulator models, so that the pure policy sees, tick after tick, what it
would have seen had it acted (its cooldowns, the cap on lent nodes, the return after
calm, the preemption budget).

Pure: no I/O, no clock (`now` is a parameter, epoch seconds). Called by the advisory pass
(`bridge.advise.advisory.Advisor`) once per tick: `sync` first (each open shadow takes at
most one step, as the reconciler's passive sync moves a real lease), then `observation`
(the tick's real `Observation` with the shadows made real: each serving shadow is a ready
replica, each shadow's Triton job is on its node, the jobs a lend would have requeued
carry that requeue), then `lend` and `return_` for the policy's actions. Tested with
literal observations in tests/unit/test_shadow.py.

Each shadow is a `ModelledLease`: the one lease view, and when its Triton job would run,
be ready and be gone. The sync reads its world from those times (`ModelledLease.world`:
its job from its submission until gone, its server ready from `ready_at`, nothing in
flight on it at a tick) and the book carries its steps out on the lab's measured
`bridge.lifecycle.StepTimes`, the same the simulator's `Timing` defaults to (one place
for both: the runtime may not import the simulator):

- lend: requested -> submitted in the lend's own pass (as the reconciler submits at once);
  its Triton job would run `preempt_start_s` later when its node has jobs to requeue,
  `slurm_start_s` when it is free; a drain-mode lend's job runs `slurm_start_s` after the
  tick that sees its node free of jobs (the shadow's world has no reservation: nothing
  fences the node in Slurm);
- submitted -> starting once that time has come, starting -> serving `triton_ready_s`
  later;
- return: serving -> draining, then releasing at the next tick (unloaded and cancelled:
  no request is left after a tick), returned `cancel_s` after that; submitted or starting
  -> releasing at once, returned once the cancel is done;
- a shadow whose node vanished from Slurm has lost its job with it: it fails, and is
  returned at the next tick.

The sync runs without deadlines (`modelled_settings`): the modelled world is never late.

An advised baseline (a reserved node without its Triton server) is a stand-in job on its
node at once and a ready replica of every model the repository has `slurm_start_s +
triton_ready_s` later, until a real Triton job appears there (kept in memory only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from bridge.daemon.observation import Observation, TritonServer
from bridge.daemon.planner import reservation_name
from bridge.lifecycle import LeaseState, StepTimes, check
from bridge.policy import Lend
from bridge.policy.leasesync import (
    LeaseWorld,
    ModelledLease,
    Settings,
    modelled_settings,
    return_step,
    sync_lease,
)
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Cancel, Move, Requeue, Step, Submit
from bridge.slurm.model import TRITON_TAG, Job
from bridge.triton.ports import HTTP_PORT

S = LeaseState
#: the tag of a shadow's stand-in Triton job in the advisory's view (never in Slurm)
SHADOW_TAG = "stb:shadow"


@dataclass(eq=False)
class ShadowLease(ModelledLease):
    """A lease the advisory pass would have made: its view and modelled times
    (`ModelledLease`), and the jobs its lend would have requeued (a preempt-mode lend of a
    busy node). Its state changes only through `ShadowBook._move`, which checks each move
    against `bridge.lifecycle.TRANSITIONS`."""

    victims: tuple[str, ...] = ()

    @property
    def node(self) -> str:
        """The view's node (the advisory's tests and lines name a shadow by it)."""
        return self.view.node


def shadow_job_id(lease_id: int) -> str:
    """The job id of a shadow's stand-in Triton job (never in Slurm)."""
    return f"shadow-{lease_id}"


@dataclass(frozen=True)
class ShadowMove:
    lease_id: int
    node: str
    old: LeaseState | None
    new: LeaseState
    at: float
    reason: str

    def line(self) -> str:
        old = self.old.value if self.old is not None else "(new)"
        return (
            f"shadow lease {self.lease_id} {self.node}: {old} -> {self.new.value} ({self.reason})"
        )


@dataclass
class _Requeue:
    """A job a shadow lend would have requeued: when, and its restarts then."""

    at: float
    restarts: int


@dataclass
class ShadowBook:
    """The open shadow leases, and the requeues their lends would have made."""

    timing: StepTimes = field(default_factory=StepTimes)
    #: a preempt-mode lend requeues its node's jobs itself (`[leases] requeue_victims`):
    #: those count in the policy's preemption budget
    requeue_victims: bool = True
    #: how long a would-be requeue is remembered (the preemption budget's hour, or the
    #: policy's `preempt_guard_s` if longer)
    remember_s: float = 3600.0
    leases: dict[int, ShadowLease] = field(default_factory=dict)
    next_id: int = 1
    #: job id -> the requeue a shadow lend would have made
    requeued: dict[str, _Requeue] = field(default_factory=dict)
    #: the shadows changed since `take_changed` was last called (to be persisted)
    changed: dict[int, ShadowLease] = field(default_factory=dict)
    #: reserved nodes whose baseline the advisory would have submitted: node -> when
    #: (kept in memory only: a restarted advisory advises it again)
    baselines: dict[str, float] = field(default_factory=dict)
    #: the models a baseline server holds (every model the repository has: the
    #: advisory sets it each pass from the observation's facts)
    baseline_models: tuple[str, ...] = ()

    @property
    def settings(self) -> Settings:
        """The sync's settings: no deadline (the modelled world is never late)."""
        return modelled_settings(self.requeue_victims)

    @classmethod
    def restore(
        cls,
        leases: Iterable[ShadowLease],
        next_id: int,
        *,
        timing: StepTimes | None = None,
        requeue_victims: bool = True,
        remember_s: float = 3600.0,
        baseline_models: tuple[str, ...] = (),
    ) -> ShadowBook:
        """A book carrying on from stored shadows (the open ones, and the recent ones whose
        victims still count: their creation time is the requeue's)."""
        book = cls(
            timing or StepTimes(),
            requeue_victims,
            remember_s,
            next_id=next_id,
            baseline_models=baseline_models,
        )
        for lease in leases:
            view = lease.view
            if view.state != S.RETURNED:
                if view.slurm_job_id is None and view.state != S.REQUESTED:
                    lease.view = replace(view, slurm_job_id=shadow_job_id(view.id))
                book.leases[view.id] = lease
            if requeue_victims:
                for job_id in lease.victims:
                    book.requeued.setdefault(job_id, _Requeue(view.created_at, -1))
            book.next_id = max(book.next_id, view.id + 1)
        return book

    # ---- what the policy sees --------------------------------------------------------

    def open_records(self) -> list[LeaseView]:
        return [self.leases[i].view for i in sorted(self.leases)]

    def serving(self) -> int:
        return sum(1 for lease in self.leases.values() if lease.state == S.SERVING)

    def states(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lease in self.leases.values():
            out[lease.state.value] = out.get(lease.state.value, 0) + 1
        return out

    def preemptions_since(self, since: float) -> int:
        """Jobs the shadow lends would have requeued at or after `since`."""
        return sum(1 for r in self.requeued.values() if r.at >= since)

    def observation(self, obs: Observation) -> Observation:
        """`obs` as the active daemon would have seen it had it made the shadows' lends:
        each open shadow's Triton job on its node (a stand-in, tagged `stb:shadow`), each
        serving shadow a ready replica of its models, and each job a shadow lend would
        have requeued with that requeue (one more restart, submitted then: the policy's
        preemption guard reads them). The rest is the real observation."""
        if not self.leases and not self.requeued and not self.baselines:
            return obs
        jobs = []
        for job in obs.jobs:
            r = self.requeued.get(job.job_id)
            if r is not None and r.restarts in (-1, job.restarts):
                if r.restarts == -1:  # restored from the store: the restarts then unknown
                    r.restarts = job.restarts
                job = replace(
                    job,
                    restarts=job.restarts + 1,
                    submit_time=datetime.fromtimestamp(r.at, UTC),
                )
            jobs.append(job)
        servers = list(obs.servers)
        for lease in self.leases.values():
            view = lease.view
            if view.state in (S.REQUESTED, S.FAILED, S.RETURNED):
                continue
            node = obs.nodes.get(view.node)
            job = _stand_in(view, node.gpus if node is not None else 1)
            jobs.append(job)
            if view.state == S.SERVING and node is not None:
                address = f"{node.addr}:{HTTP_PORT}"
                servers.append(TritonServer(job, view.node, address, True, view.models))
        t = self.timing
        for node_name, since in sorted(self.baselines.items()):
            node = obs.nodes.get(node_name)
            if node is None:
                continue
            running = obs.at >= since + t.slurm_start_s
            job = _stand_in_job(f"shadow-baseline-{node_name}", node_name, node.gpus, running)
            jobs.append(job)
            if obs.at >= since + t.slurm_start_s + t.triton_ready_s:
                address = f"{node.addr}:{HTTP_PORT}"
                servers.append(TritonServer(job, node_name, address, True, self.baseline_models))
        return replace(obs, jobs=tuple(jobs), servers=tuple(servers))

    # ---- the passive sync ------------------------------------------------------------

    def sync(self, obs: Observation, now: float) -> list[ShadowMove]:
        """Each open shadow takes at most one step of the per-state sync (the
        reconciler's passive sync), on `timing`; returned shadows leave the book."""
        self._forget(now)
        real = {n for j in obs.jobs if TRITON_TAG in j.tags for n in (j.nodes or j.requested_nodes)}
        for node in [n for n in self.baselines if n not in obs.nodes or n in real]:
            del self.baselines[node]  # gone, or a real Triton job is there now
        moves: list[ShadowMove] = []
        t = self.timing
        settings = self.settings
        for lease_id in sorted(self.leases):
            lease = self.leases[lease_id]
            view = lease.view
            listed = view.node in obs.nodes
            free = listed and not obs.work.get(view.node)
            if view.state == S.SUBMITTED and lease.running_at is None and free:
                # a drain lend's node is free: its Triton job would start now
                lease.running_at = now + t.slurm_start_s
                lease.ready_at = lease.running_at + t.triton_ready_s
                self.changed[lease_id] = lease
            step = sync_lease(view, lease.world(now, listed), now, settings)
            if step is not None:
                moves += self._carry_out(lease, step, now, obs.work)
        return moves

    # ---- the policy's actions --------------------------------------------------------

    def lend(
        self, action: Lend, obs: Observation, now: float
    ) -> tuple[ShadowLease, list[ShadowMove]]:
        """Make the shadow of `action`: requested, then (the sync's submit step) submitted
        in the same pass."""
        view = LeaseView(
            self.next_id,
            action.node,
            action.pool,
            action.lend_mode,
            S.REQUESTED,
            tuple(action.models),
            now,
            now,
            reason=action.reason,
        )
        lease = ShadowLease(view)
        self.next_id += 1
        self.leases[view.id] = lease
        self.changed[view.id] = lease
        moves = [ShadowMove(view.id, view.node, None, S.REQUESTED, now, action.reason)]
        world = LeaseWorld(
            view.node in obs.nodes,
            reservation=reservation_name(view.id),
            victims=tuple(sorted(j.job_id for j in obs.work.get(view.node, ()))),
        )
        step = sync_lease(view, world, now, self.settings)
        if step is not None:
            moves += self._carry_out(lease, step, now, obs.work)
        return lease, moves

    def return_(self, lease_id: int, reason: str, now: float) -> ShadowMove | None:
        """Give a shadow back (`bridge.policy.leasesync.return_step`, as the planner gives
        a lease back); None when it is unknown or already leaving."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return None
        step = return_step(lease.view, reason, LeaseWorld(True))  # (no fence to lift)
        moves = self._carry_out(lease, step, now, {}) if step is not None else []
        return moves[0] if moves else None

    def baseline(self, node: str, now: float) -> bool:
        """The baseline of reserved `node` would be submitted now; False when it already
        was (the advisory records it once)."""
        if node in self.baselines:
            return False
        self.baselines[node] = now
        return True

    def place(self, lease_id: int, models: Sequence[str]) -> ShadowLease | None:
        """A serving shadow's replica given `models` in place of its own (a `Place`); its
        stand-in server holds them from the next observation on (the shadow models no
        load time). None: no such serving shadow."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.view.state != S.SERVING:
            return None
        lease.view = replace(lease.view, models=tuple(models))
        self.changed[lease_id] = lease
        return lease

    def take_changed(self) -> list[ShadowLease]:
        """The shadows changed since the last call (returned ones included), once each."""
        out = [self.changed[i] for i in sorted(self.changed)]
        self.changed.clear()
        return out

    # ---- internals -------------------------------------------------------------------

    def _carry_out(
        self, lease: ShadowLease, step: Step, now: float, work: Mapping[str, tuple[Job, ...]]
    ) -> list[ShadowMove]:
        """A step of the sync, on the modelled timing: a submit sets when the job would
        run (a drain lend's: once its node is free, see `sync`), a requeue records its
        victims, a cancel when the job would be gone; fences, unloads and routing change
        nothing here (routing is `observation`'s). Then its move."""
        t = self.timing
        move = step.move
        for command in step.commands:
            if isinstance(command, Submit):
                if lease.view.lend_mode == "preempt":
                    busy = bool(work.get(command.node))
                    lease.running_at = now + (t.preempt_start_s if busy else t.slurm_start_s)
                    lease.ready_at = lease.running_at + t.triton_ready_s
                if move is not None:
                    move = replace(move, slurm_job_id=shadow_job_id(lease.view.id))
            elif isinstance(command, Requeue):
                lease.victims = command.job_ids
                for j in work.get(command.node, ()):
                    if j.job_id in command.job_ids:
                        self.requeued[j.job_id] = _Requeue(now, j.restarts)
            elif isinstance(command, Cancel) and lease.gone_at is None:
                lease.gone_at = now + t.cancel_s if lease.runs(now) else now
                self.changed[lease.view.id] = lease
        return [self._move(lease, move, now)] if move is not None else []

    def _move(self, lease: ShadowLease, move: Move, now: float) -> ShadowMove:
        view = lease.view
        check(view.state, move.new, lease_id=view.id)
        lease.view = replace(
            view,
            state=move.new,
            updated_at=now,
            reason=move.reason,
            slurm_job_id=move.slurm_job_id or view.slurm_job_id,
        )
        self.changed[view.id] = lease
        if move.new == S.RETURNED:
            self.leases.pop(view.id, None)
        return ShadowMove(view.id, view.node, view.state, move.new, now, move.reason)

    def _forget(self, now: float) -> None:
        for job_id in [j for j, r in self.requeued.items() if now - r.at >= self.remember_s]:
            del self.requeued[job_id]


def _stand_in(lease: LeaseView, gpus: int) -> Job:
    """The Triton job a shadow would have on its node, as the advisory's view shows it."""
    job_id = shadow_job_id(lease.id)
    return _stand_in_job(job_id, lease.node, gpus, lease.state != S.SUBMITTED)


def _stand_in_job(job_id: str, node: str, gpus: int, running: bool) -> Job:
    return Job(
        job_id,
        "stb-triton-shadow",
        "",
        "",
        "",
        "RUNNING" if running else "PENDING",
        "None" if running else "Resources",
        (node,) if running else (),
        f"{TRITON_TAG},{SHADOW_TAG}",
        gpus,
        0,
        None,
        None,
        requested_nodes=(node,),
    )


__all__ = ["SHADOW_TAG", "ShadowBook", "ShadowLease", "ShadowMove", "shadow_job_id"]
