"""A lend of some of a node's GPUs on the lab (issue 32), end to end through the
reconciler: busy's replica is said to take one GPU (`[models.busy] instance_gpus = 1`),
and the elastic node (4 fake GPUs) runs two elastic jobs of two GPUs each. An operator's
lend of that node for busy must requeue one of the two jobs (the younger: the least work
lost), not both; its Triton job holds one GPU, not the node, beside the job that stays;
the replica serves through nginx; and the return ends the Triton job with the other job
still running on the node throughout."""

from __future__ import annotations

import time

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState

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
    return busy_takes_one_gpu()


def _elastic_job(lab: LabSpec, node: str) -> str:
    return sbatch(
        lab, "-p", "elastic", "-A", lab.accounts[0], "-w", node, "--gres=gpu:2",
        "--requeue", "--wrap", "sleep 600",
    )  # fmt: skip


def test_a_one_gpu_lend_requeues_one_of_two_elastic_jobs(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.pool_nodes("elastic")[0]
    assert lab.gpus_per_node == 4, "the test needs 4 GPUs a node: two jobs of two"
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    older = _elastic_job(lab, node.name)
    wait_state(lab, older, {"RUNNING"}, 30)
    time.sleep(1.1)  # a second apart: the younger has less work to lose
    younger = _elastic_job(lab, node.name)
    wait_state(lab, younger, {"RUNNING"}, 30)
    try:
        request = ask_lend(queue, node.name, ["busy"])
        tick_until(
            rec,
            lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()),
            90,
            log,
        )
        (lease,) = store.open_leases()
        assert lease.gpus == 1 and lease.id is not None
        assert (queue.get(request.id or 0) or request).outcome == (
            f"lease {lease.id} lending {node.name}"
        )
        # One job requeued (back in the queue, its restart counted), the other untouched.
        shown = {**scontrol_show(lab, "job", older), **scontrol_show(lab, "job", younger)}
        assert shown[younger]["Restarts"] == "1", shown[younger]
        assert shown[older]["Restarts"] == "0" and shown[older]["JobState"] == "RUNNING"
        # The Triton job holds one GPU of the node, not the node.
        triton = scontrol_show(lab, "job", str(lease.slurm_job_id))[str(lease.slurm_job_id)]
        assert "gres/gpu=1" in triton.get("TRES", ""), triton
        assert triton.get("OverSubscribe") != "NO", triton  # not --exclusive
        # Its replica serves through nginx beside the baseline.
        assert len(upstreams(endpoint, "busy", BUSY_INPUT)) == 2
        ask_return(queue, lease.id)
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        assert squeue_state(lab, str(lease.slurm_job_id))[0] in ("", "COMPLETING")
        assert squeue_state(lab, older)[0] == "RUNNING"
        events = "\n".join(log)
        assert f"requeued job {younger} for the lend" in events, events
        assert f"requeued job {older}" not in events, events
    finally:
        slurm(lab, "scancel", older, younger, check=False)
