"""Partial lends sized to the demand (issue 32): the capacity plan sizes each lend of a
model whose replica takes k GPUs to the fewest m x k GPUs of its node that carry its
models (`capacity.plan_lends`), the node choice takes what a node can give when none
gives that many (`nodes.choose_sized`), and `decide` lends one node of m x k GPUs, not
m nodes of k each. Literal groups, demands and nodes; a fixed clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import (
    JobView,
    Lend,
    ModelSample,
    NodeView,
    ReplicaView,
    Snapshot,
    capacity,
    decide,
)
from bridge.policy.capacity import Demand, Group
from bridge.policy.nodes import choose_sized

NOW = 1_800_000_000.0
HOUR = 3600.0


def yes(model: str, replicas: int) -> bool:
    return True


#: 20 ms a request, 100 ms p99 objective, sharing its replica's GPUs (one execution each)
A = Demand(150.0, 0.02, 0.1)


def test_a_lend_is_sized_to_the_fewest_replicas_worth_that_carry_it() -> None:
    # 150 req/s x 20 ms = 3 busy GPUs: one lend of a 1-GPU model's replicas, sized to the
    # fewest GPUs that carry it, where one GPU fewer does not
    ((models, gpus),) = capacity.plan_lends([], {"a": A}, [8] * 4, yes, replica_gpus=lambda m: 1)
    assert models == ("a",) and 3 < gpus < 8
    assert capacity.carries([Group(("a",), 1, gpus)], {"a": A})
    assert not capacity.carries([Group(("a",), 1, gpus - 1)], {"a": A})


def test_a_lend_is_a_multiple_of_one_replicas_gpus() -> None:
    ((_, gpus),) = capacity.plan_lends([], {"a": A}, [8] * 4, yes, replica_gpus=lambda m: 3)
    assert gpus == 6  # 3 GPUs saturate at 3 busy; 6 carry
    assert capacity.carries([Group(("a",), 1, 6)], {"a": A})


def test_a_deficit_beyond_a_node_takes_whole_nodes_then_the_rest() -> None:
    # 400 req/s x 20 ms = 8 busy GPUs: one whole node saturates, the second is sized
    big = {"a": Demand(400.0, 0.02, 0.1)}
    plan = capacity.plan_lends([], big, [8] * 4, yes, replica_gpus=lambda m: 1)
    assert len(plan) == 2 and plan[0][1] == 8 and 0 < plan[1][1] <= 8
    held = [Group(models, 1, g) for models, g in plan]
    assert capacity.carries(held, big)
    # one slot: the one node, whole
    assert capacity.plan_lends([], big, [8], yes, replica_gpus=lambda m: 1) == [(("a",), 8)]


def test_without_replica_sizes_every_lend_is_a_whole_node_as_plan_nodes() -> None:
    demand = {"a": Demand(75.0, 0.02, 0.1, instances=1)}
    base = [Group(("a",), 1, 4)]
    whole = capacity.plan_nodes(base, demand, [4] * 5, yes)
    assert capacity.plan_lends(base, demand, [4] * 5, yes) == [(m, 4) for m in whole]
    # a replica of the node's GPUs or more (a gang's) is a whole node too
    sized = capacity.plan_lends(base, demand, [4] * 5, yes, replica_gpus=lambda m: 8)
    assert sized == [(m, 4) for m in whole]


def test_small_replicas_are_not_lent_in_a_gang_of_the_largest() -> None:
    # a (1 GPU) and b (a 16-GPU gang) both late: one replica of both would be b's gang of
    # two whole nodes; with small_apart (the per-GPU ranking's) a is lent its own GPUs
    # first, b a lend of its own after
    sizes = {"a": 1, "b": 16}

    def size(models: tuple[str, ...]) -> int:
        return max(sizes[m] for m in models)

    demand = {"a": A, "b": Demand(100.0, 0.02, 0.1)}
    plan = capacity.plan_lends([], demand, [8] * 4, yes, replica_gpus=size, small_apart=True)
    assert plan[0][0] == ("a",) and 3 < plan[0][1] < 8
    assert [models for models, _ in plan[1:]] == [("b",)]
    # each model alone, or all alike in size, is lent as before
    alone = capacity.plan_lends(
        [], {"b": demand["b"]}, [8] * 4, yes, replica_gpus=size, small_apart=True
    )
    assert alone == [(("b",), 8)]
    together = capacity.plan_lends(
        [], demand, [8] * 4, yes, replica_gpus=lambda m: 16, small_apart=True
    )
    assert together[0][0] == ("a", "b")
    # without small_apart (the default ranking: whole nodes stay), one lend of both
    assert capacity.plan_lends([], demand, [8] * 4, yes, replica_gpus=size)[0][0] == ("a", "b")


def test_a_model_without_room_is_not_planned() -> None:
    assert (
        capacity.plan_lends([], {"a": A}, [8], lambda m, n: False, replica_gpus=lambda m: 1) == []
    )


# ---- choose_sized: what the nodes can give ---------------------------------------------

CONFIG = BridgeConfig(
    pools={
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
    },
    models={"a": ModelConfig(slo_p99_ms=100, max_replicas=8, instance_gpus=1)},
    policy=PolicyConfig(
        max_lent_nodes=4, preempt_guard_s=600, capacity_headroom=1.0, sized_lends=True
    ),
)
#: a 6-GPU job requeued within the guard: its node gives its 2 free GPUs, no more
GUARDED = JobView("g", 6, NOW - 60, restarts=1, submitted_at=NOW - 120)
E1 = NodeView("e1", "elastic", True, 8, (GUARDED,))
E2 = NodeView("e2", "elastic", True, 8)
#: three 2-GPU jobs an hour old: 2 free, the others by requeueing
E3 = NodeView("e3", "elastic", True, 8, tuple(JobView(f"j{i}", 2, NOW - HOUR) for i in range(3)))
RESERVED = NodeView("r1", "inference", True, 8, has_triton=True, triton_gpus=8)


def snapshot(*nodes: NodeView) -> Snapshot:
    return Snapshot((*nodes, RESERVED), (ReplicaView("r1", ("a",), gpus=8),), {}, ())


def test_a_node_that_cannot_give_the_planned_gpus_gives_what_it_can() -> None:
    got = choose_sized(snapshot(E1, E2), CONFIG, NOW, 2, gpus=4, step=1)
    assert [(n.name, g) for n, g in got] == [("e2", 4), ("e1", 2)]
    # in steps of one replica: 2-GPU replicas give e1's 2, 3-GPU ones nothing there
    got = choose_sized(snapshot(E1, E2), CONFIG, NOW, 2, gpus=6, step=3)
    assert [(n.name, g) for n, g in got] == [("e2", 6)]


def test_a_busy_node_gives_its_free_gpus_and_the_jobs_within_the_budget() -> None:
    # a budget of one requeue: e3 gives its 2 free and one job's 2
    tight = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"max_preemptions_per_hour": 1})}
    )
    ((node, gpus),) = choose_sized(snapshot(E3), tight, NOW, 1, gpus=8, step=1)
    assert (node.name, gpus) == ("e3", 4)
    ((node, gpus),) = choose_sized(snapshot(E3), CONFIG, NOW, 1, gpus=8, step=1)
    assert (node.name, gpus) == ("e3", 8)
    with pytest.raises(ValueError):
        choose_sized(snapshot(E3), CONFIG, NOW, 1, gpus=8, step=0)


# ---- decide: one node of m x k GPUs, not m nodes of k ----------------------------------


def samples(rate: float) -> tuple[ModelSample, ...]:
    """A minute of samples at `rate` req/s, 20 ms of compute each, p99 at 90 ms (the
    requests queue: the capacity model's deficit is not contradicted)."""
    return tuple(ModelSample(NOW - 5.0 * i, 90.0, rate, 0.0, 60.0, 20.0) for i in range(12, -1, -1))


def test_decide_lends_one_node_sized_to_the_deficit() -> None:
    # the baseline's 8 GPUs carry 300 req/s at most; at 450 req/s (3 busy GPUs more and
    # the queueing) a 1-GPU model gets one lend of a few GPUs of one node
    snap = replace(
        snapshot(E2, replace(E2, name="e4")),
        history={"a": samples(450.0)},
        models=toml_models(CONFIG),
    )
    lends = [a for a in decide(snap, CONFIG, NOW) if isinstance(a, Lend)]
    assert len(lends) == 1
    (lend,) = lends
    assert lend.gpus is not None and 1 < lend.gpus < 8
    base = Group(("a",), 1, 8)
    demand = {"a": Demand(450.0, 0.02, 0.1)}
    assert capacity.carries([base, Group(("a",), 1, lend.gpus)], demand)
    assert not capacity.carries([base, Group(("a",), 1, lend.gpus - 1)], demand)
    # whole nodes where the site keeps them
    whole = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"partial_lends": False})}
    )
    lends = [a for a in decide(snap, whole, NOW) if isinstance(a, Lend)]
    assert [lend.gpus for lend in lends] == [None]
