"""A gang lease (issue 32: one replica on several whole nodes, one Slurm job with `-N n`)
in the lease store on SQLite and PostgreSQL: its members are stored and read back, no
node is in two open leases whether it is a lease's first node or a gang's member, a
returned gang frees all its nodes, and a gang with a bad member list is refused with
nothing written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bridge.daemon.actuator import record_of
from bridge.leases.errors import NodeAlreadyLeased
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState

S = LeaseState
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_gang_holds_its_members_and_no_node_is_lent_twice(store: LeaseStore) -> None:
    gang = store.create("n1", "training", "drain", ["big"], "gang-1", at(0), members=["n2"])
    assert gang.id is not None and gang.members == ["n2"] and gang.gpus is None
    view = record_of(store.get(gang.id))
    assert view.nodes == ("n1", "n2") and view.members == ("n2",)
    (event,) = store.history(gang.id)
    assert "members=n2" in (event.detail or "")
    # the member cannot be lent alone, nor be the member of another gang
    with pytest.raises(NodeAlreadyLeased, match="node n2 already has open lease"):
        store.create("n2", "training", "drain", ["busy"], "lend-2", at(1))
    with pytest.raises(NodeAlreadyLeased, match="n2"):
        store.create("n3", "training", "drain", ["big"], "gang-2", at(1), members=["n2"])
    # a gang whose member is another lease's first node is refused too
    store.create("n4", "elastic", "preempt", ["busy"], "lend-4", at(1))
    with pytest.raises(NodeAlreadyLeased, match="n4"):
        store.create("n5", "elastic", "preempt", ["big"], "gang-3", at(2), members=["n4"])
    assert [lease.node for lease in store.open_leases()] == ["n1", "n4"]
    # the same key again is the same gang (idempotent), not a refusal
    again = store.create("n1", "training", "drain", ["big"], "gang-1", at(3), members=["n2"])
    assert again.id == gang.id
    # returned, its nodes are free again
    for i, state in enumerate((S.FAILED, S.RETURNED)):
        store.set_status(gang.id, state, at(4 + i), f"to {state}")
    lent = store.create("n2", "training", "drain", ["busy"], "lend-5", at(10))
    assert lent.members is None and record_of(lent).nodes == ("n2",)


@pytest.mark.parametrize(
    ("members", "gpus", "match"),
    [
        (["n1"], None, "other nodes"),  # the first node again
        (["n2", "n2"], None, "each once"),
        ([""], None, "other nodes"),
        (["n2"], 4, "whole nodes"),  # a gang is never a partial lend
    ],
)
def test_a_bad_gang_is_refused_and_nothing_written(
    store: LeaseStore, members: list[str], gpus: int | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        store.create("n1", "training", "drain", ["big"], "k", at(0), gpus=gpus, members=members)
    assert store.open_leases() == []
