"""The weight-cache plan (`bridge.policy.weights.plan_cache`) on literal caches and
forecasts: the first nodes in lend order get the most wanted weights, a held copy counts,
unwanted copies go least recently used first and only for room, a wanted copy is never
evicted for another, budgets and the staging limit hold."""

from __future__ import annotations

import pytest

from bridge.policy.weights import CachedCopy, Evict, NodeCache, Stage, Wanted, plan_cache

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
