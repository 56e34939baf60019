"""The pure policy on literal snapshots with an injected clock: when to lend, which node,
when to return, and the guards (consecutive counts, cooldowns, bounds, the lend cap, the
recently-preempted guard, no flapping)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy import (
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
    evaluate_model,
)

T0 = 1_800_000_000.0
TICK = 5.0

CONFIG = BridgeConfig(
    models={
        "busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3),
        "echo": ModelConfig(slo_p99_ms=50, min_replicas=1, max_replicas=2),
    },
    policy=PolicyConfig(
        breach_evaluations=3,
        calm_evaluations=4,
        scale_out_cooldown_s=60,
        scale_in_cooldown_s=120,
        max_lent_nodes=2,
        preempt_guard_s=600,
        drain_wait_s=300,
    ),
)

RESERVED = NodeView("n4", "inference", True, 4, has_triton=True)
ELASTIC_IDLE = NodeView("n3", "elastic", True, 4)
TRAIN_IDLE = NodeView("n1", "training", True, 4)
BASELINE = ReplicaView("n4", ("busy", "echo"))


def samples(
    *p99s: float | None,
    rate: float | None = 10.0,
    end: float = T0,
    pending: float = 0.0,
    mean: float | None = None,
) -> tuple[ModelSample, ...]:
    """Samples one tick apart; the tick mean is `mean`, or by default half the p99."""
    n = len(p99s)
    return tuple(
        ModelSample(
            end - (n - 1 - i) * TICK,
            p,
            rate,
            pending,
            mean if mean is not None else (p / 2 if p is not None else None),
        )
        for i, p in enumerate(p99s)
    )


def snap(
    nodes: tuple[NodeView, ...] = (TRAIN_IDLE, ELASTIC_IDLE, RESERVED),
    busy: tuple[ModelSample, ...] = (),
    echo: tuple[ModelSample, ...] = (),
    leases: tuple[LeaseView, ...] = (),
    replicas: tuple[ReplicaView, ...] = (BASELINE,),
    last_lend_at: dict[str, float] | None = None,
) -> Snapshot:
    return Snapshot(nodes, replicas, {"busy": busy, "echo": echo}, leases, last_lend_at or {})


def lease(
    lease_id: int = 1,
    node: str = "n3",
    state: str = "serving",
    models: tuple[str, ...] = ("busy",),
    serving_since: float | None = T0 - 600,
    lend_mode: str = "preempt",
    created_at: float = T0 - 700,
) -> LeaseView:
    pool = "elastic" if lend_mode == "preempt" else "training"
    return LeaseView(lease_id, node, pool, lend_mode, state, models, created_at, serving_since)


BREACH = samples(150, 160, 170)


def test_sustained_breach_lends_the_idle_elastic_node() -> None:
    (action,) = decide(snap(busy=BREACH), CONFIG, T0)
    assert isinstance(action, Lend)
    assert (action.node, action.pool, action.lend_mode, action.models) == (
        "n3",
        "elastic",
        "preempt",
        ("busy",),
    )
    assert "170 ms over SLO 100 ms" in action.reason


def test_breach_must_be_consecutive() -> None:
    assert decide(snap(busy=samples(150, 90, 170)), CONFIG, T0) == []
    assert decide(snap(busy=samples(150, 170)), CONFIG, T0) == []  # too few samples
    assert decide(snap(busy=samples(150, None, 170)), CONFIG, T0) == []  # no data breaks it


def test_a_lagging_p99_without_slow_requests_now_is_no_breach() -> None:
    """After a burst Triton's 60 s p99 stays high while requests are fast again."""
    assert decide(snap(busy=samples(900, 850, 800, mean=25)), CONFIG, T0) == []
    (a,) = decide(snap(busy=samples(900, 850, 800, mean=300)), CONFIG, T0)
    assert isinstance(a, Lend)


def test_no_data_is_never_a_breach_nor_calm() -> None:
    hist = samples(None, None, None, None, rate=None)
    assert evaluate_model(hist, CONFIG.models["busy"], CONFIG.policy) == ModelStatus.STEADY


