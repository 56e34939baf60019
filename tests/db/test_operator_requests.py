"""Operator requests: queued by the CLI, taken by the daemon (real databases)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bridge.leases.requests import RequestQueue, lease_key
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_queue_pending_and_finish(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    queue = RequestQueue(engine)
    a = queue.request_lend("n3", ["busy"], T0, requested_by="ops")
    b = queue.request_return(7, T0 + timedelta(seconds=1))
    assert [r.id for r in queue.pending()] == [a.id, b.id]
    assert a.id is not None and b.id is not None
    queue.finish(a.id, T0 + timedelta(seconds=2), "lease 1 lending n3")
    queue.finish(a.id, T0 + timedelta(seconds=9), "twice")  # the first outcome stays
    assert [r.id for r in queue.pending()] == [b.id]
    done = queue.get(a.id)
    assert done is not None and done.outcome == "lease 1 lending n3"
    assert done.done_at == T0 + timedelta(seconds=2) and done.models == ["busy"]


def _stb(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "bridge.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "b.db"}"\n[models.busy]\nslo_p99_ms = 100\n'
    )
    stb = Path(sys.executable).with_name("stb")
    return subprocess.run(
        [str(stb), *args, "-c", str(config), "--wait", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_cli_refuses_bad_input_and_queues_good(tmp_path: Path) -> None:
    bad = _stb(tmp_path, "lend", "n3", "--models", "busy,nope")
    # errors go to stderr, as every command's do
    assert bad.returncode == 1 and "unknown models nope" in bad.stderr, bad
    missing = _stb(tmp_path, "return", "42")
    assert missing.returncode == 1 and "42" in missing.stderr, missing
    ok = _stb(tmp_path, "lend", "n3", "--models", "busy")
    assert ok.returncode == 0 and "request 1: lend n3" in ok.stdout
    engine = make_engine(f"sqlite:///{tmp_path / 'b.db'}")
    (req,) = RequestQueue(engine).pending()
    assert (req.kind, req.node, req.models) == ("lend", "n3", ["busy"])
    assert LeaseStore(engine).open_leases() == []  # nothing happens without the daemon


def test_a_requests_lease_is_found_by_its_key(database_url: str) -> None:
    """The tie a request taken again after a failover reads: the lease its lend made,
    by the request's key, in whatever state it is now; none for a request that made none."""
    engine = make_engine(database_url)
    create_schema(engine)
    queue, store = RequestQueue(engine), LeaseStore(engine)
    req = queue.request_lend("n3", ["busy"], T0, requested_by="ops")
    other = queue.request_lend("n4", ["busy"], T0)
    assert req.id is not None and other.id is not None
    assert lease_key(req.id) != lease_key(other.id)
    assert store.by_request_key(lease_key(req.id)) is None
    made = store.create("n3", "elastic", "preempt", ["busy"], lease_key(req.id), T0)
    assert made.id is not None
    store.set_status(made.id, LeaseState.RETURNED, T0 + timedelta(seconds=1), req.reason)
    found = store.by_request_key(lease_key(req.id))
    assert found is not None and (found.id, found.state) == (made.id, LeaseState.RETURNED)
    assert store.by_request_key(lease_key(other.id)) is None
    assert req.reason == f"operator request {req.id} by ops"
    assert other.reason == f"operator request {other.id}"
