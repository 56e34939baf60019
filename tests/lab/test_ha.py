"""Two bridges, one active, on the lab and the local PostgreSQL: the standby observes and
never acts; `kill -9` of the active one while a lend is in flight, and the other finishes
the lend (no duplicate Triton job, no lease lost); PostgreSQL restarted under both, and no
double action; operator requests through the standby's API, recorded under the token's
name."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from bridge.daemon.actuator import record_of
from bridge.lab.pair import Instance
from bridge.lab.spec import LabSpec
from bridge.lab.tokens import token_file
from bridge.leases import leader
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import lease_of
from tests.lab.helpers import cancel_triton_jobs, until

pytestmark = pytest.mark.lab
S = LeaseState
TICK_S = 2.0
#: the Triton jobs alive (squeue also lists finished ones until they age out)
LIVE: dict[str, Any] = {"tag": "stb:triton", "states": ("PENDING", "CONFIGURING", "RUNNING")}


def _lease_jobs(lab: LabSpec, store: LeaseStore, lease_id: int) -> list[str]:
    """Slurm jobs (queued, running or completing) tagged with this lease (its id and
    creation time: lease ids of earlier databases do not count)."""
    ref = record_of(store.get(lease_id)).ref
    return [j.job_id for j in SlurmCLI(env=lab.env()).jobs() if lease_of(j.tags) == ref]


def _ticks(x: Instance) -> float:
    """The ticks daemon `x` has run (stb_ticks_total, every outcome); 0 while its exporter
    does not answer."""
    try:
        page = httpx.get(f"http://{x.exporter}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
        if line.startswith("stb_ticks_total{")
    )  # fmt: skip


def _restart_postgres() -> bool:
    """Restart the local PostgreSQL cluster; False where this host cannot."""
    if shutil.which("pg_lsclusters") is None or shutil.which("pg_ctlcluster") is None:
        return False
    listed = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True)
    online = [line.split() for line in listed.stdout.splitlines() if " online " in line]
    if listed.returncode != 0 or len(online) != 1:
        return False
    version, cluster = online[0][0], online[0][1]
    done = subprocess.run(
        ["pg_ctlcluster", version, cluster, "restart"], capture_output=True, text=True, timeout=60
    )
    return done.returncode == 0


def test_two_bridges_one_acts_and_the_other_takes_over(
    lab: LabSpec, pg_database: str, tmp_path: Path
) -> None:
    engine: Engine = make_engine(pg_database)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    a = Instance("bridge-a", lab, tmp_path / "a", pg_database, TICK_S)
    b = Instance("bridge-b", lab, tmp_path / "b", pg_database, TICK_S)
    operator = {
        "Authorization": f"Bearer {token_file(lab.api_dir, 'operator').read_text().strip()}"
    }
    node = lab.pool_nodes("elastic")[0].name
    lease_id: int | None = None
    try:
        a.start().wait_role("active")
        b.start().wait_role("standby")
        assert a.metric("stb_active") == 1 and b.metric("stb_active") == 0
        assert "bridge-b is standing by: bridge-a (epoch 1) leads" in b.log.read_text()

        # an operator asks the standby's API; the active one carries it out
        asked = httpx.post(
            f"http://{b.exporter}/api/lend",
            json={"node": node, "models": ["busy"]},
            headers=operator,
            timeout=5,
        )
        assert asked.status_code == 202, asked.text
        in_flight = (S.REQUESTED, S.SUBMITTED, S.STARTING)
        until(
            "a lend in flight",
            lambda: any(x.state in in_flight for x in store.open_leases()),
            30,
            0.02,
        )
        (lease,) = store.open_leases()
        lease_id = lease.id
        assert lease_id is not None
        killed_at = time.time()
        a.kill()  # the active host is gone, its lend half done

        took_at = until("b leads", lambda: b.role() == "active", 5 * TICK_S)
        held = leader.current(engine)
        assert held is not None and (held.holder, held.epoch) == ("bridge-b", 2)
        # a comes back on its host while b finishes the lend (its start-up, some 5-10 s
        # of imports, beside b's lend); it stands by (below)
        a.start()
        served_at = until(
            "b finishes the lend", lambda: store.get(lease_id).state == S.SERVING, 120
        )
        after = [e for e in store.history(lease_id) if e.at.timestamp() >= killed_at]
        print(
            f"\nfailover: killed in {lease.state.value}; b active after "
            f"{took_at - killed_at:.2f}s (TTL {TICK_S:g}s = tick), first move by b after "
            f"{after[0].at.timestamp() - killed_at:.2f}s ({after[0].to_state.value}), "
            f"serving after {served_at - killed_at:.2f}s"
        )
        # takeover bound: the TTL, one beat, one tick (and polling)
        assert took_at - killed_at <= TICK_S + TICK_S / 3 + TICK_S + 1.0
        assert len(_lease_jobs(lab, store, lease_id)) == 1  # one Triton job: none duplicated
        assert [x.id for x in store.by_node(node)] == [lease_id]  # no lease lost or doubled
        req = queue.pending()
        assert req == []

        # a, back on its host, stands by
        a.wait_role("standby")

        # the database restarted under both: one leads afterwards, nothing acted twice
        jobs_before = sorted(j.job_id for j in SlurmCLI(env=lab.env()).jobs(**LIVE))
        events_before = len(store.history(lease_id))
        if _restart_postgres():
            # both have ticked twice on the restarted database (a tick whose beat would
            # hand the lead over has committed it by the next), instead of 4 ticks blind
            ticked = {x.name: _ticks(x) for x in (a, b)}
            assert all(ticked.values()), ticked  # both exporters answered
            until(
                "two ticks of each after the restart",
                lambda: all(_ticks(x) >= ticked[x.name] + 2 for x in (a, b)),
                10 * TICK_S,
                0.2,
            )
            until(
                "one leader after the restart",
                lambda: {a.role(), b.role()} == {"active", "standby"},
                10 * TICK_S,
            )
            assert sum(x.metric("stb_active") or 0 for x in (a, b)) == 1
            triton_jobs = SlurmCLI(env=lab.env()).jobs(**LIVE)
            assert sorted(j.job_id for j in triton_jobs) == jobs_before
            assert store.get(lease_id).state == S.SERVING
            assert len(store.history(lease_id)) == events_before
        else:
            print("PostgreSQL not restartable here (no single pg_ctlcluster cluster): skipped")

        # the operator returns it through the standby's API, under the token's name
        standby = a if a.role() == "standby" else b
        back = httpx.post(
            f"http://{standby.exporter}/api/return",
            json={"lease": lease_id},
            headers=operator,
            timeout=5,
        )
        assert back.status_code == 202, back.text
        until("returned", lambda: store.get(lease_id).state == S.RETURNED, 120)
        req_id = back.json()["request"]
        done = queue.get(req_id)
        assert done is not None and done.requested_by == "lab-operator"
        assert done.outcome.startswith(f"lease {lease_id} returning")
    finally:
        for x in (a, b):
            x.stop()
        cancel_triton_jobs(lab)  # the baseline they started, and a lease's job if left
        engine.dispose()
