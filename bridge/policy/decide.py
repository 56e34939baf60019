"""decide(snapshot, config, now) -> actions: when to lend a node, which node, when to give
one back. Pure: the same inputs give the same actions, so tests move the clock instead of
sleeping and the simulator can drive it.

Rules, in order, each tick:
1. Every usable reserved node without a Triton job gets its baseline server back (it holds
   every model's minimum replicas).
2. A drain-mode lend still waiting for its training node after `drain_wait_s` is
   abandoned (returned): a training job is never killed, the wait is bounded.
3. Scale in (at most one return per tick): the longest-serving lease whose models have all
   been calm for `calm_evaluations` ticks, once it has served `scale_in_cooldown_s`.
4. Scale out (at most one lend per tick, none in the tick of a scale-in): models that
   breached for `breach_evaluations` consecutive ticks, below `max_replicas` (lends in
   flight count), past their `scale_out_cooldown_s`, while fewer than `max_lent_nodes`
   leases are open. The node is the cheapest: idle before busy, lower `cost_rank` first
   (elastic before training), then the least work lost (GPU-seconds of the jobs a
   preemption would requeue), never a node with a job requeued within `preempt_guard_s`.
   All such models go on that one node.

Hysteresis: breach above high_watermark x SLO (with the tick's mean latency above the low
watermark: Triton's p99 window lags a minute behind), calm below low_watermark x SLO with
nothing pending; between the two nothing happens. A tick without data is neither breach nor calm,
so missing metrics never cause a lend or a return.
"""

from __future__ import annotations

import math
from collections import Counter
from enum import StrEnum

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.lifecycle import IN_FLIGHT, LeaseState
from bridge.policy.actions import Action, Lend, Return, StartBaseline
from bridge.policy.snapshot import ModelSample, NodeView, Snapshot

LENDABLE = ("preempt", "drain")
#: a drain lend still waiting for its node: decided, or its Triton job pending
WAITING = frozenset({LeaseState.REQUESTED, LeaseState.SUBMITTED})


class ModelStatus(StrEnum):
    BREACH = "breach"
    CALM = "calm"
    STEADY = "steady"


def evaluate_model(
    history: tuple[ModelSample, ...], model: ModelConfig, policy: PolicyConfig
) -> ModelStatus:
    """Sustained breach, sustained calm, or neither, from the recent samples."""
    high = policy.high_watermark * model.slo_p99_ms
    low = policy.low_watermark * model.slo_p99_ms
    # Both need the latest sample to qualify: most ticks end here (5,000 models: a third
    # of a quiet tick's time at fleet scale went into the two full checks below).
    last = history[-1] if history else None
    if last is None or not (
        (last.p99_ms is not None and last.p99_ms > high)
        or (last.request_rate is not None and (last.p99_ms is None or last.p99_ms < low))
    ):
        return ModelStatus.STEADY
    recent = history[-policy.breach_evaluations :]
    # Triton's p99 covers its last 60 s, so it lags: after a burst it stays high for a
    # minute. A breach counts only while the tick's own mean latency confirms that
    # requests are slow now (above the low watermark).
    if len(recent) == policy.breach_evaluations and all(
        s.p99_ms is not None and s.p99_ms > high and s.mean_ms is not None and s.mean_ms > low
        for s in recent
    ):
        return ModelStatus.BREACH
    recent = history[-policy.calm_evaluations :]
    if len(recent) == policy.calm_evaluations and all(
        s.request_rate is not None and (s.p99_ms is None or s.p99_ms < low) and not s.pending
        for s in recent
    ):
        return ModelStatus.CALM
    return ModelStatus.STEADY


def _severity(history: tuple[ModelSample, ...], model: ModelConfig) -> float:
    p99 = history[-1].p99_ms if history else None
    return (p99 or 0.0) / model.slo_p99_ms


def _replica_counts(snapshot: Snapshot) -> tuple[Counter[str], Counter[str]]:
    """Per model: the ready replicas that hold it, and the lends in flight that carry it
    (each replica or lease counted once, however often it names the model). One pass over
    the replicas and leases, whatever the number of models asked about."""
    ready: Counter[str] = Counter()
    for replica in snapshot.replicas:
        ready.update(set(replica.models))
    in_flight: Counter[str] = Counter()
    for lease in snapshot.leases:
        if lease.state in IN_FLIGHT:
            in_flight.update(set(lease.models))
    return ready, in_flight


