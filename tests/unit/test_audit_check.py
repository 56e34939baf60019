"""`bridge.audit.check.reconcile` and `stb audit check` on the reconciler over fakes and a
real SQLite lease store: an operator's lend and return, a pool hold and lift and a fleet
switch, asked through `bridge.audit.asks` as `stb` and the API ask, agree with the trail
(each recorded once, a lend taken again too); a lease, request, hold or switch written
past those paths, an entry recorded twice, one naming nothing, and a changed entry are
each named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from bridge.audit.asks import (
    ask_lend,
    ask_return,
    hold_pool,
    release_pool,
    switch_fleet,
    trail_of,
)
from bridge.audit.check import reconcile
from bridge.cli import app
from bridge.leases.audit import Record
from bridge.leases.fleet import FleetStore
from bridge.leases.rollouts import RolloutStore
from tests.unit.fakes import N3, Harness, address_of, at, make_harness

PAST = "(written past the bridge, straight into the database?)"


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def _lent_and_returned(h: Harness) -> None:
    """n3 lent on an operator's ask, serving, then returned on another ask."""
    h.triton.server(address_of(N3), models={"busy": "READY"})
    ask_lend(h.requests, "n3", ["busy"], now=at(0), who="alice")
    for t in range(4):
        h.tick(t)
    assert h.lease(1).state.value == "serving"
    ask_return(h.requests, 1, now=at(4), who="bob")
    h.tick(4)
    h.tick(5)


def _findings(h: Harness) -> list[str]:
    return reconcile(h.store._engine).findings


def test_what_the_operator_and_the_daemon_did_agrees_with_the_trail(h: Harness) -> None:
    _lent_and_returned(h)
    queue = h.requests
    hold_pool(queue, "training", "maintenance", now=at(6))
    hold_pool(queue, "training", "again", now=at(7))  # the hold in force: a second entry
    release_pool(queue, "training", now=at(8))
    ask_return(queue, 99, now=at(8))  # refused by the daemon: its outcome is recorded too
    h.tick(8)
    assert release_pool(queue, "training", now=at(9)) is None  # refused: not held
    switch_fleet(FleetStore.beside(h.store), "separate", now=at(10), why="test")
    found = reconcile(h.store._engine)
    assert found.findings == []
    assert dict(found.checked) == {
        "leases": 1,
        "returned leases": 1,
        "lend requests": 1,
        "return requests": 2,
        "place requests": 0,
        "finished requests": 3,
        "pool holds": 1,
        "lifted holds": 1,
        "fleet switchs": 1,
        "rollouts": 0,
        "rollout moves": 0,
    }


def test_a_lend_taken_again_after_a_crash_is_in_the_trail_once(h: Harness) -> None:
    ask_lend(h.requests, "n3", ["busy"], now=at(0))
    finish = h.requests.finish
    h.requests.finish = lambda *a, **k: None  # type: ignore[method-assign]
    h.tick(0)  # lent, but the daemon "died" before finishing the request
    h.requests.finish = finish  # type: ignore[method-assign]
    h.restarted().run_once(at(1))
    assert _findings(h) == []


def test_a_lease_and_a_request_written_past_the_bridge_s_paths_are_named(h: Harness) -> None:
    ask_lend(h.requests, "n3", ["busy"], now=at(0))
    h.tick(0)
    h.store.create("n5", "training", "drain", ["busy"], "by-hand", at(1))  # no entry
    h.requests.request_return(1, at(2), "mallory")  # no entry
    h.requests.hold("training", at(3), "mallory")  # no entry
    assert _findings(h) == [
        f"lease 2: 0 lend entries, not 1 {PAST}",
        f"return request 2: 0 return.request entries, not 1 {PAST}",
        f"pool hold 1: 0 pool.drain entries, not 1 {PAST}",
    ]


def test_an_entry_recorded_twice_or_naming_nothing_and_a_changed_one_are_named(
    h: Harness,
) -> None:
    ask_lend(h.requests, "n3", ["busy"], now=at(0))
    h.tick(0)
    store = h.reconciler.audit.store
    store.append(Record("lend", "node n3", "ok", "daemon@h", "lease 1: again"), at(1))
    store.append(Record("lend", "node n9", "ok", "daemon@h", "lease 9: ghost"), at(2))
    assert _findings(h) == [
        "lease 1: 2 lend entries, not 1",
        "lease 9: 1 lend entries for no such action, which the database does not hold",
    ]
    with h.store._engine.begin() as conn:
        conn.execute(text("UPDATE audit_entry SET detail = 'lease 1: x' WHERE seq = 1"))
    assert _findings(h)[0].startswith("the chain is broken at entry 1")


def test_facts_older_than_the_trail_are_not_held_against_it(h: Harness) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=1)  # the trail's entries are stamped now
    h.store.create("n5", "training", "drain", ["busy"], "before", long_ago)
    ask_lend(h.requests, "n3", ["busy"])
    assert _findings(h) == []


def test_an_empty_trail_holds_everything_against_it(h: Harness) -> None:
    h.store.create("n5", "training", "drain", ["busy"], "by-hand", datetime.now(UTC))
    assert _findings(h) == [
        "lease 1: 0 lend entries, not 1 (written past the bridge, straight into the database?)"
    ]


def test_stb_audit_check_says_it_agrees_or_names_each_finding(h: Harness, tmp_path: Path) -> None:
    conf = tmp_path / "bridge.toml"
    conf.write_text(f'database_url = "sqlite:///{h.db_path}"\n')
    _lent_and_returned(h)
    got = CliRunner().invoke(app, ["audit", "check", "--config", str(conf)])
    assert got.exit_code == 0, got.output
    assert "the audit trail agrees" in got.output and "1 leases" in got.output
    h.store.create("n5", "training", "drain", ["busy"], "by-hand", at(9))
    got = CliRunner().invoke(app, ["audit", "check", "--config", str(conf)])
    assert got.exit_code == 1
    assert "lease 2: 0 lend entries" in got.output and "1 finding(s)" in got.output


def test_a_rollout_s_start_and_each_move_are_held_against_the_trail(h: Harness) -> None:
    rollouts = RolloutStore(h.store._engine)
    trail = trail_of(h.requests)
    row = rollouts.start("busy", 1, 2, "10%", 60, datetime.now(UTC))
    trail.record("model.canary", "model busy", "ok", f"rollout {row.id}: version 2 beside 1")
    now = datetime.now(UTC)
    step = trail.within("rollout.step", "model busy version 2", "both loaded")
    rollouts.move(row.id or 0, "running", now, "both loaded", step=0, audit=step)
    assert _findings(h) == []
    rollouts.move(row.id or 0, "promoting", now, "by hand")  # no entry
    assert _findings(h) == [
        f"rollout move rollout {row.id} running -> promoting: 0 rollout.* entries, not 1 {PAST}"
    ]
