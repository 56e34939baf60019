"""The lease lifecycle: states, the transition table, and the legality check.

Pure and standalone: no I/O, no SQL, and nothing imported from `bridge` (an import-linter
contract checks it), so every layer can share this one copy of the state machine:

- the lease store (`bridge.leases.store.LeaseStore.set_status`) asks `allowed` inside its
  transaction and raises its own `IllegalTransition`; the tables store `LeaseState`;
- the reconciler and the operator CLI read `LeaseState`, `OPEN_STATES` and `is_final`;
- the pure policy (`bridge.policy`) reads `LeaseState` and `IN_FLIGHT`;
- the simulator (`bridge.sim.engine`) moves its leases through `check`, which raises
  `IllegalMove` for a move the table forbids.

`StepTimes` holds how long a lend's steps took on the lab: the simulator's default timing
(`bridge.sim.engine.Timing`) and the advisory pass's shadow leases
(`bridge.advise.shadow`) both take them from here.

A lease is one node lent to Triton. It moves only forward:

    requested -> submitted -> starting -> serving -> draining -> releasing -> returned

Any state that is not final may go to `failed`, which cleans up (routing, job, fence) and
ends in `returned`. `returned` is the only final state. Staying in the same state is not a
transition: the store treats it as an idempotent no-op before this table is consulted.
A serving lease's models may change (model placement, `LeaseStore.place`): that is not a
transition either; the lease stays `serving` and its history records a `serving -> serving`
event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class LeaseState(StrEnum):
    REQUESTED = "requested"  # the lend is decided and recorded; no Slurm job yet
    SUBMITTED = "submitted"  # the Triton job is submitted; its Slurm job id is known
    STARTING = "starting"  # the job runs; Triton is not ready yet
    SERVING = "serving"  # ready, models loaded, in routing
    DRAINING = "draining"  # out of routing, waiting for in-flight requests to finish
    RELEASING = "releasing"  # models unloaded, job being cancelled, node being resumed
    RETURNED = "returned"  # the node is back with Slurm; final
    FAILED = "failed"  # something broke; cleaning up, then returned


_S = LeaseState

#: old state -> the states it may move to. One comment per edge says when it is taken.
TRANSITIONS: Mapping[LeaseState, frozenset[LeaseState]] = {
    _S.REQUESTED: frozenset(
        {
            # the Triton job was submitted (sbatch answered with a job id)
            _S.SUBMITTED,
            # abandoned before submission: the lend was cancelled (operator, or the policy
            # saw the breach end) or a drain-mode training node never became free within
            # the bounded wait. No job exists, so there is nothing to drain or release; the
            # actor resumes a node it fenced (the reconciler also resumes any bridge fence
            # that no open lease holds, so a crash between the two steps is harmless)
            _S.RETURNED,
            # submission failed permanently (Slurm rejected the job)
            _S.FAILED,
        }
    ),
    _S.SUBMITTED: frozenset(
        {
            # Slurm started the job on the node
            _S.STARTING,
            # abandoned while the job is still pending (drain wait over, lend cancelled):
            # nothing serves yet, so no draining; the pending job is cancelled
            _S.RELEASING,
            # the job vanished, failed or was held by Slurm
            _S.FAILED,
        }
    ),
    _S.STARTING: frozenset(
        {
            # Triton is ready, the models are loaded, and the replica is in routing
            _S.SERVING,
            # given back before it ever served (load fell, operator return): it was never
            # in routing and has no in-flight request, so it skips draining
            _S.RELEASING,
            # Triton never became ready in time, a model failed to load, or the job died
            _S.FAILED,
        }
    ),
    _S.SERVING: frozenset(
        {
            # scale-in or operator return: taken out of routing first, then drained
            _S.DRAINING,
            # the job or the server died while serving (it is taken out of routing)
            _S.FAILED,
        }
    ),
    _S.DRAINING: frozenset(
        {
            # no request pending any more (or the drain deadline passed): unload and cancel
            _S.RELEASING,
            # the job or the server died while draining
            _S.FAILED,
        }
    ),
    _S.RELEASING: frozenset(
        {
            # the job is gone and the node is back with Slurm
            _S.RETURNED,
            # the release cannot complete (e.g. Slurm refuses the cancel): the failed path
            # retries the cleanup and alerts
            _S.FAILED,
        }
    ),
    _S.FAILED: frozenset(
        {
            # cleanup done: out of routing, job cancelled, fence lifted
            _S.RETURNED,
        }
    ),
    # final: a returned lease never changes; a new lend of the node is a new lease
    _S.RETURNED: frozenset(),
}

#: states in which the lease still holds (or may hold) its node: all but the final one
OPEN_STATES: frozenset[LeaseState] = frozenset(s for s in LeaseState if TRANSITIONS[s])


#: states in which a lend is still on its way to serving (decided, submitted or starting):
#: the policy counts them as replicas to come, so a breach is not answered twice
IN_FLIGHT: frozenset[LeaseState] = frozenset(
    {LeaseState.REQUESTED, LeaseState.SUBMITTED, LeaseState.STARTING}
)


def is_final(state: LeaseState) -> bool:
    """True for a state that never changes again (`returned`)."""
    return not TRANSITIONS[LeaseState(state)]


def allowed(old: LeaseState, new: LeaseState) -> bool:
    """True when the table allows old -> new. A same-state pair is not a transition: False."""
    return LeaseState(new) in TRANSITIONS[LeaseState(old)]


class IllegalMove(ValueError):
    """A move the transition table does not allow; names both states (and the lease, when
    given). Raised by `check`; the store raises its own `IllegalTransition` instead."""

    def __init__(self, old: LeaseState, new: LeaseState, *, lease_id: int | None = None) -> None:
        self.old = LeaseState(old)
        self.new = LeaseState(new)
        self.lease_id = lease_id
        where = f"lease {lease_id}: " if lease_id is not None else ""
        super().__init__(f"{where}illegal lease move {self.old.value} -> {self.new.value}")


def check(old: LeaseState, new: LeaseState, *, lease_id: int | None = None) -> None:
    """Raise `IllegalMove` unless the table allows old -> new (a same-state pair too)."""
    if not allowed(old, new):
        raise IllegalMove(old, new, lease_id=lease_id)


@dataclass(frozen=True)
class StepTimes:
    """Seconds each step of a lend takes, measured on the lab (bench/lend_latency.py,
    bench/triton_startup.py; Slurm 22.05)."""

    #: sbatch of a Triton job to running, on a free node
    slurm_start_s: float = 1.37
    #: the same when the node's jobs must go first: the bridge requeues them itself and
    #: submits with -w (waiting for slurmctld's own preemption pass took 18-33 s)
    preempt_start_s: float = 3.8
    #: job running to Triton ready with its models loaded
    triton_ready_s: float = 2.08
    #: scancel of a Triton job to the node free in Slurm
    cancel_s: float = 3.11
