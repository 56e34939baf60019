"""Which model weights the node-local caches of the lendable nodes should hold: the cache
plan (issue 31's first part: pure, not yet called by the daemon). Given each lendable
node's cache (its budget and the copies it holds), in the order `choose_nodes` would lend
the nodes (cheapest first), and the model versions the bridge expects to lend for with
how many lent replicas each is expected to need (`Wanted.replicas`: the forecast's), the
plan says which copies to stage and which to evict so that a lend finds its weights local.

The rule, greedy and deterministic:

- The first node in lend order is the most likely to be lent next, so it gets the most
  wanted weights first. Each wanted version is given to as many nodes as its `replicas`
  (one lent replica a node: the next `replicas` lends of it land on the first nodes
  holding it), taking the versions by `replicas` (most first), then by name.
- A node keeps a wanted copy it already holds (complete or still staging) and is given
  the next wanted versions that fit its budget once the copies nobody wants are evicted,
  least recently used first. A copy that is wanted, or still staging (its job holds
  its room until it ends), is never evicted for another; a
  version too large for a node's whole budget is not placed there.
- At most `max_staging` new copies per plan (staging is Slurm work throttled to a
  bandwidth: the rest wait for the next plan), the first nodes first.

Eviction frees only what a stage needs: a node keeps the unwanted copies it has room
for (a later forecast may want them again). Sizes are bytes; `last_used` epoch seconds.

A model lent by GPU type (MIG slices: `ModelConfig.gpu_type`, `bridge.policy.typed`) is
placed only on the nodes its typed lends could take (`lend_places`; the plan's `only`):
its weights are of no use on a node without its type.

The plan's inputs, pure too: `lend_places` (the nodes `choose_nodes` would take, in its
order, for the wanted models, then those only a typed lend of one of them would take
(`choose_typed`), then the nodes lent now: their copies count, and they come back; and
the typed models' places) and `expected_lends` (per model the lent replicas the capacity model would
add at the forecast's rates: `Wanted.replicas`). The simulator plans with them
(`bridge.sim.weights`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from bridge.config import BridgeConfig
from bridge.policy import capacity
from bridge.policy.hysteresis import service_s
from bridge.policy.nodes import choose_nodes
from bridge.policy.snapshot import NodeView, Snapshot, held_nodes
from bridge.policy.typed import choose_typed, lend_key

#: (model, version)
VersionKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class CachedCopy:
    """One version's weights in a node's cache. `complete`: staged and verified (a
    staging in flight is not complete but holds its room)."""

    model: str
    version: str
    size_bytes: int
    complete: bool = True
    last_used: float = 0.0

    @property
    def key(self) -> VersionKey:
        return (self.model, self.version)


@dataclass(frozen=True, slots=True)
class NodeCache:
    """A lendable node's cache: its size budget and the copies on it."""

    node: str
    budget_bytes: int
    copies: tuple[CachedCopy, ...] = ()

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"{self.node}: cache budget must be >= 0 bytes")


@dataclass(frozen=True, slots=True)
class Wanted:
    """A model version the bridge expects to lend for: its weights' size and the lent
    replicas it is expected to need (0: none; not placed)."""

    model: str
    version: str
    size_bytes: int
    replicas: int

    def __post_init__(self) -> None:
        if self.size_bytes < 0 or self.replicas < 0:
            raise ValueError(f"{self.model}/{self.version}: size and replicas must be >= 0")

    @property
    def key(self) -> VersionKey:
        return (self.model, self.version)


@dataclass(frozen=True, slots=True)
class Stage:
    node: str
    model: str
    version: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Evict:
    node: str
    model: str
    version: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CachePlan:
    """The plan: copies to stage and to evict (an eviction before the stage it frees room
    for), and per version the wanted replicas that no node holds after it (over the
    budgets, or waiting for a later plan past `max_staging`)."""

    stage: tuple[Stage, ...]
    evict: tuple[Evict, ...]
    unplaced: tuple[tuple[VersionKey, int], ...]


def plan_cache(
    nodes: Sequence[NodeCache],
    wanted: Sequence[Wanted],
    max_staging: int = 1,
    only: Mapping[str, Collection[str]] | None = None,
) -> CachePlan:
    """The cache plan for `nodes` in lend order (the module's rule); a model in `only` is
    placed on the nodes it names alone (`lend_places`), a copy it has elsewhere counting
    for none of its replicas."""
    only = only or {}
    if max_staging < 0:
        raise ValueError("max_staging must be >= 0")
    order = sorted((w for w in wanted if w.replicas > 0), key=lambda w: (-w.replicas, w.key))
    need = {w.key: w.replicas for w in order}
    wanted_keys = set(need)
    stages: list[Stage] = []
    evicts: list[Evict] = []
    # first, every copy already where it is wanted counts (in lend order), so a stage
    # elsewhere is not planned for a replica a node already holds
    held: dict[str, set[VersionKey]] = {}
    for cache in nodes:
        keep = held.setdefault(cache.node, set())
        for c in cache.copies:
            if c.key in wanted_keys and need[c.key] > 0 and c.key not in keep:
                if c.model in only and cache.node not in only[c.model]:
                    continue
                keep.add(c.key)
                need[c.key] -= 1
    for cache in nodes:
        keep = held[cache.node]
        used = sum(c.size_bytes for c in cache.copies)
        # copies nobody wants (or beyond what is needed), least recently used first
        spare = sorted(
            (c for c in cache.copies if c.key not in keep and c.complete),
            key=lambda c: (c.last_used, c.key),
        )
        for w in order:
            if need[w.key] <= 0 or w.key in keep or len(stages) >= max_staging:
                continue
            if w.model in only and cache.node not in only[w.model]:
                continue  # a node its typed lends never take
            if w.size_bytes > cache.budget_bytes - sum(
                c.size_bytes for c in cache.copies if c.key in keep or not c.complete
            ):
                continue  # would not fit even with every spare copy gone
            while used + w.size_bytes > cache.budget_bytes and spare:
                c = spare.pop(0)
                evicts.append(Evict(cache.node, c.model, c.version, c.size_bytes))
                used -= c.size_bytes
            stages.append(Stage(cache.node, w.model, w.version, w.size_bytes))
            used += w.size_bytes
            keep.add(w.key)
            need[w.key] -= 1
    unplaced = tuple((w.key, need[w.key]) for w in order if need[w.key] > 0)
    return CachePlan(tuple(stages), tuple(evicts), unplaced)


