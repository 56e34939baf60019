"""A lend of one MIG slice on the lab (issue 32), end to end through the reconciler, on
the node of fake MIG slices (`stb lab up --mig`: one H100 cut into 4g.40gb + 2g.20gb +
1g.10gb, in the partition `mig`, here made a preempt-mode pool): by an operator's lend
and by the real policy's. busy's replica is said
to take one 1g.10gb slice (`[models.busy] gpu_type`). A job holds the 4g slice.

- The real observation shows the node's free slices by type (Slurm's gres less its
  AllocTRES by type): the 2g and the 1g.
- An operator's lend of the node for busy asks `--gres=gpu:h100_1g.10gb:1` and holds that
  slice, not the node; the job beside it is not requeued and runs throughout; the
  replica serves through nginx; the return ends the Triton job, which the ledger books
  as inference under its lease at 1/7 of a GPU (sacct's record, ingested).
- With the 1g slice held by another (requeueable) job, the lend requeues that job alone.

The module's `lab` brings that node up (`with_mig_node`) and the lab back as it was after;
it runs last (`last`), so no other test sees the node or the restarts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.tables import LEDGER
from bridge.audit.asks import ask_lend, ask_return
from bridge.config import ModelOverride, PoolConfig, load_config
from bridge.daemon.observation import snapshot
from bridge.daemon.reconciler import Reconciler
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import MIG_POOL, LabSpec
from bridge.ledger.feed import ingest_window
from bridge.lifecycle import LeaseState as S
from bridge.load.arrivals import poisson
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from tests.lab.fixtures import with_mig_node

from .helpers import (
    BUSY_INPUT,
    Sender,
    sbatch,
    scontrol_show,
    squeue_state,
    tick_until,
    tick_until_baseline,
    upstreams,
    wait_sacct_final,
    wait_state,
)

#: last: this module's `lab` adds the node of MIG slices, and restarts the lab to do so
pytestmark = [pytest.mark.lab, pytest.mark.last]


@pytest.fixture(scope="module")
def lab(lab: LabSpec) -> Iterator[LabSpec]:
    """The session's lab with its node of MIG slices, for this module (`with_mig_node`)."""
    yield from with_mig_node(lab)


def _types(lab: LabSpec) -> tuple[str, str, str]:
    return tuple(f"{lab.gpu_type}_{p}" for p in ("1g.10gb", "2g.20gb", "4g.40gb"))  # type: ignore[return-value]


@pytest.fixture
def bridge_update(lab: LabSpec) -> dict[str, object]:
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    one = _types(lab)[0]
    return {
        "pools": {
            **base.pools,
            MIG_POOL: PoolConfig(partition=MIG_POOL, lend_mode="preempt", cost_rank=3),
        },
        "models": {**base.models, "busy": ModelOverride(gpu_type=one)},
    }


def _job_on(lab: LabSpec, slice_type: str, account: int = 0) -> str:
    """A requeueable job in the `mig` pool holding one slice of `slice_type`."""
    return sbatch(
        lab, "-p", MIG_POOL, "-A", lab.accounts[account], f"--gres=gpu:{slice_type}:1",
        "--requeue", "--wrap", "sleep 600",
    )  # fmt: skip


def _until_serving(rec: Reconciler, timeout_s: float, log: list[str]) -> None:
    """Tick until a lease serves."""
    store = rec.store
    tick_until(rec, lambda: any(x.state == S.SERVING for x in store.open_leases()), timeout_s, log)


def _ledger_books_the_slice(
    lab: LabSpec, job_id: str, lease_id: int, slice_type: str, tmp_path: Path
) -> None:
    """The lease's Triton job, ingested from sacct, is booked as inference under its lease
    at the slice's fraction of a GPU (1g of an H100's 7 compute slices: 1/7) x its elapsed
    time, as `[accounting.slices]` says by default."""
    rec = wait_sacct_final(lab, job_id)
    start = datetime.fromtimestamp(rec["time"]["start"], UTC)
    now = datetime.now(UTC)
    ledger = open_ledger(f"sqlite:///{tmp_path / 'mig-lend.db'}")
    ingest_window(lab_config(lab), SlurmCLI(env=lab.env()), ledger, floor_hour(start), now, now=now)
    with ledger.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.workload, LEDGER.c.lease, LEDGER.c.gpu_type, LEDGER.c.gpu_ms).where(
                LEDGER.c.source.startswith(f"{lab.cluster}:{job_id}:")
            )
        ).all()
    booked = sum(r.gpu_ms for r in rows)
    expected = rec["time"]["elapsed"] * 1000 / 7
    print(f"lease job {job_id}: elapsed {rec['time']['elapsed']} s, booked {booked} GPU-ms")
    # (the ledger names a lease by its job's tag: its id, then its creation time)
    assert rows and {r.gpu_type for r in rows} == {slice_type}, rows
    assert all(r.lease.startswith(f"{lease_id}.") for r in rows), rows
    assert {r.workload for r in rows} == {"inference"}, rows
    assert abs(booked - expected) < 2, (booked, expected)


