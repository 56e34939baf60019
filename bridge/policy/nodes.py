"""Which nodes a lend takes (`choose_nodes`), cheapest first: idle before busy, lower
`cost_rank` first (elastic before training), then the least work lost (GPU-seconds since
each job's start or last reported checkpoint). Never a node in a site reservation or
held, never one with a job requeued within `preempt_guard_s` or requeued
`max_requeues_per_job` times, and never more victims than the hour's
`max_preemptions_per_hour` budget leaves, and never more of a pool than its lend share
(`max_lent_share`) lets the bridge hold lent (`share_room`).

Within a cost rank, idle or busy alike, the nodes whose local weight cache
(`NodeView.cached`) makes the lend's models load soonest go first (`load_on`: the slowest
of them, each at its local load time where the node holds its weights, else at its
shared one; then, among idle nodes, the more of the lend's models held; among busy ones
the least work lost), so a lend lands where its weights are staged: a preemption loses
its victims' work on whichever node it takes, a load from the shared repository costs
every lend's requests minutes. Without caches every node loads alike and the order is
the one above.

A lend of some of a node's GPUs (`gpus`: a model whose replica takes k GPUs) takes a
busy preempt-mode node at the cost of the jobs `partial_victims` picks (the fewest GPUs
of elastic work that free k, guarded jobs kept, within the hour's budget), not all of
its jobs; a busy node with k GPUs free already costs nothing and ranks with the idle
ones. With `[policy] drain_partial_lends` a drain-mode node is lent k GPUs too,
killing nothing (else it is lent whole): one with k GPUs free ranks
with the idle ones; a busy one (the backstop's, as any busy drain node) waits for the
jobs that end first until k are free (`bridge.policy.victims.drain_wait`), and the
shortest wait goes first: the soonest known end, then, where a job waited for has no
end known, the fewest GPUs busy.

A lend sized to several replicas' worth (`choose_sized`) takes, by default, the nodes
that give the planned GPUs, then those that give one replica fewer, and so on. With
`[policy] lend_ranking = "per_gpu"` every size is ranked together by the work its
victims lose per GPU lent (plus `lease_cost_gpu_s` a lease), so busy nodes' free GPUs go
first; with `shared_lends` a lend that finds too few nodes on a sustained breach may take
GPUs of a node whose serving leases each hold some of its GPUs, beside them
(`choose_beside`). Pure; `decide`, the advisory pass and the weight-cache plan's lend
order call it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping

from bridge.config import BridgeConfig, PolicyConfig
from bridge.lifecycle import LeaseState
from bridge.policy.snapshot import LeaseView, NodeView, Snapshot, held_nodes, shares_node
from bridge.policy.victims import Victims, choose_victims, drain_wait, guarded, work_lost

#: the lend modes of the pools a lend may take nodes from
LENDABLE = ("preempt", "drain")


def share_room(
    snapshot: Snapshot,
    config: BridgeConfig,
    *,
    freed: Collection[int] = (),
    taken: Collection[str] = (),
) -> dict[str, int] | None:
    """Per lendable pool whose lend share is below 1 (`[pools.NAME] max_lent_share`, else
    `[policy] max_lent_share`), how many more of its nodes the bridge may lend:
    floor(share x the pool's nodes in the snapshot) less its leased nodes (those in `freed`,
    being returned, left out) and the nodes in `taken`. A pool at share 1 is not listed (no
    cap beyond `max_lent_nodes`); None when no pool is capped (the defaults: today's
    behaviour, to the action)."""
    default = config.policy.max_lent_share
    shares = {
        name: default if pool.max_lent_share is None else pool.max_lent_share
        for name, pool in config.pools.items()
        if pool.lend_mode in LENDABLE
    }
    capped = {name: share for name, share in shares.items() if share < 1.0}
    if not capped:
        return None
    size = Counter(node.pool for node in snapshot.nodes)
    pool_of = {node.name: node.pool for node in snapshot.nodes}
    # (nodes, not leases: a node two leases of some of its GPUs share counts once)
    held = {n for lease in snapshot.leases if lease.id not in freed for n in lease.nodes}
    lent = Counter(pool_of[n] for n in held | set(taken) if n in pool_of)
    # (1e-9: 0.29 x 100 is 28.999999999999996 in binary; the cap is 29)
    return {p: max(0, math.floor(f * size[p] + 1e-9) - lent[p]) for p, f in capped.items()}


def load_on(
    node: NodeView,
    models: Collection[str],
    load_s: Mapping[str, float],
    local_load_s: Mapping[str, float],
) -> float:
    """Seconds the slowest of `models` takes to load on `node`: a model whose weights the
    node's cache holds (`NodeView.cached`) at its `local_load_s` where known, every other
    at its shared `load_s` (0: none measured)."""
    cached = node.cached
    return max(
        (
            local_load_s[m] if m in cached and m in local_load_s else load_s.get(m, 0.0)
            for m in models
        ),
        default=0.0,
    )


def requeued_recently(node: NodeView, now: float, guard_s: float) -> bool:
    return any(
        j.restarts > 0 and j.submitted_at is not None and now - j.submitted_at < guard_s
        for j in node.jobs
    )


def partial_victims(
    node: NodeView,
    gpus: int,
    now: float,
    policy: PolicyConfig,
    budget: int,
    triton_gpus: int | None = None,
) -> Victims | None:
    """The jobs a lend of `gpus` of `node`'s GPUs requeues (`choose_victims`): never a
    guarded job (`bridge.policy.victims.guarded`), never more than `budget` of them; None
    when no such choice frees the GPUs. `triton_gpus`: the GPUs its Triton jobs hold
    (None: `node.triton_gpus`)."""
    keep = [
        j.job_id
        for j in node.jobs
        if guarded(j, now, policy.preempt_guard_s, policy.max_requeues_per_job)
    ]
    return choose_victims(
        node, gpus, now, triton_gpus=triton_gpus, keep=keep, max_jobs=max(0, budget)
    )


def partial(node_gpus: int, gpus: int | None, mode: str, drain: bool = False) -> bool:
    """A lend of `gpus` GPUs takes only some of a node of `node_gpus`: a preempt-mode node
    with more, or with `drain` (`[policy] drain_partial_lends`) a drain-mode one (a
    replica of the whole node or more takes whole nodes; a drain-mode node otherwise
    is fenced whole)."""
    ok = mode == "preempt" or (drain and mode == "drain")
    return gpus is not None and ok and gpus < node_gpus


def drain_cost(node: NodeView, gpus: int, now: float) -> tuple[float, int] | None:
    """How long a drain-mode lend of `gpus` of `node`'s GPUs waits, as `choose_nodes`
    ranks it: the seconds until the jobs that end first free them (by their time limits;
    inf when one it would wait for has no end known), then the GPUs the node's running
    jobs hold. None when the GPUs are free already. (A node whose Triton jobs leave
    fewer than `gpus` is no candidate at all: `drain_fits`.)"""
    busy = sum(j.held_here for j in node.jobs if j.started_at is not None)
    if gpus <= node.gpus - node.triton_gpus - busy:
        return None
    wait = drain_wait(node, gpus, now)
    return (math.inf if wait is None else max(0.0, wait.free_at - now)), busy


def drain_fits(node: NodeView, gpus: int) -> bool:
    """A drain-mode lend of `gpus` of `node`'s GPUs can be given, in time: its Triton jobs
    leave that many."""
    return gpus <= node.gpus - node.triton_gpus


def victims_count(
    node: NodeView, gpus: int | None, mode: str, now: float, policy: PolicyConfig
) -> int:
    """Jobs a lend of `node` requeues: a preempt-mode partial lend's `partial_victims`, a
    preempt-mode whole-node lend's every job, none for a drain-mode one."""
    if mode == "preempt" and partial(node.gpus, gpus, mode):
        assert gpus is not None
        victims = partial_victims(node, gpus, now, policy, len(node.jobs))
        return len(victims.jobs) if victims is not None else 0
    return len(node.jobs) if mode == "preempt" else 0