def expected_lends(
    snapshot: Snapshot, config: BridgeConfig, rates: Mapping[str, float]
) -> dict[str, int]:
    """Per model the policy scales, the lent replicas that would carry it at `rates` (req/s,
    the forecast's: a model not given, or without a measured compute time, is left out):
    the nodes `capacity.plan_nodes` adds to the baseline replicas (those of no lease) for
    `capacity_headroom` x the rate, up to `max_lent_nodes` and each model's
    `max_replicas`, as decide's capacity lend would. Models with none are left out."""
    policy = config.policy
    demand: dict[str, capacity.Demand] = {}
    for name, model in snapshot.models.items():
        rate = rates.get(name)
        svc = service_s(snapshot.history.get(name, ()))
        if rate is None or svc is None or not model.has_request_slo:
            continue
        demand[name] = capacity.Demand(
            rate * policy.capacity_headroom, svc, model.slo_p99_ms / 1000.0, model.instances
        )
    if not demand:
        return {}
    base: dict[tuple[tuple[str, ...], int], int] = {}
    for r in snapshot.replicas:
        if r.lease_id is None:
            key = (tuple(sorted(set(r.models))), r.gpus)
            base[key] = base.get(key, 0) + 1
    groups = [capacity.Group(models, n, gpus) for (models, gpus), n in base.items()]
    gpus = max((r.gpus for r in snapshot.replicas), default=1)

    def room(m: str, n: int) -> bool:
        return n < snapshot.models[m].max_replicas

    nodes = capacity.plan_nodes(
        groups, demand, [gpus] * policy.max_lent_nodes, room, policy.service_cv2
    )
    out: dict[str, int] = {}
    for models in nodes:
        for m in models:
            out[m] = out.get(m, 0) + 1
    return out


def lend_places(
    snapshot: Snapshot, config: BridgeConfig, now: float, models: Collection[str]
) -> tuple[list[NodeView], dict[str, frozenset[str]]]:
    """The plan's `nodes` and its `only`, from one node choice per lend kind.

    The nodes: the lendable nodes in the order lends of `models` would take them
    (`choose_nodes`, which prefers the nodes holding their weights, so a staged node stays
    first), then those only a typed lend of one of them would take (`choose_typed`: a
    training node's free slices, say), then the nodes lent now (by name).
    The places: per model of `models` lent by GPU type, the nodes its typed lends could
    take and those lent now for its type; models lent any GPU are left out (any node
    serves them)."""
    count = sum(1 for n in snapshot.nodes if n.pool in config.pools)
    order = choose_nodes(snapshot, config, now, count, models=models)
    seen = {n.name for n in order}
    only: dict[str, frozenset[str]] = {}
    for (gpu_type, _), (names, nodes) in _typed_orders(
        snapshot, config, now, models, count
    ).items():
        order += [n for n in nodes if n.name not in seen]
        seen |= {n.name for n in nodes}
        lent_for = {lease.node for lease in snapshot.leases if lease.gpu_type == gpu_type}
        for m in names:
            only[m] = frozenset(n.name for n in nodes) | lent_for
    leased = held_nodes(snapshot.leases)
    lent = sorted((n for n in snapshot.nodes if n.name in leased), key=lambda n: n.name)
    return order + [n for n in lent if n.name not in seen], only


def _typed_orders(
    snapshot: Snapshot, config: BridgeConfig, now: float, models: Collection[str], count: int
) -> dict[tuple[str, int], tuple[list[str], list[NodeView]]]:
    """Per typed lend key of `models` (`lend_key`: the type and a replica's GPUs of it),
    the models of that key and the nodes `choose_typed` gives a lend of it, in its order."""
    keys: dict[tuple[str, int], list[str]] = {}
    for m in dict.fromkeys(models):
        key = lend_key(snapshot.models, [m])
        if key is not None:
            keys.setdefault(key, []).append(m)
    return {
        key: (names, choose_typed(snapshot, config, now, count, gpu_type=key[0], gpus=key[1]))
        for key, names in keys.items()
    }
