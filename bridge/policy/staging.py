"""Which model versions the lendable nodes' weight caches should hold: the wanted list
`bridge.policy.weights.plan_cache` places (issue 31). Pure; one rule for the daemon's
staging step (`bridge.daemon.staging`) and the simulator's (`bridge.sim.weights`).

A model is wanted for the lent replicas that would carry it at its peak rate (`peaks`:
per model its highest request rate over the last day, or what the caller keeps of it):
for a model with a request objective, `weights.expected_lends` (the nodes the capacity
model adds to the baseline replicas, as decide's capacity lend would); for an LLM with a
token objective and a profile, the replicas the token capacity model needs at that rate
(`bridge.policy.llm.needs`) beyond its baseline replicas. Each at its newest version with
that version's size (`versions`; a model without one is left out). A model with none is
not wanted: the plan evicts its copies first when room is needed. New copies go only
where `stages_on` says.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.config import BridgeConfig
from bridge.policy import llm
from bridge.policy.snapshot import NodeView, Snapshot
from bridge.policy.weights import Wanted, expected_lends


def wanted(
    snapshot: Snapshot,
    config: BridgeConfig,
    peaks: Mapping[str, float],
    versions: Mapping[str, tuple[str, int]],
) -> list[Wanted]:
    """The wanted versions (the module's rule), by model name; `versions`: per model, its
    newest version and that version's size in bytes."""
    replicas = expected_lends(snapshot, config, peaks)
    baseline: dict[str, int] = {}
    for r in snapshot.replicas:
        if r.lease_id is None:
            for m in r.models:
                baseline[m] = baseline.get(m, 0) + 1
    for m, n in llm.needs(snapshot, peaks).items():
        replicas[m] = max(replicas.get(m, 0), n - baseline.get(m, 0))
    out: list[Wanted] = []
    for m, n in sorted(replicas.items()):
        known = versions.get(m)
        if n > 0 and known is not None:
            out.append(Wanted(m, known[0], known[1], n))
    return out


def stages_on(config: BridgeConfig, snapshot: Snapshot, node: NodeView) -> bool:
    """Whether a new copy may be staged on `node`: one of a preempt-mode pool (a lend there
    requeues its work anyway, a staging job with it) that is not lent now (its Triton job
    holds it whole). Never a drain-mode (training) node, where a staging job running
    when a whole-node training job wants the node would delay it. The plan gives the
    other nodes a budget of 0: the copies they hold count, nothing new goes there and
    nothing is evicted."""
    pool = config.pools.get(node.pool)
    if pool is None or pool.lend_mode != "preempt":
        return False
    return all(node.name not in lease.nodes for lease in snapshot.leases)


__all__ = ["stages_on", "wanted"]