def choose_nodes(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    count: int,
    *,
    waiting: bool = False,
    taken: frozenset[str] = frozenset(),
    freed: frozenset[int] = frozenset(),
    models: Collection[str] = (),
    gpus: int | None = None,
    spent: int = 0,
) -> list[NodeView]:
    """Up to `count` nodes to lend, cheapest first (see the module docstring). A busy
    drain-mode node serves only once its jobs end (hours, maybe): it is a candidate only
    with `waiting` (the backstop), never for a capacity deficit that must be met now;
    one whose free GPUs make a partial lend's is not busy for it.
    `taken`: nodes this tick lends already; `freed`: leases this tick returns (their
    pool's `max_lent_share` room is free again); `models`: the models the lends are for
    (the idle nodes holding their weights first within a cost rank; none: by name);
    `gpus`: the GPUs each lend takes of its node (None: whole nodes; see `partial`);
    `spent`: jobs the pass's other lends requeue already (of the hour's budget)."""
    if count <= 0:
        return []
    policy = config.policy
    leased = held_nodes(snapshot.leases) | taken
    budget = policy.max_preemptions_per_hour - snapshot.preemptions_last_hour - spent
    modes = {name: pool.lend_mode for name, pool in config.pools.items()}
    #: a partial lend's cost per busy node: its victims, the work they lose (preempt
    #: mode); its wait (drain mode, `drain_cost`)
    cost: dict[str, tuple[int, float]] = {}
    waits: dict[str, tuple[float, int]] = {}
    lendable = {
        name: pool.cost_rank for name, pool in config.pools.items() if pool.lend_mode in LENDABLE
    }
    room = share_room(snapshot, config, freed=freed, taken=taken)
    if room is not None:  # a pool whose share is lent already lends no more
        lendable = {name: rank for name, rank in lendable.items() if room.get(name, 1) > 0}
    idle: list[tuple[int, float, int, str, NodeView]] = []
    load_s, local_load_s = snapshot.load_s, snapshot.local_load_s
    busy_nodes: list[NodeView] = []
    # a busy drain-mode node is lent some of its GPUs only with `drain_partial_lends`
    drain_partial = policy.drain_partial_lends
    for node in snapshot.nodes:
        rank = lendable.get(node.pool)
        if rank is None:
            continue
        if not node.usable or node.reserved or node.has_triton or node.name in leased:
            continue
        if gpus is not None and node.gpus < gpus:  # too small for the replica (a gang's)
            continue
        free = False  # a busy node whose free GPUs make a partial lend
        mode = modes[node.pool]
        if (
            node.jobs
            and drain_partial
            and gpus is not None
            and mode == "drain"
            and partial(node.gpus, gpus, mode, True)
        ):
            if not drain_fits(node, gpus):
                continue
            wait = drain_cost(node, gpus, now)
            if wait is not None:
                waits[node.name] = wait
                busy_nodes.append(node)
                continue
            free = True  # its free GPUs make the lend: as cheap as an idle node
        elif node.jobs and gpus is not None and partial(node.gpus, gpus, mode):
            chosen_jobs = partial_victims(node, gpus, now, policy, budget)
            if chosen_jobs is None:
                continue
            if chosen_jobs.jobs:
                cost[node.name] = (len(chosen_jobs.jobs), chosen_jobs.lost)
                busy_nodes.append(node)
                continue
            free = True  # as cheap as an idle node, and an idle one stays whole for others
        if not node.jobs or free:
            if models and node.cached:
                load = load_on(node, models, load_s, local_load_s)
                held = sum(1 for m in models if m in node.cached)
            else:  # (no cache: every such node alike, the shared loads)
                load, held = -1.0, 0
            idle.append((rank, load, -held, node.name, node))
        else:
            busy_nodes.append(node)
    if models and any(t[1] >= 0.0 for t in idle):
        shared = max((load_s.get(m, 0.0) for m in models), default=0.0)
        idle = [(r, shared if load < 0.0 else load, h, n, v) for r, load, h, n, v in idle]
    idle.sort(key=lambda t: t[:4])
    if room is None:
        chosen = [t[4] for t in idle[:count]]
    else:
        chosen = []
        for *_, node in idle:
            if len(chosen) == count:
                break
            if node.pool not in room:
                chosen.append(node)
            elif room[node.pool] > 0:
                room[node.pool] -= 1
                chosen.append(node)
    if len(chosen) == count:
        # enough idle nodes: the busy ones' checks and work lost would go unread
        return chosen
    # (rank, load, the cost: work lost, or a drain lend's wait then GPUs busy; name, node)
    busy: list[tuple[int, float, tuple[float, int], str, NodeView]] = []
    for node in busy_nodes:
        rank = lendable[node.pool]
        load = load_on(node, models, load_s, local_load_s) if models and node.cached else -1.0
        if node.name in cost:  # a partial lend: its victims were checked and counted
            busy.append((rank, load, (cost[node.name][1], 0), node.name, node))
        elif config.pools[node.pool].lend_mode == "preempt":
            if len(node.jobs) > budget or requeued_recently(node, now, policy.preempt_guard_s):
                continue
            if any(j.restarts >= policy.max_requeues_per_job for j in node.jobs):
                continue
            busy.append((rank, load, (work_lost(node, now), 0), node.name, node))
        elif waiting:  # a drain lend: the shortest wait first (a whole node's: by name)
            busy.append((rank, load, waits.get(node.name, (0.0, 0)), node.name, node))
    if models and any(t[1] >= 0.0 for t in busy):
        shared = max((load_s.get(m, 0.0) for m in models), default=0.0)
        busy = [(r, shared if load < 0.0 else load, w, n, v) for r, load, w, n, v in busy]
    busy.sort(key=lambda t: t[:4])
    for *_, node in busy:
        if len(chosen) == count:
            break
        if node.name in cost:
            victims = cost[node.name][0]
        else:
            victims = len(node.jobs) if config.pools[node.pool].lend_mode == "preempt" else 0
        if victims > budget or (room is not None and room.get(node.pool, 1) <= 0):
            continue
        budget -= victims
        if room is not None and node.pool in room:
            room[node.pool] -= 1
        chosen.append(node)
    return chosen


