"""The batch route's answered requests in the ledger's database (`accounting.batchcounts`)
as the daemon's pass stores them (`bridge.daemon.batchroute.BatchRoute` with a ledger
attached), on a real SQLite ledger and a real log file: counts added per (hour, model,
job) with the log's position in the same transaction; a daemon that stops before it
writes, or that restarts, counts every line once; a write that fails keeps its counts
for the next pass; bad input refused with a clear error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

import bridge.daemon.batchroute as batchroute
from accounting.batchcounts import batch_cursor, prune_batch, record_batch, record_batch_jobs
from accounting.db import open_ledger
from accounting.errors import LedgerError
from bridge.daemon.batchroute import BatchRoute
from bridge.daemon.observation import Observation
from bridge.daemon.report import TickReport

H10 = 1764842400.0  # 2025-12-04 10:00 UTC
HOUR = datetime.fromtimestamp(H10, UTC)


@pytest.fixture
def ledger(tmp_path: Path) -> Engine:
    return open_ledger(f"sqlite:///{tmp_path}/ledger.db")


def _counts(engine: Engine) -> dict[tuple[str, str, str], int]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT bucket, model, job_id, requests FROM batch_requests")
        return {(str(b)[:13], m, j): n for b, m, j, n in rows}


def test_record_batch_adds_counts_and_moves_the_cursor_together(ledger: Engine) -> None:
    assert batch_cursor(ledger, "/var/log/b.log") is None
    record_batch(ledger, "lab", "/var/log/b.log", {(HOUR, "a", "7"): 3}, (11, 120), HOUR)
    record_batch(
        ledger, "lab", "/var/log/b.log", {(HOUR, "a", "7"): 2, (HOUR, "a", ""): 1}, (11, 200), HOUR
    )
    assert _counts(ledger) == {("2025-12-04 10", "a", "7"): 5, ("2025-12-04 10", "a", ""): 1}
    assert batch_cursor(ledger, "/var/log/b.log") == (11, 200)
    with pytest.raises(LedgerError, match="not the start of an hour"):
        record_batch(
            ledger, "lab", "/l", {(HOUR + timedelta(minutes=1), "a", "7"): 1}, (1, 1), HOUR
        )
    with pytest.raises(LedgerError, match="negative batch request count"):
        record_batch(ledger, "lab", "/l", {(HOUR, "a", "7"): -1}, (1, 1), HOUR)
    assert batch_cursor(ledger, "/l") is None  # nothing written by a refused call
    with ledger.begin() as conn:  # a job seen again takes its newest account
        record_batch_jobs(conn, [("lab", "7", "nlp", "bob"), ("lab", "8", "cv", "eve")])
        record_batch_jobs(conn, [("lab", "7", "nlp2", "bob")])
        got = sorted(conn.exec_driver_sql("SELECT job_id, account FROM batch_job"))
    assert got == [("7", "nlp2"), ("8", "cv")]
    assert prune_batch(ledger, HOUR + timedelta(hours=1)) == 2 and _counts(ledger) == {}


def _pass(route: BatchRoute, t: float) -> None:
    obs = Observation(t, {}, (), frozenset(), (), {})
    route.online(obs, t, TickReport(datetime.fromtimestamp(t, UTC)))


def _append(path: Path, n: int, job: str = "7") -> None:
    with open(path, "a") as f:
        f.write(f"{H10 + 1} 200 /batch/v2/models/a/infer {job} 0.01\n" * n)


def test_the_daemons_pass_stores_each_answered_request_once(
    ledger: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "batch.log"
    _append(log, 4)  # before the first daemon: not counted (no stored position)
    route = BatchRoute(log)
    route.attach_ledger(ledger, "lab")
    _pass(route, 1.0)
    assert _counts(ledger) == {} and batch_cursor(ledger, str(log)) == (
        log.stat().st_ino,
        log.stat().st_size,
    )
    _append(log, 3)
    _pass(route, 2.0)
    _pass(route, 3.0)  # nothing new: nothing added
    assert _counts(ledger) == {("2025-12-04 10", "a", "7"): 3}

    # the ledger fails a write: the counts wait for the next pass
    real = batchroute.record_batch

    def down(*args: Any, **kwargs: Any) -> int:
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(batchroute, "record_batch", down)
    _append(log, 2)
    _pass(route, 4.0)
    monkeypatch.setattr(batchroute, "record_batch", real)
    _append(log, 1, job="8")
    _pass(route, 5.0)
    assert _counts(ledger) == {("2025-12-04 10", "a", "7"): 5, ("2025-12-04 10", "a", "8"): 1}

    # the daemon stops after reading, before writing; lines come while it is down; a new
    # one resumes from the stored position: each line counted once
    _append(log, 2)
    monkeypatch.setattr(batchroute, "record_batch", down)
    _pass(route, 6.0)  # read, not stored: then the process dies
    monkeypatch.setattr(batchroute, "record_batch", real)
    _append(log, 1)
    restarted = BatchRoute(log)
    restarted.attach_ledger(ledger, "lab")
    _pass(restarted, 7.0)
    assert _counts(ledger) == {("2025-12-04 10", "a", "7"): 8, ("2025-12-04 10", "a", "8"): 1}
    assert batch_cursor(ledger, str(log)) == (log.stat().st_ino, log.stat().st_size)
