"""Fault 3: the Triton process of a lent replica killed (`kill -9` of tritonserver on the
lent node) while it serves.

The reconciler (`run_once`, the `bridge` fixture) lends the elastic node on an operator
request until the lease serves and nginx routes to both replicas; then the tritonserver
bound to the lent node's address gets SIGKILL. Expected: the very next tick takes the
replica out of routing (the routing file no longer names it, requests through nginx all
reach the baseline), the lease goes `failed` then `returned`, and the node is back with
Slurm: no Triton job of the lease left, no bridge fence, the node not drained.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend
from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.slurm.model import TRITON_TAG
from tests.lab.helpers import tick_until

from .tools import infer_through, tritonserver_pids, until

pytestmark = pytest.mark.lab


def test_killed_triton_leaves_routing_in_one_tick_and_the_node_returns(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    store, queue = rec.store, rec.requests
    lent, reserved = lab.pool_nodes("elastic")[0], lab.pool_nodes("infer")[0]
    routing = tmp_path / "nginx" / "conf" / "routing.conf"
    log: list[str] = []

    def routed(addr: str) -> bool:
        return routing.exists() and f"{addr}:8000" in routing.read_text()

    tick_until(rec, lambda: routed(reserved.addr), 120, log)
    ask_lend(queue, lent.name, ["busy"])
    tick_until(
        rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 120, log
    )
    (lease,) = store.open_leases()
    assert lease.id is not None
    assert routed(lent.addr)
    assert {up for _, up in infer_through(endpoint, n=20)} == {
        f"{reserved.addr}:8000",
        f"{lent.addr}:8000",
    }

    (pid,) = tritonserver_pids(lent.addr)
    os.kill(pid, signal.SIGKILL)
    until("tritonserver gone", lambda: not tritonserver_pids(lent.addr), 10, step=0.05)
    killed = time.monotonic()
    report = rec.run_once(datetime.now(UTC))  # one tick
    print(f"the tick after the kill ({time.monotonic() - killed:.2f}s): {report.lines()}")
    assert not routed(lent.addr), "\n".join([*log, *report.lines()])
    answers = infer_through(endpoint, n=10)
    assert answers == [(200, f"{reserved.addr}:8000")] * 10, answers

    tick_until(rec, lambda: store.get(lease.id or 0).state == LeaseState.RETURNED, 60, log)
    states = [e.to_state.value for e in store.history(lease.id)]
    assert states[-3:] == ["serving", "failed", "returned"], states
    print(f"lease {lease.id}: {states}; failed because: {store.history(lease.id)[-2].reason}")
    # The node is back with Slurm: no Triton job of the lease, no fence, not drained.
    jobs = [
        j
        for j in rec.slurm.jobs(tag=TRITON_TAG)
        if lent.name in j.nodes and j.state in ("PENDING", "RUNNING")
    ]
    assert jobs == [], jobs
    assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
    (node,) = [n for n in rec.slurm.nodes() if n.name == lent.name]
    assert not node.state.startswith(("drain", "down")), node.state
    assert not node.fenced_by_bridge
