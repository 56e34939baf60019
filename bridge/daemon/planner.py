"""The sync planner: what each open lease needs next, from one observation. Pure.

`plan(obs, leases, now, settings, not_before)` folds in what Slurm and Triton say (a job
running, a server ready, a job gone) and returns `Step`s: the commands a lease needs
(submit its Triton job, cancel it, unload its models, lift its fence, put it in or out of
routing) and the move its state makes once they have all succeeded. The rules per state
are the one per-state sync, `bridge.policy.leasesync` (shared with the advisory's shadow
book and the simulator); the planner reads each lease's world from the observation
(`world_of`) and hands it over. `plan_orphans` handles what no open lease holds (tagged
Triton jobs to adopt or cancel, bridge fences to lift); `plan_return` gives a lease back;
`replayed_lend` and `replayed_return` answer an operator request taken again after a
failover from the work its first attempt did. The actuator (`bridge.daemon.actuator`)
carries steps out through the adapters; errors come back as data, and a lease whose
command failed permanently is failed by the actuator with the adapter's words.

No I/O, no clock: `now` is a parameter (epoch seconds), so every case is a unit test with
literal inputs (tests/unit/test_planner.py). The steps, commands, settings and deadlines
are `bridge.policy.steps` and `bridge.policy.leasesync`'s, named here too for the
reconciler and the placer (the actuator matches the commands on `bridge.policy.steps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from bridge.config import BridgeConfig, pool_of
from bridge.daemon.observation import (
    RESERVATION_PREFIX,
    Observation,
    free_types,
    job_views,
    triton_gpus,
    usable,
)
from bridge.lifecycle import LeaseState
from bridge.policy.gang import lend_gpus, nodes_per_replica
from bridge.policy.leasesync import (
    HELD_REASONS,
    RESERVATION_SLACK_S,
    LeaseWorld,
    Settings,
    deadline,
    is_stuck,
    return_reasons,
    return_step,
    sync_lease,
)
from bridge.policy.nodes import partial
from bridge.policy.snapshot import LeaseView, NodeView, held_nodes, shares_node
from bridge.policy.steps import (
    Adopt,
    Cancel,
    Command,
    Fence,
    Move,
    Requeue,
    Resume,
    RouteIn,
    RouteOut,
    Step,
    Submit,
    SubmitBaseline,
    Unfence,
    Unload,
)
from bridge.policy.typed import lend_key, typed_view
from bridge.policy.victims import choose_victims, guarded
from bridge.slurm.model import Job, LeaseRef, lease_of

S = LeaseState
#: the planner's name for the one lease view (a copy of the stored row, `record_of`)
LeaseRecord = LeaseView


def reservation_name(lease_id: int) -> str:
    return f"{RESERVATION_PREFIX}{lease_id}"


def _job_of(lease: LeaseView, jobs: Mapping[str, Job]) -> Job | None:
    if lease.slurm_job_id:
        return jobs.get(lease.slurm_job_id)
    return next((j for j in jobs.values() if lease_of(j.tags) == lease.ref), None)


def world_of(lease: LeaseView, obs: Observation, settings: Settings | None = None) -> LeaseWorld:
    """What the observation shows of one lease: its node, its Triton job (by its job id,
    else by the tag naming the lease) and that job's server, its drain fence, and the
    jobs its submit requeues (`victims_of`)."""
    job = _job_of(lease, obs.triton_jobs())
    reservation = reservation_name(lease.id)
    return LeaseWorld(
        all(n in obs.nodes for n in lease.nodes),
        job,
        obs.server_of(job.job_id) if job else None,
        reservation,
        reservation in obs.reservations,
        victims_of(lease, obs, settings or Settings()) if lease.state == S.REQUESTED else (),
    )


def victims_of(lease: LeaseView, obs: Observation, settings: Settings) -> tuple[str, ...]:
    """The jobs a preempt-mode lease's submit requeues (a drain-mode one's: none), sorted:
    every job running on its node for a whole-node lease; for a partial one (`lent_gpus`),
    the fewest GPUs of them that free its GPUs (`bridge.policy.victims.choose_victims`,
    guarded jobs kept), as the policy chose the node by. None found (the node's jobs
    changed since): none is requeued, and Slurm starts the Triton job when its GPUs are
    free. At the observation's time."""
    now = obs.at
    running = obs.work.get(lease.node, ())
    if lease.lend_mode != "preempt":  # a drain-mode lend waits for its jobs: none goes
        return ()
    if lease.lent_gpus is None:  # whole nodes: every job on any of them
        return tuple(sorted({j.job_id for n in lease.nodes for j in obs.work.get(n, ())}))
    node = obs.nodes.get(lease.node)
    if node is None or not running:
        return ()
    jobs = job_views(obs, lease.node, types=lease.gpu_type is not None)
    view = NodeView(lease.node, lease.pool, True, node.gpus, jobs)
    keep = [
        j.job_id
        for j in jobs
        if guarded(j, now, settings.preempt_guard_s, settings.max_requeues_per_job)
    ]
    # the GPUs the node's other Triton jobs hold, or will: started ones', and those of a
    # lease sharing the node whose job pends for it (its victims still being requeued)
    held = triton_gpus(obs)[1].get(lease.node, 0) + sum(
        j.gpus
        for j in obs.triton_jobs().values()
        if j.state == "PENDING"
        and j.requested_nodes == (lease.node,)
        and lease_of(j.tags) != lease.ref
    )
    if lease.gpu_type is not None:  # GPUs of a type (MIG slices): the jobs holding it
        view = typed_view(replace(view, free_types=free_types(node)), lease.gpu_type)
        held = 0
    chosen = choose_victims(view, lease.lent_gpus, now, triton_gpus=held, keep=keep)
    return chosen.jobs if chosen is not None else ()


