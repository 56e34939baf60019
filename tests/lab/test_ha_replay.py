"""The failover replay: two real `stb daemon` on the lab and the local PostgreSQL, the
active one `kill -9`ed after it carried out an operator request and before it recorded
the outcome; the standby takes over, takes the request again, and records it as done
with the work the first one did: the same lease, one Triton job (a lend), one drain (a
return). Before requests were keyed by their id it recorded "refused: n3 is already lent".

The kill lands in that window every time, not by luck: the test row-locks the request
(`SELECT ... FOR UPDATE`), so the leader's UPDATE that records the outcome waits on the
lock (seen in `pg_stat_activity`) after the lend or return is done; the leader is killed
there, then the lock is let go and the dead leader's transaction rolls back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, make_url, text

from bridge.audit.asks import ask_lend, ask_return
from bridge.daemon.actuator import record_of
from bridge.lab.pair import Instance
from bridge.lab.spec import LabSpec
from bridge.leases.requests import OperatorRequest, RequestQueue, lease_key
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import lease_of
from tests.lab.helpers import cancel_triton_jobs, until

pytestmark = pytest.mark.lab
S = LeaseState
TICK_S = 2.0
LIVE = ("PENDING", "CONFIGURING", "RUNNING")
_WAITING = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = :db "
    "AND wait_event_type = 'Lock' AND query ILIKE 'UPDATE operator_request%'"
)

_SESSIONS = text(
    "SELECT pid, state, wait_event_type, wait_event, query FROM pg_stat_activity "
    "WHERE datname = :db ORDER BY pid"
)


def _lease_jobs(lab: LabSpec, store: LeaseStore, lease_id: int, *, live: bool = False) -> list[str]:
    """Slurm jobs tagged with this lease: every one squeue still lists (finished ones too,
    so a duplicate that ended counts), or with `live` only those queued or running."""
    ref = record_of(store.get(lease_id)).ref
    states = LIVE if live else None
    jobs = SlurmCLI(env=lab.env()).jobs(states=states)
    return [j.job_id for j in jobs if lease_of(j.tags) == ref]


def _lock(engine: Engine, req: OperatorRequest) -> Connection:
    """Row-lock the request (the leader can take it and act, not record its outcome)."""
    conn = engine.connect()
    conn.begin()
    row = conn.execute(
        text("SELECT done_at FROM operator_request WHERE id = :id FOR UPDATE"), {"id": req.id}
    ).one()
    # the leader reads, acts and writes in tens of milliseconds at best: never this fast
    assert row[0] is None, "the leader recorded the request before it could be locked"
    return conn


def _kill_as_it_records(leader: Instance, engine: Engine, lock: Connection) -> float:
    """Once the leader waits to record the outcome: kill -9 it, then let the lock go."""
    db = make_url(str(engine.url)).database

    def waiting() -> bool:
        # a transaction sees pg_stat_activity as it was at its first read: one per poll
        with engine.connect() as conn:
            return conn.execute(_WAITING, {"db": db}).scalar() == 1

    try:
        until("the leader waits to record the outcome", waiting, 30)
    except AssertionError as exc:  # say what each session was doing, and the leader
        with engine.connect() as conn:
            rows = conn.execute(_SESSIONS, {"db": db}).all()
            sessions = "\n".join(" | ".join(str(v)[:90] for v in row) for row in rows)
            tail = "\n".join(leader.log.read_text(errors="replace").splitlines()[-25:])
            raise AssertionError(f"{exc}\nsessions:\n{sessions}\n{leader.name}:\n{tail}") from None
    killed_at = time.time()
    leader.kill()
    lock.rollback()
    lock.close()
    return killed_at


def _answered(queue: RequestQueue, req: OperatorRequest, timeout_s: float) -> OperatorRequest:
    assert req.id is not None
    rid = req.id
    until(f"request {rid} answered", lambda: (queue.get(rid) or req).done_at is not None, timeout_s)
    done = queue.get(rid)
    assert done is not None and done.done_at is not None
    return done


def test_a_request_taken_again_after_a_failover_is_done_once(
    lab: LabSpec, pg_database: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_database)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    a = Instance("bridge-a", lab, tmp_path / "a", pg_database, TICK_S)
    b = Instance("bridge-b", lab, tmp_path / "b", pg_database, TICK_S)
    node = lab.pool_nodes("elastic")[0].name
    try:
        a.start().wait_role("active")
        b.start().wait_role("standby")

        # ---- a lend: a makes the lease and submits its job, then dies --------------
        lend = ask_lend(queue, node, ["busy"], who="lab-operator")
        assert lend.id is not None
        lock = _lock(engine, lend)
        until(
            "a lent the node (Triton job submitted)",
            lambda: any(x.slurm_job_id for x in store.by_node(node, open_only=True)),
            60,
            0.02,
        )
        killed_at = _kill_as_it_records(a, engine, lock)
        (lease,) = store.by_node(node, open_only=True)
        lease_id = lease.id
        assert lease_id is not None and lease.request_key == lease_key(lend.id)
        assert lease.slurm_job_id is not None
        assert (queue.get(lend.id) or lend).done_at is None  # a's outcome died with it

        took_at = until("b leads", lambda: b.role() == "active", 10 * TICK_S)
        done = _answered(queue, lend, 10 * TICK_S)
        served_at = until("serving", lambda: store.get(lease_id).state == S.SERVING, 120)
        print(
            f"\nlend replay: a killed in {lease.state.value} as it recorded request {lend.id}; "
            f"b active after {took_at - killed_at:.2f}s, request answered after "
            f"{done.done_at.timestamp() - killed_at:.2f}s ({done.outcome!r}), "
            f"serving after {served_at - killed_at:.2f}s"
        )
        assert done.done_at.timestamp() >= killed_at  # b's answer, not a's
        assert done.outcome == f"lease {lease_id} lending {node}"  # not "already lent"
        assert [x.id for x in store.by_node(node)] == [lease_id]  # one lease
        jobs = _lease_jobs(lab, store, lease_id)
        assert jobs == [lease.slurm_job_id]  # one Triton job, a's
        assert f"operator request {lend.id} (lend): lease {lease_id} lending" in b.log.read_text()

        # ---- a return: b drains the lease, then dies; a (back, standing by) leads ----
        a.start().wait_role("standby")
        ret = ask_return(queue, lease_id, who="lab-operator")
        lock = _lock(engine, ret)
        until("b began the return", lambda: store.get(lease_id).state != S.SERVING, 60, 0.02)
        killed_at = _kill_as_it_records(b, engine, lock)
        began_in = store.get(lease_id).state
        assert (queue.get(ret.id or 0) or ret).done_at is None

        done = _answered(queue, ret, 10 * TICK_S + 30)
        until("returned", lambda: store.get(lease_id).state == S.RETURNED, 120)
        print(
            f"return replay: b killed in {began_in.value} as it recorded request {ret.id}; "
            f"answered after {done.done_at.timestamp() - killed_at:.2f}s ({done.outcome!r})"
        )
        assert done.done_at.timestamp() >= killed_at
        assert done.outcome == f"lease {lease_id} returning"  # not "already draining"
        history = store.history(lease_id)
        mine = [e for e in history if e.reason == f"return: {ret.reason}"]
        assert len(mine) == 1, [(e.to_state.value, e.reason) for e in history]  # one return
        assert [e.to_state for e in history].count(S.DRAINING) == 1
        assert _lease_jobs(lab, store, lease_id, live=True) == []
        assert _lease_jobs(lab, store, lease_id) == jobs  # still the one job
        assert [x.id for x in store.by_node(node)] == [lease_id]
    finally:
        for x in (a, b):
            x.stop()
        cancel_triton_jobs(lab)
        engine.dispose()
