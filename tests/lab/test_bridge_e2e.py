"""The bridge at work on the lab, end to end, as a new site meets it: `stb init` writes a
configuration from the live cluster, and `stb lab demo` (the README's main command, its
`bridge.lab.demo.run`: the daemon's parts wired by `service.build`) runs with it on real
Slurm, real Triton, real nginx, traffic from the load generator through nginx.

A load step on `busy` makes p99 breach; the reconciler lends the elastic node (its
elastic job is requeued by Slurm), Triton starts there as a Slurm job and enters routing;
when the load falls to a trickle the lease is returned (out of routing, drained,
unloaded, cancelled) with no failed request, and the node is back with Slurm. The lend's
cost in the ledger is the Triton job's GPU time (sacct).

(`test_init_lab.py` checks `stb init`'s file against the cluster; this test proves the
demo runs with its pools.) The demo runs once a session (`demo_run`, tests/lab/demo_run.py):
tests/lab/test_sim_vs_lab.py compares the same run with its simulated twin.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.report import Window, build_report
from bridge.db import make_engine
from bridge.lab.spec import LabSpec
from bridge.leases.store import LeaseStore
from bridge.ledger.feed import ingest_window
from bridge.ledger.lending import NodeGpus, lending_section, phase_gpu_ms, read_timelines
from bridge.lifecycle import LeaseState
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TRITON_TAG

from .demo_run import DemoRun
from .helpers import wait_sacct_final

pytestmark = pytest.mark.lab


def test_the_demo_on_inits_configuration_lends_the_elastic_node_and_returns_it_cleanly(
    lab: LabSpec, demo_run: DemoRun, tmp_path: Path
) -> None:
    t0, res, printed = demo_run.started, demo_run.result, demo_run.printed
    print(printed)
    print(f"the demo took {demo_run.wall_s:.0f}s")
    assert res.heavy is not None and res.light is not None
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
    assert " -> returned" in printed and "never touched" in printed
    assert res.victim_restarts == 1  # Slurm requeued the elastic job
    assert res.training_untouched  # no training job killed or requeued
    # No request failed, during the load step or during the return.
    assert res.heavy.total.errors == {} and res.heavy.total.dropped == 0
    assert res.light.total.errors == {} and res.light.total.dropped == 0
    # The node is back with Slurm: no fence, no Triton job left on it.
    slurm = SlurmCLI(env=lab.env())
    assert not [r for r in slurm.reservations() if r.name.startswith("stb-lease-")]
    assert not [
        j for j in slurm.jobs(tag=TRITON_TAG) if res.lease_node in j.nodes and j.state == "RUNNING"
    ]

    # What the lend cost, from the same lease history and the ledger of the window: the
    # lent GPU time is the Triton job's (sacct), the startup is starting -> serving on the
    # node's GPUs, and the transitions are a part of the lent time.
    config = demo_run.config  # the reconciler's: demo.lab_config(lab, init's toml)
    engine = make_engine(config.database_url)
    store = LeaseStore(engine)
    (lease,) = [ls for ls in store.touched_since(t0) if ls.node == res.lease_node]
    assert lease.slurm_job_id is not None and lease.id == res.lease_id
    booked = wait_sacct_final(lab, lease.slurm_job_id, timeout_s=90)
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    # the next whole second (the ledger keeps seconds), waited for: never before the
    # lease's last event (24.11's sacct is final at once, so a truncated now could be)
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    time.sleep(max(0.0, (now - datetime.now(UTC)).total_seconds()))
    ingest_window(config, slurm, ledger, floor_hour(t0), now,
                  leases=store.touched_since(t0), now=now)  # fmt: skip
    window = Window(floor_hour(t0), floor_hour(now) + timedelta(hours=1), "e2e")
    section = lending_section(ledger, engine, window, None, now=now)
    row = next(r for r in section.rows if r["pool"] == "elastic")
    print("lending:", row)
    gpus = next(n.gpus for n in slurm.nodes() if n.name == res.lease_node)
    # the lease's own lent rows are its Triton job's time (the hour may hold other lends
    # of this lab, which the view's lent column also counts)
    tag = f"{lease.id}.{int(lease.created_at.timestamp())}"
    by_lease = build_report(ledger, window, ("pool", "lease"))
    mine = sum(li.gpu_ms for li in by_lease.lines if li.keys == {"pool": "elastic", "lease": tag})
    assert mine == gpus * booked["time"]["elapsed"] * 1000  # the job takes the whole node
    assert row["leases"] >= 1 and row["lent_gpu_hours"] >= mine / 3_600_000
    at = {e.to_state: e.at for e in store.history(lease.id or 0)}
    startup_s = (at[LeaseState.SERVING] - at[LeaseState.STARTING]).total_seconds()
    drain_s = (at[LeaseState.RETURNED] - at[LeaseState.DRAINING]).total_seconds()
    # this lease's phases as the view counts them (the lab's database keeps every demo's
    # leases, so the hour's row may hold an earlier run's too)
    (timeline,) = [t for t in read_timelines(engine, window.start, now) if t.lease_id == lease.id]
    nodes = {lease.node: NodeGpus(gpus, "")}
    phases = phase_gpu_ms([timeline], nodes, window.start, now)["elastic"]
    ms = gpus * len(timeline.changes)  # each stretch is counted in whole ms, per GPU
    assert phases.startup_ms == pytest.approx(gpus * startup_s * 1000, abs=ms)
    assert phases.drain_ms == pytest.approx(gpus * drain_s * 1000, abs=ms)
    assert row["startup_gpu_hours"] >= phases.startup_ms / 3_600_000 - 1e-6
    assert row["drain_gpu_hours"] >= phases.drain_ms / 3_600_000 - 1e-6
    assert 0 < row["transition_share"] < 1
