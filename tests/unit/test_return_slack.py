"""`[policy] return_slack`: a return may leave a model that the replicas held now cannot
carry at the return's rate (over its objective, calm by its latency) a little further
over it (`capacity.allowance`, `decide`'s capacity-aware return); without the slack such
a model holds every lease that shares a replica with it."""

from __future__ import annotations

import math

import pytest

from bridge.config import BridgeConfig, ModelOverride, PolicyConfig
from bridge.lifecycle import LeaseState
from bridge.modelfacts import toml_models
from bridge.policy import (
    LeaseView,
    ModelSample,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
    capacity,
    decide,
)

T0 = 1_800_000_000.0
TICK = 5.0

# `b` is served by the reserved replica alone, beside `a`; `a` also has a lent replica
BASELINE = capacity.Group(("a", "b"), 1, 4)
LENT_A = capacity.Group(("a",), 1, 4)


def demand(rate_a: float, rate_b: float) -> dict[str, capacity.Demand]:
    return {
        "a": capacity.Demand(rate_a, 0.020, 0.100),
        "b": capacity.Demand(rate_b, 0.020, 0.060),
    }


def test_the_allowance_is_the_p99_now_with_the_slack_for_models_past_their_objective() -> None:
    d = demand(3.0, 165.0)
    before = capacity.predict([BASELINE, LENT_A], d)
    assert before["a"] < 0.100 and 0.060 < before["b"] < math.inf  # b short already, a not
    assert capacity.allowance(before, d, 0.1) == {"b": pytest.approx(before["b"] * 1.1)}
    # a model saturated (an infinite p99) gets none: a return must not leave it so
    saturated = demand(3.0, 400.0)
    assert capacity.allowance(capacity.predict([BASELINE], saturated), saturated, 0.5) == {}


def test_carries_with_an_allowance_counts_a_p99_within_it_as_carried() -> None:
    small, large = demand(3.0, 165.0), demand(15.0, 165.0)
    for d, within in ((small, True), (large, False)):
        allowed = capacity.allowance(capacity.predict([BASELINE, LENT_A], d), d, 0.1)
        assert not capacity.carries([BASELINE], d)
        assert capacity.carries([BASELINE], d, allowed=allowed) is within
    # a model within its objective before gets no allowance: going over still refuses
    edge = demand(1.5, 172.5)
    before = capacity.predict([BASELINE, LENT_A], edge)
    assert before["a"] <= 0.100 < capacity.predict([BASELINE], edge)["a"]
    allowed = capacity.allowance(before, edge, 1.0)
    assert "a" not in allowed
    assert not capacity.carries([BASELINE], edge, allowed=allowed)


def config(slack: float) -> BridgeConfig:
    return BridgeConfig(
        models={
            "a": ModelOverride(slo_p99_ms=100, min_replicas=1, max_replicas=6),
            "b": ModelOverride(slo_p99_ms=60, min_replicas=1, max_replicas=6),
        },
        policy=PolicyConfig(
            max_lent_nodes=1,
            return_dwell_s=300,
            scale_in_cooldown_s=120,
            forecast_window_s=60,
            lend_lead_s=6,
            return_slack=slack,
        ),
    )


def samples(rate: float, p99_ms: float, n: int = 61) -> tuple[ModelSample, ...]:
    """`n` samples at `rate` and `p99_ms`, one tick apart, ending now."""
    return tuple(
        ModelSample(T0 - (n - 1 - i) * TICK, p99_ms, rate, 0.0, p99_ms / 2, 20.0) for i in range(n)
    )


def snap(cfg: BridgeConfig, rate_a: float, rate_b: float, p99_b_ms: float = 25.0) -> Snapshot:
    """The lease of `a` on e0 calm for the dwell; `b` at `rate_b` on the reserved replica
    (at the return's rate, 1.5 x, the capacity model finds it short with every replica)."""
    lease = LeaseView(
        1, "e0", "elastic", "preempt", LeaseState.SERVING, ("a",), T0 - 4000, T0 - 3900
    )
    return Snapshot(
        (
            NodeView("n4", "inference", True, 4, has_triton=True),
            NodeView("e0", "elastic", True, 4, has_triton=True),
        ),
        (ReplicaView("n4", ("a", "b"), gpus=4), ReplicaView("e0", ("a",), 1, gpus=4)),
        {"a": samples(rate_a, 20.0), "b": samples(rate_b, p99_b_ms)},
        (lease,),
        models=toml_models(cfg),
    )


def test_without_the_slack_a_model_short_elsewhere_holds_the_lease() -> None:
    cfg = config(0.0)
    assert decide(snap(cfg, 2.0, 110.0), cfg, T0) == []


def test_with_the_slack_the_lease_goes_and_says_which_model_it_leaves_short() -> None:
    cfg = config(0.1)
    (action,) = decide(snap(cfg, 2.0, 110.0), cfg, T0)
    assert isinstance(action, Return) and action.lease_id == 1
    assert action.reason.endswith("(b short as before, within return_slack)")


def test_the_slack_bounds_how_far_a_return_may_raise_the_p99() -> None:
    # a's rate moved to the reserved replica takes b's predicted p99 up by 17%
    assert decide(snap(config(0.1), 10.0, 100.0), config(0.1), T0) == []
    (action,) = decide(snap(config(0.2), 10.0, 100.0), config(0.2), T0)
    assert isinstance(action, Return)


def test_a_model_short_by_the_model_but_slow_by_its_latency_holds_the_lease() -> None:
    # b's p99 of 40 ms is over low_watermark x its 60 ms: not calm, no allowance
    cfg = config(0.1)
    assert decide(snap(cfg, 2.0, 110.0, p99_b_ms=40.0), cfg, T0) == []


def test_a_model_within_its_objective_before_may_not_be_pushed_over_it() -> None:
    cfg = config(1.0)
    # a (100 ms) is carried with its lease and over without it at this rate
    assert decide(snap(cfg, 1.0, 115.0), cfg, T0) == []