def choose_sized(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    count: int,
    *,
    gpus: int,
    step: int,
    taken: frozenset[str] = frozenset(),
    freed: frozenset[int] = frozenset(),
    models: Collection[str] = (),
    spent: int = 0,
) -> list[tuple[NodeView, int]]:
    """Up to `count` nodes for lends planned at `gpus` GPUs each (several replicas of
    `step` GPUs' worth, `bridge.policy.capacity.plan_lends`), with the GPUs each takes:
    the nodes that give `gpus` (`choose_nodes`, cheapest first), then for the lends
    left those that give `step` fewer, and so on down to one replica's `step`: a node
    whose free GPUs and requeueable jobs (within the hour's budget, guarded jobs kept)
    make fewer serves what it can, the next pass plans what is still short. Each node
    at the largest of those sizes it gives."""
    if step < 1:
        raise ValueError(f"a replica takes at least one GPU, got step={step}")
    if config.policy.lend_ranking == "per_gpu":
        return _by_gpu_cost(
            snapshot,
            config,
            now,
            count,
            gpus=gpus,
            step=step,
            taken=taken,
            freed=freed,
            models=models,
            spent=spent,
        )
    out: list[tuple[NodeView, int]] = []
    held = set(taken)
    policy = config.policy
    size = gpus
    while len(out) < count and size >= step:
        for node in choose_nodes(
            snapshot,
            config,
            now,
            count - len(out),
            freed=freed,
            models=models,
            gpus=size,
            taken=frozenset(held),
            spent=spent,
        ):
            out.append((node, size))
            held.add(node.name)
            spent += victims_count(node, size, config.pools[node.pool].lend_mode, now, policy)
        size -= step
    return out


