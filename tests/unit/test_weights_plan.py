"""The weight-cache plan (`bridge.policy.weights.plan_cache`) on literal caches and
forecasts: the first nodes in lend order get the most wanted weights, a held copy counts,
unwanted copies go least recently used first and only for room, a wanted copy is never
evicted for another, budgets and the staging limit hold; its inputs, the forecast's
expected lends (the capacity model's nodes) and the lend order (`choose_nodes`')."""

from __future__ import annotations

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import LeaseView, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy.weights import (
    CachedCopy,
    Evict,
    NodeCache,
    Stage,
    Wanted,
    expected_lends,
    lend_places,
    plan_cache,
)

GB = 1_000_000_000


def test_the_first_nodes_in_lend_order_get_the_most_wanted_weights() -> None:
    nodes = [NodeCache(f"n{i}", 10 * GB) for i in (1, 2, 3)]
    wanted = [Wanted("small", "1", 2 * GB, 1), Wanted("llm", "3", 6 * GB, 2)]
    plan = plan_cache(nodes, wanted, max_staging=10)
    assert plan.stage == (
        Stage("n1", "llm", "3", 6 * GB),
        Stage("n1", "small", "1", 2 * GB),
        Stage("n2", "llm", "3", 6 * GB),
    )
    assert plan.evict == () and plan.unplaced == ()


def test_a_copy_held_anywhere_counts_and_is_not_staged_again() -> None:
    nodes = [
        NodeCache("n1", 10 * GB),
        NodeCache("n2", 10 * GB, (CachedCopy("llm", "3", 6 * GB),)),
    ]
    plan = plan_cache(nodes, [Wanted("llm", "3", 6 * GB, 1)], max_staging=10)
    assert plan.stage == () and plan.evict == ()
    # a staging in flight holds its place too
    nodes[1] = NodeCache("n2", 10 * GB, (CachedCopy("llm", "3", 6 * GB, complete=False),))
    assert plan_cache(nodes, [Wanted("llm", "3", 6 * GB, 1)], max_staging=10).stage == ()


def test_unwanted_copies_go_least_recently_used_first_and_only_for_room() -> None:
    old = CachedCopy("old", "1", 4 * GB, last_used=100.0)
    recent = CachedCopy("recent", "1", 4 * GB, last_used=900.0)
    nodes = [NodeCache("n1", 10 * GB, (recent, old))]
    plan = plan_cache(nodes, [Wanted("llm", "3", 5 * GB, 1)], max_staging=1)
    assert plan.evict == (Evict("n1", "old", "1", 4 * GB),)  # 8 used + 5 > 10: one must go
    assert plan.stage == (Stage("n1", "llm", "3", 5 * GB),)


def test_a_copy_still_staging_is_never_evicted_and_holds_its_room() -> None:
    flight = CachedCopy("other", "1", 4 * GB, complete=False, last_used=0.0)
    done = CachedCopy("old", "1", 4 * GB, last_used=500.0)
    nodes = [NodeCache("n1", 10 * GB, (flight, done))]
    plan = plan_cache(nodes, [Wanted("llm", "3", 5 * GB, 1)], max_staging=1)
    # the complete one goes, though the staging one was used longer ago
    assert plan.evict == (Evict("n1", "old", "1", 4 * GB),)
    assert plan.stage == (Stage("n1", "llm", "3", 5 * GB),)
    # and what does not fit beside the copy in flight is not placed
    big = plan_cache(nodes, [Wanted("big", "1", 7 * GB, 1)], max_staging=1)
    assert big.stage == () and big.evict == () and big.unplaced == ((("big", "1"), 1),)


def test_a_wanted_copy_is_never_evicted_and_too_large_a_version_is_not_placed() -> None:
    held = CachedCopy("llm", "3", 6 * GB, last_used=0.0)
    nodes = [NodeCache("n1", 10 * GB, (held,)), NodeCache("n2", 3 * GB)]
    wanted = [Wanted("llm", "3", 6 * GB, 1), Wanted("big", "1", 5 * GB, 1)]
    plan = plan_cache(nodes, wanted, max_staging=10)
    assert plan.evict == () and plan.stage == ()  # 6 + 5 > 10 on n1, 5 > 3 on n2
    assert plan.unplaced == ((("big", "1"), 1),)


def test_staging_is_limited_per_plan_and_the_rest_waits() -> None:
    nodes = [NodeCache(f"n{i}", 10 * GB) for i in (1, 2, 3)]
    plan = plan_cache(nodes, [Wanted("llm", "3", 6 * GB, 3)], max_staging=1)
    assert plan.stage == (Stage("n1", "llm", "3", 6 * GB),)
    assert plan.unplaced == ((("llm", "3"), 2),)
    assert plan_cache(nodes, [Wanted("llm", "3", 6 * GB, 3)], max_staging=0).stage == ()


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="n1: cache budget"):
        NodeCache("n1", -1)
    with pytest.raises(ValueError, match="llm/3"):
        Wanted("llm", "3", -5, 1)
    with pytest.raises(ValueError, match="max_staging"):
        plan_cache([], [], max_staging=-1)


NOW = 1_800_000_000.0
CONFIG = BridgeConfig(
    models={"a": ModelConfig(slo_p99_ms=100, max_replicas=3, instances=1)},
    pools={
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
    },
    policy=PolicyConfig(max_lent_nodes=8, capacity_headroom=1.25),
)


def _snapshot(*nodes: NodeView, leases: tuple[LeaseView, ...] = ()) -> Snapshot:
    samples = tuple(ModelSample(NOW - 5 * i, 50.0, 10.0, compute_ms=20.0) for i in range(3))
    return Snapshot(
        nodes,
        (ReplicaView("n0", ("a",), gpus=1),),
        {"a": samples},
        leases,
        models=toml_models(CONFIG),
    )


def test_expected_lends_are_the_capacity_models_nodes_at_the_forecast_rate() -> None:
    s = _snapshot()
    # one instance of 20 ms carries under 50 req/s: 10 req/s x 1.25 fits the baseline,
    # 100 x 1.25 needs more replicas, a flood is capped by max_replicas (3 in all)
    assert expected_lends(s, CONFIG, {"a": 10.0}) == {}
    more = expected_lends(s, CONFIG, {"a": 100.0})
    assert 1 <= more["a"] <= 2
    assert expected_lends(s, CONFIG, {"a": 1e6}) == {"a": 2}
    assert expected_lends(s, CONFIG, {}) == {}  # no forecast: nothing expected


def test_lend_order_is_choose_nodes_order_then_the_lent_nodes() -> None:
    lease = LeaseView(1, "e0", "elastic", "preempt", "serving", ("a",), NOW - 99, NOW - 9)
    s = _snapshot(
        NodeView("e0", "elastic", True, 1),
        NodeView("e1", "elastic", True, 1),
        NodeView("e2", "elastic", True, 1, cached=frozenset({"a"})),
        NodeView("n0", "inference", True, 1, has_triton=True),
        leases=(lease,),
    )
    assert [n.name for n in lend_places(s, CONFIG, NOW, ["a"])[0]] == ["e2", "e1", "e0"]
    assert [n.name for n in lend_places(s, CONFIG, NOW, [])[0]] == ["e1", "e2", "e0"]
