"""A drain-mode lend of some of a training node's GPUs on the lab, end to end through the
reconciler: busy's replica is said to take one GPU (`[models.busy] instance_gpus = 1`),
and a training node (4 fake GPUs) runs two training jobs of two GPUs each, with a third
training job of two GPUs queued for it before the lend. An operator's lend of that node
for busy fences nothing and kills nothing: its Triton job pends on the node at the top
priority while both jobs run; when one of them ends (cancelled here by its owner) Slurm
gives the Triton job one of the GPUs it freed before the older queued training job (which
then lacks a second GPU and stays queued), the other job runs on untouched (never
requeued, never restarted), and the replica serves through nginx until it is returned."""

from __future__ import annotations

import time

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.slurm.model import TOP_PRIORITY_VALUE

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
    return {**busy_takes_one_gpu(), "policy": {"drain_partial_lends": True}}


def _training_job(lab: LabSpec, node: str) -> str:
    return sbatch(
        lab, "-p", "train", "-A", lab.accounts[0], "-w", node, "--gres=gpu:2",
        "--wrap", "sleep 600",
    )  # fmt: skip


def test_a_one_gpu_drain_lend_waits_only_for_the_job_holding_its_gpu(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.pool_nodes("train")[0].name
    assert lab.gpus_per_node == 4, "the test needs 4 GPUs a node: two jobs of two"
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    ending = _training_job(lab, node)
    staying = _training_job(lab, node)
    queued = ""
    try:
        wait_state(lab, ending, {"RUNNING"}, 30)
        wait_state(lab, staying, {"RUNNING"}, 30)
        queued = _training_job(lab, node)  # older than the Triton job, as high by age
        ask_lend(queue, node, ["busy"])
        tick_until(rec, lambda: any(x.slurm_job_id for x in store.open_leases()), 20, log)
        (lease,) = store.open_leases()
        assert lease.id is not None and lease.gpus == 1 and lease.lend_mode.value == "drain"
        triton = str(lease.slurm_job_id)
        # No fence: the Triton job pends on the node at the top priority, both jobs run.
        assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
        settled = time.monotonic() + 3  # a few passes, Slurm's scheduler running between
        tick_until(rec, lambda: time.monotonic() > settled, 10, log)
        shown = scontrol_show(lab, "job", triton)[triton]
        assert shown["JobState"] == "PENDING" and shown["Priority"] == str(TOP_PRIORITY_VALUE)
        assert "gpu:1" in shown.get("TresPerNode", ""), shown
        assert squeue_state(lab, ending)[0] == squeue_state(lab, staying)[0] == "RUNNING"
        assert store.get(lease.id).state == LeaseState.SUBMITTED
        # One job ends: its GPUs go to the Triton job first, and the replica serves.
        slurm(lab, "scancel", ending)
        tick_until(rec, lambda: store.get(lease.id or 0).state == LeaseState.SERVING, 60, log)
        assert len(upstreams(endpoint, "busy", BUSY_INPUT)) == 2
        shown = {j: scontrol_show(lab, "job", j)[j] for j in (triton, staying, queued)}
        assert "gres/gpu=1" in shown[triton].get("TRES", ""), shown[triton]
        assert shown[triton].get("OverSubscribe") != "NO", shown[triton]  # not --exclusive
        assert shown[queued]["JobState"] == "PENDING", shown[queued]  # one GPU left of two
        assert shown[staying]["JobState"] == "RUNNING" and shown[staying]["Restarts"] == "0"
        ask_return(queue, lease.id)
        tick_until(rec, lambda: not store.open_leases(), 60, log)
        assert squeue_state(lab, triton)[0] in ("", "COMPLETING")
        # The other training job ran throughout: one run, never requeued or restarted.
        assert squeue_state(lab, staying)[0] == "RUNNING"
        runs = slurm(lab, "sacct", "-n", "-X", "-D", "-j", staying, "-o", "State").split()
        assert runs == ["RUNNING"], runs
        events = "\n".join(log)
        assert "requeued job" not in events and "fenced by reservation" not in events, events
    finally:
        slurm(lab, "scancel", ending, staying, *([queued] if queued else []), check=False)
