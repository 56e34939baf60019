"""The leader row on the real PostgreSQL: one holder, takeover after the TTL, fencing of
a deposed holder's writes, a race of many standbys, release, a lost database, and what
`stb status` says of it."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from bridge.cli import app
from bridge.leases import leader
from bridge.leases.leader import Fenced, LeaderLease
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from tests.db.helpers import libpq

TTL = 0.8


@pytest.fixture
def engine(postgres_database: str) -> Engine:
    with psycopg.connect(libpq(make_url(postgres_database)), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    engine = make_engine(postgres_database)
    create_schema(engine)
    return engine


def test_one_holder_and_takeover_after_the_ttl(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", TTL), LeaderLease(engine, "b", TTL)
    assert a.beat() and a.epoch == 1
    assert not b.beat() and not b.active
    time.sleep(TTL / 2)
    assert a.beat()  # renewed: b still waits
    assert not b.beat()
    held = leader.current(engine)
    assert held is not None and (held.holder, held.epoch) == ("a", 1) and held.expires_in_s > 0
    time.sleep(TTL + 0.1)  # a stops beating (its host died)
    assert not a.active  # a stopped believing by its own clock ...
    assert b.beat() and b.epoch == 2  # ... and only then could b take over
    assert not a.beat() and a.epoch is None  # a comes back: it stands by
    held = leader.current(engine)
    assert held is not None and (held.holder, held.epoch) == ("b", 2)


def test_a_deposed_holder_writes_nothing(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", TTL), LeaderLease(engine, "b", TTL)
    assert a.beat()
    store = LeaseStore(engine, a.fence)
    queue = RequestQueue(engine, a.fence)
    now = datetime.now(UTC)
    lease = store.create("n1", "elastic", "preempt", ["echo"], "k1", now)
    time.sleep(TTL + 0.1)
    assert b.beat()
    with pytest.raises(Fenced, match="not the active bridge"):
        store.create("n2", "elastic", "preempt", ["echo"], "k2", now)
    # even while a still believes it leads (a paused process whose clock lags), the row
    # refuses it: the epoch is b's
    a._valid_until = time.monotonic() + 60
    a.epoch = 1
    with pytest.raises(Fenced, match=r"a \(epoch 1\) was deposed: b \(epoch 2\) leads"):
        store.set_status(lease.id, "submitted", now, reason="x")  # type: ignore[arg-type]
    req = RequestQueue(engine).request_lend("n3", [], now)
    assert req.id is not None
    a.epoch, a._valid_until = 1, time.monotonic() + 60
    with pytest.raises(Fenced):
        queue.finish(req.id, now, "done")
    assert [x.node for x in LeaseStore(engine).open_leases()] == ["n1"]
    assert LeaseStore(engine).get(lease.id).state.value == "requested"  # type: ignore[arg-type]
    assert RequestQueue(engine).get(req.id).done_at is None  # type: ignore[union-attr]
    LeaseStore(engine, b.fence).set_status(lease.id, "submitted", now, reason="b")  # type: ignore[arg-type]


def test_many_standbys_race_and_one_wins(engine: Engine) -> None:
    contenders = [LeaderLease(make_engine(engine.url), f"s{i}", TTL) for i in range(8)]
    start = threading.Barrier(len(contenders))
    won: list[str] = []

    def run(c: LeaderLease) -> None:
        start.wait()
        if c.beat():
            won.append(c.instance)

    threads = [threading.Thread(target=run, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    held = leader.current(engine)
    assert held is not None and held.holder == won[0] and held.epoch == 1


def test_release_hands_over_at_the_next_beat(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", 30), LeaderLease(engine, "b", 30)
    assert a.beat() and not b.beat()
    a.release()
    assert not a.active
    assert b.beat() and b.epoch == 2


def test_a_lost_database_ends_the_lead_after_the_ttl(engine: Engine) -> None:
    a = LeaderLease(engine, "a", TTL)
    assert a.beat()
    a.engine = make_engine(make_url(engine.url).set(port=1))  # nothing listens there
    assert a.beat()  # the lease it renewed still runs
    assert a.last_error
    time.sleep(TTL + 0.1)
    assert not a.beat() and a.epoch is None  # it stood down without the database


def test_a_takeover_waits_for_the_holders_write_in_flight(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", TTL), LeaderLease(engine, "b", TTL)
    assert a.beat()
    store = LeaseStore(engine, a.fence)
    took: list[float] = []
    fenced_until: list[float] = []
    gate = threading.Event()

    def slow_fence(session: object) -> None:
        a.fence(session)  # type: ignore[arg-type]
        gate.set()
        time.sleep(TTL + 0.5)  # the write is in flight past a's lease
        fenced_until.append(time.monotonic())  # its commit comes after this

    slow = LeaseStore(engine, slow_fence)

    def write() -> None:
        slow.create("n1", "elastic", "preempt", [], "k", datetime.now(UTC))

    writer = threading.Thread(target=write)
    writer.start()
    gate.wait(5)
    time.sleep(TTL + 0.1)
    assert b.beat()  # blocks on the share lock until a's write commits
    took.append(time.monotonic())
    writer.join()
    # b's beat returned only once a's write had left its fence, so after its commit (the
    # writer's own clock after the commit races b's by microseconds and proves nothing)
    assert fenced_until and took[0] >= fenced_until[0]
    assert [x.node for x in store.open_leases()] == ["n1"]


def test_sqlite_has_no_leader_row(tmp_path: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/b.db")
    assert not leader.supported(engine) and leader.current(engine) is None
    with pytest.raises(ValueError, match="needs PostgreSQL"):
        LeaderLease(engine, "a", TTL)


def test_status_names_the_active_instance_and_the_holds(
    engine: Engine, postgres_database: str, tmp_path: object
) -> None:
    a = LeaderLease(engine, "host-a:41", 30)
    assert a.beat()
    RequestQueue(engine).hold("training", datetime.now(UTC), "olga", "firmware")
    cfg = f'database_url = "{postgres_database}"\n[daemon]\nexporter_listen = "127.0.0.1:1"\n'
    path = f"{tmp_path}/bridge.toml"
    with open(path, "w") as f:
        f.write(cfg)
    out = CliRunner().invoke(app, ["status", "--json", "-c", path])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["leader"]["instance"] == "host-a:41" and doc["leader"]["epoch"] == 1
    assert doc["leader"]["expires_in_s"] > 0
    assert doc["holds"]["training"]["by"] == "olga"
    text = CliRunner().invoke(app, ["status", "-c", path]).output
    assert "active bridge: host-a:41 (epoch 1" in text
    assert "pool training held by olga" in text and "firmware" in text
    a.release()
    text = CliRunner().invoke(app, ["status", "-c", path]).output
    assert "no active bridge: host-a:41's lease ran out" in text
