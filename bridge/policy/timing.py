"""The lend's lead time: how long a lend takes to serve, from Slurm, Triton's start and the
slowest model's load. Pure. The forecast looks this far ahead (`bridge.policy.decide`) and
a return's break-even counts it (`bridge.policy.returns`); the simulator's quiet proof
reads the same function (`bridge.sim.quiet`).

Per pool, what the snapshot carries (`Snapshot.lend_s`, `Snapshot.lend_load_s`): the
measured seconds from a lend to its replica serving, and the slowest known load of the
models those measured lends carried (so the start overhead and the load it held are
known apart). Per model (`Snapshot.load_s`): its measured load time (a placement's
`load_model`, a lend's start: `bridge.daemon.loadtimes`).

The lead of a lend from pool p of models M:

    lead = L_p + max(0, slowest(M) - min(L_p, max(lend_lead_load_s, C_p)))

`L_p` the pool's measured lend time (else `lend_lead_s`), `C_p` the load its measured
lends held (0 unmeasured), `slowest(M)` the longest known load of M (0 for models never
measured: an unknown model falls back to the pool's figure). A lend holds no more load
than its own seconds, so the lead is never shorter than the slowest load. A site with
fast loads (under `lend_lead_load_s`, the lab's) keeps `L_p`; a model that loads in 300 s
makes it about 300 s, and a lend of it measured at 306 s (which holds its load) stays
306 s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from bridge.config import BridgeConfig
from bridge.policy.nodes import LENDABLE
from bridge.policy.snapshot import Snapshot


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
) -> float:
    """The fastest lendable pool's lead (the cheapest-first choice takes idle nodes
    first) for models whose slowest load is `slowest`; `lend_lead_s` + the load beyond
    `lend_lead_load_s` without a lendable pool."""
    leads = [
        pool_lead_s(config, name, lend_s, lend_load_s, slowest)
        for name, pool in config.pools.items()
        if pool.lend_mode in LENDABLE
    ]
    if leads:
        return min(leads)
    policy = config.policy
    return policy.lend_lead_s + max(0.0, slowest - policy.lend_lead_load_s)


def lead_s(snapshot: Snapshot, config: BridgeConfig) -> float:
    """Seconds a lend takes to serve, for the slowest-loading model the policy scales
    (one horizon for every model's forecast, as one lend may carry any of them)."""
    return lead_time(
        config,
        snapshot.lend_s,
        snapshot.lend_load_s,
        slowest_load(snapshot.load_s, snapshot.models),
    )


__all__ = ["lead_s", "lead_time", "pool_lead_s", "slowest_load"]
