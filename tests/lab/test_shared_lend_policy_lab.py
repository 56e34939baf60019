"""A lend the policy makes beside a node's partial lease (issue 32, `[policy]
shared_lends` with the per-GPU ranking), on the lab end to end through the reconciler.
busy's replica takes one GPU (`instance_gpus = 1`); the elastic node (4 fake GPUs) runs
two elastic jobs of one GPU each and an operator's lease of one GPU for busy, so one GPU
is free. The training pool is left out of the bridge's pools: the elastic node is the
only one the policy could lend, and it is lent already, so `choose_nodes` offers none.
Load on busy past what its two replicas carry holds it in breach; the policy's capacity
lend finds no node and, the breach sustained, takes GPUs beside the lease
(`choose_beside`): the free GPU first, then as many elastic jobs as the rest needs, never
the first lease's Triton job. The second Triton job serves on port slot 1 through nginx
while the first serves on, and no request fails. The test returns both leases. Without
`shared_lends` no lend is made (checked by hand)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.config import load_config
from bridge.daemon.reconciler import Reconciler
from bridge.lab.showcase import Load
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.paths import project_root
from bridge.policy import Lend
from bridge.triton.ports import http_port

from .helpers import (
    BUSY_INPUT,
    busy_takes_one_gpu,
    sbatch,
    scontrol_show,
    tick_until,
    tick_until_baseline,
    upstreams,
    wait_state,
)

pytestmark = pytest.mark.lab


@pytest.fixture
def bridge_update() -> dict[str, object]:
    one_gpu = busy_takes_one_gpu()
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    return {
        **one_gpu,
        "pools": {name: pool for name, pool in base.pools.items() if name != "training"},
        "policy": {
            # a node lent beside a lease counts once: the cap leaves the plan a slot
            "max_lent_nodes": 2,
            "partial_lends": True,
            "sized_lends": True,
            "lend_ranking": "per_gpu",
            "shared_lends": True,
            # the leases are given back by the test
            "return_dwell_s": 600,
        },
    }


def _returned(rec: Reconciler, lease_id: int) -> Callable[[], bool]:
    return lambda: rec.store.get(lease_id).state == LeaseState.RETURNED


def test_the_policy_lends_beside_a_partial_lease_on_a_sustained_breach(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.pool_nodes("elastic")[0]
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    assert lab.gpus_per_node == 4, "the test needs 4 GPUs a node"
    elastic = []
    for _ in range(2):
        argv = ("-p", "elastic", "-A", lab.accounts[0], "-w", node.name, "--gres=gpu:1")
        elastic.append(sbatch(lab, *argv, "--requeue", "--wrap", "sleep 600"))
        wait_state(lab, elastic[-1], {"RUNNING"}, 30)
    load: Load | None = None
    try:
        ask_lend(queue, node.name, ["busy"])
        tick_until(
            rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 90, log
        )
        (first,) = store.open_leases()
        assert first.slot == 0 and first.gpus == 1 and first.id is not None

        # past what the baseline and the lease carry: held in breach until the policy lends
        load = Load(endpoint, 90.0, 120.0, seed=7)
        load.start()
        made: list[Lend] = []
        deadline = time.monotonic() + 90
        while not made:
            assert time.monotonic() < deadline, "no lend beside the lease\n" + "\n".join(log)
            began = time.monotonic()
            report = rec.run_once(datetime.now(UTC))
            log += report.lines()
            made = [a for a in report.actions if isinstance(a, Lend)]
            time.sleep(max(0.0, began + 1.0 - time.monotonic()))
        (lend,) = made
        assert lend.node == node.name and lend.models == ("busy",), lend
        assert lend.reason.startswith("capacity:"), lend.reason
        assert lend.gpus is not None and 1 <= lend.gpus <= 3, lend
        tick_until(
            rec,
            lambda: sum(x.state == LeaseState.SERVING for x in store.open_leases()) == 2,
            120,
            log,
        )
        other = next(x for x in store.open_leases() if x.id != first.id)
        assert other.slot == 1 and other.gpus == lend.gpus and other.node == node.name
        assert store.get(first.id).state == LeaseState.SERVING
        # beside the lease's GPU: the free one first, then as many jobs as the rest needs;
        # the first lease's Triton job is not a victim
        events = "\n".join(log)
        requeued = [j for j in elastic if f"requeued job {j} for the lend" in events]
        assert len(requeued) == lend.gpus - 1, events
        job = str(first.slurm_job_id)
        assert scontrol_show(lab, "job", job)[job]["Restarts"] == "0"
        assert f"requeued job {job}" not in events, events
        # busy is routed to the baseline and to both of the node's servers
        near = {f"{node.addr}:{http_port(0)}", f"{node.addr}:{http_port(1)}"}
        seen = upstreams(endpoint, "busy", BUSY_INPUT, n=40)
        assert near <= seen and len(seen) == 3, seen
        load.stop_sending.set()
        load.join(90)
        assert load.report is not None and load.report.total.ok > 0
        assert load.report.total.errors == {} and load.report.total.dropped == 0
        for lease_id in (other.id, first.id):
            assert lease_id is not None
            ask_return(queue, lease_id)
            tick_until(rec, _returned(rec, lease_id), 90, log)
    finally:
        if load is not None:
            load.stop_sending.set()
            load.join(90)
        slurm(lab, "scancel", *elastic, check=False)
