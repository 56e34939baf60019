"""Lends of GPUs of one GRES type: MIG slices (issue 32). A model that says the type its
replica's GPUs are of (`ModelConfig.gpu_type`, such as `h100_1g.10gb`) is lent only GPUs
of that type, one replica's k a lend, its Triton job asking `--gres=gpu:<type>:k`.

Slurm allocates a MIG slice as it does a GPU, and each job's allocated TRES names the
types it holds (`JobView.gpu_types`), a node's the types in use (`NodeView.free_types`:
its free ones). A node with k of the type free first, as cheap as an idle one (the
cheapest pool, then the fewest of the type free: a node with more stays for a larger
lend, then by name); then a preempt-mode node whose jobs holding the type free k when
requeued, chosen as a partial lend's victims are (`typed_view`: the node as the type
sees it, `bridge.policy.nodes.partial_victims` on it). A drain-mode node is lent free
GPUs of the type only; no node of another type is ever lent instead. The node's other
GPUs go on running its jobs. Pure; `decide` (its capacity lends and its backstop) and
the planner (a typed lease's victims, an operator's typed lend) call it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy.actions import Lend
from bridge.policy.gang import lend_gpus
from bridge.policy.nodes import LENDABLE, partial_victims, share_room, take
from bridge.policy.snapshot import NodeView, Snapshot, held_nodes


def lend_type(models: Mapping[str, ModelConfig], names: Sequence[str]) -> str | None:
    """The GRES type one lend of the models `names` asks its GPUs of (`--gres=gpu:<type>:
    k`): the `gpu_type` of the first of them that says one (a lend's models share its one
    server, so the others run on those GPUs too); None: any GPU, as every lend before."""
    return next((models[m].gpu_type for m in names if m in models and models[m].gpu_type), None)


def lend_key(models: Mapping[str, ModelConfig], names: Sequence[str]) -> tuple[str, int] | None:
    """A lend of the models `names` as typed lends take it: (its `lend_type`, the GPUs of
    it one replica takes, 1 where they say none); None: a lend of any GPU."""
    gpu_type = lend_type(models, names)
    return None if gpu_type is None else (gpu_type, lend_gpus(models, names) or 1)


def typed_view(node: NodeView, gpu_type: str) -> NodeView:
    """`node` as a lend of GPUs of `gpu_type` sees it: its GPUs of that type, those free
    and those its running jobs hold (a Triton job's are neither), and the running jobs
    that hold some, each with its count of the type as the GPUs a requeue of it frees
    (`JobView.gpus_here`), so `partial_victims` picks among them as on any node."""
    jobs = tuple(
        replace(j, gpus_here=j.held_of(gpu_type))
        for j in node.jobs
        if j.started_at is not None and j.held_of(gpu_type) > 0
    )
    held = sum(j.held_here for j in jobs)
    return replace(node, gpus=node.free_of(gpu_type) + held, jobs=jobs, triton_gpus=0)


def choose_typed(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    count: int,
    *,
    gpu_type: str,
    gpus: int,
    taken: Collection[str] = (),
    freed: Collection[int] = (),
    spent: int = 0,
) -> list[NodeView]:
    """Up to `count` nodes for lends of `gpus` GPUs of `gpu_type` each (see the module
    docstring): in a lendable pool with room under its lend share, usable, in no site
    reservation or operator hold, with no Triton job and no lease, not in `taken`. Those
    with `gpus` of the type free first (the cheapest pool, then the fewest of the type
    free, then by name); then preempt-mode ones whose jobs holding the type free them
    when requeued (`partial_victims` on `typed_view`: guarded jobs kept, within the
    hour's budget less `spent`), the cheapest pool then the least work lost."""
    if gpus < 1:
        raise ValueError(f"a lend takes at least one GPU, got gpus={gpus}")
    policy = config.policy
    budget = policy.max_preemptions_per_hour - snapshot.preemptions_last_hour - spent
    leased = held_nodes(snapshot.leases) | set(taken)
    pools = {n: p for n, p in config.pools.items() if p.lend_mode in LENDABLE}
    room = share_room(snapshot, config, freed=freed, taken=taken)
    free: list[tuple[int, int, str, NodeView]] = []
    busy: list[tuple[int, float, str, NodeView, int]] = []
    for node in snapshot.nodes:
        pool = pools.get(node.pool)
        if pool is None or not node.usable or node.reserved or node.has_triton:
            continue
        if node.name in leased:
            continue
        have = node.free_of(gpu_type)
        if have >= gpus:
            free.append((pool.cost_rank, have, node.name, node))
        elif pool.lend_mode == "preempt" and budget > 0:
            chosen_jobs = partial_victims(typed_view(node, gpu_type), gpus, now, policy, budget)
            if chosen_jobs is not None and chosen_jobs.jobs:
                cost = (pool.cost_rank, chosen_jobs.lost, node.name)
                busy.append((*cost, node, len(chosen_jobs.jobs)))
    free.sort(key=lambda t: t[:3])
    busy.sort(key=lambda t: t[:3])
    ranked = [(node, gpus, 0) for *_, node in free] + [(t[3], gpus, t[4]) for t in busy]
    return [node for node, _ in take(ranked, count, budget, room)]


def typed_victims(
    node: NodeView, gpu_type: str, gpus: int, now: float, policy: PolicyConfig
) -> int:
    """Jobs a preempt-mode lend of `gpus` of `node`'s GPUs of `gpu_type` requeues (0 where
    they are free), as `choose_typed` counts them."""
    victims = partial_victims(typed_view(node, gpu_type), gpus, now, policy, len(node.jobs))
    return len(victims.jobs) if victims is not None else 0


def lends(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    group: Sequence[tuple[str, ...]],
    key: tuple[str, int],
    reason: Callable[[tuple[str, ...]], str],
    taken: set[str],
    freed: frozenset[int],
    spent: int,
) -> tuple[list[Lend], int]:
    """The lends of `group`, each of one replica's GPUs of one type (`key`: the type and
    the GPUs; MIG slices), on the nodes `choose_typed` gives, each node added to `taken`;
    and the jobs requeued so far of the hour's budget, theirs added to `spent`."""
    gpu_type, gpus = key
    found = choose_typed(
        snapshot,
        config,
        now,
        len(group),
        gpu_type=gpu_type,
        gpus=gpus,
        taken=taken,
        freed=freed,
        spent=spent,
    )
    lends: list[Lend] = []
    for node, models in zip(found, group, strict=False):
        mode = config.pools[node.pool].lend_mode
        lends.append(Lend(node.name, node.pool, mode, models, reason(models), gpus, (), gpu_type))
        taken.add(node.name)
        if mode == "preempt":
            spent += typed_victims(node, gpu_type, gpus, now, config.policy)
    return lends, spent
