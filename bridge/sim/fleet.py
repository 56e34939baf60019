"""The simulated fleet: nodes with GPUs in pools, a Slurm-like queue per partition, and
GPU-hour bookkeeping. Called by `bridge.sim.engine`, which owns the clock and the event
heap; this module only changes state when told and says what happened.

The queue is Slurm's behaviour in the parts the bridge touches:
- jobs wait per partition in submit order; each scheduling pass looks at no more than
  `max_job_test` of them (Slurm's `bf_max_job_test`) and starts every one that fits
  (first-fit backfill; Slurm's backfill would also reserve room for the top job: not
  modelled, the same for every policy);
- a single-node job goes on the node with the fewest free GPUs that fits it (best fit);
  a multi-node job takes whole free nodes;
- preemption requeues a job: its run is lost back to its last checkpoint (elastic jobs,
  when `checkpoint_s` is set; else all of it), it may start again after
  `requeue_delay_s` (Slurm 22.05: 121 s, measured on the lab);
- a drain fence (the bridge's reservation) keeps new jobs off a node, running ones go on;
- a node lent to Triton holds no batch job;
- GPU-granular lending (`bridge.sim.lending`) holds some of a node's GPUs instead
  (`SimNode.held`: claimed by leases, `claim`, `serve`, `unclaim`): they leave the node's
  free GPUs, and its other GPUs keep running and starting batch work.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.sim.result import USES
from bridge.sim.workload import SimJob

if TYPE_CHECKING:
    from bridge.sim.weights import SimCopy


@dataclass(eq=False, slots=True)
class SimNode:
    index: int
    name: str
    #: policy pool name (inference, training, elastic, loan)
    pool: str
    #: the batch partition whose jobs may run here (None: inference only)
    partition: str | None
    gpus: int
    free: int = 0
    #: running jobs: job id -> its run
    jobs: dict[str, JobRun] = field(default_factory=dict)
    #: a Triton job runs here (baseline or lease) or is about to
    triton: bool = False
    #: the bridge's drain fence (reservation)
    fenced: bool = False
    #: the node's local weight cache: model -> its copy (`bridge.sim.weights`)
    weights: dict[str, SimCopy] = field(default_factory=dict)
    #: GPUs held by GPU-granular leases (claimed, or serving): not in `free`, and no
    #: batch job runs on them (`Fleet.claim`); 0 in node-granular runs
    held: int = 0

    @property
    def schedulable(self) -> bool:
        return self.partition is not None and not self.triton and not self.fenced


@dataclass(eq=False, slots=True)
class JobRun:
    """A job's life in the queue."""

    job: SimJob
    partition: str
    eligible_at: float
    restarts: int = 0
    #: the time of the latest (re)submit: Slurm resets it at each requeue
    submitted_at: float = 0.0
    started_at: float | None = None
    first_started_at: float | None = None
    ended_at: float | None = None
    nodes: tuple[int, ...] = ()
    #: bumped at each start, so an end event of a preempted run is recognised as stale
    run: int = 0
    #: time spent pending before the first start
    wait_s: float | None = None
    #: run time saved by checkpoints of earlier runs (a requeued run resumes from there)
    done_s: float = 0.0
    #: the engine's view of this run in the policy's snapshot (`bridge.policy.JobView`,
    #: without a checkpoint) and the `run` it was made for: kept while the run goes on
    view: Any = None
    view_run: int = -1

    @property
    def remaining_s(self) -> float:
        return self.job.duration_s - self.done_s

    def checkpoint_at(self, now: float, every_s: float | None) -> float | None:
        """The last checkpoint of the current run (every `every_s` of run time)."""
        if not every_s or self.started_at is None or now - self.started_at < every_s:
            return None
        return self.started_at + (now - self.started_at) // every_s * every_s