def _recently_requeued(node: NodeView, now: float, guard_s: float) -> bool:
    return any(
        j.restarts > 0 and j.submitted_at is not None and now - j.submitted_at < guard_s
        for j in node.jobs
    )


def _work_lost(node: NodeView, now: float) -> float:
    return sum(j.gpus * max(0.0, now - j.started_at) for j in node.jobs if j.started_at is not None)


def choose_node(snapshot: Snapshot, config: BridgeConfig, now: float) -> NodeView | None:
    """The cheapest node to lend, or None (the first of equal cost, as min() would).

    A running minimum rather than a list of every candidate: at fleet size that list held
    thousands of tuples alive at once, which set off full garbage collections of the whole
    snapshot (tens of ms each) every few lending ticks."""
    leased = {lease.node for lease in snapshot.leases}
    best: tuple[tuple[int, int, float, str], NodeView] | None = None
    for node in snapshot.nodes:
        pool = config.pools.get(node.pool)
        if pool is None or pool.lend_mode not in LENDABLE:
            continue
        if not node.usable or node.has_triton or node.name in leased:
            continue
        busy = 1 if node.jobs else 0
        if best is not None and (busy, pool.cost_rank) > best[0][:2]:
            continue  # cannot beat the best whatever its jobs: skip the per-job sums
        if pool.lend_mode == "preempt" and _recently_requeued(
            node, now, config.policy.preempt_guard_s
        ):
            continue
        lost = _work_lost(node, now) if pool.lend_mode == "preempt" else 0.0
        cost = (busy, pool.cost_rank, lost, node.name)
        if best is None or cost < best[0]:
            best = (cost, node)
    return best[1] if best is not None else None


def decide(snapshot: Snapshot, config: BridgeConfig, now: float) -> list[Action]:
    policy = config.policy
    actions: list[Action] = []

    for node in snapshot.nodes:
        pool = config.pools.get(node.pool)
        if (
            pool is not None
            and pool.lend_mode == "reserved"
            and node.usable
            and not node.has_triton
        ):
            actions.append(StartBaseline(node.name, "no Triton job on reserved node"))

    for lease in snapshot.leases:
        if (
            lease.lend_mode == "drain"
            and lease.state in WAITING
            and now - lease.created_at > policy.drain_wait_s
        ):
            actions.append(Return(lease.lease_id, f"drain wait over {policy.drain_wait_s:g}s"))

    status = {
        name: evaluate_model(snapshot.history.get(name, ()), model, policy)
        for name, model in config.models.items()
    }

    abandoned = {a.lease_id for a in actions if isinstance(a, Return)}
    serving = sorted(
        (
            lease
            for lease in snapshot.leases
            if lease.state == LeaseState.SERVING
            and lease.lease_id not in abandoned
            and lease.serving_since is not None
        ),
        key=lambda lease: (lease.serving_since or 0.0, lease.lease_id),
    )
    for lease in serving:
        if now - (lease.serving_since or now) < policy.scale_in_cooldown_s:
            continue
        if lease.models and all(status.get(m) == ModelStatus.CALM for m in lease.models):
            actions.append(Return(lease.lease_id, "models calm: " + ",".join(lease.models)))
            return actions  # one change per tick

    breach = [name for name, st in status.items() if st == ModelStatus.BREACH]
    # Counted once per tick (not per breaching model), and only in a tick that needs them.
    ready, in_flight = _replica_counts(snapshot) if breach else (Counter(), Counter())
    breaching = [
        name
        for name in breach
        if ready[name] + in_flight[name] < config.models[name].max_replicas
        and now - snapshot.last_lend_at.get(name, -math.inf) >= policy.scale_out_cooldown_s
        and not in_flight[name]
    ]
    open_leases = sum(1 for lease in snapshot.leases if lease.lease_id not in abandoned)
    if breaching and open_leases < policy.max_lent_nodes:
        target = choose_node(snapshot, config, now)
        if target is not None:
            breaching.sort(key=lambda m: -_severity(snapshot.history.get(m, ()), config.models[m]))
            pool = config.pools[target.pool]
            worst = snapshot.history[breaching[0]][-1].p99_ms or 0.0
            actions.append(
                Lend(
                    target.name,
                    target.pool,
                    pool.lend_mode,
                    tuple(breaching),
                    f"p99 {worst:.0f} ms over SLO {config.models[breaching[0]].slo_p99_ms:g} ms "
                    f"for {policy.breach_evaluations} ticks",
                )
            )
    return actions
