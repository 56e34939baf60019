"""The pure policy on literal snapshots with an injected clock: when to lend, which node,
when to return, and the guards (consecutive counts, cooldowns, bounds, the lend cap, the
recently-preempted guard, no flapping)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.modelfacts import toml_models
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
    evaluate_model,
)
from bridge.policy import decide as policy_decide
from bridge.policy.decide import assess as policy_assess

T0 = 1_800_000_000.0
TICK = 5.0

CONFIG = BridgeConfig(
    models={
        "busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3),
        "echo": ModelConfig(slo_p99_ms=50, min_replicas=1, max_replicas=2),
    },
    policy=PolicyConfig(
        breach_evaluations=3,
        scale_out_cooldown_s=60,
        scale_in_cooldown_s=120,
        max_lent_nodes=2,
        preempt_guard_s=600,
        drain_wait_s=300,
        return_dwell_s=20,
    ),
)


def decide(snapshot: Snapshot, config: BridgeConfig, now: float) -> list[Action]:
    """The policy on `snapshot` with `config`'s models as the daemon's merge makes them
    from the TOML alone (no repository): the snapshot's `models`, which decide reads."""
    return policy_decide(replace(snapshot, models=toml_models(config)), config, now)


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


def test_a_sustained_breach_of_a_typed_model_lends_a_slice_of_its_type() -> None:
    # the backstop (no capacity signal: rate and means are the samples' defaults) takes a
    # node with a slice of the type free; none free anywhere: nothing is lent
    one = "h100_1g.10gb"
    typed = CONFIG.model_copy(
        update={
            "models": {**CONFIG.models, "busy": CONFIG.models["busy"].model_copy(
                update={"gpu_type": one}
            )}
        }
    )  # fmt: skip
    mig = NodeView("n5", "elastic", True, 3, free_types=((one, 1),))
    (action,) = decide(snap(nodes=(ELASTIC_IDLE, mig, RESERVED), busy=BREACH), typed, T0)
    assert isinstance(action, Lend)
    assert (action.node, action.gpus, action.gpu_type) == ("n5", 1, one)
    assert "170 ms over SLO 100 ms" in action.reason
    assert decide(snap(nodes=(ELASTIC_IDLE, RESERVED), busy=BREACH), typed, T0) == []


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
    assert evaluate_model(hist, toml_models(CONFIG)["busy"], CONFIG) == ModelStatus.STEADY


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
    assert a == Return(1, "quiet for 20s: busy")
    young = lease(serving_since=T0 - 60)
    assert decide(snap(busy=calm, leases=(young,)), CONFIG, T0) == []


def test_return_needs_every_model_of_the_lease_quiet_for_the_dwell() -> None:
    both = lease(models=("busy", "echo"))
    assert (
        decide(
            snap(busy=samples(20, 20, 20, 20), echo=samples(40, 40, 40, 40), leases=(both,)),
            CONFIG,
            T0,
        )
        == []
    )  # echo sits between watermarks
    # one tick over the low watermark inside the dwell: no return yet
    assert decide(snap(busy=samples(20, 60, 20, 20), leases=(lease(),)), CONFIG, T0) == []


def test_several_returns_in_one_tick_cheapest_pool_first() -> None:
    calm = samples(20, 20, 20, 20)
    leases = (
        lease(2, node="n5", serving_since=T0 - 300),
        lease(1, serving_since=T0 - 900),
        lease(3, node="n1", lend_mode="drain", serving_since=T0 - 1200),
    )
    actions = decide(snap(busy=calm, leases=leases), CONFIG, T0)
    assert [a.lease_id for a in actions if isinstance(a, Return)] == [1, 2, 3]


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
    assert evaluate_model(hist, toml_models(CONFIG)["busy"], CONFIG) == want


def test_a_job_started_at_time_zero_counts_as_work_lost() -> None:
    # found by the simulator, whose clock starts at 0: `if started_at` read 0.0 as "not
    # started", so the node of the job running longest looked free of work to lose
    from bridge.policy.nodes import work_lost

    node = NodeView("n1", "elastic", True, 1, (JobView("j", 1, 0.0),))
    assert work_lost(node, 100.0) == 100.0


# ---- the capacity model in decide ------------------------------------------------------

