"""What a lend takes on the simulated fleet (`Setup.granularity`), beside the policy.
Node-granular (`node`): whole nodes, every job on them requeued. GPU-granular (`gpu`):
the policy's partial lends (`[policy] partial_lends`: `bridge.policy.nodes.choose_nodes`
picks the node and `Lend.gpus`: m x k GPUs for m replicas' worth of a k-GPU replica,
`bridge.policy.capacity.plan_lends`), the replica on those GPUs of one node, the node's
other GPUs running elastic work on, only the jobs `bridge.policy.victims.choose_victims`
picks requeued when its Triton job starts (`bridge.sim.cluster`). A replica's GPUs are
its models' (`bridge.policy.gang.lend_gpus`); a model that says none takes whole nodes
in both modes, so a run without replica sizes is a node-granular run.

A replica larger than a node, which the bridge does not lend yet, is a gang of whole
nodes in both modes, placed here (`place_gang`, `bridge.policy.gang.plan_gangs`): all
its nodes or none, lent and returned together. And `stb simulate`'s options for these.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge.config import PolicyConfig
from bridge.policy.gang import plan_gangs
from bridge.policy.snapshot import NodeView
from bridge.policy.victims import guarded, work_lost

#: `Setup.granularity`'s values (`stb simulate --granularity`)
GRANULARITIES = ("node", "gpu")


def check_granularity(value: str) -> str:
    """`value` when it is one of GRANULARITIES; ValueError naming it otherwise."""
    if value not in GRANULARITIES:
        raise ValueError(f"granularity {value!r}: choose from {', '.join(GRANULARITIES)}")
    return value


@dataclass(frozen=True)
class Rules:
    """The policy's limits on requeueing, as `bridge.policy.nodes.choose_nodes` applies
    them to whole nodes: a job requeued within `guard_s` or `max_requeues` times is never
    requeued; one lend requeues at most `budget` jobs (what the hour's preemption budget
    leaves)."""

    guard_s: float
    max_requeues: int
    budget: int

    @classmethod
    def of(cls, policy: PolicyConfig, preemptions_last_hour: int) -> Rules:
        return cls(
            policy.preempt_guard_s,
            policy.max_requeues_per_job,
            max(0, policy.max_preemptions_per_hour - preemptions_last_hour),
        )


def kept(node: NodeView, now: float, rules: Rules) -> frozenset[str]:
    """The node's jobs `rules` keep from a requeue (`bridge.policy.victims.guarded`)."""
    return frozenset(
        j.job_id for j in node.jobs if guarded(j, now, rules.guard_s, rules.max_requeues)
    )


def place_gang(
    candidates: Sequence[NodeView],
    n: int,
    now: float,
    rules: Rules,
    *,
    preempt: bool,
    prefer: str = "",
) -> tuple[NodeView, ...] | None:
    """`n` whole nodes of `candidates` for a replica that spans nodes, or None (all or
    nothing): nodes no lease holds any GPU of, each with every job requeued (none kept by
    `rules`; a drain pool's: idle only), the idle first, then the least work lost, the
    policy's own node (`prefer`) first among equals; formed by
    `bridge.policy.gang.plan_gangs` (one pool and GPU count), the first gang whose jobs
    fit the preemption budget."""
    ranked: list[tuple[int, float, bool, str, NodeView]] = []
    for node in candidates:
        if node.triton_gpus:
            continue
        jobs = [j for j in node.jobs if j.started_at is not None]
        if jobs and (not preempt or kept(node, now, rules)):
            continue
        ranked.append((len(jobs), work_lost(node, now), node.name != prefer, node.name, node))
    ranked.sort(key=lambda t: t[:4])
    order = [t[4] for t in ranked]
    for gang in plan_gangs(order, n, len(order)):
        if sum(len(node.jobs) for node in gang) <= rules.budget:
            return gang
    return None


def parse_replica_gpus(text: str, models: Sequence[str]) -> dict[str, int]:
    """`stb simulate --replica-gpus`: per model, the GPUs one replica takes. Numbers
    alone go to the run's models in their order, cycled (`1,2,4,8,16`: m0 1, m1 2, ...,
    m5 1 again); `MODEL=N` names one (and wins over the numbers); "" none (whole nodes).
    ValueError naming a bad item."""
    cycle: list[int] = []
    named: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        model, sep, raw = item.rpartition("=")
        if not raw.strip().isdigit() or int(raw) < 1:
            raise ValueError(f"--replica-gpus: {raw!r} in {item!r} is not a whole number >= 1")
        if not sep:
            cycle.append(int(raw))
        elif model.strip() not in models:
            raise ValueError(f"--replica-gpus: no model {model.strip()!r} in this run")
        else:
            named[model.strip()] = int(raw)
    out = {m: cycle[i % len(cycle)] for i, m in enumerate(models)} if cycle else {}
    out.update(named)
    return out
