"""Lending a training node gently, on the lab: while its training job runs, the node takes
no new work and Triton waits; no training job is killed; when the job ends Triton starts
there and serves; on return the fence is lifted and queued training work runs."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState

from .helpers import tick_until

pytestmark = pytest.mark.lab


def _state(lab: LabSpec, job: str) -> str:
    return slurm(lab, "squeue", "-h", "-j", job, "-o", "%T", check=False).strip()


def test_training_node_is_lent_only_once_free_and_no_job_is_killed(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, _ = bridge
    assert rec.requests is not None
    node = lab.pool_nodes("train")[0].name
    gpus = f"--gres=gpu:{lab.gpus_per_node}"
    training = slurm(
        lab,
        "sbatch",
        "--parsable",
        "-p",
        "train",
        "-A",
        "team-vision",
        "-w",
        node,
        gpus,
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 25",
    ).strip()
    later = ""
    log: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while _state(lab, training) != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        ask_lend(rec.requests, node, ["busy"])
        tick_until(
            rec,
            lambda: any(lease.state == LeaseState.SUBMITTED for lease in rec.store.open_leases()),
            30,
            log,
        )
        (lease,) = rec.store.open_leases()
        assert lease.lend_mode.value == "drain" and lease.slurm_job_id
        # The node takes no new work while the training job runs, and Triton waits.
        later = slurm(
            lab,
            "sbatch",
            "--parsable",
            "-p",
            "train",
            "-A",
            "team-nlp",
            "-w",
            node,
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 5",
        ).strip()
        for _ in range(5):
            rec.run_once(datetime.now(UTC))
            time.sleep(1)
        assert _state(lab, training) == "RUNNING"
        assert _state(lab, later) == "PENDING"
        assert _state(lab, lease.slurm_job_id) == "PENDING"
        assert rec.store.get(lease.id or 0).state == LeaseState.SUBMITTED
        # The training job ends on its own; then Triton starts there and serves.
        tick_until(rec, lambda: rec.store.get(lease.id or 0).state == LeaseState.SERVING, 90, log)
        acct = slurm(lab, "sacct", "-n", "-X", "-j", training, "-o", "State")
        assert acct.split()[0] == "COMPLETED"  # finished, never killed or requeued
        assert _state(lab, later) == "PENDING"  # still held off by the fence
        ask_return(rec.requests, lease.id or 0)
        tick_until(rec, lambda: not rec.store.open_leases(), 90, log)
        assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
        deadline = time.monotonic() + 60
        while _state(lab, later) == "PENDING":  # queued training work runs again
            assert time.monotonic() < deadline, "\n".join(log)
            time.sleep(1)
    finally:
        slurm(lab, "scancel", training, *([later] if later else []), check=False)
