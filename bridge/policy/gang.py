"""Replicas that span nodes (tensor or pipeline parallel across nodes): how many GPUs and
nodes one replica takes (`gpus_per_replica`, `nodes_per_replica`), which candidate nodes
form each replica's gang (`plan_gangs`), and the state of a gang's lease from its
members' (`gang_state`).

A gang is one Slurm job with `-N n`: all its nodes or none, one replica in routing, lent,
drained and returned together. Its nodes come from one pool and have the same GPU count:
a Slurm job runs in one partition (a pool is one partition), and a replica split evenly
over its nodes needs the same GPUs on each. That also keeps a gang from mixing a preempt
node, taken now at the cost of its elastic work, with a drain node it would wait hours
for. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from bridge.config import BridgeConfig, ModelConfig
from bridge.lifecycle import TRANSITIONS, LeaseState
from bridge.policy.actions import Lend
from bridge.policy.nodes import choose_nodes
from bridge.policy.snapshot import NodeView, Snapshot


def gpus_per_replica(
    *,
    instance_gpus: int | None = None,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
) -> int | None:
    """GPUs one replica of a model takes: the larger of the distinct GPUs its
    instance_group names (`instance_gpus`) and its parallel world (tensor x pipeline
    parallel size), for both are the one server's GPUs; None when none of them is said
    (instances on every GPU of the node, Triton's default: a replica takes whole nodes,
    as a lease does today). Not `ModelConfig.instances`, which counts executions
    (several may share a GPU, and CPU ones hold none). A model's: `replica_gpus`."""
    for name, value in (
        ("instance_gpus", instance_gpus),
        ("tensor_parallel", tensor_parallel),
        ("pipeline_parallel", pipeline_parallel),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if instance_gpus is None and tensor_parallel is None and pipeline_parallel is None:
        return None
    world = (tensor_parallel or 1) * (pipeline_parallel or 1)
    return max(instance_gpus or 1, world)


def replica_gpus(model: ModelConfig) -> int | None:
    """`gpus_per_replica` of a model's facts (`ModelConfig.instance_gpus`,
    `tensor_parallel`, `pipeline_parallel`: config.pbtxt or the TOML); None: whole nodes.
    A model of a `gpu_type` (a MIG slice) that says none of them takes 1 of its type."""
    k = gpus_per_replica(
        instance_gpus=model.instance_gpus,
        tensor_parallel=model.tensor_parallel,
        pipeline_parallel=model.pipeline_parallel,
    )
    return 1 if k is None and model.gpu_type is not None else k


def lend_gpus(models: Mapping[str, ModelConfig], names: Sequence[str]) -> int | None:
    """GPUs one replica of the models `names` (one lend's) takes together: the largest of
    their `replica_gpus`, for they share the one server; None (whole nodes) when any of
    them does not say its GPUs, or is not among `models`."""
    sizes = [replica_gpus(models[m]) if m in models else None for m in names]
    if not sizes or any(s is None for s in sizes):
        return None
    return max(s for s in sizes if s is not None)


def nodes_per_replica(gpus: int | None, node_gpus: int) -> int:
    """Nodes of `node_gpus` GPUs one replica of `gpus` GPUs spans: 1 when it fits on one
    (None: a whole node), else enough whole nodes for its GPUs."""
    if node_gpus < 1:
        raise ValueError(f"a node lent to a replica has GPUs, got {node_gpus}")
    return 1 if gpus is None else max(1, math.ceil(gpus / node_gpus))


def plan_gangs(
    candidates: Sequence[NodeView], nodes_per_replica: int, replicas: int
) -> list[tuple[NodeView, ...]]:
    """Up to `replicas` gangs of exactly `nodes_per_replica` nodes from `candidates`
    (ordered cheapest first, as `bridge.policy.nodes.choose_nodes` returns them): each
    gang the first `nodes_per_replica` candidates, in their order, of one pool and GPU
    count; the gangs in the order they fill, so the first is the one whose dearest node
    comes earliest. Nodes left over in a group too small for a gang are not taken (all or
    nothing). `nodes_per_replica` 1 gives each candidate alone, in its order."""
    if nodes_per_replica < 1:
        raise ValueError(f"a gang has at least one node, got {nodes_per_replica}")
    gangs: list[tuple[NodeView, ...]] = []
    filling: dict[tuple[str, int], list[NodeView]] = {}
    for node in candidates:
        if len(gangs) >= replicas:
            break
        group = filling.setdefault((node.pool, node.gpus), [])
        group.append(node)
        if len(group) == nodes_per_replica:
            gangs.append(tuple(group))
            group.clear()
    return gangs


def spans(snapshot_nodes: Iterable[NodeView], pools: Collection[str], gpus: int | None) -> bool:
    """Whether a replica of `gpus` GPUs spans nodes: it fits on no node of `pools` (the
    lendable ones) whole. None (whole nodes) never does."""
    if gpus is None:
        return False
    largest = max((n.gpus for n in snapshot_nodes if n.pool in pools), default=0)
    return largest > 0 and gpus > largest


def plan_sized_gangs(
    candidates: Sequence[NodeView], gpus: int, replicas: int
) -> list[tuple[NodeView, ...]]:
    """`plan_gangs` for replicas of `gpus` GPUs on nodes that may differ in GPUs: each
    gang of one pool and GPU count, as many nodes as `nodes_per_replica` says for that
    count (two 8-GPU nodes, or four 4-GPU ones, for 16 GPUs); the gangs in the order they
    fill, up to `replicas`. Nodes without GPUs are left out."""
    gangs: list[tuple[NodeView, ...]] = []
    filling: dict[tuple[str, int], list[NodeView]] = {}
    for node in candidates:
        if len(gangs) >= replicas:
            break
        if node.gpus < 1:
            continue
        group = filling.setdefault((node.pool, node.gpus), [])
        group.append(node)
        if len(group) == nodes_per_replica(gpus, node.gpus):
            gangs.append(tuple(group))
            group.clear()
    return gangs


def gang_lends(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    gpus: int,
    group: Sequence[tuple[str, ...]],
    why: Callable[[Sequence[str]], str],
    taken: set[str],
    freed: frozenset[int],
    spent: int,
) -> list[Lend]:
    """The lends of `group`, whose replicas take `gpus` GPUs, more than a node has: each
    a gang of whole nodes (`bridge.policy.gang.plan_sized_gangs`: one pool and GPU count,
    all or nothing) from the cheapest nodes (`choose_nodes`, whole nodes), its server on
    the gang's first node in the snapshot's order (Slurm's: the job's batch host), within
    `max_lent_nodes` (a gang counts its nodes); `why` gives a lend's reason for its
    models. Called by `bridge.policy.decide`."""
    policy = config.policy
    # (nodes, not leases: a gang holds several)
    lent = sum(len(lease.nodes) for lease in snapshot.leases if lease.lease_id not in freed)
    room = max(0, policy.max_lent_nodes - lent - len(taken))
    # every node there is room for: the gangs form within a pool and GPU count, which
    # the cheapest few alone may not fill
    candidates = choose_nodes(
        snapshot,
        config,
        now,
        room,
        freed=freed,
        models=list(dict.fromkeys(m for models in group for m in models)),
        taken=frozenset(taken),
        spent=spent,
    )
    order = {node.name: i for i, node in enumerate(snapshot.nodes)}
    lends: list[Lend] = []
    for gang, models in zip(plan_sized_gangs(candidates, gpus, len(group)), group, strict=False):
        if sum(len(lend.nodes) for lend in lends) + len(gang) > room:
            break
        first, *others = sorted(gang, key=lambda n: order[n.name])
        mode = config.pools[first.pool].lend_mode
        reason = f"{why(models)}; one replica of {gpus} GPUs on {len(gang)} nodes"
        members = tuple(n.name for n in others)
        lends.append(Lend(first.name, first.pool, mode, models, reason, None, members))
    return lends


def _steps() -> dict[LeaseState, int]:
    """Each state's step on the lease's forward path, from the transition table: the
    longest chain of moves from `requested` (0) to it, `failed` left out (`returned` 6)."""
    ahead: dict[LeaseState, int] = {s: 0 for s in LeaseState if s != LeaseState.FAILED}
    for _ in ahead:  # the table without `failed` is acyclic: len(ahead) rounds settle it
        for old, news in TRANSITIONS.items():
            if old in ahead:
                for new in news - {LeaseState.FAILED}:
                    ahead[new] = max(ahead[new], ahead[old] + 1)
    return ahead


_STEP = _steps()


def gang_state(member_states: Iterable[LeaseState]) -> LeaseState:
    """The state of a gang's lease from its members': `failed` when any member failed
    (a node of the replica failing fails the replica); otherwise the furthest step every
    member has reached (the least advanced), so the gang serves only once all serve and
    is returned only once all are."""
    states = [LeaseState(s) for s in member_states]
    if not states:
        raise ValueError("a gang has at least one member")
    if LeaseState.FAILED in states:
        return LeaseState.FAILED
    return min(states, key=_STEP.__getitem__)
