"""Model placement (`bridge.policy.placement`, issue 29's frozen layout) on literal
snapshots with a fixed clock, and the simulator carrying it out: a shifting mix re-packs a
lent replica instead of lending a node; the last replica of a model with traffic is never
unloaded; a lease mid-placement is neither placed again nor returned; a simulated Place
moves the model, which serves afterwards."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import (
    LeaseView,
    Lend,
    ModelSample,
    NodeView,
    Place,
    ReplicaView,
    Return,
    Snapshot,
    decide,
)
from bridge.policy.decide import assess
from bridge.policy.returns import PEAK_BUCKET_S, RatePeaks, ReturnHistory
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.workload import ArrivalSeries

T0 = 1_800_000_000.0
TICK = 5.0

#: two models with an instance each per replica (20 ms a request: one replica carries
#: under 50 req/s of each), lends of up to 4 nodes
CONFIG = BridgeConfig(
    models={
        "a": ModelConfig(slo_p99_ms=100, max_replicas=6, instances=1),
        "b": ModelConfig(slo_p99_ms=100, max_replicas=6, instances=1),
    },
    policy=PolicyConfig(
        max_lent_nodes=4,
        capacity_headroom=1.25,
        return_headroom=1.5,
        return_dwell_s=20,
        return_dwell_max_s=3600,
        relend_work_s=600,
        scale_in_cooldown_s=120,
        forecast_window_s=60,
        lend_lead_s=30,
    ),
)
NODES = (
    NodeView("e1", "elastic", True, 4),
    NodeView("n4", "inference", True, 4, has_triton=True),
)
BASELINE = ReplicaView("n4", ("a", "b"), gpus=4)
#: lease 1 on e0, lent for `a` an hour ago
LENT_A = LeaseView(1, "e0", "elastic", "preempt", "serving", ("a",), T0 - 3700, T0 - 3600)


def steady(rate: float, p99: float, n: int = 13) -> tuple[ModelSample, ...]:
    """`n` samples at `rate` (20 ms a request), the tick's mean half the p99: 60 ms
    queues (a capacity lend is confirmed), 20 ms is calm."""
    return tuple(
        ModelSample(T0 - (n - 1 - i) * TICK, p99, rate, 0.0, p99 / 2, 20.0) for i in range(n)
    )


#: `a` fell to 5 req/s (calm), `b` rose to 30 req/s: at 1.25 x 30 one replica of `b`
#: gives a p99 of 190 ms, two give 78 ms
SHIFTED = {"a": steady(5.0, 20.0), "b": steady(30.0, 60.0)}


def snap(
    replicas: tuple[ReplicaView, ...],
    history: dict[str, tuple[ModelSample, ...]] = SHIFTED,
    leases: tuple[LeaseView, ...] = (LENT_A,),
    **more: object,
) -> Snapshot:
    return Snapshot(
        NODES,
        replicas,
        history,
        leases,
        models=toml_models(CONFIG),
        **more,  # type: ignore[arg-type]
    )


def kinds(actions: list[object]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_shifting_mix_re_packs_the_lent_replica_without_a_lend() -> None:
    """`a` has the baseline's replica besides the lent one, which it no longer needs at
    1.5 x 5 req/s: the lent replica is given `b` in place of `a`, and no node is lent.
    With placement off, `b` gets a node of its own (and the lease keeps `a`)."""
    snapshot = snap((BASELINE, ReplicaView("e0", ("a",), 1, gpus=4)))
    (action,) = decide(snapshot, CONFIG, T0)
    assert isinstance(action, Place)
    assert (action.lease_id, action.models) == (1, ("b",))
    assert action.key == "place:1:b"
    assert action.reason == "placement: b 38 req/s in place of a"
    plan = assess(snapshot, CONFIG, T0)
    assert plan.acts and plan.placements == [action] and plan.wanted == []
    off = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"placement": False})}
    )
    (lend,) = decide(snapshot, off, T0)
    assert isinstance(lend, Lend) and lend.models == ("b",) and lend.node == "e1"


def test_the_last_replica_of_a_model_with_traffic_is_never_unloaded() -> None:
    """The lent replica is `a`'s only one (the baseline holds `b` alone). `a` has no
    requests now: with no burst within its return dwell its replica may go to `b`; after
    returns lent again too soon (its dwell 1,212 s) a 120 req/s burst 15 minutes ago is
    within it, so `a` keeps its replica and `b` gets a node instead."""
    idle_a = tuple(ModelSample(T0 - (12 - i) * TICK, None, 0.0, 0.0, None, 20.0) for i in range(13))
    history = {"a": idle_a, "b": SHIFTED["b"]}
    replicas = (ReplicaView("n4", ("b",), gpus=4), ReplicaView("e0", ("a",), 1, gpus=4))
    now_bucket = T0 - T0 % PEAK_BUCKET_S
    burst = RatePeaks(
        tuple(
            (now_bucket - k * PEAK_BUCKET_S, 120.0 if k == 15 else 0.0) for k in range(60, 0, -1)
        ),
        now_bucket,
        0.0,
    )
    quiet = snap(replicas, history, peaks={"a": burst})
    (action,) = decide(quiet, CONFIG, T0)
    assert isinstance(action, Place) and action.models == ("b",)
    flapped = replace(quiet, returns={"a": ReturnHistory((120.0, 100.0), None)})
    actions = decide(flapped, CONFIG, T0)
    assert kinds(actions) == ["Lend"]
    assert isinstance(actions[0], Lend) and actions[0].models == ("b",)


def test_a_lease_mid_placement_is_neither_placed_again_nor_returned() -> None:
    """Lease 1 is being given `a` (its replica holds nothing yet while `a` loads). It
    counts as a replica of `a`, as a lend in flight would: with `b` quiet, nothing is
    returned though `a` is calm and carried without it; with `b` late it is not placed
    again: `b` gets a node. Settled, the same lease would go back, or be placed."""
    loading = ReplicaView("e0", (), 1, gpus=4)
    calm = {"a": steady(5.0, 20.0), "b": steady(10.0, 20.0)}
    assert decide(snap((BASELINE, loading), calm), CONFIG, T0) == []
    settled = ReplicaView("e0", ("a",), 1, gpus=4)
    assert kinds(decide(snap((BASELINE, settled), calm), CONFIG, T0)) == ["Return"]
    actions = decide(snap((BASELINE, loading)), CONFIG, T0)
    assert kinds(actions) == ["Lend"]
    assert not [a for a in actions if isinstance(a, (Place, Return))]
    assert kinds(decide(snap((BASELINE, settled)), CONFIG, T0)) == ["Place"]


def test_a_return_of_the_tick_becomes_a_place_when_another_model_is_late() -> None:
    """Lease 1 (`a`, calm) and lease 2 (`b`) serve; `b` is late for one more replica:
    lease 1 would go back and a node be lent for `b`. It is placed instead."""
    lent_b = LeaseView(2, "e2", "elastic", "preempt", "serving", ("b",), T0 - 3700, T0 - 3600)
    replicas = (
        BASELINE,
        ReplicaView("e0", ("a",), 1, gpus=4),
        ReplicaView("e2", ("b",), 2, gpus=4),
    )
    history = {"a": steady(5.0, 20.0), "b": steady(60.0, 60.0)}
    actions = decide(snap(replicas, history, (LENT_A, lent_b)), CONFIG, T0)
    assert kinds(actions) == ["Place"]
    assert isinstance(actions[0], Place) and actions[0].lease_id == 1


# ---- the simulator ---------------------------------------------------------------------


def _series(*phases: tuple[float, float]) -> np.ndarray:
    """(seconds, req/s) phases as a 5 s step series."""
    return np.concatenate([np.full(int(s / TICK), r) for s, r in phases])


def _setup(placement: bool, load_s: float = 0.0) -> Setup:
    """A reserved node serving `a` and `b` and one elastic node to lend, each replica two
    20 ms servers (the policy sizes each model on its own instance of them). `a` bursts
    first (the node is lent for it), then falls, and `b` rises past what the reserved
    replica carries."""
    horizon = 3000.0
    a = _series((300, 10.0), (600, 110.0), (horizon - 900, 5.0))
    b = _series((930, 5.0), (horizon - 930, 110.0))
    config = BridgeConfig(
        tick_s=TICK,
        pools={
            "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
            "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        },
        models={
            "a": ModelConfig(slo_p99_ms=100, max_replicas=2, instances=1),
            "b": ModelConfig(slo_p99_ms=100, max_replicas=2, instances=1),
        },
        policy=PolicyConfig(
            max_lent_nodes=1,
            return_dwell_s=6 * TICK,
            scale_in_cooldown_s=60,
            scale_out_cooldown_s=60,
            placement=placement,
        ),
    )
    return Setup(
        name="t",
        description="test",
        config=config,
        nodes=[
            SimNode(0, "inf0", "inference", None, 2),
            SimNode(1, "el0", "elastic", "elastic", 2),
        ],
        jobs=(),
        arrivals=ArrivalSeries(TICK, {"a": a, "b": b}),
        service_s={"a": 0.020, "b": 0.020},
        horizon_s=horizon,
        replica_servers=2,
        timing=Timing(model_load_s={"a": load_s, "b": load_s}),
        check_quiet=True,
    )


def test_the_simulator_carries_a_place_and_the_moved_model_serves() -> None:
    """The node lent for `a`'s burst is placed onto `b` once `b` rises (no second node to
    lend): `b` is served by two replicas from then on, after the 60 s load, and more of
    its requests meet the SLO than with placement off (the lease keeping `a`). Skipping
    quiet ticks (proven or not) changes no decision."""
    engine = Engine(_setup(True, load_s=60.0))
    result = engine.run()
    lend, place = result.decisions[:2]
    assert (lend.kind, lend.node, lend.models) == ("lend", "el0", ("a",))
    assert (place.kind, place.node, place.models) == ("place", "el0", ("b",))
    assert place.at_s > 930
    group = engine.serving.groups[("b",), None]  # (a whole node's replica)
    assert group.nodes == 1 and group.born >= place.at_s + 60.0
    assert not any(models == ("a",) for models, _ in engine.serving.groups)
    assert [r.models for r in engine.replica_views if r.lease_id is not None] == [("b",)]
    frozen = Engine(_setup(False, load_s=60.0)).run()
    assert "place" not in {d.kind for d in frozen.decisions}
    assert result.models["b"].within_share > frozen.models["b"].within_share + 0.05
    always = Engine(replace(_setup(True, load_s=60.0), always_decide=True)).run()
    assert always.decisions == result.decisions
    unproven = Engine(replace(_setup(True, load_s=60.0), prove_quiet=False)).run()
    assert unproven.decisions == result.decisions
