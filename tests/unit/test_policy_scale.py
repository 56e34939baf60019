"""The policy's decide, which counts replicas and lends in flight once per tick and keeps a
running minimum of the lendable nodes, so that a fleet-sized snapshot costs linear time and
little garbage, against a straightforward reference kept here (the policy as first written:
a scan of every replica and lease for each breaching model, a list of every candidate node).
On random small snapshots the two must return exactly the same actions, in the same order,
with the same reasons. `--hypothesis-show-statistics` shows which actions the examples
reached."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy import (
    Action,
    JobView,
    LeaseView,
    Lend,
    ModelSample,
    ModelStatus,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
    StartBaseline,
    decide,
)

T0 = 1_800_000_000.0

# --- the reference: the original decide, straightforward and quadratic -----------------

LENDABLE = ("preempt", "drain")
IN_FLIGHT = ("requested", "submitted", "starting")


def ref_evaluate(
    history: tuple[ModelSample, ...], model: ModelConfig, policy: PolicyConfig
) -> ModelStatus:
    high = policy.high_watermark * model.slo_p99_ms
    low = policy.low_watermark * model.slo_p99_ms
    recent = history[-policy.breach_evaluations :]
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


def ref_severity(history: tuple[ModelSample, ...], model: ModelConfig) -> float:
    p99 = history[-1].p99_ms if history else None
    return (p99 or 0.0) / model.slo_p99_ms


def ref_replicas(snapshot: Snapshot, model: str) -> int:
    ready = sum(1 for r in snapshot.replicas if model in r.models)
    in_flight = sum(
        1 for lease in snapshot.leases if lease.state in IN_FLIGHT and model in lease.models
    )
    return ready + in_flight


def ref_recently_requeued(node: NodeView, now: float, guard_s: float) -> bool:
    return any(
        j.restarts > 0 and j.submitted_at is not None and now - j.submitted_at < guard_s
        for j in node.jobs
    )


def ref_work_lost(node: NodeView, now: float) -> float:
    return sum(j.gpus * max(0.0, now - j.started_at) for j in node.jobs if j.started_at is not None)


def ref_choose_node(snapshot: Snapshot, config: BridgeConfig, now: float) -> NodeView | None:
    leased = {lease.node for lease in snapshot.leases}
    candidates = []
    for node in snapshot.nodes:
        pool = config.pools.get(node.pool)
        if pool is None or pool.lend_mode not in LENDABLE:
            continue
        if not node.usable or node.has_triton or node.name in leased:
            continue
        if pool.lend_mode == "preempt" and ref_recently_requeued(
            node, now, config.policy.preempt_guard_s
        ):
            continue
        busy = 1 if node.jobs else 0
        lost = ref_work_lost(node, now) if pool.lend_mode == "preempt" else 0.0
        candidates.append(((busy, pool.cost_rank, lost, node.name), node))
    return min(candidates, key=lambda c: c[0])[1] if candidates else None


def ref_decide(snapshot: Snapshot, config: BridgeConfig, now: float) -> list[Action]:
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
            and lease.state in ("requested", "submitted")
            and now - lease.created_at > policy.drain_wait_s
        ):
            actions.append(Return(lease.lease_id, f"drain wait over {policy.drain_wait_s:g}s"))

    status = {
        name: ref_evaluate(snapshot.history.get(name, ()), model, policy)
        for name, model in config.models.items()
    }

    abandoned = {a.lease_id for a in actions if isinstance(a, Return)}
    serving = sorted(
        (
            lease
            for lease in snapshot.leases
            if lease.state == "serving"
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
            return actions

    breaching = [
        name
        for name, st in status.items()
        if st == ModelStatus.BREACH
        and ref_replicas(snapshot, name) < config.models[name].max_replicas
        and now - snapshot.last_lend_at.get(name, -math.inf) >= policy.scale_out_cooldown_s
        and not any(lease.state in IN_FLIGHT and name in lease.models for lease in snapshot.leases)
    ]
    open_leases = sum(1 for lease in snapshot.leases if lease.lease_id not in abandoned)
    if breaching and open_leases < policy.max_lent_nodes:
        target = ref_choose_node(snapshot, config, now)
        if target is not None:
            breaching.sort(
                key=lambda m: -ref_severity(snapshot.history.get(m, ()), config.models[m])
            )
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


# --- random small worlds ------------------------------------------------------------------

MODELS = ("a", "b", "c", "d")
#: a pool no configuration names ("gone") is never lent nor given a baseline
POOLS = ("training", "elastic", "inference", "gone")
STATES = ("requested", "submitted", "starting", "serving", "draining", "releasing", "failed")
#: ages in seconds, around the cooldowns, guards and waits the policies below use
AGES = st.sampled_from((0.0, 5.0, 30.0, 60.0, 100.0, 299.0, 300.0, 301.0, 900.0, 4000.0))
#: a model's name list, duplicates and a model no configuration knows included
NAMES = st.lists(st.sampled_from((*MODELS, "zz")), max_size=4).map(tuple)
#: the same, longer and so more often with a name twice
CROWDED = st.lists(st.sampled_from((*MODELS, "zz")), max_size=7).map(tuple)
#: the default pools; each example's models and policy go into a copy (validated by their
#: own classes; a BridgeConfig built anew would read the environment every time)
BASE = BridgeConfig()


@st.composite
def configs(draw: st.DrawFn) -> BridgeConfig:
    models = {}
    for name in draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=4, unique=True)):
        low = draw(st.integers(0, 2))
        models[name] = ModelConfig(
            slo_p99_ms=draw(st.sampled_from((10.0, 100.0, 250.0))),
            min_replicas=low,
            max_replicas=low + draw(st.integers(0 if low else 1, 3)),
        )
    policy = PolicyConfig(
        high_watermark=draw(st.sampled_from((0.8, 1.0, 1.5))),
        low_watermark=draw(st.sampled_from((0.3, 0.5))),
        breach_evaluations=draw(st.integers(1, 3)),
        calm_evaluations=draw(st.integers(1, 4)),
        scale_out_cooldown_s=draw(st.sampled_from((0.0, 60.0))),
        scale_in_cooldown_s=draw(st.sampled_from((0.0, 300.0))),
        max_lent_nodes=draw(st.sampled_from((0, 1, 2, 3, 3, 4, 4))),
        preempt_guard_s=draw(st.sampled_from((0.0, 900.0))),
        drain_wait_s=draw(st.sampled_from((0.0, 300.0))),
    )
    return BASE.model_copy(update={"models": models, "policy": policy})


def jobs() -> st.SearchStrategy[JobView]:
    return st.builds(
        JobView,
        job_id=st.sampled_from(("1", "2", "3")),
        gpus=st.integers(1, 8),
        started_at=st.none() | AGES.map(lambda a: T0 - a),
        restarts=st.integers(0, 2),
        submitted_at=st.none() | AGES.map(lambda a: T0 - a),
    )


@st.composite
def histories(draw: st.DrawFn, slo: float) -> tuple[ModelSample, ...]:
    """Random samples, or a run built to breach or to be calm (so that every path runs)."""
    kind = draw(st.sampled_from(("random", "breach", "breach", "breach", "calm")))
    n = draw(st.sampled_from((0, 1, 2, 3, 3, 4, 5)))
    out = []
    for i in range(n):
        at = T0 - (n - 1 - i) * 5.0
        if kind == "breach":  # now and then a fast tick (a lagging p99) breaks the run
            p99 = slo * draw(st.sampled_from((1.6, 2.0, 4.0)))
            mean = p99 * draw(st.sampled_from((0.8, 0.8, 0.8, 0.8, 0.05)))
            out.append(ModelSample(at, p99, 10.0, 0.0, mean))
        elif kind == "calm":
            low = draw(st.none() | st.sampled_from((0.1 * slo, 0.2 * slo)))
            out.append(ModelSample(at, low, 10.0, draw(st.sampled_from((0.0, 0.0, 1.0)))))
        else:
            mult = st.none() | st.sampled_from((0.1, 0.4, 0.5, 0.8, 1.0, 1.2, 3.0))
            p, m = draw(mult), draw(mult)
            out.append(
                ModelSample(
                    at,
                    None if p is None else p * slo,
                    draw(st.none() | st.sampled_from((0.0, 10.0))),
                    draw(st.none() | st.sampled_from((0.0, 2.0))),
                    None if m is None else m * slo,
                )
            )
    return tuple(out)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Snapshot, BridgeConfig]:
    config = draw(configs())
    node_names = [f"n{i}" for i in range(draw(st.integers(0, 6)))]
    nodes = tuple(
        NodeView(
            name,
            draw(st.sampled_from(POOLS)),
            draw(st.integers(0, 3)) > 0,  # usable
            8,
            tuple(draw(st.lists(jobs(), max_size=2))),
            draw(st.integers(0, 3)) == 0,  # has_triton
        )
        for name in node_names
    )
    somewhere = st.sampled_from((*node_names, "elsewhere"))
    replicas = tuple(
        ReplicaView(draw(somewhere), draw(NAMES), draw(st.none() | st.integers(1, 5)))
        for _ in range(draw(st.integers(0, 4)))
    )
    leases = tuple(
        LeaseView(
            lease_id,
            draw(somewhere),
            draw(st.sampled_from(("training", "elastic"))),
            draw(st.sampled_from(("preempt", "drain"))),
            draw(st.sampled_from(STATES)),
            draw(NAMES),
            T0 - draw(AGES),
            draw(st.none() | AGES.map(lambda a: T0 - a)),
        )
        for lease_id in draw(st.lists(st.integers(1, 6), max_size=4, unique=True))
    )
    history = {  # a model may have no samples at all
        name: draw(histories(model.slo_p99_ms))
        for name, model in config.models.items()
        if draw(st.integers(0, 3)) > 0
    }
    last_lend_at = {name: T0 - draw(AGES) for name in config.models if draw(st.integers(0, 2)) == 0}
    return Snapshot(nodes, replicas, history, leases, last_lend_at), config


@st.composite
def crowded_worlds(draw: st.DrawFn) -> tuple[Snapshot, BridgeConfig]:
    """Most models breach (their one sample is over the SLO), on a handful of lendable
    nodes (idle, busy, guarded, down): what the lend carries turns on the replica and lease
    counts (duplicate names, lease states, max_replicas, cooldowns) and the order on equal
    severities, and which node it takes on choose_node's order."""
    models = {}
    for name in MODELS:
        top = draw(st.integers(1, 4))
        models[name] = ModelConfig(
            slo_p99_ms=100.0, min_replicas=draw(st.integers(0, top)), max_replicas=top
        )
    policy = PolicyConfig(
        breach_evaluations=1, scale_out_cooldown_s=60, max_lent_nodes=draw(st.integers(1, 6))
    )
    config = BASE.model_copy(update={"models": models, "policy": policy})
    history = {
        name: (ModelSample(T0, p99, 10.0, 0.0, p99),)
        for name in MODELS
        for p99 in [draw(st.sampled_from((60.0, 60.0, 150.0, 200.0, 400.0)))]
    }
    replicas = tuple(
        ReplicaView(f"r{i}", draw(CROWDED), None) for i in range(draw(st.integers(0, 6)))
    )
    leases = tuple(
        LeaseView(
            lease_id,
            f"l{lease_id}",
            "elastic",
            draw(st.sampled_from(("preempt", "drain"))),
            draw(st.sampled_from(STATES)),
            draw(CROWDED),
            T0 - draw(AGES),
            draw(st.none() | AGES.map(lambda a: T0 - a)),
        )
        for lease_id in draw(st.lists(st.integers(1, 6), max_size=4, unique=True))
    )
    last_lend_at = {name: T0 - draw(AGES) for name in MODELS if draw(st.booleans())}
    nodes = tuple(
        NodeView(
            f"n{i}",
            draw(st.sampled_from(("training", "elastic"))),
            draw(st.integers(0, 4)) > 0,  # usable
            8,
            tuple(draw(st.lists(jobs(), max_size=2))),
            draw(st.integers(0, 4)) == 0,  # has_triton
        )
        for i in range(draw(st.integers(1, 5)))
    )
    return Snapshot(nodes, replicas, history, leases, last_lend_at), config


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_decide_equals_the_reference(world: tuple[Snapshot, BridgeConfig]) -> None:
    snapshot, config = world
    want = ref_decide(snapshot, config, T0)
    breach = [
        m
        for m in config.models
        if ref_evaluate(snapshot.history.get(m, ()), config.models[m], config.policy)
        == ModelStatus.BREACH
    ]
    event(
        f"{min(len(breach), 2)} breaching, "
        + (",".join(type(a).__name__ for a in want) or "nothing")
    )
    assert decide(snapshot, config, T0) == want


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_worlds())
def test_decide_equals_the_reference_when_most_models_breach(
    world: tuple[Snapshot, BridgeConfig],
) -> None:
    snapshot, config = world
    want = ref_decide(snapshot, config, T0)
    event(",".join(f"{type(a).__name__}" for a in want) or "nothing")
    assert decide(snapshot, config, T0) == want
