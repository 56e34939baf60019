"""Fault 7: the routing directory unwritable.

As root, permission bits stop nothing, so the fault is structural: the directory that
holds the routing file and the service-discovery document is moved aside and a plain file
takes its name (every write under it fails with "Not a directory"). The real `stb daemon`
runs; an operator lend gives it a new replica to publish. Expected: a step error "route"
(counted in stb_step_errors_total) each time the publish is tried, the loop
goes on (ticks keep being counted, none failed) and tries again every tick, requests
through nginx still answer from the old routing, the lease is not failed for it; once the
directory is back the next tick publishes the new replica and no more route errors are
counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend
from bridge.lab.spec import LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState

from .tools import DaemonProc, Metrics, delta, infer_through, until

pytestmark = pytest.mark.lab


def _route_errors(m: Metrics) -> float:
    return sum(v for (step, _kind), v in m.step_errors().items() if step == "route")


def test_unwritable_routing_dir_is_a_route_error_and_recovers(
    lab: LabSpec, daemon_config: Path, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    daemon = daemons(daemon_config)
    lent, reserved = lab.pool_nodes("elastic")[0], lab.pool_nodes("infer")[0]
    routing_dir = tmp_path / "routing"
    conf = routing_dir / "upstreams.conf"

    def routed(addr: str) -> bool:
        return conf.is_file() and f"{addr}:8000" in conf.read_text()

    until("the baseline routed", lambda: routed(reserved.addr), 120)
    engine = make_engine(daemon.database_url)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    before = daemon.must_metrics()

    aside = tmp_path / "routing.aside"
    routing_dir.rename(aside)
    routing_dir.write_text("not a directory: the routing files cannot be written\n")
    try:
        ask_lend(queue, lent.name, ["busy"])
        until(
            "a route error",
            lambda: _route_errors(daemon.must_metrics()) > _route_errors(before),
            90,
            step=0.5,
        )
        first = daemon.must_metrics()
        until(  # tried again on the next tick, refused again
            "the publish retried",
            lambda: _route_errors(daemon.must_metrics()) > _route_errors(first),
            5,
            step=0.5,
        )
        time.sleep(3)  # still broken: the loop keeps ticking
        later = daemon.must_metrics()
        answers = infer_through(daemon.listen, n=10)
        (lease,) = store.open_leases()
    finally:
        routing_dir.unlink()
        aside.rename(routing_dir)
    fixed = time.monotonic()
    print(
        f"while broken: ticks {delta(later.ticks(), first.ticks())}, step errors "
        f"{delta(later.step_errors(), first.step_errors())}; lease {lease.state.value}"
    )
    # The loop went on, retrying the publish; the old routing kept serving.
    ticks = delta(later.ticks(), first.ticks())
    assert sum(ticks.values()) >= 3, ticks
    assert ticks.get("failed", 0) == 0, ticks
    assert _route_errors(later) > _route_errors(first)
    assert answers == [(200, f"{reserved.addr}:8000")] * 10, answers
    assert lease.state != LeaseState.FAILED, lease.reason

    # published by the next tick (1 s ticks; 5 s allows for a slow pass)
    until("the new replica published", lambda: routed(lent.addr), 5, step=0.2)
    until(
        "the lease serving",
        lambda: store.get(lease.id or 0).state == LeaseState.SERVING,
        30,
        step=0.2,
    )
    print(f"published {time.monotonic() - fixed:.1f}s after the directory came back")
    settled = daemon.must_metrics()
    time.sleep(3)
    after = daemon.must_metrics()
    assert _route_errors(after) == _route_errors(settled)  # recovered: no more errors
    assert delta(after.ticks(), settled.ticks()).get("ok", 0) >= 1
    assert (routing_dir / "http_sd.json").is_file()
    seen = {up for _, up in infer_through(daemon.listen, n=20)}
    assert seen == {f"{reserved.addr}:8000", f"{lent.addr}:8000"}, seen
    assert "failed" not in [e.to_state.value for e in store.history(lease.id or 0)]
