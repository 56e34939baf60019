"""Replicas that span nodes (`bridge.policy.gang`), on literal inputs: a replica's GPUs and
nodes, gangs planned all or nothing within one pool and GPU count, and a gang's state
from its members' (one member failing fails the gang)."""

from __future__ import annotations

import pytest

from bridge.lifecycle import LeaseState
from bridge.policy.gang import gang_state, gpus_per_replica, nodes_per_replica, plan_gangs
from bridge.policy.snapshot import NodeView

S = LeaseState


def nodes(pool: str, *names: str, gpus: int = 8) -> list[NodeView]:
    return [NodeView(name, pool, True, gpus) for name in names]


def names(gangs: list[tuple[NodeView, ...]]) -> list[tuple[str, ...]]:
    return [tuple(n.name for n in gang) for gang in gangs]


@pytest.mark.parametrize(
    ("facts", "gpus"),
    [
        ({}, None),  # nothing said: whole nodes, as today
        ({"instance_gpus": 1}, 1),  # a 7B model on one named GPU
        ({"tensor_parallel": 4}, 4),  # a 70B model
        ({"tensor_parallel": 8, "pipeline_parallel": 2}, 16),  # a 405B model
        ({"instance_gpus": 4, "tensor_parallel": 4}, 4),  # the ranks' GPUs named: the same 4
        ({"instance_gpus": 2, "tensor_parallel": 4}, 4),
        ({"pipeline_parallel": 2}, 2),
    ],
)
def test_gpus_per_replica(facts: dict[str, int], gpus: int | None) -> None:
    assert gpus_per_replica(**facts) == gpus


def test_gpus_per_replica_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="tensor_parallel"):
        gpus_per_replica(tensor_parallel=0)


@pytest.mark.parametrize(
    ("gpus", "node_gpus", "count"),
    [(None, 8, 1), (1, 8, 1), (8, 8, 1), (9, 8, 2), (16, 8, 2), (16, 4, 4)],
)
def test_nodes_per_replica(gpus: int | None, node_gpus: int, count: int) -> None:
    assert nodes_per_replica(gpus, node_gpus) == count


def test_gangs_take_the_cheapest_nodes_of_one_pool_in_order() -> None:
    candidates = nodes("elastic", "e1", "e2", "e3", "e4")
    assert names(plan_gangs(candidates, 2, 2)) == [("e1", "e2"), ("e3", "e4")]
    assert names(plan_gangs(candidates, 2, 1)) == [("e1", "e2")]


def test_too_few_nodes_for_a_gang_give_no_partial_gang() -> None:
    assert plan_gangs(nodes("elastic", "e1"), 2, 1) == []
    # three nodes, two replicas of two: one gang, the third node left untaken
    assert names(plan_gangs(nodes("elastic", "e1", "e2", "e3"), 2, 2)) == [("e1", "e2")]


def test_a_gang_never_mixes_pools_even_when_that_is_cheaper() -> None:
    e1, e2 = nodes("elastic", "e1", "e2")
    (t1,) = nodes("training", "t1")
    # e1, t1 are the two cheapest, but a gang is one Slurm job: one partition
    assert names(plan_gangs([e1, t1, e2], 2, 1)) == [("e1", "e2")]
    assert plan_gangs([e1, t1], 2, 1) == []


def test_the_gang_whose_dearest_node_comes_first_is_planned_first() -> None:
    a1, a2 = nodes("a", "a1", "a2")
    b1, b2 = nodes("b", "b1", "b2")
    assert names(plan_gangs([a1, b1, b2, a2], 2, 1)) == [("b1", "b2")]
    assert names(plan_gangs([a1, b1, b2, a2], 2, 2)) == [("b1", "b2"), ("a1", "a2")]


def test_a_gang_never_mixes_gpu_counts() -> None:
    (big1,) = nodes("elastic", "big1", gpus=8)
    (small,) = nodes("elastic", "small", gpus=4)
    (big2,) = nodes("elastic", "big2", gpus=8)
    assert names(plan_gangs([big1, small, big2], 2, 1)) == [("big1", "big2")]


def test_gangs_of_one_node_are_the_candidates_in_their_order() -> None:
    candidates = [*nodes("training", "t1"), *nodes("elastic", "e1", gpus=4)]
    assert names(plan_gangs(candidates, 1, 5)) == [("t1",), ("e1",)]
    assert plan_gangs(candidates, 1, 0) == []
    with pytest.raises(ValueError, match="at least one node"):
        plan_gangs(candidates, 0, 1)


@pytest.mark.parametrize(
    ("members", "state"),
    [
        ((S.SERVING, S.SERVING), S.SERVING),
        ((S.SERVING, S.FAILED), S.FAILED),  # one node failing fails the replica
        ((S.REQUESTED, S.FAILED, S.SERVING), S.FAILED),
        ((S.STARTING, S.SERVING), S.STARTING),  # serves only once all serve
        ((S.SUBMITTED, S.STARTING, S.SERVING), S.SUBMITTED),
        ((S.RELEASING, S.RETURNED), S.RELEASING),  # returned only once all are
        ((S.DRAINING, S.RELEASING), S.DRAINING),
        ((S.RETURNED, S.RETURNED), S.RETURNED),
        (("serving", "starting"), S.STARTING),  # plain strings name states too
    ],
)
def test_gang_state(members: tuple[LeaseState, ...], state: LeaseState) -> None:
    assert gang_state(members) == state


def test_a_gang_has_members() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        gang_state([])


def test_a_models_replica_gpus_come_from_its_facts() -> None:
    from bridge.config import ModelConfig
    from bridge.policy.gang import replica_gpus

    assert replica_gpus(ModelConfig(slo_p99_ms=100)) is None  # whole nodes
    tp = ModelConfig(slo_p99_ms=100, tensor_parallel=4, pipeline_parallel=2)
    assert replica_gpus(tp) == 8
    assert replica_gpus(ModelConfig(slo_p99_ms=100, instance_gpus=3, tensor_parallel=2)) == 3


def test_a_lends_gpus_are_its_largest_replicas_or_whole_nodes() -> None:
    from bridge.config import ModelConfig
    from bridge.policy.gang import lend_gpus

    models = {
        "one": ModelConfig(slo_p99_ms=100, instance_gpus=1),
        "tp2": ModelConfig(slo_p99_ms=100, tensor_parallel=2),
        "whole": ModelConfig(slo_p99_ms=100),
    }
    assert lend_gpus(models, ["one"]) == 1
    assert lend_gpus(models, ["one", "tp2"]) == 2  # one server holds both
    assert lend_gpus(models, ["one", "whole"]) is None
    assert lend_gpus(models, ["unknown"]) is None
    assert lend_gpus(models, []) is None
