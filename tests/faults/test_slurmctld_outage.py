"""Fault 1: slurmctld stopped for 30 s and restarted while a lend is in flight.

The real `stb daemon` (APScheduler, 1 s ticks) lends the elastic node on an operator
request; as soon as the lease's Triton job runs and its tritonserver has started (the
lease is `submitted` or `starting`, not yet serving), the lab's slurmctld is stopped by
its pid file, kept down 30 s, and started again. Expected: the ticks of the outage end
`failed` or `errors` with transient step errors counted (no `ok` tick while Slurm cannot
be reached, /healthz 503), the lease never moves to `failed`, no second Triton job is
submitted, and once slurmctld is back the lend completes (serving) with no one's help.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend
from bridge.lab.spec import LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import ControllerUnreachable
from bridge.slurm.model import TRITON_TAG, lease_of

from .tools import (
    DaemonProc,
    delta,
    restart_lab,
    stop_lab_daemon,
    tritonserver_pids,
    until,
)

pytestmark = pytest.mark.lab
#: long enough for ticks begun after the first 15 s (all must fail) to end within it
OUTAGE_S = 30.0


def _lease_jobs(cli: SlurmCLI, lease_id: int) -> list[str]:
    return [
        j.job_id
        for j in cli.jobs(tag=TRITON_TAG)
        if (lease_of(j.tags) or (0, 0))[0] == lease_id and j.state in ("PENDING", "RUNNING")
    ]


def test_slurmctld_outage_while_a_lend_is_in_flight(
    lab: LabSpec, daemon_config: Path, daemons: Callable[..., DaemonProc]
) -> None:
    daemon = daemons(daemon_config)
    engine = make_engine(daemon.database_url)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    node = lab.pool_nodes("elastic")[0]
    until("the daemon's first good tick", lambda: daemon.healthz() == 200, 60)

    ask_lend(queue, node.name, ["busy"])

    def in_flight() -> bool:
        leases = store.by_node(node.name, open_only=True)
        return bool(
            leases
            and leases[-1].state in (LeaseState.SUBMITTED, LeaseState.STARTING)
            and leases[-1].slurm_job_id
            and tritonserver_pids(node.addr)  # past the sbatch script's own scontrol call
        )

    until("the lend in flight (job running, Triton starting)", in_flight, 90, step=0.02)
    (lease,) = store.by_node(node.name, open_only=True)
    assert lease.id is not None
    job_id, stopped_in = lease.slurm_job_id, lease.state.value
    before = daemon.must_metrics()

    stop_lab_daemon(lab, "slurmctld")
    stopped = time.monotonic()
    states: list[str] = []
    health: set[int | None] = set()
    settled = None  # metrics once any tick begun before the stop has ended
    try:
        while time.monotonic() - stopped < OUTAGE_S:
            states.append(store.get(lease.id).state.value)
            health.add(daemon.healthz())
            if settled is None and time.monotonic() - stopped > 15:
                settled = daemon.must_metrics()
            time.sleep(1)
        during = daemon.must_metrics()
    finally:
        restarting = time.monotonic()
        restart_lab(lab)

    until(
        "the lend completes after slurmctld is back",
        lambda: store.get(lease.id or 0).state == LeaseState.SERVING,
        120,
        step=0.5,
    )
    to_serving = time.monotonic() - restarting
    until("a good tick again", lambda: daemon.healthz() == 200, 30)
    after = daemon.must_metrics()
    history = [e.to_state.value for e in store.history(lease.id)]
    print(
        f"stopped in {stopped_in}; ticks during the outage "
        f"{delta(during.ticks(), before.ticks())}; step errors "
        f"{delta(during.step_errors(), before.step_errors())}; serving "
        f"{to_serving:.1f}s after slurmctld was started again; history {history}"
    )

    # The outage: ticks failed (or completed with errors), none ok, errors transient.
    ticks = delta(during.ticks(), before.ticks())
    assert ticks.get("failed", 0) + ticks.get("errors", 0) >= 1, ticks
    assert settled is not None
    assert delta(during.ticks(), settled.ticks()).get("ok", 0) == 0, during.ticks()
    step_errors = delta(during.step_errors(), before.step_errors())
    transient = sum(v for (_step, kind), v in step_errors.items() if kind == "transient")
    assert transient >= 1, step_errors
    assert 503 in health, health
    # No lease failed because of it; the lend went on once Slurm answered.
    assert "failed" not in states and "failed" not in history, (states, history)
    assert history[-1] == "serving"
    assert delta(after.ticks(), during.ticks()).get("ok", 0) >= 1
    # One Triton job for the lease, the one submitted before the outage.
    cli = SlurmCLI(env=lab.env())
    assert store.get(lease.id).slurm_job_id == job_id
    assert _lease_jobs(cli, lease.id) == [job_id]
    assert [x.id for x in store.by_node(node.name)] == [lease.id]  # no second lease


def test_the_job_list_raises_while_slurmctld_is_down(lab: LabSpec) -> None:
    cli = SlurmCLI(env=lab.env())
    stop_lab_daemon(lab, "slurmctld")
    try:
        with pytest.raises(ControllerUnreachable):
            print(f"squeue with slurmctld down gave: {cli.jobs()}")
    finally:
        restart_lab(lab)
