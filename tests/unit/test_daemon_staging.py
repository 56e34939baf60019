"""The daemon's staging step (`bridge.daemon.staging.Stager`) inside the reconciler's
pass, on the fake Slurm, a real lease database (SQLite) and a real model repository with
weights manifests: the wanted version staged on the node a lend would take first, the
job's outcome read back into the catalogue, the node's copy in the policy's view, at most
`max_jobs` at once, a plan once a minute. (The staging job itself, on real Slurm, is
tests/lab/test_weights_lab.py's.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bridge.config import WeightsConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.leases.weights import WeightStore
from bridge.policy.weights import Wanted
from bridge.slurm.model import STAGING_TAG
from bridge.weights import manifest
from tests.unit.fakes import (
    BASELINE_JOB,
    N1,
    N3,
    N5,
    FakeRouter,
    FakeSlurm,
    FakeTriton,
    address_of,
    at,
    make_config,
)

#: `[weights] plan_every_s`'s default
EVERY = 60.0


def publish(repo: Path, model: str, version: int, size: int) -> manifest.Manifest:
    folder = repo / model / str(version)
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"w" * size)
    return manifest.write_manifest(folder, model, version)


class World:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_jobs: int) -> None:
        repo = tmp_path / "repo"
        self.first = publish(repo, "busy", 1, 1000)
        publish(repo, "calm", 1, 500)
        base = make_config(tmp_path)
        self.config = base.model_copy(
            update={
                "triton": base.triton.model_copy(
                    update={"model_repository": repo, "log_dir": tmp_path / "logs"}
                ),
                "weights": WeightsConfig(cache_root=tmp_path / "cache", max_jobs=max_jobs),
            }
        )
        self.repo = repo
        (tmp_path / "logs").mkdir()
        self.logs = tmp_path / "logs"
        engine = make_engine(self.config.database_url)
        create_schema(engine)
        self.slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB])
        triton = FakeTriton()
        triton.server(address_of(N1), models={"busy": "READY", "calm": "READY"})
        self.triton = triton
        store = LeaseStore(engine)
        self.leases = store
        self.requests = RequestQueue(engine)
        self.weights = WeightStore(engine)
        self.reconciler = Reconciler(
            self.config,
            self.slurm,
            store,
            Observer(self.slurm, self.config, triton),
            triton,
            FakeRouter(),
            BridgeMetrics(clock=lambda: 1_000.0),
            self.requests,
            triton.forget,
        )
        #: what the wanted rule says (its own tests are test_cache_policy's); the plan,
        #: the jobs and the catalogue are the real ones
        self.want: list[Wanted] = []
        monkeypatch.setattr("bridge.daemon.staging.wanted", lambda *a: list(self.want))

    def tick(self, seconds: float) -> list[str]:
        return self.reconciler.run_once(at(seconds)).events

    def staging_jobs(self) -> list[str]:
        return [j.job_id for j in self.slurm.jobs(tag=STAGING_TAG)]

    def end(self, job_id: str, state: str) -> None:
        self.slurm.jobs_[job_id] = replace(self.slurm.jobs_[job_id], state=state)


def test_the_wanted_version_is_staged_where_a_lend_lands_and_its_copy_reaches_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, monkeypatch, max_jobs=1)
    w.want = [Wanted("busy", "1", 1000, 1), Wanted("calm", "1", 500, 1)]
    events = w.tick(0)
    (spec,) = [s for s in w.slurm.specs if s.comment == STAGING_TAG]
    # the elastic node: the first a lend takes (n1 is the reserved baseline's, n5 a
    # training node, dearer)
    assert spec.nodelist == ("n3",) and spec.env["STB_WEIGHTS_MODEL"] == "busy"
    assert spec.name == "stb-staging-busy-1" and spec.nice == w.config.weights.nice
    assert spec.account == w.config.triton.account
    assert any("staging busy version 1 on n3" in e for e in events)
    (row,) = w.weights.copies()
    assert (row.node, row.model, row.version, row.state) == ("n3", "busy", 1, "staging")
    (job_id,) = w.staging_jobs()
    assert row.job_id == job_id
    # max_jobs = 1: calm waits; and no plan before a minute has passed
    w.end(job_id, "COMPLETED")
    w.tick(EVERY - 1)
    assert w.weights.copies()[0].state == "staging"
    events = w.tick(EVERY)
    busy = w.weights.copies("n3", ("complete",))
    assert [(c.model, c.size_bytes, c.digest) for c in busy] == [
        ("busy", w.first.total_bytes, w.first.digest)
    ]
    assert any("staged busy version 1 on n3" in e for e in events)
    # the same plan stages calm: the one slot is free again
    assert [c.model for c in w.weights.copies(states=("staging",))] == ["calm"]
    assert w.reconciler.stager is not None
    assert w.reconciler.stager.cached()["n3"] == frozenset({"busy"})
    w.tick(EVERY + 5)
    snap = w.reconciler.last_snapshot
    assert snap is not None
    assert {n.name: n.cached for n in snap.nodes}["n3"] == frozenset({"busy"})


def test_a_failed_or_vanished_staging_job_fails_its_copy_and_a_new_version_is_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, monkeypatch, max_jobs=2)
    w.want = [Wanted("busy", "1", 1000, 1)]
    w.tick(0)
    (first,) = w.staging_jobs()
    w.end(first, "FAILED")
    w.want = []  # nothing wanted: the failure is read, nothing staged again
    events = w.tick(EVERY)
    (row,) = w.weights.copies()
    assert row.state == "failed" and f"staging job {first} failed" in row.reason
    assert any("staging of busy version 1 on n3 failed" in e for e in events)
    # wanted again: a new job, the row back to staging; then the job leaves the queue
    # with no outcome seen (past MinJobAge while the daemon was away)
    w.want = [Wanted("busy", "1", 1000, 1)]
    w.tick(2 * EVERY)
    (row,) = w.weights.copies()
    assert row.state == "staging" and row.job_id != first
    del w.slurm.jobs_[row.job_id]
    w.want = []
    w.tick(3 * EVERY)
    (row,) = w.weights.copies()
    assert row.state == "failed" and "outcome was not seen" in row.reason
    assert w.reconciler.stager is not None and w.reconciler.stager.cached() == {}


def test_without_a_cache_root_the_daemon_has_no_staging_step(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    engine = make_engine(config.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB])
    triton = FakeTriton()
    reconciler = Reconciler(
        config, slurm, LeaseStore(engine), Observer(slurm, config, triton), triton
    )
    assert reconciler.stager is None


def test_the_wanted_rule_takes_the_lends_of_both_capacity_models_beyond_the_baseline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bridge.policy import staging
    from bridge.policy.snapshot import ReplicaView, Snapshot

    snap = Snapshot(
        nodes=(),
        replicas=(ReplicaView("n1", ("llm", "busy")), ReplicaView("n3", ("llm",), lease_id=4)),
        history={},
        leases=(),
    )
    monkeypatch.setattr(staging, "expected_lends", lambda s, c, r: {"busy": 2, "calm": 0})
    # the token model: llm needs 3 replicas at its peak, one of them the baseline's
    monkeypatch.setattr(staging.llm, "needs", lambda s, r: {"llm": 3, "tiny": 1})
    versions = {"busy": ("4", 10), "llm": ("2", 99), "calm": ("1", 5)}
    got = staging.wanted(snap, make_config(tmp_path), {}, versions)
    # calm: no lend expected; tiny: no version known (not in the repository)
    assert got == [Wanted("busy", "4", 10, 2), Wanted("llm", "2", 99, 2)]


def test_a_copy_the_triton_job_refused_is_failed_and_staged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, monkeypatch, max_jobs=1)
    w.want = [Wanted("busy", "1", 1000, 1)]
    w.tick(0)
    (job,) = w.staging_jobs()
    w.end(job, "COMPLETED")
    w.tick(EVERY)
    assert [c.state for c in w.weights.copies()] == ["complete"]
    # a lend of busy on n3; its Triton job's overlay refused the copy (its log says so)
    w.slurm.jobs_.pop(job)
    w.triton.server(address_of(N3), models={"busy": "READY"})
    w.requests.request_lend("n3", ["busy"], at(EVERY + 1))
    w.tick(EVERY + 1)
    triton_job = w.leases.get(1).slurm_job_id
    (w.logs / f"triton-{triton_job}.log").write_text(
        "stb-weights: model=busy version=1 source=shared path=/r/busy/1 reason=sha256 of "
        "weights.bin differs from what the manifest says\n"
    )
    for t in (EVERY + 2, EVERY + 3):
        w.tick(t)
    assert w.leases.get(1).state.value == "serving"
    assert "weights: busy=shared" in w.leases.get(1).reason
    events = w.tick(2 * EVERY + 1)
    copies = [(c.node, c.state, c.reason) for c in w.weights.copies()]
    # refused: failed with the reason; nothing staged while n3 is lent (its Triton job
    # holds it) and never on n5, a training node (a staging job could delay training)
    assert copies == [
        ("n3", "failed", "the Triton job of lease 1 read the shared repository instead")
    ], events
    assert any("read the shared repository instead" in e for e in events), events
    assert not any(e.startswith("staging busy") for e in events), events
    # the lease goes back: the copy is staged again on n3
    w.requests.request_return(1, at(2 * EVERY + 2))
    t = 2 * EVERY + 2
    while w.leases.open_leases() and t < 2 * EVERY + 60:
        w.tick(t)
        t += 1
    assert not w.leases.open_leases()
    events = w.tick(4 * EVERY)
    assert [(c.node, c.state) for c in w.weights.copies()] == [("n3", "staging")], events


def test_room_is_made_by_the_staging_job_that_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, monkeypatch, max_jobs=1)
    w.config = w.config.model_copy(
        update={"weights": w.config.weights.model_copy(update={"budget_bytes": 1500})}
    )
    w.reconciler.config = w.config
    assert w.reconciler.stager is not None
    w.reconciler.stager.config = w.config
    w.want = [Wanted("calm", "1", 500, 1)]
    w.tick(0)
    (job,) = w.staging_jobs()
    w.end(job, "COMPLETED")
    w.want = [Wanted("busy", "1", 1000, 1)]  # calm no longer wanted; 500 + 1000 fit
    w.tick(EVERY)
    (busy_job,) = [j for j in w.staging_jobs() if j != job]
    w.end(busy_job, "COMPLETED")
    w.want = [Wanted("echo", "1", 400, 1)]  # 1500 used: calm (least recent) must go
    publish(w.repo, "echo", 1, 400)
    w.tick(2 * EVERY)
    spec = w.slurm.specs[-1]
    assert spec.env["STB_WEIGHTS_MODEL"] == "echo" and spec.nodelist == ("n3",)
    assert spec.env["STB_WEIGHTS_EVICT"] == "calm/1"
    states = {c.model: (c.state, c.reason) for c in w.weights.copies("n3")}
    assert states["calm"][0] == "evicted" and "room for echo version 1" in states["calm"][1]
    assert states["busy"] == ("complete", "") and states["echo"][0] == "staging"