def test_idle_node_before_busy_elastic_before_training_least_work_lost() -> None:
    young = NodeView("n5", "elastic", True, 4, (JobView("7", 4, T0 - 60),))
    old = NodeView("n6", "elastic", True, 4, (JobView("8", 4, T0 - 6000),))
    busy_train = NodeView("n2", "training", True, 4, (JobView("9", 4, T0 - 10),))
    nodes = (busy_train, old, young, TRAIN_IDLE, RESERVED)
    # An idle training node beats any busy node.
    (a,) = decide(snap(nodes=nodes, busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and (a.node, a.lend_mode) == ("n1", "drain")
    # Without it: elastic before training, and the elastic job with the least work lost.
    (a,) = decide(snap(nodes=(busy_train, old, young, RESERVED), busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and a.node == "n5"
    # An idle elastic node beats an idle training node.
    (a,) = decide(snap(nodes=(TRAIN_IDLE, ELASTIC_IDLE, RESERVED), busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and a.node == "n3"


def test_recently_requeued_job_is_not_preempted_again() -> None:
    fresh = JobView("7", 4, T0 - 30, restarts=1, submitted_at=T0 - 200)
    guarded = NodeView("n3", "elastic", True, 4, (fresh,))
    busy_train = NodeView("n2", "training", True, 4, (JobView("9", 4, T0 - 10),))
    (a,) = decide(snap(nodes=(guarded, busy_train, RESERVED), busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and a.node == "n2"  # drain the training node instead
    assert decide(snap(nodes=(guarded, RESERVED), busy=BREACH), CONFIG, T0) == []
    # Once the guard has passed, it may be preempted again.
    (a,) = decide(snap(nodes=(guarded, RESERVED), busy=BREACH), CONFIG, T0 + 500)
    assert isinstance(a, Lend) and a.node == "n3"


def test_all_breaching_models_go_on_the_one_new_node_worst_first() -> None:
    (a,) = decide(snap(busy=BREACH, echo=samples(60, 70, 200)), CONFIG, T0)
    assert isinstance(a, Lend) and a.models == ("echo", "busy")  # echo is 4x its SLO


def test_scale_out_cooldown() -> None:
    assert decide(snap(busy=BREACH, last_lend_at={"busy": T0 - 30}), CONFIG, T0) == []
    (a,) = decide(snap(busy=BREACH, last_lend_at={"busy": T0 - 60}), CONFIG, T0)
    assert isinstance(a, Lend)


def test_a_lend_in_flight_is_not_repeated() -> None:
    starting = lease(state="starting", serving_since=None, created_at=T0 - 10)
    s = snap(
        nodes=(TRAIN_IDLE, replace(ELASTIC_IDLE, has_triton=True), RESERVED),
        busy=BREACH,
        leases=(starting,),
    )
    assert decide(s, CONFIG, T0) == []


def test_max_replicas_counts_lent_replicas() -> None:
    replicas = (BASELINE, ReplicaView("n3", ("busy",), 1), ReplicaView("n5", ("busy",), 2))
    leases = (lease(1), lease(2, node="n5"))
    cfg = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"max_lent_nodes": 5})}
    )
    assert decide(snap(busy=BREACH, leases=leases, replicas=replicas), cfg, T0) == []


def test_lend_cap() -> None:
    leases = (lease(1, node="n7"), lease(2, node="n8"))
    replicas = (BASELINE,)
    assert (
        decide(
            snap(busy=samples(150, 160, 170), leases=leases, replicas=replicas),
            CONFIG.model_copy(
                update={"models": {"busy": ModelConfig(slo_p99_ms=100, max_replicas=9)}}
            ),
            T0,
        )
        == []
    )


def test_sustained_calm_returns_the_lease_after_its_cooldown() -> None:
    calm = samples(20, 25, 30, 20)
    (a,) = decide(snap(busy=calm, leases=(lease(),)), CONFIG, T0)
    assert a == Return(1, "models calm: busy")
    young = lease(serving_since=T0 - 60)
    assert decide(snap(busy=calm, leases=(young,)), CONFIG, T0) == []


def test_calm_needs_no_pending_and_all_models_of_the_lease() -> None:
    assert (
        decide(snap(busy=samples(20, 25, 30, 20, pending=2), leases=(lease(),)), CONFIG, T0) == []
    )
    both = lease(models=("busy", "echo"))
    assert (
        decide(
            snap(busy=samples(20, 20, 20, 20), echo=samples(40, 40, 40, 40), leases=(both,)),
            CONFIG,
            T0,
        )
        == []
    )  # echo sits between watermarks


def test_one_return_per_tick_oldest_first_and_no_lend_in_that_tick() -> None:
    calm = samples(20, 20, 20, 20)
    leases = (lease(2, node="n5", serving_since=T0 - 300), lease(1, serving_since=T0 - 900))
    actions = decide(snap(busy=calm, echo=samples(90, 95, 99), leases=leases), CONFIG, T0)
    assert actions == [Return(1, "models calm: busy")]


def test_flapping_load_never_lends_or_returns() -> None:
    """p99 alternating above and below the SLO every tick, over ten minutes."""
    history: tuple[ModelSample, ...] = ()
    lent = lease()
    for i in range(120):
        now = T0 + i * TICK
        p99 = 180.0 if i % 2 else 40.0
        history = (*history, ModelSample(now, p99, 20.0, 0.0, p99 / 2))[-10:]
        assert decide(snap(busy=history, leases=(lent,)), CONFIG, now) == [], i


def test_hysteresis_between_watermarks_holds() -> None:
    steady = samples(60, 70, 80, 90)  # below the SLO, above the low watermark
    assert decide(snap(busy=steady, leases=(lease(),)), CONFIG, T0) == []


def test_dead_baseline_is_resubmitted() -> None:
    down = replace(RESERVED, has_triton=False)
    actions = decide(snap(nodes=(ELASTIC_IDLE, down), replicas=()), CONFIG, T0)
    assert actions == [StartBaseline("n4", "no Triton job on reserved node")]
    unusable = replace(down, usable=False)
    assert decide(snap(nodes=(ELASTIC_IDLE, unusable), replicas=()), CONFIG, T0) == []


def test_drain_wait_is_bounded() -> None:
    waiting = lease(
        node="n1", state="submitted", serving_since=None, lend_mode="drain", created_at=T0 - 301
    )
    (a,) = decide(snap(leases=(waiting,)), CONFIG, T0)
    assert a == Return(1, "drain wait over 300s")
    assert decide(snap(leases=(replace(waiting, created_at=T0 - 200),)), CONFIG, T0) == []


def test_reserved_and_unusable_nodes_are_never_lent() -> None:
    nodes = (RESERVED, replace(ELASTIC_IDLE, usable=False))
    assert decide(snap(nodes=nodes, busy=BREACH), CONFIG, T0) == []


def test_decide_is_pure() -> None:
    s = snap(busy=BREACH)
    assert decide(s, CONFIG, T0) == decide(s, CONFIG, T0)


@pytest.mark.parametrize("p99", [100.0, 100.1])
def test_breach_is_strictly_above_the_high_watermark(p99: float) -> None:
    hist = samples(p99, p99, p99)
    want = ModelStatus.BREACH if p99 > 100 else ModelStatus.STEADY
    assert evaluate_model(hist, CONFIG.models["busy"], CONFIG.policy) == want


def test_a_job_started_at_time_zero_counts_as_work_lost() -> None:
    # found by the simulator, whose clock starts at 0: `if started_at` read 0.0 as "not
    # started", so the node of the job running longest looked free of work to lose
    from bridge.policy.decide import _work_lost

    node = NodeView("n1", "elastic", True, 1, (JobView("j", 1, 0.0),))
    assert _work_lost(node, 100.0) == 100.0