SIZED = BridgeConfig(
    models={"busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=6, instances=1)},
    policy=PolicyConfig(
        max_lent_nodes=4,
        capacity_headroom=1.25,
        return_headroom=1.5,
        return_dwell_s=20,
        scale_in_cooldown_s=120,
        forecast_window_s=60,
        lend_lead_s=30,
    ),
)
ELASTIC = tuple(NodeView(f"e{i}", "elastic", True, 4) for i in range(5))


def steady(rate: float, n: int = 13, p99: float = 60.0, compute_ms: float = 20.0) -> tuple:
    """`n` samples at a constant rate of a model whose requests take `compute_ms`; the p99
    under the SLO (100 ms) but over the low watermark (50 ms): requests queue, so a
    capacity lend is confirmed (`test_a_capacity_lend_needs_the_requests_to_queue`)."""
    return tuple(
        ModelSample(T0 - (n - 1 - i) * TICK, p99, rate, 0.0, p99 / 2, compute_ms) for i in range(n)
    )


def sized(busy: tuple, leases: tuple = (), replicas: tuple | None = None) -> Snapshot:
    base = (ReplicaView("n4", ("busy",), gpus=4),)
    return Snapshot((*ELASTIC, RESERVED), replicas or base, {"busy": busy}, leases)


def test_the_whole_deficit_is_lent_in_one_tick_before_any_breach() -> None:
    """One instance of 20 ms: at 60 req/s x 1.25 headroom, two replicas (37.5 req/s each)
    would give a p99 of 193 ms, three 98 ms: two lends now, while the measured p99 is
    still fine."""
    actions = decide(sized(steady(60.0)), SIZED, T0)
    lends = [a for a in actions if isinstance(a, Lend)]
    assert [a.node for a in lends] == ["e0", "e1"]
    assert all(a.models == ("busy",) and a.reason.startswith("capacity:") for a in lends)
    # within capacity: nothing
    assert decide(sized(steady(20.0)), SIZED, T0) == []


def test_lends_in_flight_count_as_capacity() -> None:
    flying = tuple(
        LeaseView(i, f"e{i}", "elastic", "preempt", "submitted", ("busy",), T0 - 5)
        for i in range(2)
    )
    assert decide(sized(steady(60.0), leases=flying), SIZED, T0) == []


def test_a_rising_trend_lends_before_the_rate_arrives() -> None:
    """20 req/s now (one replica suffices) but rising 0.5 req/s each second: in the 30 s a
    lend takes, the forecast is 35 req/s, which one replica cannot carry: a lend now."""
    ramp = tuple(
        ModelSample(T0 - (12 - i) * TICK, 30.0, 20.0 - (12 - i) * TICK / 2, 0.0, 15.0, 20.0)
        for i in range(13)
    )
    assert ramp[-1].request_rate == 20.0
    lends = [a for a in decide(sized(ramp), SIZED, T0) if isinstance(a, Lend)]
    assert len(lends) == 1 and "busy 44 req/s" in lends[0].reason
    flat = steady(20.0)
    assert decide(sized(flat), SIZED, T0) == []


def test_a_return_never_goes_into_a_predicted_breach() -> None:
    """Quiet latency is not enough: at 30 req/s x 1.5 the one replica left would give a
    p99 over the SLO, so the lease stays; at 10 req/s it goes."""
    lent = LeaseView(1, "e0", "elastic", "preempt", "serving", ("busy",), T0 - 700, T0 - 600)
    replicas = (ReplicaView("n4", ("busy",), gpus=4), ReplicaView("e0", ("busy",), 1, gpus=4))
    busy = sized(steady(30.0, p99=20.0), leases=(lent,), replicas=replicas)
    assert not [a for a in decide(busy, SIZED, T0) if isinstance(a, Return)]
    calm = sized(steady(10.0, p99=20.0), leases=(lent,), replicas=replicas)
    (a,) = decide(calm, SIZED, T0)
    assert isinstance(a, Return) and "carry busy 15 req/s" in a.reason


def test_max_replicas_bounds_the_capacity_lend() -> None:
    cfg = SIZED.model_copy(
        update={"models": {"busy": ModelConfig(slo_p99_ms=100, max_replicas=2, instances=1)}}
    )
    lends = [a for a in decide(sized(steady(60.0)), cfg, T0) if isinstance(a, Lend)]
    assert len(lends) == 1


def test_site_reservations_are_never_lent() -> None:
    nodes = (replace(ELASTIC[0], reserved=True), RESERVED)
    snapshot = Snapshot(nodes, (ReplicaView("n4", ("busy",), gpus=4),), {"busy": steady(60.0)}, ())
    assert decide(snapshot, SIZED, T0) == []


def test_the_preemption_budget_and_the_requeue_count_bound_the_victims() -> None:
    busy_nodes = tuple(
        NodeView(f"e{i}", "elastic", True, 4, (JobView(f"j{i}", 4, T0 - 600),)) for i in range(4)
    )
    history = {"busy": steady(60.0)}
    base = (ReplicaView("n4", ("busy",), gpus=4),)
    full = Snapshot((*busy_nodes, RESERVED), base, history, ())
    assert len([a for a in decide(full, SIZED, T0) if isinstance(a, Lend)]) == 2
    spent = replace(full, preemptions_last_hour=SIZED.policy.max_preemptions_per_hour - 1)
    assert len([a for a in decide(spent, SIZED, T0) if isinstance(a, Lend)]) == 1
    worn = tuple(
        replace(n, jobs=(replace(n.jobs[0], restarts=SIZED.policy.max_requeues_per_job),))
        for n in busy_nodes
    )
    assert decide(replace(full, nodes=(*worn, RESERVED)), SIZED, T0) == []


def test_a_reported_checkpoint_makes_a_long_job_the_cheaper_victim() -> None:
    old = NodeView("e0", "elastic", True, 4, (JobView("1", 4, T0 - 7200, checkpoint_at=T0 - 60),))
    young = NodeView("e1", "elastic", True, 4, (JobView("2", 4, T0 - 600),))
    snapshot = Snapshot(
        (old, young, RESERVED), (ReplicaView("n4", ("busy",), gpus=4),), {"busy": steady(30.0)}, ()
    )
    (a,) = decide(snapshot, SIZED, T0)
    assert isinstance(a, Lend) and a.node == "e0"


def test_a_capacity_lend_needs_the_requests_to_queue() -> None:
    """The lab's closed-loop client: the rate (60 req/s, 1.2 replicas' worth by the
    capacity model) is what the client's own concurrency makes, and its requests do not
    wait (p99 8 ms, mean 4 ms against a 100 ms SLO): no capacity lend. The same rate
    rising (the forecast above it) is met ahead, and so are requests that queue."""
    closed_loop = steady(60.0, p99=8.0)
    assert decide(sized(closed_loop), SIZED, T0) == []
    plan = policy_assess(replace(sized(closed_loop), models=toml_models(SIZED)), SIZED, T0)
    assert plan.unconfirmed == ["busy"]
    rising = tuple(
        ModelSample(s.at, 8.0, 60.0 - (T0 - s.at) / 10, 0.0, 4.0, 20.0) for s in closed_loop
    )
    assert [a for a in decide(sized(rising), SIZED, T0) if isinstance(a, Lend)]
    queued = steady(60.0, p99=60.0)
    assert [a for a in decide(sized(queued), SIZED, T0) if isinstance(a, Lend)]


def test_an_idle_model_is_calm_whatever_the_lagging_p99() -> None:
    """Triton's p99 covers its last 60 s: a replica's first slow answers keep it over the
    low watermark for a minute after the model went idle. A tick that served no request
    and had none waiting is calm all the same; one with requests waiting is not, nor is
    one that served requests with that p99."""
    busy = toml_models(CONFIG)["busy"]
    dwell = 20 // int(TICK) + 1  # return_dwell_s 20 in ticks, with one to spare
    assert evaluate_model(samples(*[70.0] * dwell, rate=0.0), busy, CONFIG) == ModelStatus.CALM
    waiting = samples(*[70.0] * dwell, rate=0.0, pending=2.0)
    assert evaluate_model(waiting, busy, CONFIG) == ModelStatus.STEADY
    served = samples(*[70.0] * dwell, rate=0.5)
    assert evaluate_model(served, busy, CONFIG) == ModelStatus.STEADY
    # one slow tick with requests in the dwell breaks it
    mixed = (*samples(*[70.0] * (dwell - 1), rate=0.0, end=T0 - TICK), *samples(70.0, rate=1.0))
    assert evaluate_model(mixed, busy, CONFIG) == ModelStatus.STEADY


# ---- partial lends (issue 32): a replica of k GPUs takes k GPUs of a preempt node -------

#: busy's replica takes one GPU (its instance_group's GPUs)
ONE_GPU = CONFIG.model_copy(
    update={
        "models": {
            **CONFIG.models,
            "busy": CONFIG.models["busy"].model_copy(update={"instance_gpus": 1}),
        }
    }
)


def test_a_one_gpu_replica_lends_one_gpu_of_an_idle_elastic_node() -> None:
    (a,) = decide(snap(busy=BREACH), ONE_GPU, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("n3", 1)
    # whole nodes as before when the model does not say its GPUs
    (a,) = decide(snap(busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("n3", None)
    # and when the site keeps whole nodes
    whole = ONE_GPU.model_copy(
        update={"policy": ONE_GPU.policy.model_copy(update={"partial_lends": False})}
    )
    (a,) = decide(snap(busy=BREACH), whole, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("n3", None)


def test_a_partial_lend_costs_only_the_jobs_it_requeues() -> None:
    # e1 runs one 4-GPU job an hour old; e2 runs two 2-GPU jobs, one an hour old, one a
    # day old. Whole nodes: e1 (the least work lost, 4 GPU-hours against 4 x 1 day).
    # One GPU: e2, requeueing its hour-old 2-GPU job (2 GPU-hours, not e1's 4).
    e1 = NodeView("e1", "elastic", True, 4, (JobView("1", 4, T0 - 3600),))
    day = JobView("2", 2, T0 - 86400)
    hour = JobView("3", 2, T0 - 3600)
    e2 = NodeView("e2", "elastic", True, 4, (day, hour))
    nodes = (e1, e2, RESERVED)
    (a,) = decide(snap(nodes=nodes, busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("e1", None)
    (a,) = decide(snap(nodes=nodes, busy=BREACH), ONE_GPU, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("e2", 1)


def test_a_busy_node_with_a_free_gpu_is_as_cheap_as_an_idle_one() -> None:
    # e1 has 3 of its 4 GPUs busy: a one-GPU lend there requeues nothing and keeps the
    # idle node whole; "e1" < "n3" by name among equals
    e1 = NodeView("e1", "elastic", True, 4, (JobView("1", 3, T0 - 3600),))
    (a,) = decide(snap(nodes=(e1, ELASTIC_IDLE, RESERVED), busy=BREACH), ONE_GPU, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("e1", 1)


def test_a_partial_lend_never_requeues_a_guarded_job_nor_a_drain_node_partly() -> None:
    fresh = JobView("1", 2, T0 - 30, restarts=1, submitted_at=T0 - 100)  # requeued lately
    old = JobView("2", 2, T0 - 3600)
    e1 = NodeView("e1", "elastic", True, 4, (fresh, old))
    # whole nodes: e1 is skipped (a job of it was requeued within the guard): the backstop
    # waits for the training node instead
    busy_train = NodeView("n2", "training", True, 4, (JobView("9", 4, T0 - 10),))
    (a,) = decide(snap(nodes=(e1, busy_train, RESERVED), busy=BREACH), CONFIG, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("n2", None)
    # one GPU: e1, by requeueing the other job only
    (a,) = decide(snap(nodes=(e1, busy_train, RESERVED), busy=BREACH), ONE_GPU, T0)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("e1", 1)
    # a drain-mode node is fenced whole, whatever the replica's GPUs ...
    (a,) = decide(snap(nodes=(TRAIN_IDLE, RESERVED), busy=BREACH), ONE_GPU, T0)
    assert isinstance(a, Lend) and (a.node, a.lend_mode, a.gpus) == ("n1", "drain", None)
    # ... unless drain_partial_lends: then lent the replica's GPUs (its job waits for them)
    drain = ONE_GPU.model_copy(
        update={"policy": ONE_GPU.policy.model_copy(update={"drain_partial_lends": True})}
    )
    (a,) = decide(snap(nodes=(TRAIN_IDLE, RESERVED), busy=BREACH), drain, T0)
    assert isinstance(a, Lend) and (a.node, a.lend_mode, a.gpus) == ("n1", "drain", 1)
