"""A standby's pass and an operator's pool hold, on the fakes and a real lease store: the
standby observes, routes and reports, and never moves a lease, takes a request or calls
a Slurm write; a held pool's leases are returned and its nodes are not lent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import ObserveConfig
from bridge.daemon.observe import Observer
from bridge.lifecycle import LeaseState
from tests.unit.fakes import N3, Harness, address_of, at, make_harness

S = LeaseState


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def test_a_standby_observes_and_routes_but_never_acts(h: Harness) -> None:
    active = False
    h.reconciler.is_active = lambda: active
    req = h.requests.request_lend("n3", ["busy"], at(0))
    assert req.id is not None
    for t in range(3):
        r = h.tick(t)
        assert not r.active and r.actions == []
    assert h.slurm.writes == [] and h.store.open_leases() == []
    assert h.requests.get(req.id).done_at is None  # type: ignore[union-attr]
    assert h.router.tables and h.router.endpoints("busy")  # the baseline is routed
    assert r.lease_states == {} and "busy" in r.p99_ms
    active = True  # it takes over: the request waiting for it is carried out
    r = h.tick(3)
    assert r.active and h.slurm.ops("submit")
    assert h.store.open_leases()[0].node == "n3"
    assert "lending n3" in h.requests.get(req.id).outcome  # type: ignore[union-attr]


def test_a_held_pool_returns_its_leases_and_lends_nothing(h: Harness) -> None:
    h.triton.server(address_of(N3), models={"busy": "READY"})
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in range(3):
        h.tick(t)
    assert h.lease(1).state == S.SERVING
    h.requests.hold("elastic", at(3), "olga", "firmware")
    r = h.tick(3)
    assert h.lease(1).state == S.DRAINING
    assert "pool elastic held by olga" in h.lease(1).reason
    assert any("pool elastic held by olga" in e for e in r.events)
    for t in range(4, 60, 5):
        h.tick(t)
    assert h.lease(1).state == S.RETURNED
    again = h.requests.request_lend("n3", ["busy"], at(61))
    h.tick(61)
    outcome = h.requests.get(again.id).outcome  # type: ignore[arg-type, union-attr]
    assert outcome == "refused: pool elastic is held by olga (stb resume elastic)"
    assert [x.state for x in h.store.open_leases()] == []
    h.requests.release("elastic", at(62), "olga")
    h.requests.request_lend("n3", ["busy"], at(62))
    h.tick(62)
    assert h.store.open_leases()[0].node == "n3"  # lendable again


def test_a_pool_of_observers_sees_what_one_thread_sees(h: Harness) -> None:
    h.triton.server(address_of(N3), models={"busy": "READY"}, pending={"busy": 2})
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in range(3):
        h.tick(t)
    pooled_config = h.config.model_copy(update={"observe": ObserveConfig(concurrency=4)})
    one = Observer(h.slurm, h.config, h.triton)
    pooled = Observer(h.slurm, pooled_config, h.triton)
    try:
        a, b = one.observe(10.0), pooled.observe(10.0)
        assert [(s.job.job_id, s.ready, s.models, s.pending) for s in a.servers] == [
            (s.job.job_id, s.ready, s.models, s.pending) for s in b.servers
        ]
        assert len(b.servers) == 2 and any(s.pending == {"busy": 2.0} for s in b.servers)
        assert a.history.keys() == b.history.keys()
        assert len(h.triton.threads) > 1  # the pool's threads asked
    finally:
        one.close()
        pooled.close()
