"""Which elastic jobs a lease of some of a node's GPUs requeues (`choose_victims`), and
which a drain-mode one waits for (`drain_wait`).

`choose_victims`: for a one-replica lease of `k` GPUs on a node of a preempt pool, the
running jobs whose requeue frees enough GPUs, choosing the fewest GPUs of elastic work
requeued; among equals the least work lost (GPU-seconds since each job's start or last
reported checkpoint, as `work_lost` counts it), then the fewest jobs,
then the job ids (as strings: no meaning, only a fixed answer). A node whose free GPUs
already make `k` needs no victim. Which jobs may be requeued at all (the requeue guard,
the per-job requeue limit) and how many (the hour's preemption budget) are the caller's
rules, passed in as `keep` and `max_jobs`.

Every subset of the node's running GPU jobs is tried when there are at most
`EXHAUSTIVE_JOBS` of them (an 8-GPU node runs at most 8); beyond that a greedy choice
stands in (`_greedy`), which may requeue more than the fewest GPUs.

`drain_wait`: for a drain-mode lease of `k` GPUs, the running jobs it waits for, those
that end first (by `JobView.ends_at`, their time limits) until their GPUs make `k`, and
when that is.

Both take the node's GPUs held by Triton jobs (baselines, other leases) from
`NodeView.triton_gpus`; a caller that knows better (a pass that has just submitted a
Triton job the snapshot does not show) passes `triton_gpus`. Pure."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import NamedTuple

from bridge.policy.snapshot import JobView, NodeView

#: most running GPU jobs whose subsets are all tried (2^16 subsets: some 50 ms on one
#: core, and only on a node running that many); more fall back to the greedy choice
EXHAUSTIVE_JOBS = 16


@dataclass(frozen=True)
class Victims:
    """The jobs a lease of some of a node's GPUs requeues, and what that costs."""

    #: the job ids to requeue, sorted; empty when the node has the GPUs free
    jobs: tuple[str, ...]
    #: GPUs of elastic work requeued (the sum of the jobs' GPUs)
    gpus: int
    #: GPU-seconds of work lost (`work_lost` of the jobs)
    lost: float


#: a candidate's rank, lower is better: GPUs requeued, work lost, jobs, their ids
_Rank = tuple[int, float, int, tuple[str, ...]]


def work_lost(node: NodeView, now: float) -> float:
    """GPU-seconds a preemption of the node's jobs would throw away: since each job's start
    or its last reported checkpoint, whichever is later."""
    lost = 0.0
    for j in node.jobs:
        if j.started_at is None:
            continue
        since = max(j.started_at, j.checkpoint_at or j.started_at)
        lost += j.gpus * max(0.0, now - since)
    return lost


def guarded(job: JobView, now: float, guard_s: float, max_requeues: int) -> bool:
    """A job no lend may requeue: requeued `max_requeues` times already, or requeued
    within the last `guard_s` seconds (`[policy] max_requeues_per_job`,
    `preempt_guard_s`; a whole-node lend skips a node with such a job,
    `bridge.policy.nodes.choose_nodes`)."""
    if job.restarts >= max_requeues:
        return True
    return job.restarts > 0 and job.submitted_at is not None and now - job.submitted_at < guard_s


def choose_victims(
    node: NodeView,
    k: int,
    now: float,
    *,
    triton_gpus: int | None = None,
    keep: Collection[str] = (),
    max_jobs: int | None = None,
) -> Victims | None:
    """The running jobs of `node` to requeue so that `k` of its GPUs are free for one
    replica, or None when no choice frees them (`k` beyond the node's GPUs less
    `triton_gpus`, or too few GPUs held by jobs that may go).

    `triton_gpus`: GPUs of the node held by Triton jobs; None: `node.triton_gpus`.
    `keep`: ids of jobs never to requeue. `max_jobs`: the most jobs one choice may
    requeue (the preemption budget left); None: no limit. Pending jobs (`started_at`
    None) hold no GPUs and are never chosen; nor are jobs without GPUs (requeueing them
    frees nothing)."""
    if k < 1:
        raise ValueError(f"a lease takes at least one GPU, got k={k}")
    if triton_gpus is None:
        triton_gpus = node.triton_gpus
    running = [j for j in node.jobs if j.started_at is not None]
    free = node.gpus - triton_gpus - sum(j.held_here for j in running)
    if free >= k:
        return Victims((), 0, 0.0)
    need = k - free
    kept = set(keep)
    movable = sorted(
        (j for j in running if j.held_here > 0 and j.job_id not in kept), key=lambda j: j.job_id
    )
    if sum(j.held_here for j in movable) < need:
        return None
    lost = {j.job_id: work_lost(replace(node, jobs=(j,)), now) for j in movable}
    limit = len(movable) if max_jobs is None else min(max_jobs, len(movable))
    if limit < 1:
        return None
    if len(movable) <= EXHAUSTIVE_JOBS:
        best = _exhaustive(movable, need, lost, limit)
    else:
        best = _greedy(movable, need, lost, limit)
    if best is None:
        return None
    gpus, loss, _, ids = best
    return Victims(ids, gpus, loss)