def _by_gpu_cost(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    count: int,
    *,
    gpus: int,
    step: int,
    taken: frozenset[str],
    freed: frozenset[int],
    models: Collection[str],
    spent: int,
) -> list[tuple[NodeView, int]]:
    """`choose_sized` with `[policy] lend_ranking = "per_gpu"`: the nodes `choose_nodes`
    offers at every size from `gpus` down to `step`, ranked together by cost rank, the
    lend's models' load there, then the work its victims lose per GPU it takes (plus
    `lease_cost_gpu_s` a lease), the larger size first on a tie. An idle node's GPUs and
    a busy node's free ones cost nothing and go before any victim. Each node once, at the
    size it ranks best, within the hour's budget and the pools' lend shares."""
    policy = config.policy
    budget = policy.max_preemptions_per_hour - snapshot.preemptions_last_hour - spent
    # (cost rank, load, GPU-seconds lost per GPU lent, -size, name, node, size, victims)
    ranked: list[tuple[int, float, float, int, str, NodeView, int, int]] = []
    for size in range(gpus, step - 1, -step):
        offered = choose_nodes(
            snapshot,
            config,
            now,
            len(snapshot.nodes),
            freed=freed,
            models=models,
            gpus=size,
            taken=taken,
            spent=spent,
        )
        for node in offered:
            mode = config.pools[node.pool].lend_mode
            lost, jobs = 0.0, 0
            if node.jobs and partial(node.gpus, size, mode):
                victims = partial_victims(node, size, now, policy, len(node.jobs))
                if victims is not None:
                    lost, jobs = victims.lost, len(victims.jobs)
            elif node.jobs and mode == "preempt":
                lost, jobs = work_lost(node, now), len(node.jobs)
            load = load_on(node, models, snapshot.load_s, snapshot.local_load_s)
            per_gpu = (lost + policy.lease_cost_gpu_s) / size
            rank = config.pools[node.pool].cost_rank
            ranked.append((rank, load, per_gpu, -size, node.name, node, size, jobs))
    ranked.sort(key=lambda t: t[:5])
    room = share_room(snapshot, config, freed=freed, taken=taken)
    return take([t[5:] for t in ranked], count, budget, room)


