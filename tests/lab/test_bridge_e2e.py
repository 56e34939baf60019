"""The bridge at work on the lab, end to end: real Slurm, real Triton, real nginx, traffic
from the load generator through nginx.

A load step on `busy` makes p99 breach; the reconciler lends the elastic node (its
elastic job is requeued by Slurm), Triton starts there as a Slurm job and enters routing;
when the load falls to a trickle the lease is returned (out of routing, drained,
unloaded, cancelled) with no failed request, and the node is back with Slurm.
"""

from __future__ import annotations

import pytest

from bridge.daemon.reconciler import Reconciler
from bridge.lab.showcase import Scenario
from bridge.lab.spec import LabSpec

pytestmark = pytest.mark.lab
TICK_S = 2.0


def test_load_step_lends_the_elastic_node_and_returns_it_without_a_failed_request(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    res = Scenario(lab, rec, endpoint).run(wait_requeued=False)
    assert res.heavy is not None and res.light is not None
    print(
        f"heavy: {res.heavy.total.ok} ok, p99 {res.heavy.total.latency.p99_ms} ms; "
        f"light: {res.light.total.ok} ok"
    )
    assert res.lease_node == lab.pool_nodes("elastic")[0].name
    assert res.lease_states == [
        "requested",
        "submitted",
        "starting",
        "serving",
        "draining",
        "releasing",
        "returned",
    ]
    assert res.victim_restarts == 1  # Slurm requeued the elastic job
    assert res.training_untouched  # no training job killed or requeued
    # No request failed, during the load step or during the return.
    assert res.heavy.total.errors == {} and res.heavy.total.dropped == 0
    assert res.light.total.errors == {} and res.light.total.dropped == 0
    # The node is back with Slurm: no fence, no Triton job left on it.
    assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
    assert not [
        j
        for j in rec.slurm.jobs(tag="stb:triton")
        if res.lease_node in j.nodes and j.state == "RUNNING"
    ]