def plan_lease(lease: LeaseView, obs: Observation, now: float, settings: Settings) -> Step | None:
    """The next step of one open lease, or None when it waits (`sync_lease`)."""
    return sync_lease(lease, world_of(lease, obs, settings), now, settings)


def plan(
    obs: Observation,
    leases: Sequence[LeaseView],
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


def plan_return(lease: LeaseView, reason: str, obs: Observation) -> Step | None:
    """Give a lease back (`return_step`): out of routing then drain (serving), cancel (on
    its way), or abandon (not yet submitted). None for a lease already leaving."""
    return return_step(lease, reason, world_of(lease, obs))


def plan_orphans(
    obs: Observation,
    leases: Sequence[LeaseView],
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
    open_nodes = held_nodes(open_leases)
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
        elif job.state == "RUNNING" and job.nodes:
            node = obs.nodes.get(job.nodes[0])
            pool = pool_of(node, config) if node else None
            if pool is None or config.pools[pool].lend_mode == "reserved":
                continue
            mode = config.pools[pool].lend_mode
            first, *others = job.nodes  # a gang's server runs on its first node
            partial = not others and node is not None and 0 < job.gpus < node.gpus
            adopt = Adopt(
                job.job_id, first, pool, mode, tuple(others), job.gpus if partial else None
            )
            steps.append(Step(None, (adopt,)))
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


def lease_refs_to_check(obs: Observation, leases: Sequence[LeaseView]) -> set[int]:
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
    leases: Sequence[LeaseView],
    config: BridgeConfig,
) -> tuple[str, str, tuple[str, ...]] | str:
    """An operator's lend, validated: (pool, lend mode, models), or the refusal's text.
    The models are those of this tick's facts (default: every model the repository
    holds). A node other leases hold is refused here unless each is a lease of some of
    its GPUs by preemption; whether the lend may share it is `shared_node_refusal`'s,
    once its GPUs are known."""
    known = obs.nodes.get(node)
    if known is None:
        return f"refused: Slurm has no node {node!r}"
    pool = pool_of(known, config)
    if pool is None or config.pools[pool].lend_mode not in ("preempt", "drain"):
        return f"refused: {node} is in no lendable pool (pool {pool})"
    if any(not shares(lease, node) for lease in _holders(node, leases)):
        return f"refused: {node} is already lent"
    unknown = sorted(set(models) - set(obs.models.names))
    if unknown:
        return f"refused: unknown models {', '.join(unknown)}"
    return pool, config.pools[pool].lend_mode, tuple(models) or obs.models.served


def _holders(node: str, leases: Sequence[LeaseView]) -> list[LeaseView]:
    return [lease for lease in leases if node in lease.nodes and lease.state != S.RETURNED]


def shares(lease: LeaseView, node: str) -> bool:
    """Whether `lease` leaves `node` to other leases of some of its GPUs by preemption:
    it is one itself, on `node` (the rule `LeaseStore.create` keeps)."""
    return lease.node == node and shares_node(lease)


def shared_node_refusal(
    node: str,
    gpus: int | None,
    mode: str,
    gpu_type: str | None,
    obs: Observation,
    leases: Sequence[LeaseView],
) -> str | None:
    """Why an operator's lend of `gpus` of `node` may not stand beside the node's open
    leases (each of some of its GPUs by preemption, `check_operator_lend`), or None: it
    may when it is one too, and its GPUs are not held by those leases (GPUs of a type,
    MIG slices, are checked free by `operator_typed`). It then takes a port slot of its
    own (`LeaseStore.create`)."""
    holders = _holders(node, leases)
    if not holders:
        return None
    if gpus is None or mode != "preempt":
        return f"refused: {node} is already lent (a whole node or a drain is not shared)"
    if gpu_type is None:
        known = obs.nodes.get(node)
        left = (known.gpus if known is not None else 0) - sum(
            lease.lent_gpus or 0 for lease in holders
        )
        if gpus > left:
            return (
                f"refused: {node}'s leases {', '.join(str(lease.id) for lease in holders)} "
                f"hold all but {left} of its GPUs; the lend takes {gpus}"
            )
    return None


def operator_lend_gpus(
    node: str, models: Sequence[str], mode: str, obs: Observation, config: BridgeConfig
) -> int | None:
    """GPUs of `node` an operator's lend of `models` takes: as the policy's lends, the
    GPUs a replica of them takes (`bridge.policy.gang.lend_gpus`) where that is a
    partial lend (`bridge.policy.nodes.partial`, `[policy] partial_lends`); None: the
    whole node."""
    if not config.policy.partial_lends:
        return None
    k = lend_gpus(obs.models.scaled, models)
    known = obs.nodes.get(node)
    drain = config.policy.drain_partial_lends
    return k if known is not None and partial(known.gpus, k, mode, drain) else None


def operator_typed(
    node: str, models: Sequence[str], mode: str, obs: Observation
) -> tuple[str, int] | str | None:
    """An operator's lend of `models` whose GPUs are of one type (a MIG slice,
    `bridge.policy.typed.lend_key`): (the type, the GPUs of it a replica takes), as the
    policy's lends of them (in a preempt-mode pool the jobs holding the type are
    requeued at the submit, `victims_of`; in a drain-mode one the GPUs must be free);
    the refusal's text when `node` has too few; None: the lend's GPUs are of no type."""
    key = lend_key(obs.models.scaled, models)
    if key is None:
        return None
    gpu_type, k = key
    known = obs.nodes.get(node)
    free = dict(free_types(known)).get(gpu_type, 0) if known else 0
    running = job_views(obs, node, types=True)
    held = sum(j.held_of(gpu_type) for j in running if j.started_at is not None)
    if free < k and (mode != "preempt" or free + held < k):
        which = "free" if mode != "preempt" else "free or held by jobs"
        return (
            f"refused: a replica of {','.join(models)} takes {k} GPU(s) of type {gpu_type}; "
            f"node {node} has {free if mode != 'preempt' else free + held} of them {which}"
        )
    return gpu_type, k


def operator_gang(
    node: str,
    models: Sequence[str],
    obs: Observation,
    leases: Sequence[LeaseView],
    config: BridgeConfig,
) -> tuple[str, ...] | str:
    """The other nodes of an operator's lend of `node` whose replica spans nodes (its
    models' `bridge.policy.gang.lend_gpus` more than `node` has): as many nodes as
    `nodes_per_replica` says, of `node`'s pool and GPU count, usable, with no Triton job
    and in no open lease, the idle first, then in Slurm's order; () for a replica that
    fits `node`; the refusal's text when too few are free (all or nothing)."""
    known = obs.nodes.get(node)
    k = lend_gpus(obs.models.scaled, models)
    if known is None or k is None or k <= known.gpus:
        return ()
    n = nodes_per_replica(k, known.gpus)
    pool = pool_of(known, config)
    held = held_nodes(lease for lease in leases if lease.state != S.RETURNED)
    bound = triton_gpus(obs)[0]
    free = [
        other
        for other in obs.nodes.values()
        if other.name != node
        and pool_of(other, config) == pool
        and other.gpus == known.gpus
        and usable(other)
        and other.name not in held
        and other.name not in bound
    ]
    free.sort(key=lambda other: bool(obs.work.get(other.name)))  # the idle first (stable)
    if len(free) < n - 1:
        return (
            f"refused: a replica of {','.join(models)} takes {k} GPUs, {n} nodes of "
            f"{known.gpus} in pool {pool}; {len(free) + 1} free"
        )
    return tuple(other.name for other in free[: n - 1])


# ---- operator requests taken again -----------------------------------------------------
# After a failover the new leader takes again a request that the old one carried out but
# did not record (killed in between). The request's work is found in the store (the lease
# its lend made, keyed by the request; the move its return made, named by it) and the
# request is answered as its first attempt would have been: done once, never refused as
# someone else's work.

#: a lease's history as the answers below read it: (state entered, reason), oldest first
Moves = Sequence[tuple[LeaseState, str]]


def replayed_lend(made: LeaseView, moves: Moves) -> str:
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


def replayed_return(lease: LeaseView, moves: Moves, reason: str) -> str | None:
    """The outcome of a return with `reason` of a lease already leaving or returned, when
    a move in its history `moves` was this return's own (`return_reasons`): its first
    attempt's answer. None when no move is (the return is someone else's, answered as
    such: "already draining", "already returned")."""
    mine = set(return_reasons(reason))
    if any(why in mine for _, why in moves):
        return f"lease {lease.id} returning"
    return None


__all__ = [
    "HELD_REASONS",
    "RESERVATION_SLACK_S",
    "Adopt",
    "Cancel",
    "Command",
    "Fence",
    "LeaseRecord",
    "Move",
    "Moves",
    "Requeue",
    "Resume",
    "RouteIn",
    "RouteOut",
    "Settings",
    "Step",
    "Submit",
    "SubmitBaseline",
    "Unfence",
    "Unload",
    "check_operator_lend",
    "deadline",
    "is_stuck",
    "lease_refs_to_check",
    "operator_gang",
    "operator_lend_gpus",
    "operator_typed",
    "plan",
    "plan_lease",
    "plan_orphans",
    "plan_return",
    "replayed_lend",
    "replayed_return",
    "reservation_name",
    "return_reasons",
    "shared_node_refusal",
    "shares",
    "world_of",
]