class DrainWait(NamedTuple):
    """What a drain-mode lease of some of a node's GPUs waits for."""

    #: the running jobs to wait for, in the order they end (then by id); empty when the
    #: node has the GPUs free
    jobs: tuple[str, ...]
    #: when the GPUs are free (epoch seconds): the last of those jobs' ends, `now` when
    #: none is waited for or all are past their end
    free_at: float


def drain_wait(
    node: NodeView, k: int, now: float, *, triton_gpus: int | None = None
) -> DrainWait | None:
    """The running jobs of `node` a drain-mode lease of `k` GPUs waits for, and when
    its GPUs are free: the jobs that end first (`JobView.ends_at`; ties by id) taken
    until the free GPUs and theirs make `k`. None when `k` is beyond the node's GPUs
    less `triton_gpus`, and None when the wait runs into a job with no end time (no
    time limit, or none known): when the GPUs are free cannot be said then, though
    Slurm may still end that job. Jobs without GPUs are never waited for; pending jobs
    (`started_at` None) hold none.

    `triton_gpus`: GPUs of the node held by Triton jobs; None: `node.triton_gpus`."""
    if k < 1:
        raise ValueError(f"a lease takes at least one GPU, got k={k}")
    if triton_gpus is None:
        triton_gpus = node.triton_gpus
    if k > node.gpus - triton_gpus:
        return None
    running = [j for j in node.jobs if j.started_at is not None and j.held_here > 0]
    free = node.gpus - triton_gpus - sum(j.held_here for j in running)
    waited: list[str] = []
    free_at = now
    # jobs with no end sort last: reaching one means the known ends do not make `k`
    # (and all the jobs' GPUs do: `k` fits beside Triton's)
    for j in sorted(running, key=lambda j: (j.ends_at is None, j.ends_at or 0.0, j.job_id)):
        if free >= k:
            break
        if j.ends_at is None:
            return None
        waited.append(j.job_id)
        free += j.held_here
        free_at = max(free_at, j.ends_at)
    return DrainWait(tuple(waited), free_at)


def _rank(jobs: Sequence[JobView], lost: dict[str, float]) -> _Rank:
    ids = tuple(sorted(j.job_id for j in jobs))
    return sum(j.gpus for j in jobs), sum(lost[i] for i in ids), len(ids), ids


def _exhaustive(
    movable: Sequence[JobView], need: int, lost: dict[str, float], limit: int
) -> _Rank | None:
    """The best of every subset of at most `limit` jobs whose GPUs make `need`."""
    best: _Rank | None = None
    for size in range(1, limit + 1):
        for subset in combinations(movable, size):
            if sum(j.held_here for j in subset) < need:
                continue
            gpus = sum(j.gpus for j in subset)
            if best is not None and gpus > best[0]:
                continue
            rank = _rank(subset, lost)
            if best is None or rank < best:
                best = rank
    return best


def _greedy(
    movable: Sequence[JobView], need: int, lost: dict[str, float], limit: int
) -> _Rank | None:
    """For nodes with more than `EXHAUSTIVE_JOBS` GPU jobs: the best of three choices of
    at most `limit` jobs: the one job that makes `need` alone at the least cost; the
    smallest jobs taken until they make it; the largest taken until they do (the least
    work lost first among equals, then each taken job that is not needed given back, the
    largest first). Not always the fewest GPUs, and may find none under a tight `limit`
    where some choice exists."""
    ranks = [_rank((j,), lost) for j in movable if j.held_here >= need]
    for sign in (1, -1):
        taken: list[JobView] = []
        for j in sorted(movable, key=lambda j: (sign * j.held_here, lost[j.job_id], j.job_id)):
            if sum(t.held_here for t in taken) >= need:
                break
            taken.append(j)
        for j in sorted(taken, key=lambda j: (-j.held_here, -lost[j.job_id], j.job_id)):
            if sum(t.held_here for t in taken) - j.held_here >= need:
                taken.remove(j)
        ranks.append(_rank(taken, lost))
    return min((r for r in ranks if r[2] <= limit), default=None)
