"""Fault 6: the lease database unreachable for 30 s.

The real `stb daemon` keeps its leases in PostgreSQL (127.0.0.1:5432, a database of this
test's own), reached through a TCP forwarder on 127.0.0.1 that the test pauses: open
connections are cut and new ones refused for 30 s. Before the pause the elastic node is
lent and serving; at the pause the test cancels the baseline Triton job (a tick that
could act would start a new one) and queues an operator return directly in PostgreSQL
(which the daemon cannot read). Expected: the ticks of the outage fail (outcome
"failed"; no "ok" tick, /healthz 503); no Slurm action is taken meanwhile (no sbatch, the
lent replica's job untouched); when the forwarder listens again the daemon resumes by
itself: good ticks, the baseline started again, the queued return carried out.
Skipped, with the reason, when no PostgreSQL answers.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.lab.spec import LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, make_engine
from bridge.lifecycle import LeaseState
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import BASELINE_TAG, TRITON_TAG

from .tools import DaemonProc, TcpForwarder, delta, until

pytestmark = pytest.mark.lab
POSTGRES = ("127.0.0.1", 5432)
OUTAGE_S = 30.0


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A database of this test's own on the local PostgreSQL; dropped after."""
    try:
        admin = psycopg.connect(
            f"host={POSTGRES[0]} port={POSTGRES[1]} user=postgres dbname=postgres",
            autocommit=True,
            connect_timeout=3,
        )
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL does not answer at {POSTGRES[0]}:{POSTGRES[1]}: {exc}")
    name = f"stb_faults_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def forwarder() -> Iterator[TcpForwarder]:
    fwd = TcpForwarder(POSTGRES).start()
    yield fwd
    fwd.close()


def test_lease_database_unreachable_for_30s(
    lab: LabSpec,
    daemon_config: Path,
    daemons: Callable[..., DaemonProc],
    pg_database: str,
    forwarder: TcpForwarder,
) -> None:
    through = f"postgresql+psycopg://postgres@127.0.0.1:{forwarder.port}/{pg_database}"
    direct = f"postgresql+psycopg://postgres@{POSTGRES[0]}:{POSTGRES[1]}/{pg_database}"
    config = daemon_config.read_text()
    config = re.sub(r'(?m)^database_url = ".*"$', f'database_url = "{through}"', config)
    daemon_config.write_text(config)
    daemon = daemons(daemon_config)
    until("the daemon's first good tick", lambda: daemon.healthz() == 200, 60)
    engine = make_engine(direct)  # the test's own way in, around the forwarder
    store, queue = LeaseStore(engine), RequestQueue(engine)
    cli = SlurmCLI(env=lab.env())
    lent, reserved = lab.pool_nodes("elastic")[0], lab.pool_nodes("infer")[0]

    ask_lend(queue, lent.name, ["busy"])
    until(
        "the lease serving",
        lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()),
        120,
        step=0.5,
    )
    (lease,) = store.open_leases()
    assert lease.id is not None and lease.slurm_job_id

    def baselines() -> list[str]:
        return [
            j.job_id
            for j in cli.jobs(tag=BASELINE_TAG)
            if j.state in ("PENDING", "RUNNING") and (reserved.name in j.nodes or not j.nodes)
        ]

    (baseline,) = baselines()
    before = daemon.must_metrics()

    forwarder.pause()
    paused = time.monotonic()
    assert forwarder.refuses()
    cli.cancel(baseline)  # a tick able to act would start another baseline
    ret = ask_return(queue, lease.id)  # out of the daemon's sight
    jobs_before = {j.job_id for j in cli.jobs(tag=TRITON_TAG)}
    health: set[int | None] = set()
    new_jobs: set[str] = set()
    settled = None
    try:
        while time.monotonic() - paused < OUTAGE_S:
            health.add(daemon.healthz())
            new_jobs |= {j.job_id for j in cli.jobs(tag=TRITON_TAG)} - jobs_before
            if settled is None and time.monotonic() - paused > 8:
                settled = daemon.must_metrics()
            time.sleep(1)
        during = daemon.must_metrics()
        lent_job = [j for j in cli.jobs() if j.job_id == lease.slurm_job_id]
    finally:
        forwarder.resume()
    resumed = time.monotonic()

    ticks = delta(during.ticks(), before.ticks())
    print(
        f"during the outage: ticks {ticks}, step errors "
        f"{delta(during.step_errors(), before.step_errors())}, /healthz {health}"
    )
    assert ticks.get("failed", 0) >= 1, ticks
    assert settled is not None
    assert delta(during.ticks(), settled.ticks()).get("ok", 0) == 0, during.ticks()
    assert 503 in health, health
    # No Slurm action while blind: nothing submitted, the lent replica's job untouched.
    assert new_jobs == set(), new_jobs
    assert [j.state for j in lent_job] == ["RUNNING"], lent_job
    assert store.get(lease.id).state == LeaseState.SERVING
    assert (queue.get(ret.id or 0) or ret).done_at is None

    # Back: the daemon resumes by itself.
    until("a good tick after the outage", lambda: daemon.healthz() == 200, 60)
    until("the baseline started again", lambda: bool(baselines()), 60)
    until(
        "the queued return carried out",
        lambda: store.get(lease.id or 0).state == LeaseState.RETURNED,
        90,
        step=0.5,
    )
    print(f"resumed: returned {time.monotonic() - resumed:.1f}s after the database came back")
    assert forwarder.accepted >= 2  # the daemon reconnected through the forwarder
    after = daemon.must_metrics()
    assert delta(after.ticks(), during.ticks()).get("ok", 0) >= 1
    states = [e.to_state.value for e in store.history(lease.id)]
    assert states[-4:] == ["serving", "draining", "releasing", "returned"], states
