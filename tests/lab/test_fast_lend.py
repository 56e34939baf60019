"""Fast lending on the lab: the bridge requeues a preempt-mode lend's victims itself
(Slurm's own requeue: the job gets SIGTERM, is requeued and runs again), and a load step
that needs two more replicas of `busy` gets two nodes in one tick, returned later with no
failed request."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.reconciler import Reconciler
from bridge.lab.showcase import Load
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.policy import Lend

from .helpers import sbatch, squeue_state, tick_until, tick_until_baseline, wait_state

pytestmark = pytest.mark.lab

#: an elastic job that checkpoints on SIGTERM (what Slurm sends when it requeues a job):
#: it appends a line per run and per signal to its own file
CHECKPOINTING = """#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0}" >> {marker}
trap 'echo "term ${SLURM_RESTART_COUNT:-0}" >> {marker}; exit 0' TERM
sleep 3600 &
wait
"""


def test_a_preempt_lend_requeues_the_victim_which_checkpoints_and_runs_again(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, _ = bridge
    assert rec.requests is not None
    node = lab.pool_nodes("elastic")[0].name
    log: list[str] = []
    marker = tmp_path / "checkpoints.log"
    script = tmp_path / "ckpt.sbatch"
    script.write_text(CHECKPOINTING.replace("{marker}", str(marker)))
    job = sbatch(
        lab,
        "-p",
        "elastic",
        "-A",
        "team-research",
        "-w",
        node,
        "--gres=gpu:1",
        "--requeue",
        "-o",
        str(tmp_path / "ckpt-%j.out"),
        str(script),
    )
    try:
        # the elastic job starts on its node while the baseline starts on the reserved one
        tick_until_baseline(rec, lab, log)
        _lend_and_return(rec, lab, node, job, marker, log)
    finally:
        rec.slurm.cancel(job)


def _lend_and_return(
    rec: Reconciler, lab: LabSpec, node: str, job: str, marker: Path, log: list[str]
) -> None:
    assert rec.requests is not None
    wait_state(lab, job, {"RUNNING"}, 60)
    # RUNNING comes before the prolog and the script's first line: lend only once the
    # job's first run has begun (else the requeue's SIGTERM can beat its trap)
    deadline = time.monotonic() + 60
    while not (marker.exists() and "run 0" in marker.read_text()):
        assert time.monotonic() < deadline, "the elastic job's first run never began"
        time.sleep(0.2)
    queue, store = rec.requests, rec.store
    ask_lend(queue, node, ["busy"])
    tick_until(
        rec,
        lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()),
        120,
        log,
    )
    # The bridge requeued the job itself (not slurmctld's preemption pass)...
    assert any(f"requeued job {job} for the lend" in line for line in log), "\n".join(log)
    # ...which got SIGTERM in its first run and is requeued, not cancelled.
    lines = marker.read_text().split("\n")
    assert "run 0" in lines and "term 0" in lines
    state, _ = squeue_state(lab, job)
    assert state in {"PENDING", "REQUEUED", "CONFIGURING", "RUNNING"}
    (lease,) = store.open_leases()
    assert lease.id is not None
    ask_return(queue, lease.id)
    tick_until(rec, lambda: not store.open_leases(), 120, log)
    # Slurm holds a requeued job for its requeue delay (the lab's cred_expire + 1: 31 s from
    # the requeue), then it runs again: a second run, on the node it was taken from or another
    # elastic one. The node is back now, so the test lifts the rest of the hold (the job's
    # begin time, what the delay sets) rather than wait it out: the run after it is Slurm's.
    slurm(lab, "scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_state(lab, job, {"RUNNING"}, 240)
    deadline = time.monotonic() + 30
    while "run 1" not in marker.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "run 1" in marker.read_text().split("\n")


def test_a_load_step_that_needs_two_replicas_more_gets_two_nodes_in_one_tick(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    """45 req/s on busy (one instance of 20 ms): with the 1.25 headroom, two replicas
    would give a p99 over 100 ms, three under it. The capacity model asks for both nodes
    at once; the loads of the return run on with no failed request."""
    rec, endpoint = bridge
    # a return dwell of 2 s (the fixture's 6 s): the return waits for Triton's p99 window
    # to forget the step anyway (below), and the dwell's rate is the trickle's either way
    policy = rec.config.policy.model_copy(update={"max_lent_nodes": 2, "return_dwell_s": 2})
    rec.config = rec.config.model_copy(update={"policy": policy})
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    heavy = Load(endpoint, 45.0, 40.0, seed=1)
    heavy.start()
    time.sleep(2.0)
    rec.observer.observe(time.time())  # a scrape inside the step: the next window is all load
    time.sleep(2.0)
    report = rec.run_once(datetime.now(UTC))
    log += report.lines()
    lends = [a for a in report.actions if isinstance(a, Lend)]
    assert len(lends) == 2, "\n".join(log)
    assert all(a.models == ("busy",) and a.reason.startswith("capacity:") for a in lends)
    store = rec.store
    tick_until(
        rec,
        lambda: sum(x.state == LeaseState.SERVING for x in store.open_leases()) == 2,
        120,
        log,
    )
    heavy.join()
    # The return waits for the step's queueing to leave Triton's 60 s p99 window (calm is
    # p99 under the low watermark), so it comes a minute or more after the step began, how
    # long the step lasts aside. The trickle runs until every lease is back (a trickle of
    # fixed length would have to outlast the return, and then the test waited it out).
    light = Load(endpoint, 4.0, 600.0, seed=2)
    light.start()
    try:
        tick_until(rec, lambda: not store.open_leases(), 90, log)
    finally:
        light.stop_sending.set()  # what is in flight is still answered and counted
        light.join(90)
    assert heavy.report is not None and light.report is not None
    assert light.report.total.ok > 0
    assert heavy.report.total.errors == {} and heavy.report.total.dropped == 0
    assert light.report.total.errors == {} and light.report.total.dropped == 0
