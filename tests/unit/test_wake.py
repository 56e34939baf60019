"""A standby's activator and the leader (`Reconciler` on the fakes of tests/unit/fakes.py,
a real lease store and request queue on one SQLite file): nginx may send the requests of
a model at zero to any daemon's activator, but only the leader's policy lends. A standby
holding such requests writes one wake request a model (`RequestQueue.request_wake`, asked
again while they wait, never two pending); the leader's next pass counts it as waiting
(decide's rule 6) and lends from zero, and records the request as taken."""

from __future__ import annotations

from pathlib import Path

from bridge.config import ModelConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, make_engine
from tests.unit.fakes import Harness, at, make_harness


def _reconciler(h: Harness, *, active: bool, waiting: dict[str, int] | None) -> Reconciler:
    config = h.config.model_copy(
        update={"models": h.config.models | {"cold": ModelConfig(slo_p99_ms=500, min_replicas=0)}}
    )
    engine = make_engine(config.database_url)
    return Reconciler(
        config,
        h.slurm,
        LeaseStore(engine),
        Observer(h.slurm, config, h.triton),
        h.triton,
        h.router,
        BridgeMetrics(instance="standby-b" if not active else "leader-a"),
        RequestQueue(engine),
        h.triton.forget,
        is_active=lambda: active,
        waiting=(lambda: dict(waiting)) if waiting is not None else None,
    )


def test_a_standbys_held_requests_reach_the_leaders_policy(tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    standby = _reconciler(h, active=False, waiting={"cold": 3})
    leader = _reconciler(h, active=True, waiting={})
    leader.run_once(at(0))  # the leader's first pass: the baseline as it is, no wake yet
    assert leader.last_snapshot is not None and leader.last_snapshot.waiting == {}

    report = standby.run_once(at(1))
    report_again = standby.run_once(at(2))  # still held: the same pending request
    wakes = [r for r in h.requests.pending() if r.kind == "wake"]
    assert len(wakes) == 1 and wakes[0].models == ["cold"]
    assert wakes[0].requested_by == "activator of standby-b"
    assert any("3 request(s) held here" in e for e in report.events), report.events
    assert any(f"wake request {wakes[0].id}" in e for e in report_again.events)
    assert not h.store.open_leases()  # a standby never acts

    leader.run_once(at(3))
    assert leader.last_snapshot is not None and leader.last_snapshot.waiting == {"cold": 1}
    taken = h.requests.get(wakes[0].id or 0)
    assert taken is not None and taken.done_at is not None
    assert taken.outcome.startswith("cold waiting at activator of standby-b")
    (lease,) = h.store.open_leases()  # rule 6: lent from zero at that pass
    assert lease.models == ["cold"], lease

    leader.run_once(at(4))  # taken once: the count does not linger
    assert leader.last_snapshot is not None and leader.last_snapshot.waiting == {}


def test_a_standby_without_held_requests_writes_nothing(tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    _reconciler(h, active=False, waiting={"cold": 0}).run_once(at(1))
    _reconciler(h, active=False, waiting=None).run_once(at(2))
    assert h.requests.pending() == []
