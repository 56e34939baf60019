"""Fault 5: nginx refuses the reload.

With the baseline routed, the managed nginx's main configuration gets an unknown
directive, so `nginx -t` (which the bridge runs before every reload) fails; the running
nginx keeps its old configuration. An operator lend then gives the reconciler (`run_once`)
a new replica to publish. Expected: a step error "route" quoting nginx, the loop goes on
(no failed tick) and tries the publish again every tick and is refused again; the routing
file keeps the old table and requests through nginx's listen address still answer (from
the baseline); the lease is not failed for it. Once the configuration is fixed, the next
tick publishes the new replica.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend
from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.routing.nginxctl import find_nginx
from tests.lab.helpers import tick_until

from .tools import infer_through

pytestmark = pytest.mark.lab
BAD = "stb_fault_not_a_directive on;"
BROKEN_S = 12.0  # seconds nginx stays broken after the first refusal


def test_nginx_refusing_the_reload_keeps_the_old_routing(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    store, queue = rec.store, rec.requests
    lent, reserved = lab.pool_nodes("elastic")[0], lab.pool_nodes("infer")[0]
    prefix = tmp_path / "nginx"
    main, routing = prefix / "conf" / "nginx.conf", prefix / "conf" / "routing.conf"
    log: list[str] = []

    def routed(addr: str) -> bool:
        return routing.exists() and f"{addr}:8000" in routing.read_text()

    tick_until(rec, lambda: routed(reserved.addr), 120, log)
    good = main.read_text()
    main.write_text(good.replace("http {", f"http {{\n    {BAD}", 1))
    check = subprocess.run(
        [find_nginx(), "-p", f"{prefix}/", "-c", str(main), "-t"],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert check.returncode != 0 and "unknown directive" in check.stderr, check.stderr
    published = routing.read_text()

    ask_lend(queue, lent.name, ["busy"])
    route_errors: list[str] = []
    ticks, deadline = 0, time.monotonic() + 90
    while not route_errors and time.monotonic() < deadline:
        ticks += 1
        report = rec.run_once(datetime.now(UTC))
        log += report.lines()
        route_errors += [e.message for e in report.errors if e.step == "route"]
        time.sleep(0.5)
    assert route_errors, "\n".join(log)
    print(f"first route error after {ticks} ticks: {route_errors[0]}")
    assert "unknown directive" in route_errors[0], route_errors[0]
    # The loop goes on: no failed tick, and the publish is tried again every tick and
    # refused again.
    outcomes = []
    broken_until = time.monotonic() + BROKEN_S
    while time.monotonic() < broken_until:
        report = rec.run_once(datetime.now(UTC))
        log += report.lines()
        outcomes.append(report.outcome.value)
        route_errors += [e.message for e in report.errors if e.step == "route"]
        assert {e.step for e in report.errors} <= {"route"}, "\n".join(log)
        time.sleep(1)
    assert "failed" not in outcomes, outcomes
    assert len(route_errors) >= 2, "\n".join(log)  # retried, refused again
    assert all("unknown directive" in m for m in route_errors)
    assert routing.read_text() == published  # the old table stays in place
    answers = infer_through(endpoint, n=10)
    assert answers == [(200, f"{reserved.addr}:8000")] * 10, answers
    (lease,) = store.open_leases()
    assert lease.state != LeaseState.FAILED, lease.reason

    main.write_text(good)
    fixed = time.monotonic()
    report = rec.run_once(datetime.now(UTC))  # the next tick publishes
    log += report.lines()
    assert not [e for e in report.errors if e.step == "route"], report.lines()
    assert routed(lent.addr), "\n".join(log)
    print(
        f"{len(route_errors)} refusals in {len(outcomes) + 1} ticks while broken; "
        f"published by the next tick, {time.monotonic() - fixed:.1f}s after the fix"
    )
    tick_until(rec, lambda: store.get(lease.id or 0).state == LeaseState.SERVING, 10, log)
    seen = {up for _, up in infer_through(endpoint, n=20)}
    assert seen == {f"{reserved.addr}:8000", f"{lent.addr}:8000"}, seen
    assert "failed" not in [e.to_state.value for e in store.history(lease.id or 0)]
