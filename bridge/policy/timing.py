"""The lend's lead time: how long a lend takes to serve, from Slurm, Triton's start and the
slowest model's load. Pure. The forecast looks this far ahead (`bridge.policy.decide`) and
a return's break-even counts it (`bridge.policy.returns`); the simulator's quiet proof
reads the same function (`bridge.sim.quiet`).

Per pool, what the snapshot carries (`Snapshot.lend_s`, `Snapshot.lend_load_s`): the
measured seconds from a lend to its replica serving, and the slowest known load of the
models those measured lends carried (so the start overhead and the load it held are
known apart). Per model, its measured load time by source (a placement's `load_model`, a
lend's start: `bridge.daemon.loadtimes`): from the shared model repository
(`Snapshot.load_s`) and from a node's local weight cache (`Snapshot.local_load_s`, issue
31); per node, the models whose weights its cache holds (`NodeView.cached`).

The lead of a lend from pool p of models M on node n:

    lead = L_p + max(0, slowest_n(M) - min(L_p, max(lend_lead_load_s, C_p)))

`L_p` the pool's measured lend time (else `lend_lead_s`), `C_p` the load its measured
lends held (0 unmeasured), `slowest_n(M)` the longest load of M on n: each model at its
local load time where n's cache holds it and that time is known, else at its shared one
(0 for models never measured: an unknown model falls back to the pool's figure). A lend
holds no more load than its own seconds, so the lead is never shorter than the slowest
load. A site with fast loads (under `lend_lead_load_s`, the lab's) keeps `L_p`; a model
that loads in 300 s makes it about 300 s, and a lend of it measured at 306 s (which holds
its load) stays 306 s; the same lend on a node holding its weights, loading in 10 s,
keeps `L_p`.

The lead the policy plans with (`lead_s`, one horizon for every model's forecast, M the
models it scales): the fastest lendable pool's, each pool's on the node a lend from it
would take first (`bridge.policy.nodes.choose_nodes`' order: an idle candidate if the
pool has one, else a busy one if the pool preempts, its preemption guards, which read
the clock, left out; among them the one whose `slowest_n(M)` is least). A pool with no
such node, and every pool when no node holds weights or no local load time is known,
counts `slowest(M)` at the shared load times.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from bridge.config import BridgeConfig
from bridge.policy.nodes import LENDABLE
from bridge.policy.snapshot import NodeView, Snapshot, held_nodes


def slowest_load(load_s: Mapping[str, float], models: Iterable[str]) -> float:
    """The longest known load of `models` (0 when none is known)."""
    return max((load_s.get(m, 0.0) for m in models), default=0.0) if load_s else 0.0


def pool_lead_s(
    config: BridgeConfig,
    pool: str,
    lend_s: Mapping[str, float],
    lend_load_s: Mapping[str, float],
    slowest: float,
) -> float:
    """Seconds a lend from `pool` of models whose slowest load is `slowest` takes to
    serve (the module docstring's rule)."""
    policy = config.policy
    measured = lend_s.get(pool)
    base = policy.lend_lead_s if measured is None else measured
    held = max(policy.lend_lead_load_s, lend_load_s.get(pool, 0.0) if measured is not None else 0.0)
    # (a lend holds no more load than its own seconds: it never serves before its load)
    return base + max(0.0, slowest - min(base, held))


def lead_time(
    config: BridgeConfig,
    lend_s: Mapping[str, float],
    lend_load_s: Mapping[str, float],
    slowest: float,
    by_pool: Mapping[str, float] | None = None,
) -> float:
    """The fastest lendable pool's lead (the cheapest-first choice takes idle nodes
    first) for models whose slowest load is `slowest` (`by_pool`: a pool's own, on the
    node a lend from it would take: `pool_slowest`); `lend_lead_s` + the load beyond
    `lend_lead_load_s` without a lendable pool."""
    at = by_pool or {}
    leads = [
        pool_lead_s(config, name, lend_s, lend_load_s, at.get(name, slowest))
        for name, pool in config.pools.items()
        if pool.lend_mode in LENDABLE
    ]
    if leads:
        return min(leads)
    policy = config.policy
    return policy.lend_lead_s + max(0.0, slowest - policy.lend_lead_load_s)


def pool_slowest(
    config: BridgeConfig,
    nodes: Sequence[NodeView],
    leased: Collection[str],
    models: Iterable[str],
    load_s: Mapping[str, float],
    local_load_s: Mapping[str, float],
) -> dict[str, float] | None:
    """Per lendable pool with a candidate node, `slowest_n(models)` on the node a lend
    from it would take first (the module docstring's rule; `leased`: the nodes with an
    open lease). None when no node holds weights or no local load time is known: every
    pool then loads from the shared repository (`slowest_load`)."""
    if not local_load_s or not any(n.cached for n in nodes):
        return None
    modes = {name: pool.lend_mode for name, pool in config.pools.items()}
    # the models by shared load, slowest first: a node's slowest is the first one its
    # cache does not serve locally, or a local load (its cache holds few models)
    order = sorted(((load_s.get(m, 0.0), m) for m in models), reverse=True)
    wanted = {m for _, m in order}
    idle: dict[str, float] = {}
    busy: dict[str, float] = {}
    for node in nodes:
        mode = modes.get(node.pool)
        if mode not in LENDABLE or not node.usable or node.reserved or node.has_triton:
            continue
        if node.name in leased or (node.jobs and mode != "preempt"):
            continue
        cached = node.cached
        slowest = 0.0
        for shared, m in order:
            if m not in cached or m not in local_load_s:
                slowest = shared
                break
        for m in cached:
            if m in wanted and m in local_load_s and local_load_s[m] > slowest:
                slowest = local_load_s[m]
        best = busy if node.jobs else idle
        if slowest < best.get(node.pool, float("inf")):
            best[node.pool] = slowest
    return {**busy, **idle}  # (a pool with an idle candidate lends that first)


def lead_s(snapshot: Snapshot, config: BridgeConfig) -> float:
    """Seconds a lend takes to serve, for the slowest-loading model the policy scales
    (one horizon for every model's forecast, as one lend may carry any of them), on the
    node each pool would lend first (the module docstring's rule)."""
    leased = held_nodes(snapshot.leases) if snapshot.local_load_s else ()
    return lead_time(
        config,
        snapshot.lend_s,
        snapshot.lend_load_s,
        slowest_load(snapshot.load_s, snapshot.models),
        pool_slowest(
            config,
            snapshot.nodes,
            leased,
            snapshot.models,
            snapshot.load_s,
            snapshot.local_load_s,
        ),
    )


__all__ = ["lead_s", "lead_time", "pool_lead_s", "pool_slowest", "slowest_load"]
