"""The audit trail's store on SQLite and the real PostgreSQL: appenders in several
threads and several processes at once make one linear chain (no fork, no gap, `verify`
holds); an entry and the operator request it records commit together; a deposed
daemon's entry is fenced like its lease writes, and the leader's carries its epoch."""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine

from bridge.audit.trail import Trail, daemon, operator
from bridge.leases.audit import AuditStore, Record
from bridge.leases.leader import Fenced, LeaderLease
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState

THREADS, PROCESSES, EACH = 4, 3, 15


def _engine(database_url: str) -> Engine:
    engine = make_engine(database_url)
    create_schema(engine)
    return engine


def _append(url: str, who: str, n: int, barrier: Any) -> None:
    store = AuditStore(make_engine(url))
    barrier.wait()
    for i in range(n):
        store.append(Record("lend", f"node {who}-{i}", "ok", who), datetime.now(UTC))


def _check_linear(store: AuditStore, writers: list[str], n: int) -> None:
    entries = list(store.walk())
    assert [e.seq for e in entries] == list(range(1, len(writers) * n + 1))
    for who in writers:  # each writer's entries in its own order, none lost
        mine = [e.target for e in entries if e.actor == who]
        assert mine == [f"node {who}-{i}" for i in range(n)]
    verdict = store.verify()
    assert verdict.broken is None and verdict.checked == len(writers) * n


def test_threads_appending_at_once_make_one_chain(database_url: str) -> None:
    _engine(database_url)
    barrier = threading.Barrier(THREADS)
    writers = [f"t{i}" for i in range(THREADS)]
    threads = [
        threading.Thread(target=_append, args=(database_url, who, EACH, barrier)) for who in writers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _check_linear(AuditStore(make_engine(database_url)), writers, EACH)


def test_processes_appending_at_once_make_one_chain(database_url: str) -> None:
    """The daemon, `stb` commands and the API are processes of their own: fresh
    interpreters (forkserver), started together, each appending as fast as it can."""
    _engine(database_url)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    barrier = ctx.Barrier(PROCESSES)
    writers = [f"p{i}" for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=_append, args=(database_url, who, EACH, barrier), daemon=True)
        for who in writers
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    _check_linear(AuditStore(make_engine(database_url)), writers, EACH)


def test_a_request_and_its_entry_commit_together(database_url: str) -> None:
    engine = _engine(database_url)
    store, queue = AuditStore(engine), RequestQueue(engine)
    trail = Trail(store, operator({"SLURM_JOB_ID": "77"}))
    now = datetime.now(UTC)
    req = queue.request_lend("n3", ["echo"], now, "alice", trail.within("lend.request", "node n3"))

    def broken(session: Any, written: str) -> None:
        trail.within("lend.request", "node n5")(session, written)
        raise RuntimeError("the process died here")

    with pytest.raises(RuntimeError):
        queue.request_lend("n5", [], now, "alice", broken)
    assert [r.id for r in queue.pending()] == [req.id]
    (entry,) = store.walk()
    assert (entry.detail, entry.slurm_job, entry.epoch) == (f"request {req.id}", "77", None)


def test_a_lease_its_return_and_a_request_s_outcome_commit_with_their_entries(
    database_url: str,
) -> None:
    """The daemon's facts (a lease made, its first move out, an operator request's
    outcome) and their entries: both or neither; a lend made again records nothing."""
    engine = _engine(database_url)
    store, leases, queue = AuditStore(engine), LeaseStore(engine), RequestQueue(engine)
    trail = Trail(store, daemon())
    now = datetime.now(UTC)
    lease = leases.create(
        "n3", "elastic", "preempt", ["echo"], "k1", now, audit=trail.within("lend", "node n3")
    )
    again = leases.create(
        "n3", "elastic", "preempt", ["echo"], "k1", now, audit=trail.within("lend", "node n3")
    )
    assert again.id == lease.id and lease.id is not None

    def dies(session: Any, written: str) -> None:
        trail.within("lend", "node n5")(session, written)
        raise RuntimeError("the process died here")

    with pytest.raises(RuntimeError):
        leases.create("n5", "training", "drain", ["echo"], "k2", now, audit=dies)
    assert [x.node for x in leases.open_leases()] == ["n3"]
    with pytest.raises(RuntimeError):
        leases.set_status(lease.id, LeaseState.RETURNED, now, "abandoned: test", audit=dies)
    assert leases.get(lease.id).state == LeaseState.REQUESTED
    leases.set_status(
        lease.id,
        LeaseState.RETURNED,
        now,
        "abandoned: test",
        audit=trail.within("return", "lease 1"),
    )
    req = queue.request_return(lease.id, now, "alice")
    with pytest.raises(RuntimeError):
        queue.finish(req.id or 0, now, "lease 1 returning", dies)
    assert [r.id for r in queue.pending()] == [req.id]
    queue.finish(req.id or 0, now, "ok", trail.within("request.done", f"request {req.id}"))
    got = [(e.action, e.detail) for e in store.walk()]
    assert got == [
        ("lend", f"lease {lease.id}"),
        ("return", f"lease {lease.id} requested -> returned"),
        ("request.done", f"request {req.id}"),
    ]
    assert store.verify().broken is None


def test_a_deposed_daemon_records_nothing_and_the_leader_its_epoch(
    database_url: str,
) -> None:
    engine = _engine(database_url)
    if engine.dialect.name != "postgresql":
        pytest.skip("the leader row is PostgreSQL's (SQLite: one daemon, the file lock)")
    ttl = 0.8
    a, b = LeaderLease(engine, "a", ttl), LeaderLease(engine, "b", ttl)
    assert a.beat()
    theirs, ours = AuditStore(engine, a.fence), AuditStore(engine, b.fence)
    theirs.append(Record("lend", "node n1", "ok", "daemon@a"), datetime.now(UTC))
    time.sleep(ttl + 0.1)
    assert b.beat()
    a.epoch, a._valid_until = 1, time.monotonic() + 60  # a still believes it leads
    with pytest.raises(Fenced, match=r"a \(epoch 1\) was deposed"):
        theirs.append(Record("return", "lease 1", "ok", "daemon@a"), datetime.now(UTC))
    ours.append(Record("return", "lease 1", "ok", "daemon@b"), datetime.now(UTC))
    got = [(e.seq, e.actor, e.epoch) for e in AuditStore(engine).walk()]
    assert got == [(1, "daemon@a", 1), (2, "daemon@b", 2)]
    assert AuditStore(engine).verify().broken is None
