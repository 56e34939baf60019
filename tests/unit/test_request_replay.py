"""Operator requests taken again after a failover (`Reconciler` on the fakes of
tests/unit/fakes.py, a real lease store on a SQLite file): the active bridge is killed
after it carried a request out and before it recorded the outcome, and the next bridge,
a fresh `Reconciler` on the same database and cluster, answers the request from the work
the first one did (the lease its lend made, the move its return made): nothing done
twice, nothing refused for being the request's own. A refusal that is one (another
request lent the node, returned the lease) still is.

Fast aids for the loop's logic; the real failover, two daemons and `kill -9`, is
tests/lab/test_ha_replay.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import pytest

from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.requests import RequestQueue, lease_key
from bridge.leases.store import LeaseStore, make_engine
from bridge.lifecycle import LeaseState
from bridge.slurm.errors import CommandRejected
from tests.unit.fakes import N3, Harness, address_of, at, make_harness

S = LeaseState


class Killed(BaseException):
    """`kill -9` of the active bridge: nothing after it runs, nothing catches it."""


def _die(*_: Any, **__: Any) -> NoReturn:
    raise Killed


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    h = make_harness(tmp_path)
    h.triton.server(address_of(N3), models={"busy": "READY"})
    return h


def standby(h: Harness) -> Reconciler:
    """The other bridge, leading now: its own process (store, queue, actuator, memory),
    the same database and cluster."""
    engine = make_engine(h.config.database_url)
    return Reconciler(
        h.config,
        h.slurm,
        LeaseStore(engine),
        Observer(h.slurm, h.config, h.triton),
        h.triton,
        h.router,
        h.metrics,
        RequestQueue(engine),
        h.triton.forget,
    )


def killed_before_recording(h: Harness, t: float) -> None:
    """The active bridge's pass at `t` carries out the pending requests, then dies as it
    records the first outcome."""
    h.reconciler.requests = RequestQueue(make_engine(h.config.database_url))
    h.reconciler.requests.finish = _die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        h.tick(t)


def outcome(h: Harness, request_id: int | None) -> str:
    req = h.requests.get(request_id or 0)
    assert req is not None and req.done_at is not None, "request not answered"
    return req.outcome


def test_a_lend_taken_again_is_answered_from_the_lease_it_made(h: Harness) -> None:
    req = h.requests.request_lend("n3", ["busy"], at(0), requested_by="ops")
    killed_before_recording(h, 1)
    (made,) = h.store.open_leases()
    assert (made.state, made.slurm_job_id, made.request_key) == (S.SUBMITTED, "100", lease_key(1))
    assert h.requests.get(req.id or 0).done_at is None  # type: ignore[union-attr]

    b = standby(h)
    r = b.run_once(at(3))
    assert outcome(h, req.id) == "lease 1 lending n3"  # was "refused: n3 is already lent"
    assert "operator request 1 (lend): lease 1 lending n3" in r.events
    assert len(h.slurm.ops("submit")) == 1  # one Triton job
    assert [x.id for x in h.store.by_node("n3")] == [1]  # one lease
    b.run_once(at(4))
    assert h.lease(1).state == S.SERVING
    assert h.store.history(1)[0].reason == "operator request 1 by ops"


def test_a_lend_whose_bridge_died_before_the_lease_is_lent_once(h: Harness) -> None:
    req = h.requests.request_lend("n3", ["busy"], at(0))
    h.reconciler.store.create = _die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        h.tick(1)
    assert h.store.open_leases() == [] and h.slurm.ops("submit") == []

    b = standby(h)
    b.run_once(at(3))
    b.run_once(at(4))
    assert outcome(h, req.id) == "lease 1 lending n3"
    assert len(h.slurm.ops("submit")) == 1
    assert [(x.id, x.request_key) for x in h.store.by_node("n3")] == [(1, lease_key(1))]


def test_a_lend_that_failed_taken_again_is_the_failure(h: Harness) -> None:
    h.slurm.fail("submit", CommandRejected("sbatch", "Invalid account"))
    req = h.requests.request_lend("n3", ["busy"], at(0))
    killed_before_recording(h, 1)
    assert h.lease(1).state == S.FAILED

    b = standby(h)
    b.run_once(at(3))  # cleans the failed lease up to returned, then the request
    assert h.lease(1).state == S.RETURNED
    # was a second lease, a second sbatch and "failed: lease 2: ..."
    assert outcome(h, req.id) == "failed: lease 1: submit: sbatch: Invalid account"
    assert len(h.slurm.ops("submit")) == 1 and len(h.store.by_node("n3")) == 1


def test_a_lend_of_a_node_another_request_lent_is_still_refused(h: Harness) -> None:
    first = h.requests.request_lend("n3", ["busy"], at(0))
    h.tick(0)
    assert outcome(h, first.id) == "lease 1 lending n3"
    second = h.requests.request_lend("n3", ["busy"], at(1))
    killed_before_recording(h, 1)  # refused it, died before recording that

    b = standby(h)
    b.run_once(at(3))
    assert outcome(h, second.id) == "refused: n3 is already lent"
    assert len(h.slurm.ops("submit")) == 1 and len(h.store.by_node("n3")) == 1


def serving(h: Harness) -> None:
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in range(3):
        h.tick(t)
    assert h.lease(1).state == S.SERVING


def test_a_return_under_way_taken_again_is_answered_returning(h: Harness) -> None:
    serving(h)
    ret = h.requests.request_return(1, at(3), requested_by="ops")
    killed_before_recording(h, 3)
    assert h.lease(1).state == S.DRAINING

    b = standby(h)
    b.run_once(at(4))
    assert outcome(h, ret.id) == "lease 1 returning"  # was "lease 1 is already releasing"
    b.run_once(at(5))
    assert h.lease(1).state == S.RETURNED
    assert h.slurm.ops("cancel") == [("100",)]  # cancelled once
    assert [e.reason for e in h.store.history(1)][4] == "return: operator request 2 by ops"


def test_a_return_done_before_it_is_taken_again_is_not_refused(h: Harness) -> None:
    h.requests.request_lend("n3", ["busy"], at(0))
    h.tick(0)
    assert h.lease(1).state == S.SUBMITTED
    ret = h.requests.request_return(1, at(1))
    killed_before_recording(h, 1)  # cancelled its job: releasing
    assert h.lease(1).state == S.RELEASING

    b = standby(h)
    b.run_once(at(3))  # its sync finds the job gone (returned), then the request
    assert h.lease(1).state == S.RETURNED
    assert outcome(h, ret.id) == "lease 1 returning"  # was "refused: ... already returned"
    assert h.slurm.ops("cancel") == [("100",)]


def test_a_return_of_a_lease_returned_by_another_request_is_still_refused(h: Harness) -> None:
    serving(h)
    first = h.requests.request_return(1, at(3))
    for t in range(3, 6):
        h.tick(t)
    assert h.lease(1).state == S.RETURNED and outcome(h, first.id) == "lease 1 returning"
    again = h.requests.request_return(1, at(6))
    killed_before_recording(h, 6)

    b = standby(h)
    b.run_once(at(7))
    assert outcome(h, again.id) == "refused: lease 1 is already returned"
