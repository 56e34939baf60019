"""An operator's asks of the daemon, each written with its audit entry in one transaction:
a lend, return or placement queued (`RequestQueue`), a pool held or its hold lifted, the
fleet's mode switched (`FleetStore`). `stb lend|return|place|drain|resume|fleet mode`
(`bridge.ops.cli`, `bridge.fleet.cli`) and the HTTP API's POSTs (`bridge.http.routes`)
ask through these, so all word the trail alike and none can write an ask the trail does
not hold (`bridge.audit.check` finds one that was).

`trail` is who asks (`Trail.as_` an API caller); None: this command's user, on the
queue's database, unfenced (an operator's ask is no leader's write).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bridge.audit.trail import Trail, operator
from bridge.db import Transactions
from bridge.leases.audit import AuditStore
from bridge.leases.fleet import FleetStore, FleetSwitch
from bridge.leases.requests import OperatorRequest, PoolHold, RequestQueue


def trail_of(store: Transactions) -> Trail:
    """The trail of `store`'s database as this command's user writes it."""
    return Trail(AuditStore.beside(store, fenced=False), operator())


def models_text(models: Sequence[str]) -> str:
    """A lend's or placement's models as the trail says them."""
    return f"models {','.join(models)}" if models else "every model"


def _who(trail: Trail | None, store: Transactions, who: str | None) -> tuple[Trail, str]:
    t = trail or trail_of(store)
    return t, who if who is not None else (t.actor.token or t.actor.unix_user or t.actor.name)


def ask_lend(
    queue: RequestQueue,
    node: str,
    models: Sequence[str],
    *,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> OperatorRequest:
    """Queue a lend of `node` for `models` (none: every model), recorded as lend.request."""
    t, by = _who(trail, queue, who)
    audit = t.within("lend.request", f"node {node}", models_text(models))
    return queue.request_lend(node, list(models), now or datetime.now(UTC), by, audit)


def ask_return(
    queue: RequestQueue,
    lease: int,
    *,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> OperatorRequest:
    """Queue a return of lease `lease`, recorded as return.request."""
    t, by = _who(trail, queue, who)
    audit = t.within("return.request", f"lease {lease}")
    return queue.request_return(lease, now or datetime.now(UTC), by, audit)


def ask_place(
    queue: RequestQueue,
    lease: int,
    models: Sequence[str],
    *,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> OperatorRequest:
    """Queue a placement of `models` on serving lease `lease`, recorded as place.request."""
    t, by = _who(trail, queue, who)
    audit = t.within("place.request", f"lease {lease}", models_text(models))
    return queue.request_place(lease, list(models), now or datetime.now(UTC), by, audit)


def hold_pool(
    queue: RequestQueue,
    pool: str,
    reason: str = "",
    *,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> PoolHold:
    """Hold `pool` (the hold in force, if any), recorded as pool.drain."""
    t, by = _who(trail, queue, who)
    audit = t.within("pool.drain", f"pool {pool}")
    return queue.hold(pool, now or datetime.now(UTC), by, reason, audit)


def release_pool(
    queue: RequestQueue,
    pool: str,
    *,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> PoolHold | None:
    """Lift `pool`'s hold, recorded as pool.resume; None (recorded as refused) when it
    was not held."""
    t, by = _who(trail, queue, who)
    hold = queue.release(
        pool, now or datetime.now(UTC), by, t.within("pool.resume", f"pool {pool}")
    )
    if hold is None:
        t.record("pool.resume", f"pool {pool}", "refused", "not held")
    return hold


def switch_fleet(
    fleet: FleetStore,
    mode: str,
    *,
    max_lent_nodes: int | None = None,
    why: str = "",
    baseline: dict[str, Any] | None = None,
    trail: Trail | None = None,
    now: datetime | None = None,
    who: str | None = None,
) -> FleetSwitch:
    """Switch the fleet to `mode` (FleetError, nothing written, for a bad switch),
    recorded as fleet.mode: the mode, its lend cap and why."""
    t, by = _who(trail, fleet, who)
    cap = "" if max_lent_nodes is None else f", at most {max_lent_nodes} nodes lent"
    said = f"{mode}{cap}" + (f": {why}" if why else "")
    return fleet.switch(
        mode,
        now or datetime.now(UTC),
        max_lent_nodes=max_lent_nodes,
        who=by,
        why=why,
        baseline=baseline,
        audit=t.within("fleet.mode", "fleet", said),
    )


__all__ = [
    "ask_lend",
    "ask_place",
    "ask_return",
    "hold_pool",
    "models_text",
    "release_pool",
    "switch_fleet",
    "trail_of",
]
