"""Crash safety on the lab: whatever moment the daemon dies at, a restart ends with the
same lease state, no duplicate lease or Triton job, and no fence left behind.

The two windows inside a tick are reproduced exactly: a lease recorded but not yet
submitted, and a Triton job submitted but its id not yet recorded. The others are hit with
a real `kill -9` of `stb daemon` as soon as its lease is seen in each state (submitted,
starting, serving, draining, releasing), followed by a restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon import launcher
from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.leases.models import LendMode
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import lease_of

from .helpers import tick_until

pytestmark = pytest.mark.lab


def _until(what: str, cond: Callable[[], bool], timeout_s: float, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(step)


def _lease_jobs(cli: SlurmCLI, lease_id: int) -> list[str]:
    return [
        j.job_id
        for j in cli.jobs(tag="stb:triton")
        if (lease_of(j.tags) or (0, 0))[0] == lease_id and j.state in ("PENDING", "RUNNING")
    ]


def test_crash_after_recording_the_lend_before_sbatch(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, _ = bridge
    node = lab.pool_nodes("elastic")[0].name
    lease = rec.store.create(  # the daemon's write of a lend, its audit entry with it
        node,
        "elastic",
        LendMode.PREEMPT,
        ["busy"],
        "crash-a",
        datetime.now(UTC),
        audit=rec.audit.within("lend", f"node {node}", "crash-a"),
    )
    assert lease.id is not None
    tick_until(rec, lambda: rec.store.get(lease.id or 0).state == LeaseState.SERVING, 90)
    assert len(_lease_jobs(rec.slurm, lease.id)) == 1  # submitted once


def test_crash_after_sbatch_before_recording_the_job(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, _ = bridge
    node = lab.pool_nodes("elastic")[0].name
    lease = rec.store.create(  # the daemon's write of a lend, its audit entry with it
        node,
        "elastic",
        LendMode.PREEMPT,
        ["busy"],
        "crash-b",
        datetime.now(UTC),
        audit=rec.audit.within("lend", f"node {node}", "crash-b"),
    )
    assert lease.id is not None
    spec = launcher.triton_job(
        rec.config.triton,
        node=node,
        models=["busy"],
        lease=(lease.id, int(lease.created_at.timestamp())),
        exclusive=True,
        gpus=lab.gpus_per_node,
    )
    orphan = rec.slurm.submit(spec)  # the daemon died right after this sbatch
    tick_until(rec, lambda: rec.store.get(lease.id or 0).state == LeaseState.SERVING, 90)
    assert rec.store.get(lease.id).slurm_job_id == orphan
    assert _lease_jobs(rec.slurm, lease.id) == [orphan]  # adopted, not submitted again


ORDER = ["requested", "submitted", "starting", "serving", "draining", "releasing", "returned"]


def test_kill_9_in_each_lease_state(lab: LabSpec, daemon_config: Path, tmp_path: Path) -> None:
    """kill -9 the daemon as soon as its lease is seen in each state (the kill lands
    between ticks or inside one, whichever comes), restart it, and check it converges."""
    env = os.environ | lab.env() | {"STB_HOME": str(project_root())}
    stb = str(Path(sys.executable).with_name("stb"))
    log = open(tmp_path / "daemon.log", "ab")  # noqa: SIM115 - closed below

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [stb, "daemon", "-c", str(daemon_config)], env=env, stdout=log, stderr=subprocess.STDOUT
        )

    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    store, queue, cli = LeaseStore(engine), RequestQueue(engine), SlurmCLI(env=lab.env())
    node = lab.pool_nodes("elastic")[0].name
    daemon = start()
    killed_in: list[str] = []

    def kill_in(state: str) -> None:
        """Wait for the lease to be in `state`; kill -9 and restart the daemon there."""
        nonlocal daemon
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            leases = store.by_node(node)
            now_state = leases[-1].state.value if leases else "requested"
            if now_state == state:
                daemon.send_signal(signal.SIGKILL)
                daemon.wait(timeout=10)
                killed_in.append(state)
                daemon = start()  # the lock died with the process: the restart takes it
                return
            if ORDER.index(now_state) > ORDER.index(state):
                return  # passed it between two looks
            time.sleep(0.02)
        raise AssertionError(f"lease never reached {state}")

    try:
        ask_lend(queue, node, ["busy"])
        for state in ("submitted", "starting", "serving"):
            kill_in(state)
        _until("serving again", lambda: store.by_node(node)[-1].state == LeaseState.SERVING, 60)
        (lease,) = store.open_leases()
        assert lease.id is not None
        # A second lend of the same node while it is lent is refused, not duplicated.
        dup = ask_lend(queue, node, ["busy"])
        _until(
            "the duplicate lend answered",
            lambda: (queue.get(dup.id or 0) or dup).done_at is not None,
            30,
        )
        assert "already lent" in (queue.get(dup.id or 0) or dup).outcome
        assert len(_lease_jobs(cli, lease.id)) == 1
        ask_return(queue, lease.id)
        for state in ("draining", "releasing"):
            kill_in(state)
        _until("returned", lambda: store.get(lease.id or 0).state == LeaseState.RETURNED, 120)
        print(f"killed -9 in: {', '.join(killed_in)}")
        assert len(killed_in) >= 4 and {"serving", "releasing"} <= set(killed_in), killed_in
        states = [e.to_state.value for e in store.history(lease.id)]
        assert states == ORDER
        assert [lease.id] == [x.id for x in store.by_node(node)]  # no duplicate lease
        assert _lease_jobs(cli, lease.id) == []
        assert not [r for r in cli.reservations() if r.name.startswith("stb-lease-")]
        baselines = [j for j in cli.jobs(tag="stb:baseline") if j.state == "RUNNING"]
        assert len(baselines) == 1  # the restarts did not start a second baseline
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        for job in cli.jobs(tag="stb:triton"):
            cli.cancel(job.job_id)
