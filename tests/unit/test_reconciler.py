"""The control loop's logic (`Reconciler.run_once`) on in-memory Slurm, Triton and routing
fakes (tests/unit/fakes.py), a real lease store on a SQLite file and an injected clock:
errors as data (permanent -> failed once, transient -> backoff), a tick that cannot observe
or reach its database acts on nothing, routing errors, deadlines, metrics, the happy path;
and the daemon's scheduler wiring (`bridge.daemon.service`), every pass on one thread.

Fast aids for the loop's logic only; the real proof is on the lab (tests/lab).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from bridge.config import ModelConfig
from bridge.daemon.report import Outcome, StepError
from bridge.daemon.service import Bridge, scheduler_for, serve, tick_once
from bridge.leases import requests as requests_mod
from bridge.leases.requests import RequestQueue
from bridge.leases.store import make_engine
from bridge.lifecycle import LeaseState, allowed
from bridge.policy import ModelSample
from bridge.routing.errors import NginxConfigRejected, NginxUnavailable, RoutingFilesUnwritable
from bridge.slurm.errors import CommandRejected, ControllerUnreachable, UnparseableOutput
from bridge.slurm.model import Job
from tests.unit.fakes import N3, N5, Harness, address_of, at, make_harness

S = LeaseState
ADDR3 = address_of(N3)
REJECTED = "Invalid account or account/partition combination specified"


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def sample(h: Harness, name: str, **labels: str) -> float:
    value = h.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def states(h: Harness, lease_id: int = 1) -> list[tuple[LeaseState | None, LeaseState]]:
    return [(e.from_state, e.to_state) for e in h.store.history(lease_id)]


def lend(h: Harness, node: str, t: float, models: tuple[str, ...] = ("busy",)) -> int:
    req = h.requests.request_lend(node, list(models), at(t))
    assert req.id is not None
    return req.id


def outcome_of(h: Harness, request_id: int) -> str:
    req = h.requests.get(request_id)
    assert req is not None and req.done_at is not None
    return req.outcome


def to_starting(h: Harness) -> None:
    """Lease 1 on n3: lent at t=0, submitted, starting at t=1 (n3's Triton not ready)."""
    lend(h, "n3", 0)
    h.tick(0)
    h.tick(1)
    assert h.lease(1).state == S.STARTING


def to_serving(h: Harness) -> None:
    """Lease 1 on n3 serving at t=2, its Triton ready with `busy`."""
    h.triton.server(ADDR3, models={"busy": "READY"})
    to_starting(h)
    h.tick(2)
    assert h.lease(1).state == S.SERVING


# ---- permanent errors: failed once, no retry storm ------------------------------------


def test_slurm_rejects_the_triton_job_the_lease_fails_once_and_returns(h: Harness) -> None:
    h.slurm.fail("submit", CommandRejected("sbatch", REJECTED))
    req = lend(h, "n3", 0)

    r = h.tick(1)
    assert len(h.slurm.ops("submit")) == 1
    assert r.outcome == Outcome.ERRORS
    assert r.errors == [StepError("submit", "permanent", f"sbatch: {REJECTED}", 1)]
    lease = h.lease(1)
    assert lease.state == S.FAILED
    assert lease.reason == f"submit: sbatch: {REJECTED}"
    assert outcome_of(h, req).startswith("failed")
    assert REJECTED in outcome_of(h, req)

    r = h.tick(2)
    assert h.lease(1).state == S.RETURNED
    assert r.returned == [("elastic", "failed", 1.0)]
    assert states(h) == [(None, S.REQUESTED), (S.REQUESTED, S.FAILED), (S.FAILED, S.RETURNED)]

    for t in range(3, 13):  # Slurm still refuses: nobody asks again
        r = h.tick(t)
        assert r.outcome == Outcome.OK, r.lines()
    assert len(h.slurm.ops("submit")) == 1
    assert len(h.store.by_node("n3")) == 1
    assert h.store.open_leases() == []
    assert sample(h, "stb_step_errors_total", step="submit", kind="permanent") == 1
    assert sample(h, "stb_returns_total", outcome="failed") == 1


# ---- transient errors: bounded exponential backoff ------------------------------------


def test_transient_sbatch_error_is_retried_with_exponential_backoff(tmp_path: Path) -> None:
    h = make_harness(tmp_path, requested_deadline_s=1000)  # base 2 s, max 60 s
    h.slurm.fail("submit", ControllerUnreachable("sbatch: Unable to contact slurm controller"))
    lend(h, "n3", 0)
    tried: list[int] = []
    for t in range(200):
        if t == 150:
            h.slurm.heal("submit")
        before = len(h.slurm.ops("submit"))
        r = h.tick(t)
        if len(h.slurm.ops("submit")) > before:
            tried.append(t)
        if t == 30:
            assert r.outcome == Outcome.ERRORS
            assert r.errors == [
                StepError("submit", "transient", "sbatch: Unable to contact slurm controller", 1)
            ]
            assert r.retries == {1: 5}
        if t == 31:
            assert r.outcome == Outcome.OK and r.errors == []
            assert r.retries == {1: 5}  # still waiting: counted until a step succeeds
            assert h.lease(1).state == S.REQUESTED
            assert sample(h, "stb_lease_retries", lease="1") == 5
    # waits 2, 4, 8, 16, 32, then 60 (the cap), 60; Slurm back at 150: next try at 182
    assert tried == [0, 2, 6, 14, 30, 62, 122, 182]
    assert sample(h, "stb_step_errors_total", step="submit", kind="transient") == 7
    assert r.retries == {}
    assert h.lease(1).state == S.STARTING  # submitted at 182, its job ran at 183
    assert [s for _, s in states(h)] == [S.REQUESTED, S.SUBMITTED, S.STARTING]
    assert sample(h, "stb_lease_retries", lease="1") == 0


def test_transient_error_past_the_requested_deadline_fails_the_lease(h: Harness) -> None:
    h.slurm.fail("submit", ControllerUnreachable("sbatch: Unable to contact slurm controller"))
    lend(h, "n3", 0)
    for t in range(0, 122):
        h.tick(t)
    lease = h.lease(1)
    assert lease.state == S.FAILED
    assert lease.reason == "stuck in requested for 121 s (deadline 120 s)"
    assert len(h.slurm.ops("submit")) == 6  # 0, 2, 6, 14, 30, 62


# ---- a tick that cannot see Slurm or its database acts on nothing ---------------------


@pytest.mark.parametrize("op", ["nodes", "jobs", "reservations"])
@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ControllerUnreachable("squeue: Unable to contact slurm controller"), "transient"),
        (UnparseableOutput("squeue", "<garbage>"), "permanent"),
    ],
)
def test_slurm_down_during_observe_fails_the_tick_and_touches_nothing(
    h: Harness, op: str, exc: Exception, kind: str
) -> None:
    h.slurm.start_state = "PENDING"
    lend(h, "n3", 0)
    h.tick(0)
    before = h.lease(1)
    assert before.state == S.SUBMITTED
    waiting = lend(h, "n5", 5)
    h.slurm.calls.clear()
    h.slurm.fail(op, exc)

    r = h.tick(10 * 60)  # far past every deadline: still nothing is decided
    assert r.outcome == Outcome.FAILED
    assert r.errors == [StepError("observe", kind, str(exc), None)]
    assert r.lease_states is None
    assert h.slurm.writes == []
    after = h.lease(1)
    assert (after.state, after.updated_at, after.reason) == (
        before.state,
        before.updated_at,
        before.reason,
    )
    assert len(h.store.history(1)) == 2
    assert [q.id for q in h.requests.pending()] == [waiting]
    assert sample(h, "stb_ticks_total", outcome="failed") == 1
    assert sample(h, "stb_step_errors_total", step="observe", kind=kind) == 1

    h.slurm.heal()
    r = h.tick(10 * 60 + 1)
    assert r.outcome == Outcome.OK, r.lines()
    assert h.requests.pending() == []
    assert h.store.by_node("n5", open_only=True)[0].state == S.SUBMITTED


