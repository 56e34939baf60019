"""Leases that share a node (issue 32: two models' replicas of some GPUs each on one
8-GPU node) in the lease store on SQLite and PostgreSQL: leases of some GPUs by
preemption share a node, each on the lowest port slot free; any other lease of a held
node is refused, as is a lease of some GPUs of a node a whole-node, drain or gang lease
holds; a returned lease's slot is taken again; concurrent creates get distinct slots; and
an adopted job's lease takes the slot its server listens on."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bridge.config import BridgeConfig, ModelConfig, PoolConfig
from bridge.daemon.actuator import Actuator, record_of
from bridge.daemon.observation import Observation
from bridge.daemon.planner import plan_orphans
from bridge.daemon.report import TickReport
from bridge.leases.errors import NodeAlreadyLeased
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.modelfacts import merge_models
from bridge.slurm.model import Node
from tests.unit.planner_literals import job

S = LeaseState
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _close(store: LeaseStore, lease_id: int, t: float) -> None:
    for i, state in enumerate((S.FAILED, S.RETURNED)):
        store.set_status(lease_id, state, at(t + i), f"to {state}")


def test_partial_preempt_leases_share_a_node_each_on_its_own_slot(store: LeaseStore) -> None:
    a = store.create("n4", "elastic", "preempt", ["m1"], "a", at(0), gpus=1)
    b = store.create("n4", "elastic", "preempt", ["m2"], "b", at(1), gpus=2)
    c = store.create("n4", "elastic", "preempt", ["m3"], "c", at(2), gpus=1)
    assert (a.slot, b.slot, c.slot) == (0, 1, 2)
    assert record_of(b).slot == 1
    (event,) = store.history(b.id or 0)
    assert "slot=1" in (event.detail or "")
    # the same key again is the same lease on the same slot, not a fourth
    assert store.create("n4", "elastic", "preempt", ["m2"], "b", at(3), gpus=2).id == b.id
    # a returned lease's slot is the lowest free again
    _close(store, b.id or 0, 4)
    d = store.create("n4", "elastic", "preempt", ["m4"], "d", at(10), gpus=1)
    assert d.slot == 1
    assert sorted(lease.slot for lease in store.open_leases()) == [0, 1, 2]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # a whole node is not shared, either way round
        ({"lend_mode": "preempt"}, {"lend_mode": "preempt", "gpus": 1}),
        ({"lend_mode": "preempt", "gpus": 1}, {"lend_mode": "preempt"}),
        # a drain-mode lease of some GPUs waits on the node's jobs: not shared
        ({"lend_mode": "drain", "gpus": 2}, {"lend_mode": "preempt", "gpus": 1}),
        ({"lend_mode": "preempt", "gpus": 1}, {"lend_mode": "drain", "gpus": 2}),
        # a gang's member is held whole
        ({"lend_mode": "preempt", "members": ["n4"]}, {"lend_mode": "preempt", "gpus": 1}),
    ],
)
def test_a_node_held_otherwise_is_not_shared(
    store: LeaseStore, first: dict[str, object], second: dict[str, object]
) -> None:
    node = "n9" if first.get("members") else "n4"
    store.create(node, "elastic", models=["m1"], request_key="one", now=at(0), **first)  # type: ignore[arg-type]
    with pytest.raises(NodeAlreadyLeased, match="n4 already has open lease"):
        store.create("n4", "elastic", models=["m2"], request_key="two", now=at(1), **second)  # type: ignore[arg-type]
    assert len(store.open_leases()) == 1


def test_concurrent_shares_of_a_node_take_distinct_slots(store: LeaseStore) -> None:
    store.create("n4", "elastic", "preempt", ["m0"], "first", at(0), gpus=1)
    barrier = threading.Barrier(4)
    made: list[int] = []
    errors: list[BaseException] = []

    def lend(i: int) -> None:
        barrier.wait()
        try:
            made.append(
                store.create("n4", "elastic", "preempt", [f"m{i}"], f"k{i}", at(1), gpus=1).slot
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=lend, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(made) == [1, 2, 3, 4]


def test_an_adopted_jobs_lease_takes_the_slot_its_server_is_on(store: LeaseStore) -> None:
    """Adoption (a job whose lease record was lost) names the slot: the lease takes it,
    and the next lease of the node the lowest slot left free."""
    adopted = store.create("n4", "elastic", "preempt", [], "adopt:77", at(0), gpus=1, slot=2)
    assert adopted.slot == 2
    nxt = store.create("n4", "elastic", "preempt", ["m1"], "after", at(1), gpus=1)
    assert nxt.slot == 0
    with pytest.raises(NodeAlreadyLeased, match="on slot 2"):
        store.create("n4", "elastic", "preempt", [], "adopt:78", at(2), gpus=1, slot=2)
    with pytest.raises(ValueError, match="slot=-1"):
        store.create("n4", "elastic", "preempt", [], "adopt:79", at(2), gpus=1, slot=-1)
    assert sorted(lease.slot for lease in store.open_leases()) == [0, 2]


def test_the_actuator_adopts_two_orphans_of_a_shared_node_on_their_slots(
    store: LeaseStore,
) -> None:
    """Two Triton jobs of lost lease records share n3 (4 GPUs), one GPU each, on ports
    8000 and 8020: the orphan pass adopts each as a lease of one GPU on the slot its
    server listens on (not both as the whole node, which the second would be refused)."""
    config = BridgeConfig(
        pools={
            "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
            "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        },
        models={"busy": ModelConfig(slo_p99_ms=100)},
    )
    n3 = Node("n3", "10.0.0.3", ("elastic",), "mixed", frozenset(), "", "a100", 4, 0)
    first = replace(job("100", on="n3", comment="stb:triton,stb:lease=5.100"), gpus=1)
    other = replace(job("200", on="n3", comment="stb:triton,stb:lease=6.100,stb:port=8020"), gpus=1)
    now = at(0)
    obs = Observation(
        now.timestamp(), {"n3": n3}, (first, other), frozenset(), (), {},
        models=merge_models(None, config.models),
    )  # fmt: skip
    actuator = Actuator(config, None, store, lambda _: None, None)  # type: ignore[arg-type]
    actuator.begin(obs, [])
    report = TickReport(now)
    for step in plan_orphans(obs, [], {}, config):
        assert actuator.run(step, now, report), report.lines()
    adopted = sorted(store.open_leases(), key=lambda x: x.slot)
    assert [(x.slurm_job_id, x.gpus, x.slot) for x in adopted] == [("100", 1, 0), ("200", 1, 2)]
