"""A replica that spans nodes on the lab (issue 32), end to end through the reconciler:
busy's replica is said to take 8 GPUs (`[models.busy] tensor_parallel = 8`), two of the
lab's 4-GPU training nodes. An operator's lend of the first training node makes one
lease of both (a gang): one Slurm job with `-N 2` fenced and run on the two nodes, its
server on the first, one replica in routing, which serves and returns with no request
failed under load; a second lend of the gang fails its replica when its other node
goes down (Slurm ends the whole job), and the gang's nodes come back to Slurm."""

from __future__ import annotations

import time

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.config import ModelOverride, load_config
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson
from bridge.paths import project_root

from .helpers import Sender, scontrol_show, squeue_state, tick_until, tick_until_baseline

pytestmark = pytest.mark.lab

S = LeaseState


@pytest.fixture
def bridge_update() -> dict[str, object]:
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    return {"models": {**base.models, "busy": ModelOverride(tensor_parallel=8)}}


def _serving(rec: Reconciler) -> bool:
    return any(x.state == S.SERVING for x in rec.store.open_leases())


def test_a_two_node_replica_serves_returns_and_fails_as_one(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    first, second = (n.name for n in lab.pool_nodes("train")[:2])
    assert lab.gpus_per_node * 2 == 8, "the test needs two 4-GPU training nodes"
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    sender = Sender(endpoint, poisson(20.0, 60.0, seed=41), "busy")
    sender.start()
    down = False
    try:
        request = ask_lend(queue, first, ["busy"])
        tick_until(rec, lambda: _serving(rec), 90, log)
        (lease,) = store.open_leases()
        assert lease.id is not None and lease.members == [second] and lease.gpus is None
        done = queue.get(request.id or 0)
        assert done is not None and done.outcome == f"lease {lease.id} lending {first},{second}"
        # One job, both nodes whole, in the fence the drain-mode lend made.
        job_id = str(lease.slurm_job_id)
        shown = scontrol_show(lab, "job", job_id)[job_id]
        assert shown["NumNodes"] == "2" and shown["BatchHost"] == first, shown
        assert f"gres/gpu={2 * lab.gpus_per_node}" in shown.get("TRES", ""), shown
        assert shown.get("Reservation", "").startswith("stb-lease-"), shown
        # One replica in routing: the server on the first node, beside the baseline.
        obs = rec.last_observation
        assert obs is not None
        server = obs.server_of(job_id)
        assert server is not None and server.node == first and server.ready
        time.sleep(3)  # requests on both replicas
        ask_return(queue, lease.id)
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        sender.finish()
        c = sender.counters
        assert c.sent > 60 and c.ok == c.sent and c.errors == 0 and c.dropped == 0, (
            c,
            "\n".join(log),
        )
        assert squeue_state(lab, job_id)[0] in ("", "COMPLETING")
        assert not any(r.startswith("stb-lease-") for r in scontrol_show(lab, "reservation")), (
            "the fence is lifted"
        )

        # Lent again, its second node goes down: Slurm ends the job, the replica fails.
        ask_lend(queue, first, ["busy"])
        tick_until(rec, lambda: _serving(rec), 90, log)
        (again,) = store.open_leases()
        slurm(lab, "scontrol", "update", f"NodeName={second}", "State=DOWN", "Reason=gang test")
        down = True
        tick_until(rec, lambda: not store.open_leases(), 60, log)
        assert again.id is not None
        failed = [e for e in store.history(again.id) if e.to_state == S.FAILED]
        assert len(failed) == 1, "\n".join(log)
        # (the job ending with the node, or the node leaving Slurm's list, whichever the
        # pass saw first)
        why = failed[0].reason
        assert why.startswith(f"Triton job {again.slurm_job_id}") or "vanished" in why, why
    finally:
        sender.stop()
        if down:
            slurm(lab, "scontrol", "update", f"NodeName={second}", "State=RESUME", check=False)
        slurm(lab, "scancel", "--partition=train", check=False)