class Usage:
    """GPUs per (pool, use) over time, integrated into GPU-seconds. Each (pool, use) is
    integrated up to its own last change (`move`); `accrue` brings every one up to a time
    (read `seconds` only after it)."""

    def __init__(self, pools: list[str]) -> None:
        self.gpus = {p: dict.fromkeys(USES, 0) for p in pools}
        self.seconds = {p: dict.fromkeys(USES, 0.0) for p in pools}
        #: per (pool, use): the time `seconds` holds it up to
        self._since = {p: dict.fromkeys(USES, 0.0) for p in pools}

    def accrue(self, now: float) -> None:
        for pool, uses in self.gpus.items():
            for use in uses:
                self._accrue(pool, use, now)

    def _accrue(self, pool: str, use: str, now: float) -> None:
        since = self._since[pool]
        dt = now - since[use]
        if dt > 0:
            n = self.gpus[pool][use]
            if n:
                self.seconds[pool][use] += n * dt
            since[use] = now

    def move(self, pool: str, src: str, dst: str, n: int, now: float) -> None:
        """`n` GPUs of `pool` from use `src` to `dst`, both integrated up to `now` first."""
        _move(self, pool, src, dst, n, now)


class Fleet:
    def __init__(
        self,
        nodes: list[SimNode],
        jobs: dict[str, JobRun],
        requeue_delay_s: float = 121.0,
        max_job_test: int = 500,
        checkpoint_s: float | None = None,
    ) -> None:
        self.nodes = nodes
        self.runs = jobs
        self.requeue_delay_s = requeue_delay_s
        #: elastic jobs checkpoint every this many seconds of run time (None: never)
        self.checkpoint_s = checkpoint_s
        self.max_job_test = max_job_test
        self.usage = Usage(sorted({n.pool for n in nodes}))
        #: pool -> its (gpus, since, seconds) of `usage`, for the hot paths' `_move`
        self._rows = {
            p: (self.usage.gpus[p], self.usage._since[p], self.usage.seconds[p])
            for p in self.usage.gpus
        }
        self.partitions = sorted({n.partition for n in nodes if n.partition})
        #: partition -> free GPUs -> schedulable nodes with that many free
        self._free: dict[str, list[set[int]]] = {}
        gmax = max((n.gpus for n in nodes), default=0)
        for p in self.partitions:
            self._free[p] = [set() for _ in range(gmax + 1)]
        #: partition -> indexed nodes with a free GPU (`any(self._free[p][1:])`, counted)
        self._avail: dict[str, int] = dict.fromkeys(self.partitions, 0)
        #: partition -> until when a pass would start nothing there: its last pass started
        #: nothing, and since then no job came, no node was indexed (gained free GPUs or
        #: became schedulable) and no pending job it saw waiting became eligible
        self._settled: dict[str, float] = {}
        #: job kind -> its pending jobs (`pending_count`)
        self._pending_of: Counter[str] = Counter()
        #: pending jobs, all partitions (none: a pass would start nothing)
        self.waiting = 0
        #: partition -> pending (submit order key, job id, its run), sorted (by the first
        #: two: a job is pending once at most, so its run is never compared)
        self.pending: dict[str, list[tuple[float, str, JobRun]]] = {p: [] for p in self.partitions}
        self.preemptions = 0
        self.lost_gpu_s = 0.0
        for node in nodes:
            node.free = node.gpus
            use = "inference" if node.triton else "idle"
            self.usage.gpus[node.pool][use] += node.gpus
            self._index(node)

    # ---- the free-GPU index ---------------------------------------------------------

    def _index(self, node: SimNode) -> None:
        if node.partition is not None and not node.triton and not node.fenced:  # schedulable
            bucket = self._free[node.partition][node.free]
            if node.index not in bucket:
                bucket.add(node.index)
                if node.free > 0:
                    self._avail[node.partition] += 1
                self._settled.pop(node.partition, None)

    def _unindex(self, node: SimNode) -> None:
        if node.partition is not None:
            bucket = self._free[node.partition][node.free]
            if node.index in bucket:
                bucket.remove(node.index)
                if node.free > 0:
                    self._avail[node.partition] -= 1

    def _fit(self, partition: str, job: SimJob) -> list[int] | None:
        buckets = self._free[partition]
        if job.nodes > 1:
            whole: list[int] = []
            for g in range(job.gpus_per_node, len(buckets)):
                for i in buckets[g]:
                    if self.nodes[i].free == self.nodes[i].gpus:
                        whole.append(i)
                        if len(whole) == job.nodes:
                            return whole
            return None
        for g in range(job.gpus_per_node, len(buckets)):
            if buckets[g]:
                return [next(iter(buckets[g]))]
        return None

    # ---- queue ----------------------------------------------------------------------

    def submit(self, run: JobRun) -> None:
        bisect.insort(self.pending[run.partition], (run.job.submit_s, run.job.job_id, run))
        self._settled.pop(run.partition, None)
        self._pending_of[run.job.kind] += 1
        self.waiting += 1

    def start_alone(self, run: JobRun, now: float) -> bool:
        """`submit(run)` and then `schedule(now)`, for a single-node job submitted when no
        job waits (the engine's common case: most jobs start as they come): True when the
        pass would start it, and it is started; False changes nothing (then submit it)."""
        job = run.job
        partition = run.partition
        if job.nodes != 1 or run.eligible_at > now or self.max_job_test <= 0 or self.waiting:
            return False
        if not self._avail[partition]:
            return False  # (the pass skips the partition)
        buckets = self._free[partition]
        for g in range(job.gpus_per_node, len(buckets)):
            if buckets[g]:
                self._settled.pop(partition, None)  # (`submit`)
                self._start_on(run, next(iter(buckets[g])), now)
                return True
        return False

    def schedule(self, now: float) -> list[JobRun]:
        """One scheduling pass over every partition: the runs it started."""
        started: list[JobRun] = []
        avail, settled = self._avail, self._settled
        for partition, queue in self.pending.items():
            if not queue or not avail[partition]:
                continue  # (the pass would keep every entry)
            if now < settled.get(partition, -math.inf):
                continue  # the same pass as the last, which started nothing
            buckets = self._free[partition]
            top = len(buckets)
            if len(queue) == 1 and self.max_job_test > 0:
                # the loop below on a queue of one job (most passes: jobs seldom wait)
                run = queue[0][2]
                if run.eligible_at > now:
                    settled[partition] = run.eligible_at
                    continue
                job = run.job
                if job.nodes == 1:
                    for g in range(job.gpus_per_node, top):
                        if buckets[g]:
                            self._start_on(run, next(iter(buckets[g])), now)
                            break
                    else:
                        settled[partition] = math.inf
                        continue
                else:
                    chosen = self._fit(partition, job)
                    if chosen is None:
                        settled[partition] = math.inf
                        continue
                    self._start(run, chosen, now)
                self._pending_of[job.kind] -= 1
                self.waiting -= 1
                started.append(run)
                queue.clear()
                settled.pop(partition, None)
                continue
            taken: list[int] = []
            looked = 0
            wakes = math.inf
            limit = self.max_job_test
            for i, entry in enumerate(queue):
                if looked >= limit or not avail[partition]:
                    break  # (the pass keeps the rest)
                run = entry[2]
                if run.eligible_at > now:
                    if run.eligible_at < wakes:
                        wakes = run.eligible_at
                    continue
                looked += 1
                job = run.job
                if job.nodes == 1:  # `_fit` and `_start` of a single-node job, inlined
                    for g in range(job.gpus_per_node, top):
                        if buckets[g]:
                            self._start_on(run, next(iter(buckets[g])), now)
                            break
                    else:
                        continue
                else:
                    chosen = self._fit(partition, job)
                    if chosen is None:
                        continue
                    self._start(run, chosen, now)
                self._pending_of[job.kind] -= 1
                self.waiting -= 1
                started.append(run)
                taken.append(i)
            if not taken:
                settled[partition] = wakes  # nothing started: the queue is as it was
            else:
                if len(taken) == len(queue):
                    queue.clear()
                else:
                    for i in reversed(taken):
                        del queue[i]
                settled.pop(partition, None)
        return started

    def _start_on(self, run: JobRun, i: int, now: float) -> None:
        """`_start(run, [i], now)`, for the one node of a single-node job."""
        run.nodes = (i,)
        run.started_at = now
        run.run += 1
        job = run.job
        if run.first_started_at is None:
            run.first_started_at = now
            run.wait_s = now - job.submit_s
        gpn = job.gpus_per_node
        node = self.nodes[i]
        partition = node.partition
        assert partition is not None  # (it was in the free-GPU index)
        free = node.free
        buckets = self._free[partition]
        bucket = buckets[free]
        if i in bucket:  # `_unindex`
            bucket.remove(i)
            if free > 0:
                self._avail[partition] -= 1
        free -= gpn
        node.free = free
        node.jobs[job.job_id] = run
        if not node.triton and not node.fenced:  # `_index`
            bucket = buckets[free]
            if i not in bucket:
                bucket.add(i)
                if free > 0:
                    self._avail[partition] += 1
                self._settled.pop(partition, None)
        if gpn:  # `usage.move(node.pool, "idle", job.kind, gpn, now)`, written out
            kind = job.kind
            gpus, since, seconds = self._rows[node.pool]
            dt = now - since["idle"]
            if dt > 0:
                if gpus["idle"]:
                    seconds["idle"] += gpus["idle"] * dt
                since["idle"] = now
            dt = now - since[kind]
            if dt > 0:
                if gpus[kind]:
                    seconds[kind] += gpus[kind] * dt
                since[kind] = now
            gpus["idle"] -= gpn
            gpus[kind] += gpn

    def _start(self, run: JobRun, chosen: list[int], now: float) -> None:
        run.nodes = tuple(chosen)
        run.started_at = now
        run.run += 1
        if run.first_started_at is None:
            run.first_started_at = now
            run.wait_s = now - run.job.submit_s
        job = run.job
        gpn, job_id, kind = job.gpus_per_node, job.job_id, job.kind
        nodes, avail = self.nodes, self._avail
        for i in chosen:
            # `_unindex`, the change, `_index` and `usage.move` inlined (the hot path)
            node = nodes[i]
            partition = node.partition
            free = node.free
            if partition is not None:
                buckets = self._free[partition]
                bucket = buckets[free]
                if i in bucket:
                    bucket.remove(i)
                    if free > 0:
                        avail[partition] -= 1
            free -= gpn
            node.free = free
            node.jobs[job_id] = run
            if partition is not None and not node.triton and not node.fenced:
                bucket = buckets[free]
                if i not in bucket:
                    bucket.add(i)
                    if free > 0:
                        avail[partition] += 1
                    self._settled.pop(partition, None)
            _move(self.usage, node.pool, "idle", kind, gpn, now)

    def _release(self, run: JobRun, now: float) -> list[SimNode]:
        freed = []
        job = run.job
        gpn, job_id, kind = job.gpus_per_node, job.job_id, job.kind
        nodes, avail = self.nodes, self._avail
        for i in run.nodes:
            # `_unindex`, the change, `_index` and `usage.move` inlined (the hot path)
            node = nodes[i]
            partition = node.partition
            free = node.free
            if partition is not None:
                buckets = self._free[partition]
                bucket = buckets[free]
                if i in bucket:
                    bucket.remove(i)
                    if free > 0:
                        avail[partition] -= 1
            free += gpn
            node.free = free
            node.jobs.pop(job_id, None)
            fenced = node.fenced
            if partition is not None and not node.triton and not fenced:
                bucket = buckets[free]
                if i not in bucket:
                    bucket.add(i)
                    if free > 0:
                        avail[partition] += 1
                    self._settled.pop(partition, None)
            _move(self.usage, node.pool, kind, "fenced" if fenced else "idle", gpn, now)
            freed.append(node)
        run.nodes = ()
        run.started_at = None
        return freed

    def finish(self, run: JobRun, now: float) -> list[SimNode]:
        run.ended_at = now
        return self._release(run, now)

    def end(self, run: JobRun, now: float) -> None:
        """`finish`, without the list of nodes freed (the engine's hot path): a
        single-node job's `_release` is inlined."""
        run.ended_at = now
        if len(run.nodes) != 1:
            self._release(run, now)
            return
        i = run.nodes[0]
        job = run.job
        gpn = job.gpus_per_node
        node = self.nodes[i]
        partition = node.partition
        free = node.free
        if partition is not None:
            buckets = self._free[partition]
            bucket = buckets[free]
            if i in bucket:  # `_unindex`
                bucket.remove(i)
                if free > 0:
                    self._avail[partition] -= 1
        free += gpn
        node.free = free
        node.jobs.pop(job.job_id, None)
        fenced = node.fenced
        if partition is not None and not node.triton and not fenced:  # `_index`
            bucket = buckets[free]
            if i not in bucket:
                bucket.add(i)
                if free > 0:
                    self._avail[partition] += 1
                self._settled.pop(partition, None)
        if gpn:  # `_move(self.usage, node.pool, job.kind, idle or fenced, gpn, now)`
            src, dst = job.kind, "fenced" if fenced else "idle"
            gpus, since, seconds = self._rows[node.pool]
            dt = now - since[src]
            if dt > 0:
                if gpus[src]:
                    seconds[src] += gpus[src] * dt
                since[src] = now
            dt = now - since[dst]
            if dt > 0:
                if gpus[dst]:
                    seconds[dst] += gpus[dst] * dt
                since[dst] = now
            gpus[src] -= gpn
            gpus[dst] += gpn
        run.nodes = ()
        run.started_at = None

    def preempt(self, run: JobRun, now: float) -> list[SimNode]:
        """Requeue a running job (its run is lost); the nodes it freed."""
        assert run.started_at is not None
        self.preemptions += 1
        every = self.checkpoint_s if run.job.kind == "elastic" else None
        saved_at = run.checkpoint_at(now, every)
        saved = saved_at - run.started_at if saved_at is not None else 0.0
        run.done_s += saved
        self.lost_gpu_s += run.job.gpus * (now - run.started_at - saved)
        freed = self._release(run, now)
        run.restarts += 1
        run.submitted_at = now
        run.eligible_at = now + self.requeue_delay_s
        self.submit(run)
        return freed

    # ---- the bridge's hold on nodes ---------------------------------------------------

    def fence(self, node: SimNode, now: float) -> None:
        self._unindex(node)
        node.fenced = True
        self.usage.move(node.pool, "idle", "fenced", node.free, now)

    def unfence(self, node: SimNode, now: float) -> None:
        node.fenced = False
        self.usage.move(node.pool, "fenced", "idle", node.free, now)
        self._index(node)

    def take(self, node: SimNode, now: float) -> None:
        """A Triton job starts on the (free) node."""
        assert not node.jobs, f"{node.name} still runs {sorted(node.jobs)}"
        self._unindex(node)
        src = "fenced" if node.fenced else "idle"
        self.usage.move(node.pool, src, "inference", node.gpus, now)
        node.triton = True
        node.fenced = False

    def give_back(self, node: SimNode, now: float) -> None:
        """The Triton job ended; the node is Slurm's again."""
        node.triton = False
        self.usage.move(node.pool, "inference", "idle", node.gpus, now)
        self._index(node)

    # ---- GPU-granular leases: some GPUs of a node ---------------------------------------

    def claim(self, node: SimNode, n: int, now: float) -> None:
        """A lease claims `n` of the node's free GPUs: they leave `free` (no batch job
        starts on them) and are booked fenced until its Triton job runs (`serve`)."""
        if not 0 <= n <= node.free:
            raise ValueError(f"{node.name}: claim of {n} GPUs, {node.free} free")
        if n == 0:
            return
        self._unindex(node)
        node.free -= n
        node.held += n
        self.usage.move(node.pool, "idle", "fenced", n, now)
        self._index(node)

    def serve(self, node: SimNode, n: int, now: float) -> None:
        """A Triton job starts on `n` GPUs the lease has claimed on the node."""
        self.usage.move(node.pool, "fenced", "inference", n, now)

    def unclaim(self, node: SimNode, n: int, now: float, *, served: bool) -> None:
        """`n` GPUs a lease held on the node are Slurm's again (`served`: its Triton job
        ran on them; else they were claimed only)."""
        if not 0 <= n <= node.held:
            raise ValueError(f"{node.name}: unclaim of {n} GPUs, {node.held} held")
        if n == 0:
            return
        self._unindex(node)
        node.held -= n
        node.free += n
        self.usage.move(node.pool, "inference" if served else "fenced", "idle", n, now)
        self._index(node)

    def running_on(self, node: SimNode) -> Iterator[JobRun]:
        jobs = node.jobs
        for job_id in sorted(jobs):
            yield jobs[job_id]

    def pending_count(self, kind: str) -> int:
        """Pending jobs of `kind` (counted as they are submitted and started)."""
        return self._pending_of[kind]


def _move(usage: Usage, pool: str, src: str, dst: str, n: int, now: float) -> None:
    """`Usage.move`, unrolled: its one copy, called for every node of every job start and
    end (the single-node fast paths, `Fleet._start_on` and `Fleet.end`, write it out)."""
    if n:
        gpus, since, seconds = usage.gpus[pool], usage._since[pool], usage.seconds[pool]
        dt = now - since[src]
        if dt > 0:
            if gpus[src]:
                seconds[src] += gpus[src] * dt
            since[src] = now
        dt = now - since[dst]
        if dt > 0:
            if gpus[dst]:
                seconds[dst] += gpus[dst] * dt
            since[dst] = now
        gpus[src] -= n
        gpus[dst] += n