def take(
    ranked: list[tuple[NodeView, int, int]], count: int, budget: int, room: dict[str, int] | None
) -> list[tuple[NodeView, int]]:
    """Up to `count` of the (node, GPUs, victims) `ranked`, in their order: each node once,
    its victims within the `budget` left, and a node of a pool in `room` only while the
    pool has room (None: no pool capped)."""
    out: list[tuple[NodeView, int]] = []
    held: set[str] = set()
    for node, size, jobs in ranked:
        if len(out) == count:
            break
        if node.name in held or jobs > budget:
            continue
        if room is not None and node.pool in room:
            if room[node.pool] <= 0:
                continue
            room[node.pool] -= 1
        budget -= jobs
        held.add(node.name)
        out.append((node, size))
    return out


def choose_beside(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    count: int,
    *,
    gpus: int,
    step: int,
    taken: frozenset[str] = frozenset(),
    spent: int = 0,
) -> list[tuple[NodeView, int]]:
    """Up to `count` lends of GPUs of nodes already lent, beside their leases (`[policy]
    shared_lends`, when a sized lend finds too few other nodes): a usable, unreserved
    preempt-mode node not in `taken` whose open leases each hold some of its GPUs by
    preemption (`shares_node`) and serve gives the planned `gpus` or, with fewer not
    lent, the most of those in steps of `step`, at the cost of the jobs
    `partial_victims` picks beside the leases' GPUs. The least work lost per GPU first
    (cost rank first, the larger on a tie), within the hour's budget. The node is lent
    already: it takes no more of its pool's lend share (`share_room`)."""
    policy = config.policy
    budget = policy.max_preemptions_per_hour - snapshot.preemptions_last_hour - spent
    on: dict[str, list[LeaseView]] = {}
    for lease in snapshot.leases:
        for name in lease.nodes:
            on.setdefault(name, []).append(lease)
    ranked: list[tuple[int, float, int, str, NodeView, int, int]] = []
    for node in snapshot.nodes:
        leases = on.get(node.name)
        pool = config.pools.get(node.pool)
        if not leases or pool is None or pool.lend_mode != "preempt" or node.name in taken:
            continue
        if not node.usable or node.reserved:
            continue
        if not all(shares_node(lease) and lease.state == LeaseState.SERVING for lease in leases):
            continue
        lent = sum(lease.lent_gpus or 0 for lease in leases)
        size = min(gpus, (node.gpus - lent) // step * step)
        if size < step:
            continue
        victims = partial_victims(node, size, now, policy, budget, triton_gpus=lent)
        if victims is None:
            continue
        per_gpu = (victims.lost + policy.lease_cost_gpu_s) / size
        ranked.append((pool.cost_rank, per_gpu, -size, node.name, node, size, len(victims.jobs)))
    ranked.sort(key=lambda t: t[:4])
    return take([t[4:] for t in ranked], count, budget, None)
