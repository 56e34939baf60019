"""Operators lend and return through the daemon's state machine (`stb lend`, `stb return`
queue requests; the reconciler's tick carries them out), on the lab."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState

from .helpers import tick_until, tick_until_baseline

pytestmark = pytest.mark.lab


def test_operator_lend_and_return(lab: LabSpec, bridge: tuple[Reconciler, str]) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    elastic = lab.pool_nodes("elastic")[0].name
    reserved = lab.pool_nodes("infer")[0].name
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    now = datetime.now(UTC)
    bad = [queue.request_lend(reserved, [], now), queue.request_lend("n99", [], now)]
    good = queue.request_lend(elastic, ["busy"], now)
    tick_until(
        rec,
        lambda: any(lease.state == LeaseState.SERVING for lease in store.open_leases()),
        120,
        log,
    )
    outcomes = {r.id: (queue.get(r.id or 0) or r).outcome for r in [*bad, good]}
    assert outcomes[bad[0].id].startswith("refused: ") and "no lendable pool" in outcomes[bad[0].id]
    assert "no node 'n99'" in outcomes[bad[1].id]
    (lease,) = store.open_leases()
    assert outcomes[good.id] == f"lease {lease.id} lending {elastic}"
    assert (lease.node, lease.models) == (elastic, ["busy"])
    # The lent replica is in routing: nginx sends busy requests to both replicas.
    seen = set()
    for _ in range(20):
        r = httpx.post(
            f"http://{endpoint}/v2/models/busy/infer",
            json={
                "inputs": [
                    {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                ]
            },
        )
        assert r.status_code == 200
        seen.add(r.headers.get("X-Stb-Upstream"))
    assert len(seen) == 2, seen
    assert lease.id is not None
    queue.request_return(lease.id, datetime.now(UTC))
    tick_until(rec, lambda: not store.open_leases(), 120, log)
    states = [e.to_state.value for e in store.history(lease.id)]
    assert states[-4:] == ["serving", "draining", "releasing", "returned"]
    again = queue.request_return(lease.id, datetime.now(UTC))
    rec.run_once(datetime.now(UTC))
    assert "already returned" in (queue.get(again.id or 0) or again).outcome
