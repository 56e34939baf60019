"""Model placement by the policy on the lab (`bridge.policy.placement`, carried out by
`bridge.daemon.placer`): the issue's target, "a shift of load from one model to another is
met by moving a model onto an existing replica, not by a lend, with no failed request".

A node is lent for `echo` (an operator request), then no further node may be lent
(`max_lent_nodes` = 1) and the lease may not go back (a long return dwell), so only a
placement can meet more demand. `echo` keeps a light load; `busy` (20 ms per request, one
instance, SLO 100 ms) gets 30 req/s, which the baseline replica alone carries in fact but
not by the capacity model at the lend's demand (1.25 x 30 req/s: its p99 is predicted
far past 100 ms). The real reconciler with the real policy then moves the lent replica
from `echo` to `busy` (`Place`): `busy` is loaded there and routed there, `echo` leaves
its routes, no `Lend` is decided, and no request of either model fails across the move."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from bridge.daemon.reconciler import Reconciler
from bridge.daemon.report import TickReport
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson
from bridge.policy.actions import Lend, Place

from .helpers import (
    RecordingRouter,
    Sender,
    lend_serving,
    tick_until,
    tick_until_placed,
    upstreams,
)

pytestmark = pytest.mark.lab

#: req/s of `busy`: late by the capacity model on one replica at the lend's headroom
#: (1.25 x 30 req/s x 20 ms: 75% busy), carried by two at the return's (1.5 x 15 req/s)
BUSY_RATE = 30.0
#: req/s of `echo`: light, the baseline alone carries it
ECHO_RATE = 8.0


def test_a_shift_of_load_is_met_by_a_placement_not_a_lend(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    policy = rec.config.policy.model_copy(
        update={
            "placement": True,
            "max_lent_nodes": 1,  # the operator's lend takes the only slot: no lend is left
            "scale_in_cooldown_s": 5,
            "return_dwell_s": 600,  # the calm echo lease is not given back meanwhile
        }
    )
    rec.config = rec.config.model_copy(update={"policy": policy})
    store, act = rec.store, rec.actuator
    router = RecordingRouter(act.router)
    act.router = router
    reports: list[TickReport] = []
    run_once = rec.run_once

    def recorded(now: datetime | None = None) -> TickReport:
        report = run_once(now)
        reports.append(report)
        return report

    rec.run_once = recorded  # type: ignore[method-assign]  # each pass's report kept
    elastic = lab.pool_nodes("elastic")[0].name
    log: list[str] = []
    started = datetime.now(UTC)
    lease, address = lend_serving(rec, lab, ["echo"], log)
    routes = router.routes
    assert address in routes("echo") and address not in routes("busy")
    serving_reports = len(reports)
    echo = Sender(endpoint, poisson(ECHO_RATE, 60.0, seed=41), "echo")
    echo.config = replace(echo.config, shape=(1, 16))
    busy = Sender(endpoint, poisson(BUSY_RATE, 60.0, seed=42), "busy")
    echo.start()
    busy.start()
    try:

        def places() -> list[Place]:
            return [a for r in reports for a in r.actions if isinstance(a, Place)]

        tick_until(rec, lambda: bool(places()), 40, log)
        placed_at = time.monotonic()

        tick_until_placed(rec, lease.slurm_job_id, address, routes, "busy", "echo", log)
        echo.finish()
        busy.finish()
    finally:
        echo.stop()
        busy.stop()
    timeline = "\n".join(log)
    # the policy's one decision: the lent replica moved from echo to busy
    (place,) = places()
    assert place.lease_id == lease.id and tuple(place.models) == ("busy",), timeline
    assert place.reason.startswith("placement: busy ") and "in place of echo" in place.reason
    assert any(
        e.startswith(f"place lease {lease.id} on {elastic}: +busy -echo: placement:")
        for r in reports
        for e in r.events
    ), timeline
    # no lend decided, before the lease served or after; the operator's lease the only one
    lends = [a for r in reports for a in r.actions if isinstance(a, Lend)]
    assert not lends, (lends, timeline)
    assert [x.id for x, _ in store.lends_since(started)] == [lease.id]
    assert len(reports) > serving_reports
    after = store.get(lease.id)
    assert after.models == ["busy"] and after.state == LeaseState.SERVING, timeline
    last = store.history(lease.id)[-1]
    assert (last.from_state, last.to_state) == (LeaseState.SERVING, LeaseState.SERVING)
    assert last.reason.startswith("place: placement: busy "), last.reason
    assert "['echo'] -> ['busy']" in (last.detail or ""), last.detail
    # echo left the lent server's routes for good once placed; busy is routed there
    later = [table for t, table in router.tables if t >= placed_at]
    out = [i for i, table in enumerate(later) if address not in dict(table.routes).get("echo", ())]
    assert out and all(
        address not in dict(table.routes).get("echo", ()) for table in later[out[0] :]
    )
    assert address in upstreams(
        endpoint, "busy", {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    )
    assert address not in upstreams(
        endpoint,
        "echo",
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    )
    for sender, least in ((echo, 60), (busy, 300)):
        c = sender.counters
        assert c.sent > least and c.ok == c.sent and c.errors == 0 and c.dropped == 0, (
            sender.config.model,
            c,
            timeline,
        )
