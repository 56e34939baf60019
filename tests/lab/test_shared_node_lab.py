"""Two leases on one node (issue 32: a node runs more than one Triton job, each a lease
of some of its GPUs), on the lab end to end through the reconciler. busy's replica takes
one GPU (`[models.busy] instance_gpus = 1`); the elastic node (4 fake GPUs) runs three
elastic jobs of one GPU each. Two operator lends of the node for busy each make a lease
of one GPU: the first takes the free GPU and requeues nothing; the second, on port slot
1, requeues one job (the youngest), not the others, and its Triton job listens on 8010
(its comment says `stb:port=8010`); nginx routes busy to three replicas: the baseline
and the node's two. Returning the first, with requests going on, fails none of them;
the second goes on serving on its own ports, and the two older jobs run throughout."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.triton.ports import http_port

from .helpers import (
    BUSY_INPUT,
    busy_takes_one_gpu,
    sbatch,
    scontrol_show,
    squeue_state,
    tick_until,
    tick_until_baseline,
    upstreams,
    wait_state,
)

pytestmark = pytest.mark.lab


@pytest.fixture
def bridge_update() -> dict[str, object]:
    # leases given back by the test, not the policy's quiet return while the second starts
    return {**busy_takes_one_gpu(), "policy": {"return_dwell_s": 600}}


def restarts(lab: LabSpec, job_id: str) -> str:
    return scontrol_show(lab, "job", job_id)[job_id]["Restarts"]


def _serving(rec: Reconciler, n: int) -> bool:
    return sum(x.state == LeaseState.SERVING for x in rec.store.open_leases()) == n


def test_two_leases_share_a_node_each_on_its_own_ports(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.pool_nodes("elastic")[0]
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    assert lab.gpus_per_node == 4, "the test needs 4 GPUs a node: three jobs and one free"
    elastic = []
    for _ in range(3):  # a second apart: the youngest has the least work to lose
        argv = ("-p", "elastic", "-A", lab.accounts[0], "-w", node.name, "--gres=gpu:1")
        elastic.append(sbatch(lab, *argv, "--requeue", "--wrap", "sleep 600"))
        wait_state(lab, elastic[-1], {"RUNNING"}, 30)
        time.sleep(1.1)
    older, youngest = elastic[:2], elastic[2]
    try:
        ask_lend(queue, node.name, ["busy"])
        tick_until(rec, lambda: _serving(rec, 1), 90, log)
        # the free GPU made the first lease: nothing requeued
        assert all(restarts(lab, j) == "0" for j in elastic)
        second = ask_lend(queue, node.name, ["busy"])
        tick_until(rec, lambda: _serving(rec, 2), 90, log)
        first, other = sorted(store.open_leases(), key=lambda x: x.slot)
        assert (first.slot, other.slot) == (0, 1) and first.gpus == other.gpus == 1
        assert first.id is not None and other.id is not None
        assert (queue.get(second.id or 0) or second).outcome == (
            f"lease {other.id} lending {node.name}"
        )
        # the second requeued the youngest job, not the older two
        assert [restarts(lab, j) for j in elastic] == ["0", "0", "1"]
        job = str(other.slurm_job_id)
        shown = scontrol_show(lab, "job", job)[job]
        assert "gres/gpu=1" in shown.get("TRES", ""), shown
        assert "stb:port=8010" in shown.get("Comment", ""), shown
        # busy is routed to the baseline and to both of the node's servers
        near = {f"{node.addr}:{http_port(0)}", f"{node.addr}:{http_port(1)}"}
        seen = upstreams(endpoint, "busy", BUSY_INPUT, n=40)
        assert near <= seen and len(seen) == 3, seen

        # the first lease returned while requests go on: none fails
        failed: list[str] = []
        sent = [0]
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set() and sent[0] < 5000:
                    r = client.post(
                        f"http://{endpoint}/v2/models/busy/infer", json={"inputs": [BUSY_INPUT]}
                    )
                    sent[0] += 1
                    if r.status_code != 200:
                        failed.append(f"{r.status_code} {r.text[:100]}")

        sender = threading.Thread(target=load, name="shared-node-load")
        sender.start()
        try:
            ask_return(queue, first.id)
            tick_until(rec, lambda: store.get(first.id or 0).state == LeaseState.RETURNED, 90, log)
        finally:
            stop.set()
            sender.join(timeout=60)
        assert sent[0] > 0 and failed == [], (sent[0], failed[:5])
        assert store.get(other.id).state == LeaseState.SERVING
        assert squeue_state(lab, str(first.slurm_job_id))[0] in ("", "COMPLETING")
        seen = upstreams(endpoint, "busy", BUSY_INPUT)
        assert f"{node.addr}:{http_port(1)}" in seen and f"{node.addr}:{http_port(0)}" not in seen
        for j in older:
            assert squeue_state(lab, j)[0] == "RUNNING" and restarts(lab, j) == "0"
        ask_return(queue, other.id)
        tick_until(rec, lambda: store.get(other.id or 0).state == LeaseState.RETURNED, 90, log)
        events = "\n".join(log)
        assert f"requeued job {youngest} for the lend" in events, events
        assert not any(f"requeued job {j}" in events for j in older), events
    finally:
        slurm(lab, "scancel", *elastic, check=False)