def _db_error() -> OperationalError:
    return OperationalError("SELECT lease", {}, Exception("unable to open database file"))


def test_lease_database_unreachable_fails_the_tick_without_slurm_writes(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    to_starting(h)
    h.slurm.calls.clear()

    def down() -> list[Any]:
        raise _db_error()

    monkeypatch.setattr(h.store, "open_leases", down)
    r = h.tick(10)
    assert r.outcome == Outcome.FAILED
    assert [(e.step, e.kind, e.lease_id) for e in r.errors] == [("store", "transient", None)]
    assert "unable to open database file" in r.errors[0].message
    assert h.slurm.calls == []
    assert sample(h, "stb_ticks_total", outcome="failed") == 1
    assert sample(h, "stb_step_errors_total", step="store", kind="transient") == 1

    monkeypatch.undo()
    assert h.tick(11).outcome == Outcome.OK


def test_lease_database_file_gone_then_back(h: Harness) -> None:
    """The SQLite file's folder moved away (the engine disposed): failed ticks, no Slurm
    write; the daemon resumes by itself once it is back."""
    to_starting(h)
    lend(h, "n5", 2)
    db_dir = h.db_path.parent
    away = db_dir.with_name("db-away")
    h.store._engine.dispose()
    shutil.move(db_dir, away)
    h.slurm.calls.clear()
    try:
        for t in (10, 15):
            r = h.tick(t)
            assert r.outcome == Outcome.FAILED
            assert [(e.step, e.kind) for e in r.errors] == [("store", "transient")]
        assert h.slurm.writes == []
    finally:
        shutil.move(away, db_dir)
    r = h.tick(20)
    assert r.outcome == Outcome.OK, r.lines()
    assert h.lease(1).state == S.STARTING
    assert h.store.by_node("n5", open_only=True)[0].state == S.SUBMITTED
    assert sample(h, "stb_ticks_total", outcome="failed") == 2


def test_operator_request_inserted_while_the_tick_finishes_another(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = RequestQueue(make_engine(h.config.database_url))  # another process: the CLI
    req = lend(h, "n3", 0)
    racing = {"done": False}

    inserter: list[threading.Thread] = []

    class RacingSession(Session):
        def get(self, *args: Any, **kwargs: Any) -> Any:
            found = super().get(*args, **kwargs)
            if not racing["done"]:
                racing["done"] = True
                # the CLI inserts from another process while this transaction is open:
                # without a write lock taken up front it commits in between (and this
                # transaction's UPDATE then fails); with one it waits for the commit
                t = threading.Thread(target=other.request_lend, args=("n5", ["busy"], at(0)))
                t.start()
                t.join(0.5)
                inserter.append(t)
            return found

    monkeypatch.setattr(requests_mod, "Session", RacingSession)
    r = h.tick(1)
    inserter[0].join(10)
    assert racing["done"] and not inserter[0].is_alive()
    assert len(other.pending()) == 1  # the CLI's request waits for the next pass
    assert r.outcome == Outcome.OK, r.lines()
    assert outcome_of(h, req) == "lease 1 lending n3"


# ---- serving lease whose server vanishes -----------------------------------------------


def test_serving_lease_whose_server_stops_answering_fails_after_the_grace_and_is_cancelled(
    h: Harness,
) -> None:
    to_serving(h)
    assert ADDR3 in h.router.endpoints("busy")
    h.triton.servers[ADDR3].unreachable = True

    h.tick(10)  # unanswered: out of routing, the lease goes on within the grace
    assert h.lease(1).state == S.SERVING
    assert ADDR3 not in h.router.endpoints("busy")
    h.triton.servers[ADDR3].unreachable = False
    h.tick(12)  # it answers again: back in routing
    assert h.lease(1).state == S.SERVING
    assert ADDR3 in h.router.endpoints("busy")
    h.triton.servers[ADDR3].unreachable = True
    h.tick(14)
    assert h.lease(1).state == S.SERVING
    r = h.tick(14 + 15)  # unanswered for `[leases] unanswered_grace_s`: failed
    lease = h.lease(1)
    assert lease.state == S.FAILED
    assert lease.reason == "Triton server unanswered for 17s while serving"  # since 12
    assert ADDR3 not in h.router.endpoints("busy")
    assert h.router.endpoints("busy") == ("10.0.0.1:8000",)  # the baseline goes on
    assert r.outcome == Outcome.OK

    h.tick(11)
    assert h.slurm.ops("cancel") == [("100",)]
    r = h.tick(12)
    assert h.lease(1).state == S.RETURNED
    assert r.returned == [("elastic", "failed", 12.0)]
    assert [s for _, s in states(h)][-3:] == [S.SERVING, S.FAILED, S.RETURNED]


# ---- routing errors --------------------------------------------------------------------

ROUTING_ERRORS = [
    pytest.param(
        NginxConfigRejected("/etc/nginx/stb.conf", 'unknown directive "upstrem"'),
        "permanent",
        id="nginx-rejected",
    ),
    pytest.param(
        RoutingFilesUnwritable("routing/stb.conf: [Errno 30] Read-only file system"),
        "transient",
        id="unwritable",
    ),
    pytest.param(NginxUnavailable("no nginx master: /run/nginx.pid"), "transient", id="no-nginx"),
]


@pytest.mark.parametrize(("exc", "kind"), ROUTING_ERRORS)
def test_routing_publish_error_is_a_step_error_and_the_pass_completes(
    h: Harness, exc: Exception, kind: str
) -> None:
    to_starting(h)
    lend(h, "n5", 1)
    published = len(h.router.tables)
    before = h.lease(1)
    h.router.fail_with = exc

    r = h.tick(2)
    assert r.outcome == Outcome.ERRORS
    assert r.errors == [StepError("route", kind, str(exc), None)]
    assert r.lease_states == {"starting": 1, "submitted": 1}  # the pass went on to the end
    assert h.lease(1).updated_at == before.updated_at
    assert h.store.by_node("n5", open_only=True)[0].state == S.SUBMITTED
    assert len(h.router.tables) == published
    assert sample(h, "stb_step_errors_total", step="route", kind=kind) == 1

    h.router.fail_with = None
    assert h.tick(3).outcome == Outcome.OK
    assert len(h.router.tables) == published + 1


@pytest.mark.parametrize(("exc", "kind"), ROUTING_ERRORS)
def test_routing_error_on_the_way_to_serving_keeps_the_lease_starting(
    h: Harness, exc: Exception, kind: str
) -> None:
    to_starting(h)
    h.triton.server(ADDR3, models={"busy": "READY"})
    h.router.fail_with = exc

    r = h.tick(2)
    assert [(e.step, e.kind, e.lease_id) for e in r.errors] == [
        ("route", kind, 1),  # RouteIn, before the move to serving
        ("route", kind, None),  # the pass's own publish
    ]
    lease = h.lease(1)
    assert lease.state == S.STARTING  # a routing error says nothing about the lease
    # either kind: no backoff (routing is local and idempotent: the next tick tries again)
    # and no failed lease
    assert r.retries == {}

    h.router.fail_with = None
    h.tick(10)
    assert h.lease(1).state == S.SERVING
    assert ADDR3 in h.router.endpoints("busy")


# ---- deadlines -------------------------------------------------------------------------


def test_lease_stuck_in_releasing_past_its_deadline_fails(h: Harness) -> None:
    h.slurm.cancel_removes = False  # the Triton job ignores the cancel
    to_starting(h)
    h.requests.request_return(1, at(2))
    h.tick(2)
    assert h.lease(1).state == S.RELEASING
    for t in (100, 200, 302):
        r = h.tick(t)
        assert h.lease(1).state == S.RELEASING
        assert r.stuck == {}
    assert len(h.slurm.ops("cancel")) == 4  # the return's, then once per pass

    r = h.tick(303)
    lease = h.lease(1)
    assert lease.state == S.FAILED
    assert lease.reason == "stuck in releasing for 301 s (deadline 300 s); job 100 still RUNNING"

    r = h.tick(604)  # the failed lease's own cleanup does not finish: reported stuck
    assert h.lease(1).state == S.FAILED
    assert list(r.stuck) == [1]
    assert r.stuck[1].startswith("failed: stuck in releasing")
    assert sample(h, "stb_leases_stuck") == 1

    h.slurm.end_job("100")
    h.tick(605)
    assert h.lease(1).state == S.RETURNED


# ---- the report's outcome and the metrics ----------------------------------------------


def test_outcomes_and_tick_metrics(h: Harness) -> None:
    assert h.tick(0).outcome == Outcome.OK
    assert h.tick(5).outcome == Outcome.OK
    h.router.fail_with = RoutingFilesUnwritable("routing/stb.conf: [Errno 28] No space left")
    assert h.tick(10).outcome == Outcome.ERRORS
    h.router.fail_with = None
    h.slurm.fail("nodes", ControllerUnreachable("sinfo: Unable to contact slurm controller"))
    assert h.tick(15).outcome == Outcome.FAILED
    h.slurm.heal()
    to_starting(h)  # two more ok ticks

    assert sample(h, "stb_ticks_total", outcome="ok") == 4
    assert sample(h, "stb_ticks_total", outcome="errors") == 1
    assert sample(h, "stb_ticks_total", outcome="failed") == 1
    assert sample(h, "stb_tick_duration_seconds_count") == 6
    assert sample(h, "stb_step_errors_total", step="route", kind="transient") == 1
    assert sample(h, "stb_step_errors_total", step="observe", kind="transient") == 1
    assert sample(h, "stb_last_good_tick_timestamp_seconds") == 1_000.0  # the metrics clock
    assert sample(h, "stb_leases", state="starting") == 1
    assert sample(h, "stb_lends_total", pool="elastic") == 1
    healthy, body = h.metrics.health(h.config.tick_s)
    assert healthy and body["last_outcome"] == "ok"


# ---- the whole way ---------------------------------------------------------------------


def test_happy_path_lend_serve_return(h: Harness) -> None:
    h.triton.server(ADDR3, models={"busy": "READY"})
    req = lend(h, "n3", 0)
    h.tick(0)
    assert outcome_of(h, req) == "lease 1 lending n3"
    assert h.lease(1).state == S.SUBMITTED
    spec = h.slurm.specs[0]
    assert spec.nodelist == ("n3",) and spec.exclusive and spec.reservation is None
    h.tick(1)
    assert h.lease(1).state == S.STARTING
    r = h.tick(2)
    assert h.lease(1).state == S.SERVING
    assert r.served == [("elastic", 2.0)]
    assert ADDR3 in h.router.endpoints("busy")

    ret = h.requests.request_return(1, at(3))
    h.tick(3)
    assert outcome_of(h, ret.id or 0) == "lease 1 returning"
    assert h.lease(1).state == S.DRAINING
    assert ADDR3 not in h.router.endpoints("busy")
    h.tick(4)
    assert h.lease(1).state == S.RELEASING
    assert h.triton.servers[ADDR3].unloads == ["busy"]
    assert h.triton.forgotten == [ADDR3]
    assert h.slurm.ops("cancel") == [("100",)]
    r = h.tick(5)
    assert h.lease(1).state == S.RETURNED
    assert r.returned == [("elastic", "returned", 5.0)]

    moves = states(h)
    assert [s for _, s in moves] == [
        S.REQUESTED,
        S.SUBMITTED,
        S.STARTING,
        S.SERVING,
        S.DRAINING,
        S.RELEASING,
        S.RETURNED,
    ]
    assert all(old is None or allowed(old, new) for old, new in moves)
    assert sample(h, "stb_returns_total", outcome="returned") == 1
    assert h.slurm.reservations_ == {}


def test_a_partial_lend_asks_slurm_for_its_gpus_and_requeues_one_job(tmp_path: Path) -> None:
    # busy's replica takes one GPU; n3 (4 GPUs) runs two elastic jobs of 2 GPUs each
    one_gpu = {"busy": ModelConfig(slo_p99_ms=100, instance_gpus=1)}
    h = make_harness(tmp_path, models=one_gpu)
    for job_id, started in (("7", 0.0), ("8", 3000.0)):
        h.slurm.add_job(
            Job(job_id, "train", "elastic", "team", "u", "RUNNING", "None", ("n3",),
                "stb:elastic", 2, 0, at(started), at(started))
        )  # fmt: skip
    req = lend(h, "n3", 3600)
    h.tick(3600)
    assert outcome_of(h, req) == "lease 1 lending n3"
    spec = h.slurm.specs[0]
    assert (spec.nodelist, spec.exclusive, spec.gpus_per_node) == (("n3",), False, 1)
    assert spec.partition == "elastic"  # its pool's: it preempts nothing itself
    assert h.slurm.ops("requeue") == [("8",)]  # the younger job: the least work lost
    assert h.store.get(1).gpus == 1


def test_drain_mode_lend_fences_then_return_unfences(h: Harness) -> None:
    h.slurm.start_state = "PENDING"  # the training job still runs there
    lend(h, "n5", 0)
    h.tick(0)
    assert h.lease(1).state == S.SUBMITTED
    assert h.slurm.ops("create_reservation") == [("stb-lease-1", ("n5",), 1800 + 7 * 86400)]
    spec = h.slurm.specs[0]
    assert (spec.reservation, spec.partition, spec.nodelist) == ("stb-lease-1", "train", ("n5",))
    assert spec.gpus_per_node == N5.gpus

    h.tick(60)  # pending: the fence is not made again
    assert len(h.slurm.ops("create_reservation")) == 1

    h.requests.request_return(1, at(61))
    h.tick(61)
    assert h.lease(1).state == S.RELEASING
    assert h.slurm.ops("cancel") == [("100",)]
    h.tick(62)
    assert h.lease(1).state == S.RETURNED
    # (lifted by the lease's own step, and again by the orphan sweep of the same pass,
    # which still sees the reservation in the pass's observation: harmless, idempotent)
    assert set(h.slurm.ops("delete_reservation")) == {("stb-lease-1",)}
    assert h.slurm.reservations_ == {}
    moves = states(h)
    assert all(old is None or allowed(old, new) for old, new in moves)


def test_draining_lease_whose_triton_hangs_is_still_released(h: Harness) -> None:
    to_serving(h)
    h.requests.request_return(1, at(3))
    h.tick(3)
    assert h.lease(1).state == S.DRAINING
    h.triton.servers[ADDR3].unreachable = True
    for t in range(4, 1800, 10):
        h.tick(t)
    assert h.slurm.ops("cancel"), "the Triton job was never cancelled"
    assert h.lease(1).state in (S.RELEASING, S.FAILED, S.RETURNED)


# ---- the daemon's scheduler: every pass on one thread ----------------------------------


class StubClients:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_scheduler_runs_every_tick_on_one_thread(tmp_path: Path) -> None:
    h = make_harness(tmp_path, tick_s=0.2)
    clients = StubClients()
    bridge = Bridge(h.config, h.reconciler, h.metrics, None, None, clients)  # type: ignore[arg-type]
    passes = threading.Event()
    published = h.router.publish

    def publish(table: Any) -> object:  # the end of each pass: its requests are finished
        passes.set()
        return published(table)

    h.router.publish = publish  # type: ignore[method-assignment]
    stop = threading.Event()
    hammered = {"requests": 0, "reads": 0}

    def hammer() -> None:
        # Another process's view of the database (the operator CLI), and Slurm's state
        # changing under the tick. Requests are written between passes: one written while
        queue = RequestQueue(make_engine(h.config.database_url))
        while not stop.is_set():
            if passes.wait(0.01):
                passes.clear()
                now = datetime.now(UTC)
                queue.request_lend("n3", ["busy"], now)
                queue.request_lend("n7", [], now)  # refused: no such node
                for lease in h.store.by_node("n3", open_only=True):
                    assert lease.id is not None
                    queue.request_return(lease.id, now)
                hammered["requests"] += 1
            h.store.open_leases()
            queue.pending()
            h.slurm.nodes_["n5"] = N5
            hammered["reads"] += 1

    scheduler = scheduler_for(bridge, BackgroundScheduler)
    worker = threading.Thread(target=hammer, name="hammer")
    scheduler.start()
    worker.start()
    try:
        time.sleep(3.0)
    finally:
        stop.set()
        worker.join(5)
        scheduler.shutdown(wait=True)
        bridge.close()

    assert not worker.is_alive()
    ticks = sample(h, "stb_ticks_total", outcome="ok") + sample(
        h, "stb_ticks_total", outcome="errors"
    )
    assert ticks >= 8, ticks
    assert sample(h, "stb_ticks_total", outcome="failed") == 0
    assert hammered["requests"] >= 5 and hammered["reads"] > 50
    # every Slurm and Triton call came from one thread: the tick executor's
    assert len(h.slurm.threads) == 1, h.slurm.threads
    tick_thread = next(iter(h.slurm.threads))
    assert h.triton.threads == {tick_thread}
    assert tick_thread not in (threading.get_ident(), worker.ident)
    assert len(h.slurm.ops("submit")) >= 2  # lends went through, and were given back
    assert any(lease.state == S.RETURNED for lease in h.store.by_node("n3"))
    assert clients.closed == 1


def test_tick_once_counts_an_unexpected_exception_as_a_failed_tick(h: Harness) -> None:
    bridge = Bridge(h.config, h.reconciler, h.metrics, None, None, StubClients())  # type: ignore[arg-type]

    def boom(now: datetime) -> Any:
        raise KeyError("bug")

    h.reconciler.run_once = boom  # type: ignore[method-assignment]
    assert tick_once(bridge) is None
    assert sample(h, "stb_ticks_total", outcome="failed") == 1
    assert sample(h, "stb_tick_exceptions_total", kind="KeyError") == 1


def _elastic_job(job_id: str, node: str) -> Job:
    return Job(
        job_id, "exp", "elastic", "team-nlp", "u", "RUNNING", "None", (node,), "", 4, 0, None,
        None,
    )  # fmt: skip


def test_a_preempt_lend_requeues_the_victims_and_one_that_ended_is_no_failure(
    h: Harness,
) -> None:
    h.slurm.add_job(_elastic_job("7", "n3"))
    h.slurm.add_job(_elastic_job("8", "n3"))
    h.slurm.fail("requeue", CommandRejected("scontrol requeue 7", "Job has already finished"), 1)
    lend(h, "n3", 0)
    r = h.tick(0)
    assert h.lease(1).state == S.SUBMITTED
    assert h.slurm.ops("submit") and h.slurm.ops("requeue") == [("7",), ("8",)]
    # the submit came first, so the Triton job is first in line when the node frees
    assert next(op for op, _ in h.slurm.calls if op in ("submit", "requeue")) == "submit"
    assert any("job 7 not requeued" in e for e in r.events)
    assert any("requeued job 8 for the lend" in e for e in r.events)
    assert h.reconciler.actuator.preemptions_since(0.0) == 1


def test_a_transient_requeue_error_leaves_the_lend_to_slurmctld(h: Harness) -> None:
    h.slurm.add_job(_elastic_job("7", "n3"))
    h.slurm.fail("requeue", ControllerUnreachable("scontrol requeue 7", "timed out"), 1)
    lend(h, "n3", 0)
    h.tick(0)
    assert h.lease(1).state == S.REQUESTED  # the step failed after its submit...
    h.tick(100)
    assert h.lease(1).state == S.SUBMITTED  # ...and the next tick finds its Triton job
    assert len(h.slurm.ops("submit")) == 1


def test_a_return_and_the_next_lend_of_its_models_reach_the_policy(h: Harness) -> None:
    """The reconciler remembers each return and closes it at the next lend of its models
    (the gap `bridge.policy.returns` learns the dwell from), and each pass's rates go into
    the models' peaks."""
    h.triton.server(ADDR3, models={"busy": "READY"})
    lend(h, "n3", 0)
    for t in range(3):
        h.tick(t)
    assert h.lease(1).state == S.SERVING
    h.requests.request_return(1, at(3))
    h.tick(3)
    memory = h.reconciler.memory
    assert memory.returns.view()["busy"].open_since == at(3).timestamp()
    for t in range(4, 6):
        h.tick(t)
    assert h.lease(1).state == S.RETURNED
    lend(h, "n3", 40)
    h.tick(40)
    assert memory.returns.view()["busy"].gaps == (37.0,)
    assert memory.returns.view()["busy"].open_since is None
    # the newest sample of each model into its peaks; a model gone from the history goes
    memory.track({"busy": (ModelSample(at(41).timestamp(), 20.0, 12.0, 0.0, 10.0),)})
    assert memory.peaks.view()["busy"].top == 12.0
    memory.track({})
    assert memory.peaks.view() == {}


def test_a_second_sigterm_while_the_daemon_stops_is_harmless() -> None:
    """serve() stops the scheduler at SIGTERM; a second one while it closes (an operator's
    second kill, systemd's, a test's teardown) must not raise out of the shutdown."""
    done: list[str] = []

    class Exporter:
        def stop(self) -> None:
            done.append("exporter stopped")

    def closing() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, mid-shutdown
        done.append("closed")

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        serve(BlockingScheduler(), Exporter(), closing)  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert done == ["exporter stopped", "closed"]


def test_the_clients_of_a_server_whose_job_ended_are_let_go(h: Harness) -> None:
    """A Triton job asked last pass and gone this one (cancelled by another bridge, ended
    on its own): its clients are forgotten, so no keep-alive connection of this bridge
    holds tritonserver's exit (a standby asks the lent servers too, never cancels)."""
    h.tick(0)
    assert h.triton.forgotten == []
    baseline = address_of(h.slurm.nodes_["n1"])
    del h.slurm.jobs_["10"]  # the baseline job ends outside the bridge
    h.tick(1)
    assert h.triton.forgotten == [baseline]
    h.tick(2)
    assert h.triton.forgotten == [baseline]  # once


def test_a_restarted_reconciler_recalls_the_returns_from_the_lease_store(h: Harness) -> None:
    """The dwell learned from past returns survives a restart: the first active pass of a
    new reconciler on the same store replays the recent leases' lends and returns (a
    return is when the lease began draining, or releasing: the second one never served)."""
    h.triton.server(ADDR3, models={"busy": "READY"})
    lend(h, "n3", 0)
    for t in range(3):
        h.tick(t)
    h.requests.request_return(1, at(3))
    for t in range(3, 6):
        h.tick(t)
    lend(h, "n3", 40)
    for t in range(40, 43):
        h.tick(t)
    h.requests.request_return(2, at(50))
    for t in range(50, 53):
        h.tick(t)
    assert [h.lease(i).state for i in (1, 2)] == [S.RETURNED, S.RETURNED]
    before = h.reconciler.memory.returns.view()["busy"]
    assert before.gaps == (37.0,) and before.open_since == at(50).timestamp()

    again = h.restarted()
    assert again.memory.returns.view() == {}
    again.run_once(at(60))
    assert again.memory.returns.view()["busy"] == before
