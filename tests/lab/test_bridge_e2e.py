"""The bridge at work on the lab, end to end: real Slurm, real Triton, real nginx, traffic
from the load generator through nginx.

A load step on `busy` makes p99 breach; the reconciler lends the elastic node (its
elastic job is requeued by Slurm), Triton starts there as a Slurm job and enters routing;
when the load falls to a trickle the lease is returned (out of routing, drained,
unloaded, cancelled) with no failed request, and the node is back with Slurm.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.report import Window, build_report
from bridge.daemon.reconciler import Reconciler
from bridge.db import make_engine
from bridge.lab.showcase import Scenario
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import ingest_window
from bridge.ledger.lending import lending_section
from bridge.lifecycle import LeaseState

from .helpers import wait_sacct_final

pytestmark = pytest.mark.lab
TICK_S = 2.0


def test_load_step_lends_the_elastic_node_and_returns_it_without_a_failed_request(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    t0 = datetime.now(UTC)
    res = Scenario(lab, rec, endpoint).run(wait_requeued=False)
    assert res.heavy is not None and res.light is not None
    print(
        f"heavy: {res.heavy.total.ok} ok, p99 {res.heavy.total.latency.p99_ms} ms; "
        f"light: {res.light.total.ok} ok"
    )
    assert res.lease_node == lab.pool_nodes("elastic")[0].name
    assert res.lease_states == [
        "requested",
        "submitted",
        "starting",
        "serving",
        "draining",
        "releasing",
        "returned",
    ]
    assert res.victim_restarts == 1  # Slurm requeued the elastic job
    assert res.training_untouched  # no training job killed or requeued
    # No request failed, during the load step or during the return.
    assert res.heavy.total.errors == {} and res.heavy.total.dropped == 0
    assert res.light.total.errors == {} and res.light.total.dropped == 0
    # The node is back with Slurm: no fence, no Triton job left on it.
    assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
    assert not [
        j
        for j in rec.slurm.jobs(tag="stb:triton")
        if res.lease_node in j.nodes and j.state == "RUNNING"
    ]

    # What the lend cost, from the same lease history and the ledger of the window: the
    # lent GPU time is the Triton job's (sacct), the startup is starting -> serving on the
    # node's GPUs, and the transitions are a part of the lent time.
    (lease,) = [ls for ls in rec.store.touched_since(t0) if ls.node == res.lease_node]
    assert lease.slurm_job_id is not None
    booked = wait_sacct_final(lab, lease.slurm_job_id, timeout_s=90)
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    # the next whole second (the ledger keeps seconds), waited for: never before the
    # lease's last event (24.11's sacct is final at once, so a truncated now could be)
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    time.sleep(max(0.0, (now - datetime.now(UTC)).total_seconds()))
    ingest_window(rec.config, rec.slurm, ledger, floor_hour(t0), now,
                  leases=rec.store.touched_since(t0), now=now)  # fmt: skip
    window = Window(floor_hour(t0), floor_hour(now) + timedelta(hours=1), "e2e")
    engine = make_engine(rec.config.database_url)
    section = lending_section(ledger, engine, window, None, now=now)
    row = next(r for r in section.rows if r["pool"] == "elastic")
    print("lending:", row)
    gpus = next(n.gpus for n in rec.slurm.nodes() if n.name == res.lease_node)
    # the lease's own lent rows are its Triton job's time (the hour may hold other lends
    # of this lab, which the view's lent column also counts)
    tag = f"{lease.id}.{int(lease.created_at.timestamp())}"
    by_lease = build_report(ledger, window, ("pool", "lease"))
    mine = sum(li.gpu_ms for li in by_lease.lines if li.keys == {"pool": "elastic", "lease": tag})
    assert mine == gpus * booked["time"]["elapsed"] * 1000  # the job takes the whole node
    assert row["leases"] == 1 and row["lent_gpu_hours"] >= mine / 3_600_000
    at = {e.to_state: e.at for e in rec.store.history(lease.id or 0)}
    startup_s = (at[LeaseState.SERVING] - at[LeaseState.STARTING]).total_seconds()
    assert row["startup_gpu_hours"] == pytest.approx(gpus * startup_s / 3600, abs=1e-6)
    drain_s = (at[LeaseState.RETURNED] - at[LeaseState.DRAINING]).total_seconds()
    assert row["drain_gpu_hours"] == pytest.approx(gpus * drain_s / 3600, abs=1e-6)
    assert 0 < row["transition_share"] < 1
