"""The fleet's modes on a running lab (issue 33's migration path), through the
reconciler: with busy under load and a training job running, a lent elastic node goes
back when the fleet switches to separate (within one drain timeout), advisory lends
nothing and refuses an operator's lend naming the mode, shared lends again, and the
fallback returns the lease again; no request fails, the training job is never touched,
and each switch's figures count the training job from Slurm's accounting."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from bridge.audit.asks import ask_lend, switch_fleet
from bridge.daemon.reconciler import Reconciler
from bridge.fleet.baseline import measure
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.leases.fleet import FleetStore
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson

from .helpers import (
    Sender,
    sbatch,
    scontrol_show,
    tick_until,
    tick_until_baseline,
    wait_state,
)

pytestmark = pytest.mark.lab

S = LeaseState


def _serving(rec: Reconciler) -> bool:
    return any(x.state == S.SERVING for x in rec.store.open_leases())


def test_separate_advisory_shared_separate_loses_nothing(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store, fleet = rec.requests, rec.store, FleetStore.beside(rec.store)
    elastic = lab.pool_nodes("elastic")[0].name
    train = lab.pool_nodes("train")[0].name
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    training = sbatch(
        lab, "-p", "train", "-A", lab.accounts[0], "-w", train, "--gres=gpu:2",
        "--requeue", "--wrap", "sleep 600",
    )  # fmt: skip
    wait_state(lab, training, {"RUNNING"}, 30)
    sender = Sender(endpoint, poisson(20.0, 90.0, seed=43), "busy")
    sender.start()
    try:
        ask_lend(queue, elastic, ["busy"])
        tick_until(rec, lambda: _serving(rec), 90, log)

        # separate: the lease goes back within one drain timeout
        now = datetime.now(UTC)
        figures = measure(rec.config, rec.slurm, now, 3600.0)
        switch_fleet(fleet, "separate", now=now, who="test", baseline=figures)
        began = time.monotonic()
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        took = time.monotonic() - began
        assert took < rec.config.leases.drain_timeout_s, (took, "\n".join(log))
        assert figures["training"]["training"]["jobs"] >= 1, figures  # sacct saw the job

        # advisory: nothing lent, an operator's lend refused naming the mode
        switch_fleet(fleet, "advisory", who="test")
        request = ask_lend(queue, elastic, ["busy"])
        tick_until(rec, lambda: (queue.get(request.id or 0) or request).done_at is not None, 10)
        outcome = (queue.get(request.id or 0) or request).outcome
        assert outcome.startswith("refused: pool elastic is held by fleet mode advisory"), outcome
        assert store.open_leases() == []

        # shared: lent again; then the fallback returns it again
        switch_fleet(fleet, "shared", who="test")
        ask_lend(queue, elastic, ["busy"])
        tick_until(rec, lambda: _serving(rec), 90, log)
        switch_fleet(fleet, "separate", who="test", why="fallback")
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        sender.finish()
        c = sender.counters
        assert c.sent > 100 and c.ok == c.sent and c.errors == 0 and c.dropped == 0, (
            c,
            "\n".join(log),
        )
        shown = scontrol_show(lab, "job", training)[training]
        assert shown["JobState"] == "RUNNING" and shown["Restarts"] == "0", shown
    finally:
        sender.stop()
        slurm(lab, "scancel", training, check=False)