def test_a_lend_of_one_mig_slice_leaves_the_job_on_the_other_slices_running(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.mig_nodes[0].name
    one, two, four = _types(lab)
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    job = _job_on(lab, four)
    other = ""
    try:
        wait_state(lab, job, {"RUNNING"}, 30)
        tick_until(rec, lambda: rec.last_observation is not None, 10, log)
        assert rec.last_observation is not None
        snap = snapshot(rec.last_observation, rec.config, [], {})
        (view,) = [n for n in snap.nodes if n.name == node]
        assert view.pool == MIG_POOL and dict(view.free_types) == {one: 1, two: 1, four: 0}

        request = ask_lend(queue, node, ["busy"])
        _until_serving(rec, 90, log)
        (lease,) = store.open_leases()
        assert (lease.gpus, lease.gpu_type) == (1, one) and lease.id is not None
        assert (queue.get(request.id or 0) or request).outcome == (
            f"lease {lease.id} lending {node}"
        )
        # The Triton job holds the 1g slice (not the 2g one Slurm gives `--gres=gpu:1`,
        # nor the node); the job beside it stays.
        triton = scontrol_show(lab, "job", str(lease.slurm_job_id))[str(lease.slurm_job_id)]
        assert f"gres/gpu:{one}=1" in triton.get("TRES", ""), triton
        assert f"gres/gpu:{two}" not in triton.get("TRES", ""), triton
        assert triton.get("OverSubscribe") != "NO", triton  # not --exclusive
        shown = scontrol_show(lab, "job", job)[job]
        assert shown["JobState"] == "RUNNING" and shown["Restarts"] == "0", shown
        # Its replica serves through nginx beside the baseline.
        assert len(upstreams(endpoint, "busy", BUSY_INPUT)) == 2
        ask_return(queue, lease.id)
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        assert squeue_state(lab, str(lease.slurm_job_id))[0] in ("", "COMPLETING")
        assert "requeued job" not in "\n".join(log)
        _ledger_books_the_slice(lab, str(lease.slurm_job_id), lease.id, one, tmp_path)

        # The 1g slice held by a job: the lend requeues that job, not the one on the 4g.
        other = _job_on(lab, one, account=1)
        wait_state(lab, other, {"RUNNING"}, 30)
        ask_lend(queue, node, ["busy"])
        _until_serving(rec, 90, log)
        (again,) = store.open_leases()
        assert (again.gpus, again.gpu_type) == (1, one)
        both = {**scontrol_show(lab, "job", job), **scontrol_show(lab, "job", other)}
        assert both[other]["Restarts"] == "1", both[other]
        assert both[job]["JobState"] == "RUNNING" and both[job]["Restarts"] == "0", both
        events = "\n".join(log)
        assert f"requeued job {other} for the lend" in events, events
        assert f"requeued job {job}" not in events, events
        assert again.id is not None
        ask_return(queue, again.id)
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        assert squeue_state(lab, job)[0] == "RUNNING"
    finally:
        slurm(lab, "scancel", job, *([other] if other else []), check=False)


def test_the_policy_lends_a_slice_for_a_typed_model_over_its_objective(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    """The real policy, on the real observation: busy (20 ms a request, one instance,
    SLO 100 ms) at 70 req/s is over its objective on the baseline, and its lend takes the
    MIG node's free 1g slice (the elastic node has no GPU of that type), requeueing
    nothing; no request fails."""
    rec, endpoint = bridge
    store = rec.store
    node = lab.mig_nodes[0].name
    one, _, four = _types(lab)
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    job = _job_on(lab, four)
    load = Sender(endpoint, poisson(70.0, 40.0, seed=7), "busy")
    try:
        wait_state(lab, job, {"RUNNING"}, 30)
        load.start()
        _until_serving(rec, 60, log)
        (lease,) = store.open_leases()
        timeline = "\n".join(log)
        assert (lease.node, lease.gpus, lease.gpu_type) == (node, 1, one), timeline
        assert lease.id is not None
        first = store.history(lease.id)[0].reason  # why it was lent: the policy's lend
        assert first.startswith("capacity: busy"), first
        load.finish()
        shown = scontrol_show(lab, "job", job)[job]
        assert shown["JobState"] == "RUNNING" and shown["Restarts"] == "0", shown
        assert "requeued job" not in timeline, timeline
        c = load.counters
        assert c.errors == 0 and c.dropped == 0 and c.ok == c.sent > 0, c
    finally:
        load.stop()
        slurm(lab, "scancel", job, check=False)
