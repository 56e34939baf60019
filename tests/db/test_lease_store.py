"""LeaseStore against real databases (SQLite file and PostgreSQL): the state machine as
persisted, its history, idempotency, one open lease per node, and concurrent writers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, insert, text
from sqlalchemy.exc import IntegrityError

from bridge.daemon.actuator import record_of
from bridge.leases.errors import (
    IllegalTransition,
    LeaseNotFound,
    NodeAlreadyLeased,
    RequestKeyConflict,
    UnexpectedState,
)
from bridge.leases.models import Lease, LendMode
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState

S = LeaseState
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lend(store: LeaseStore, node: str = "n3", key: str = "lend-1", t: float = 0) -> Lease:
    return store.create(node, "elastic", "preempt", ["busy"], key, at(t))


def walk(store: LeaseStore, lease_id: int, *states: LeaseState, t: float = 1) -> Lease:
    lease = store.get(lease_id)
    for i, state in enumerate(states):
        lease = store.set_status(lease_id, state, at(t + i), f"to {state}")
    return lease


def moves(store: LeaseStore, lease_id: int) -> list[tuple[LeaseState | None, LeaseState]]:
    return [(e.from_state, e.to_state) for e in store.history(lease_id)]


def test_happy_path_with_history(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    assert (lease.state, lease.lend_mode, lease.models) == (S.REQUESTED, LendMode.PREEMPT, ["busy"])
    store.set_status(lease.id, S.SUBMITTED, at(1), "sbatch", slurm_job_id="4242")
    store.set_status(lease.id, S.STARTING, at(2), "job running")
    store.set_status(lease.id, S.SERVING, at(3), "ready", models=["busy", "echo"])
    assert [x.id for x in store.open_leases()] == [lease.id]
    store.set_status(lease.id, S.DRAINING, at(4), "scale-in", detail="p99 40 ms < low mark")
    store.set_status(lease.id, S.RELEASING, at(5), "no request pending")
    done = store.set_status(lease.id, S.RETURNED, at(6), "job cancelled")

    got = store.get(lease.id)
    for read in (done, got):
        assert read.state == S.RETURNED
        assert read.slurm_job_id == "4242"
        assert read.models == ["busy", "echo"]
        assert (read.created_at, read.updated_at, read.reason) == (at(0), at(6), "job cancelled")
    assert moves(store, lease.id) == [
        (None, S.REQUESTED),
        (S.REQUESTED, S.SUBMITTED),
        (S.SUBMITTED, S.STARTING),
        (S.STARTING, S.SERVING),
        (S.SERVING, S.DRAINING),
        (S.DRAINING, S.RELEASING),
        (S.RELEASING, S.RETURNED),
    ]
    events = store.history(lease.id)
    assert [e.at for e in events] == [at(i) for i in range(7)]
    assert all(e.at.tzinfo is UTC for e in events)
    assert events[1].detail == "slurm_job_id='4242'"
    assert events[3].detail == "models=['busy', 'echo']"
    assert events[4].detail == "p99 40 ms < low mark"
    assert events[4].reason == "scale-in"
    assert store.open_leases() == []
    assert store.by_job("4242") is not None
    assert store.by_job("9999") is None
    assert [x.id for x in store.by_node("n3")] == [lease.id]
    assert store.by_node("n3", open_only=True) == []


def test_create_is_idempotent_by_request_key(store: LeaseStore) -> None:
    first = lend(store)
    assert first.id is not None
    again = lend(store, t=30)
    assert again.id == first.id
    assert again.created_at == at(0)
    # a retry after the lease moved on returns the lease as it is now, never a second one
    store.set_status(first.id, S.SUBMITTED, at(1), "sbatch", slurm_job_id="7")
    retry = store.create("n3", "elastic", LendMode.PREEMPT, ["busy"], "lend-1", at(60))
    assert (retry.id, retry.state) == (first.id, S.SUBMITTED)
    assert len(store.by_node("n3")) == 1
    assert moves(store, first.id) == [(None, S.REQUESTED), (S.REQUESTED, S.SUBMITTED)]
    with pytest.raises(RequestKeyConflict, match="lend-1"):
        store.create("n4", "elastic", "preempt", ["busy"], "lend-1", at(61))


def test_set_status_repeated_is_a_noop(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    store.set_status(lease.id, S.SUBMITTED, at(1), "sbatch", slurm_job_id="11")
    # a retry (say, after a crash between the write and its acknowledgement): nothing written
    same = store.set_status(lease.id, S.SUBMITTED, at(9), "retry", slurm_job_id="12")
    assert (same.state, same.slurm_job_id, same.updated_at, same.reason) == (
        S.SUBMITTED,
        "11",
        at(1),
        "sbatch",
    )
    assert store.get(lease.id).slurm_job_id == "11"
    assert len(store.history(lease.id)) == 2


def test_illegal_move_refused_and_nothing_written(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    with pytest.raises(IllegalTransition, match="requested -> serving") as err:
        store.set_status(lease.id, S.SERVING, at(5), "skip ahead", slurm_job_id="99")
    assert (err.value.old, err.value.new, err.value.lease_id) == ("requested", "serving", lease.id)
    after = store.get(lease.id)
    assert (after.state, after.slurm_job_id, after.updated_at, after.reason) == (
        S.REQUESTED,
        None,
        at(0),
        "lend requested",
    )
    assert moves(store, lease.id) == [(None, S.REQUESTED)]
    assert store.by_job("99") is None


def test_final_state_never_changes(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    walk(store, lease.id, S.SUBMITTED, S.STARTING, S.FAILED, S.RETURNED)
    for state in LeaseState:
        if state is S.RETURNED:
            continue
        with pytest.raises(IllegalTransition, match=f"returned -> {state}"):
            store.set_status(lease.id, state, at(50), "too late")
    store.set_status(lease.id, S.RETURNED, at(51), "again")  # same state: no-op
    assert store.get(lease.id).updated_at == at(4)
    assert moves(store, lease.id)[-2:] == [(S.STARTING, S.FAILED), (S.FAILED, S.RETURNED)]


def test_abandoned_before_submission_frees_the_node(store: LeaseStore) -> None:
    lease = store.create("n1", "training", "drain", ["busy"], "lend-n1", at(0))
    assert lease.id is not None
    store.set_status(lease.id, S.RETURNED, at(300), "abandoned: drain wait over 300s")
    second = store.create("n1", "training", "drain", ["busy"], "lend-n1-b", at(301))
    assert second.id != lease.id
    assert [x.id for x in store.by_node("n1")] == [lease.id, second.id]
    assert [x.id for x in store.by_node("n1", open_only=True)] == [second.id]


def test_one_open_lease_per_node(store: LeaseStore) -> None:
    first = lend(store)
    assert first.id is not None
    store.set_status(first.id, S.SUBMITTED, at(1), "sbatch", slurm_job_id="5")
    store.set_status(first.id, S.FAILED, at(2), "job vanished")  # failed is still open
    with pytest.raises(NodeAlreadyLeased) as err:
        lend(store, key="lend-2", t=3)
    assert "n3" in str(err.value) and f"lease {first.id}" in str(err.value)
    assert (err.value.node, err.value.lease_id, err.value.state) == ("n3", first.id, "failed")
    other = lend(store, node="n4", key="lend-3", t=3)  # another node is free
    assert len(store.open_leases()) == 2
    store.set_status(first.id, S.RETURNED, at(4), "cleaned up")
    again = lend(store, key="lend-2", t=5)
    assert [x.id for x in store.open_leases()] == [other.id, again.id]


def test_database_refuses_a_second_open_lease_even_past_the_store(
    store: LeaseStore, engine: Engine
) -> None:
    lend(store)
    row: dict[str, Any] = {
        "node": "n3",
        "pool": "elastic",
        "lend_mode": "preempt",
        "models": [],
        "state": "starting",
        "request_key": "sneaky",
        "reason": "",
        "created_at": at(1),
        "updated_at": at(1),
    }
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(Lease).values(**row))
    with engine.begin() as conn:  # a returned lease of the same node is fine
        conn.execute(insert(Lease).values(**{**row, "state": "returned"}))


def test_times_are_utc_aware_and_naive_times_refused(store: LeaseStore) -> None:
    cest = timezone(timedelta(hours=2))
    local = datetime(2026, 6, 1, 14, 0, tzinfo=cest)
    lease = store.create("n3", "elastic", "preempt", [], "k", local)
    assert lease.id is not None
    read = store.get(lease.id)
    assert read.created_at == local
    assert read.created_at.tzinfo is UTC
    assert read.created_at.hour == 12
    with pytest.raises(ValueError, match="naive"):
        store.set_status(lease.id, S.SUBMITTED, datetime(2026, 6, 1, 15), "sbatch")
    with pytest.raises(ValueError, match="naive"):
        store.create("n4", "elastic", "preempt", [], "k2", datetime(2026, 6, 1, 15))
    assert moves(store, lease.id) == [(None, S.REQUESTED)]
    assert len(store.open_leases()) == 1


def test_expected_state_is_compare_and_set(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    walk(store, lease.id, S.SUBMITTED, S.STARTING, S.SERVING)
    with pytest.raises(UnexpectedState, match="expected state starting, found serving") as err:
        store.set_status(lease.id, S.FAILED, at(9), "not ready in time", expected=S.STARTING)
    assert isinstance(err.value, IllegalTransition)
    assert store.get(lease.id).state == S.SERVING
    # the no-op still wins over `expected`: someone already did what was asked
    store.set_status(lease.id, S.SERVING, at(9), "ready", expected=S.STARTING)
    assert len(store.history(lease.id)) == 4


def test_bad_calls(store: LeaseStore) -> None:
    with pytest.raises(LeaseNotFound):
        store.get(404)
    with pytest.raises(LeaseNotFound):
        store.set_status(404, S.SUBMITTED, at(0), "sbatch")
    lease = lend(store)
    assert lease.id is not None
    with pytest.raises(TypeError, match="node"):
        store.set_status(lease.id, S.SUBMITTED, at(1), "sbatch", node="n9")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="sequence"):
        store.create("n4", "elastic", "preempt", "busy", "k4", at(0))
    with pytest.raises(ValueError):
        store.create("n4", "elastic", "borrow", ["busy"], "k4", at(0))
    assert store.history(404) == []


# ---- concurrent writers: each thread gets its own connection from the engine's pool ----


def race(*calls: Callable[[], Lease]) -> list[Lease | Exception]:
    """Run the calls at the same instant on separate threads; their results or errors."""
    barrier = threading.Barrier(len(calls))

    def go(call: Callable[[], Lease]) -> Lease | Exception:
        barrier.wait(timeout=10)
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls))


@pytest.mark.parametrize("round_", range(3))
def test_race_from_starting_has_exactly_one_winner(store: LeaseStore, round_: int) -> None:
    lease = lend(store, node=f"n{round_}", key=f"race-{round_}")
    assert lease.id is not None
    lid = lease.id
    walk(store, lid, S.SUBMITTED, S.STARTING)
    results = race(
        lambda: store.set_status(lid, S.SERVING, at(10), "ready", expected=S.STARTING),
        lambda: store.set_status(lid, S.FAILED, at(10), "start timeout", expected=S.STARTING),
    )
    winners = [r for r in results if isinstance(r, Lease)]
    losers = [r for r in results if not isinstance(r, Lease)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert isinstance(losers[0], IllegalTransition)
    final = store.get(lid).state
    assert final == winners[0].state
    from_starting = [m for m in moves(store, lid) if m[0] == S.STARTING]
    assert from_starting == [(S.STARTING, final)]


def test_race_to_the_same_state_writes_once(store: LeaseStore) -> None:
    lease = lend(store)
    assert lease.id is not None
    lid = lease.id
    walk(store, lid, S.SUBMITTED, S.STARTING)
    results = race(
        lambda: store.set_status(lid, S.SERVING, at(10), "ready", expected=S.STARTING),
        lambda: store.set_status(lid, S.SERVING, at(11), "ready", expected=S.STARTING),
    )
    assert all(isinstance(r, Lease) and r.state == S.SERVING for r in results), results
    assert moves(store, lid).count((S.STARTING, S.SERVING)) == 1


def test_racing_creates_make_one_lease(store: LeaseStore) -> None:
    same_key = race(lambda: lend(store), lambda: lend(store))
    assert all(isinstance(r, Lease) for r in same_key), same_key
    assert len({r.id for r in same_key if isinstance(r, Lease)}) == 1
    other_keys = race(lambda: lend(store, "n4", "a"), lambda: lend(store, "n4", "b"))
    assert sorted(type(r).__name__ for r in other_keys) == ["Lease", "NodeAlreadyLeased"]
    assert len(store.open_leases()) == 2


def test_set_status_rereads_the_row_under_a_lock(
    store: LeaseStore, engine: Engine, database_url: str
) -> None:
    """PostgreSQL: while another transaction holds the row, set_status waits for it and then
    judges the state that transaction committed (no lost update)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("row locks: PostgreSQL (SQLite serializes writers with BEGIN IMMEDIATE)")
    lease = lend(store)
    assert lease.id is not None
    lid = lease.id
    walk(store, lid, S.SUBMITTED, S.STARTING)
    outcome: list[Lease | Exception] = []

    def mark_serving() -> None:
        try:
            outcome.append(store.set_status(lid, S.SERVING, at(10), "ready"))
        except Exception as exc:
            outcome.append(exc)

    with engine.connect() as other:
        other.execute(text("SELECT id FROM lease WHERE id = :id FOR UPDATE"), {"id": lid})
        worker = threading.Thread(target=mark_serving)
        worker.start()
        with engine.connect() as probe:
            deadline = time.monotonic() + 10
            while not probe.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one():
                assert time.monotonic() < deadline, "set_status never waited for the row lock"
                probe.rollback()
                time.sleep(0.01)
        assert not outcome
        other.execute(
            text("UPDATE lease SET state = 'failed', reason = 'job died' WHERE id = :id"),
            {"id": lid},
        )
        other.commit()
    worker.join(timeout=10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], IllegalTransition)
    assert "failed -> serving" in str(outcome[0])
    assert store.get(lid).state == S.FAILED


def test_a_lease_keeps_its_gpu_type_and_a_bad_one_is_refused(store: LeaseStore) -> None:
    # issue 32: a lend of MIG slices asks `--gres=gpu:<type>:k`; its lease keeps the type
    one = "h100_1g.10gb"
    made = store.create("m1", "mig", "preempt", ["small"], "k1", T0, gpus=1, gpu_type=one)
    assert made.id is not None
    view = record_of(store.get(made.id))
    assert (view.lent_gpus, view.gpu_type) == (1, one)
    (event,) = store.history(made.id)
    assert f"gpus=1 gpu_type={one}" in (event.detail or "")
    with pytest.raises(ValueError, match="GRES type"):
        store.create("m2", "mig", "preempt", ["small"], "k2", T0, gpus=1, gpu_type="a:b")
    with pytest.raises(ValueError, match="GRES type"):
        store.create("m2", "mig", "preempt", ["small"], "k3", T0, gpu_type=one)
    assert [lease.node for lease in store.open_leases()] == ["m1"]
    # a lease of any GPU, or of the whole node, has none, as before
    plain = store.create("n3", "elastic", "preempt", ["busy"], "k4", T0, gpus=2)
    assert plain.id is not None and record_of(store.get(plain.id)).gpu_type is None
