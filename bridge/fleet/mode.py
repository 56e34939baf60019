"""What the fleet's mode in force (`bridge.leases.fleet`) makes a pass of the daemon do.
Pure: the reconciler reads the switch in force each pass and applies these.

- `holds`: in `separate` and `advisory` every lendable pool is held, as an operator's
  `stb drain POOL` holds one: the policy lends nothing there, the pass returns every
  lease gracefully (out of routing, drained, then given back), and an operator's lend
  is refused naming the mode. Nothing is written: switching back lifts them.
- `configured`: a gradual `shared` step's lend cap, never above the configuration's.
- `advice`: in `advisory`, the lends and returns the policy would make if shared, said."""

from __future__ import annotations

from collections.abc import Iterable

from bridge.config import BridgeConfig
from bridge.leases.fleet import FleetSwitch
from bridge.leases.requests import PoolHold
from bridge.policy.actions import Action, Lend, Return
from bridge.policy.nodes import LENDABLE


def fenced(switch: FleetSwitch | None) -> bool:
    """The mode in force lends nothing (`separate`, `advisory`); None: shared."""
    return switch is not None and switch.mode in ("separate", "advisory")


def holds(switch: FleetSwitch | None, config: BridgeConfig) -> dict[str, PoolHold]:
    """The holds the mode in force puts on every lendable pool (none in `shared`)."""
    if switch is None or not fenced(switch):
        return {}
    by = f"fleet mode {switch.mode}" + (f" ({switch.who})" if switch.who else "")
    return {
        name: PoolHold(pool=name, held_by=by, held_at=switch.at, reason=switch.why)
        for name, pool in config.pools.items()
        if pool.lend_mode in LENDABLE
    }


def configured(switch: FleetSwitch | None, config: BridgeConfig) -> BridgeConfig:
    """`config` with a gradual shared step's lend cap (the smaller of the two)."""
    if switch is None or switch.mode != "shared" or switch.max_lent_nodes is None:
        return config
    cap = min(switch.max_lent_nodes, config.policy.max_lent_nodes)
    policy = config.policy.model_copy(update={"max_lent_nodes": cap})
    return config.model_copy(update={"policy": policy})


def advice(actions: Iterable[Action]) -> list[str]:
    """The lends and returns of `actions` (the policy's decisions on the snapshot as if
    shared), each said as what the bridge would do."""
    out = []
    for action in actions:
        if isinstance(action, Lend):
            nodes = ",".join(action.nodes)
            gpus = "" if action.gpus is None else f" ({action.gpus} GPUs)"
            out.append(
                f"advisory: would lend {nodes}{gpus} for {','.join(action.models)}: {action.reason}"
            )
        elif isinstance(action, Return):
            out.append(f"advisory: would return lease {action.lease_id}: {action.reason}")
    return out
