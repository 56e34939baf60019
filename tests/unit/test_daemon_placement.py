"""Model placement carried out by the daemon (`bridge.daemon.placement`, the pure rules, on
literal inputs; `bridge.daemon.placer`, the reconciler carrying a placement out on the
fakes of tests/unit/fakes.py with a real lease store): recorded first, the dropped model
out of routing before it is unloaded, the gained one loaded then routed; resumed by a
restarted daemon from what the store and Triton say; a refused load undone; `stb place`.
A load is asked and the pass goes on: the fake's loads are held open by an Event
(`FakeServer.load_gate`) while passes run, and the placer's clock is a list's first item
where the seconds matter. (The policy's placement is tests/unit/test_placement.py's.)"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.daemon.observation import TritonServer
from bridge.daemon.placement import (
    Load,
    LoadOutcome,
    Verdict,
    asks,
    check_place,
    judge_load,
    plan_placement,
    withheld,
)
from bridge.daemon.planner import LeaseRecord
from bridge.leases.errors import UnexpectedState
from bridge.leases.loads import LoadStore
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.policy import Place
from bridge.triton.client import TritonHttpClient
from bridge.triton.errors import TritonUnreachable
from tests.unit.fakes import N3, Harness, address_of, at, make_harness
from tests.unit.planner_literals import job

S = LeaseState
ADDR3 = address_of(N3)


def lease(models: tuple[str, ...] = ("calm",), state: LeaseState = S.SERVING) -> LeaseRecord:
    return LeaseRecord(7, "n3", "elastic", "preempt", state, models, 0.0, 1.0, "100")


def server(models: tuple[str, ...], pending: dict[str, float] | None = None) -> TritonServer:
    return TritonServer(job("100"), "n3", ADDR3, True, models, pending or {})


# ---- the pure rules ----------------------------------------------------------------------


def test_a_placed_replica_loads_what_it_gains_and_waits_to_unload_what_it_drops() -> None:
    plan = plan_placement(lease(), server(("busy",)), {}, 100.0, 30.0)
    assert plan is not None
    assert (plan.load, plan.unload, plan.waiting) == (("calm",), (), ("busy",))


@pytest.mark.parametrize(
    ("out_since", "pending", "now", "unloads"),
    [
        ({"busy": 100.0}, {}, 100.0, False),  # out of routing this very pass: not yet seen
        ({"busy": 100.0}, {}, 102.0, True),  # seen since: nothing in flight
        ({"busy": 100.0}, {"busy": 2.0}, 102.0, False),  # requests in flight: wait
        ({"busy": 100.0}, {"busy": 2.0}, 130.0, True),  # ... up to drain_timeout_s
        ({"busy": 100.0}, {"calm": 5.0}, 102.0, True),  # another model's requests: not its
        ({}, {}, 102.0, False),  # never published without it: it waits
    ],
)
def test_a_dropped_model_is_unloaded_as_a_return_drains(
    out_since: dict[str, float], pending: dict[str, float], now: float, unloads: bool
) -> None:
    plan = plan_placement(lease(), server(("busy", "calm"), pending), out_since, now, 30.0)
    assert plan is not None
    assert plan.load == ()
    assert plan.unload == (("busy",) if unloads else ())
    assert plan.waiting == (() if unloads else ("busy",))


def test_nothing_to_place() -> None:
    assert plan_placement(lease(), server(("calm",)), {}, 100.0, 30.0) is None
    assert plan_placement(lease(state=S.DRAINING), server(("busy",)), {}, 100.0, 30.0) is None
    # a server holding what its lease never gave it, with no placement on record: left alone
    assert plan_placement(lease(), server(("busy",)), {}, 100, 30, placed=False) is None
    # an adopted job's lease lists no model: nothing of its server is taken away
    assert plan_placement(lease(()), server(("busy",)), {}, 100.0, 30.0) is None


def test_routing_withholds_the_models_a_lease_no_longer_lists() -> None:
    leases = [lease(), lease(()), LeaseRecord(8, "n2", "elastic", "preempt", S.SERVING, ("a",), 0)]
    held = withheld(leases, {"100": ("busy", "calm"), "200": ("a",)})
    assert held == {("100", "busy")}


def test_check_place() -> None:
    known = ("busy", "calm")
    assert check_place(lease(), 7, ("busy",), known) is None
    assert check_place(None, 7, ("busy",), known) == "refused: no lease with id 7"
    assert "needs at least one model" in (check_place(lease(), 7, (), known) or "")
    assert "unknown models nope" in (check_place(lease(), 7, ("nope",), known) or "")
    assert "named twice" in (check_place(lease(), 7, ("busy", "busy"), known) or "")
    refused = check_place(lease(state=S.STARTING), 7, ("busy",), known)
    assert refused == "refused: lease 7 is starting, not serving"


def test_a_model_triton_loads_already_is_waited_for_not_asked_again() -> None:
    states = {"b": "LOADING", "c": "UNAVAILABLE", "d": "READY"}
    assert asks(("a", "b", "c"), {"a"}, states) == (("c",), ("b",))
    assert asks(("a",), (), {}) == (("a",), ())
    assert asks(("a",), ("a",), {}) == ((), ())


#: the placer's clock at each judgement; the load asked at 10, its call begun at 11
NOW, TIMEOUT = 200.0, 1800.0
ANSWERED = Load("b", 10.0, running=False, began_at=11.0, answered_at=53.0)


@pytest.mark.parametrize(
    ("load", "state", "now", "ready", "outcome"),
    [
        # the call answered: taken as said; the load time is ask to answer
        (replace(ANSWERED, answer="loaded"), None, NOW, True, (Verdict.LOADED, 42.0, "")),
        (
            replace(ANSWERED, answer="refused", message="no"),
            None,
            NOW,
            True,
            (Verdict.REFUSED, 190.0, "no"),
        ),
        # ... an undo waits for the server to be seen ready (what it still holds known)
        (
            replace(ANSWERED, answer="refused", message="no"),
            None,
            NOW,
            False,
            (Verdict.WAIT, 190.0, "no"),
        ),
        # the call still running: under way, up to the bound
        (Load("b", 10.0), None, NOW, True, (Verdict.LOADING, 190.0, "")),
        (Load("b", 10.0), None, 1811.0, True, (Verdict.TIMED_OUT, 1801.0, "")),
        # no answer (the client's timeout): Triton's index says
        (replace(ANSWERED, answer="unanswered"), "READY", NOW, True, (Verdict.LOADED, 189.0, "")),
        (
            replace(ANSWERED, answer="unanswered"),
            "LOADING",
            NOW,
            True,
            (Verdict.LOADING, 190.0, ""),
        ),
        (replace(ANSWERED, answer="unanswered"), None, NOW, True, (Verdict.LOADING, 190.0, "")),
        (
            replace(ANSWERED, answer="unanswered"),
            "LOADING",
            1811.0,
            True,
            (Verdict.TIMED_OUT, 1801.0, ""),
        ),
        (
            replace(ANSWERED, answer="unanswered", message="bad weights"),
            "UNAVAILABLE",
            NOW,
            True,
            (Verdict.REFUSED, 190.0, "bad weights"),
        ),
        (
            replace(ANSWERED, answer="unanswered", message="timed out"),
            "",
            NOW,
            True,
            (Verdict.RETRY, 190.0, "timed out"),
        ),
        # found loading (a dead process's ask): its load time is not known
        (
            Load("b", 10.0, asked=False, running=False),
            "READY",
            NOW,
            True,
            (Verdict.LOADED, None, ""),
        ),
        (
            Load("b", 10.0, asked=False, running=False),
            "LOADING",
            NOW,
            True,
            (Verdict.LOADING, 190.0, ""),
        ),
        (
            Load("b", 10.0, asked=False, running=False),
            "",
            NOW,
            True,
            (Verdict.RETRY, 190.0, "not loading"),
        ),
    ],
)
def test_a_load_under_way_is_judged(
    load: Load, state: str | None, now: float, ready: bool, outcome: tuple[Any, ...]
) -> None:
    got = judge_load(load, state, now, TIMEOUT, server_ready=ready)
    verdict, seconds, why = outcome
    if verdict == Verdict.TIMED_OUT:
        why = f"still loading {seconds:.0f}s after it was asked (model_load_timeout_s 1800)"
    assert got == LoadOutcome(verdict, seconds, why)


# ---- the reconciler ----------------------------------------------------------------------


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def serving_busy(h: Harness) -> None:
    """Lease 1 on n3 serving `busy` from t=2."""
    h.triton.server(ADDR3, models={"busy": "READY"})
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in (0, 1, 2):
        h.tick(t)
    assert h.lease(1).state == S.SERVING


def place(h: Harness, t: float, models: tuple[str, ...] = ("calm",)) -> str:
    """Ask for a placement of lease 1 at `t` and take the pass, then wait for the loads it
    asked to answer (the fake's: at once, unless held); the request's outcome."""
    req = h.requests.request_place(1, list(models), at(t))
    h.tick(t)
    done = h.requests.get(req.id or 0)
    assert done is not None and done.done_at is not None
    if h.triton.servers[ADDR3].load_gate is None:
        settled(h)
    return done.outcome


def settled(h: Harness) -> None:
    """The loads asked have answered (the pass itself never waits for them)."""
    assert h.reconciler.placer.settle(5.0)


def until(cond: Callable[[], bool]) -> None:
    """Wait (briefly, bounded) for an ask's thread to reach a point: e.g. into the fake's
    load, held there by its gate."""
    deadline = time.monotonic() + 5.0
    while not cond():
        assert time.monotonic() < deadline, "the ask's thread did not get there"
        time.sleep(0.005)


def held(h: Harness) -> threading.Event:
    """n3's loads held open until the returned Event is set."""
    gate = threading.Event()
    h.triton.servers[ADDR3].load_gate = gate
    return gate


def clock_of(h: Harness, start: float = 100.0) -> list[float]:
    """The placer's clock, set by the test: its first item."""
    now = [start]
    h.reconciler.placer.clock = lambda: now[0]
    return now


def routed(h: Harness, model: str) -> tuple[str, ...]:
    return h.router.endpoints(model)


def test_a_placement_loads_then_routes_and_routes_out_before_it_unloads(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    fake.pending["busy"] = 1.0  # a request of busy in flight on n3
    assert ADDR3 in routed(h, "busy")

    assert place(h, 3) == "lease 1 placing calm on n3"
    stored = h.lease(1)
    assert (stored.state, stored.models) == (S.SERVING, ["calm"])
    last = h.store.history(1)[-1]
    assert (last.from_state, last.to_state) == (S.SERVING, S.SERVING)
    assert last.reason.startswith("place: operator request")
    assert fake.models == {"busy": "READY", "calm": "READY"}  # loaded, busy still loaded
    assert ADDR3 not in routed(h, "busy")  # busy left n3's routes at once
    assert fake.unloads == []

    r = h.tick(4)  # calm seen READY: routed there; busy in flight: kept loaded
    assert ADDR3 in routed(h, "calm") and ADDR3 not in routed(h, "busy")
    assert fake.unloads == [], r.lines()

    fake.pending["busy"] = 0.0
    r = h.tick(5)
    assert fake.unloads == ["busy"]
    assert any("unloaded busy (placement; busy: no request in flight)" in e for e in r.events)
    assert any("placement done, holds calm" in e for e in r.events)
    r = h.tick(6)
    assert ADDR3 in routed(h, "calm") and ADDR3 not in routed(h, "busy")
    assert h.lease(1).state == S.SERVING and r.outcome.value == "ok", r.lines()
    # every table published after the placement left busy off n3
    placed = [t for t in h.router.tables if ADDR3 in dict(t.routes).get("calm", ())]
    assert placed and all(ADDR3 not in dict(t.routes).get("busy", ()) for t in placed)


def test_the_drain_of_a_dropped_model_is_bounded(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    fake.pending["busy"] = 3.0
    place(h, 3)
    h.tick(10)
    assert fake.unloads == []
    h.tick(3 + h.config.leases.drain_timeout_s)  # out of routing since t=3: timed out
    assert fake.unloads == ["busy"]


def test_a_placement_whose_load_was_done_is_finished_by_a_restarted_daemon(
    h: Harness,
) -> None:
    """The daemon died after the placement was recorded and calm loaded, before busy was
    unloaded: the next daemon (nothing in memory) finishes it from the store and Triton,
    busy kept out of routing from its first publish and unloaded only after it."""
    serving_busy(h)
    place(h, 3)
    fake = h.triton.servers[ADDR3]
    assert set(fake.models) == {"busy", "calm"} and fake.unloads == []

    again = h.restarted()
    published = len(h.router.tables)
    again.run_once(at(20))
    assert fake.unloads == []  # its first publish leaves busy out; the drain starts there
    assert ADDR3 not in routed(h, "busy") and ADDR3 in routed(h, "calm")
    r = again.run_once(at(21))
    assert fake.unloads == ["busy"], r.lines()
    assert all(ADDR3 not in dict(t.routes).get("busy", ()) for t in h.router.tables[published:])
    assert h.lease(1).models == ["calm"] and h.lease(1).state == S.SERVING


def test_a_placement_recorded_but_not_loaded_is_loaded_by_the_next_pass(h: Harness) -> None:
    """The daemon died right after recording the placement: the next pass loads calm."""
    serving_busy(h)
    h.store.place(1, ["calm"], at(3), "by hand")
    h.tick(4)
    settled(h)
    fake = h.triton.servers[ADDR3]
    assert fake.models.get("calm") == "READY"
    assert ADDR3 not in routed(h, "busy")
    h.tick(5)
    assert fake.unloads == ["busy"]


def test_a_load_triton_refuses_undoes_the_placement(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    fake.reject["load"] = "failed to load 'calm'"
    assert place(h, 3) == "lease 1 placing calm on n3"  # asked; its answer comes later
    r = h.tick(4)
    assert [(e.step, e.kind) for e in r.errors] == [("load", "permanent")]
    assert "failed to load 'calm'" in r.errors[0].message
    assert h.lease(1).models == ["busy"] and h.lease(1).state == S.SERVING
    assert "undone" in h.store.history(1)[-1].reason
    h.tick(5)
    assert ADDR3 in routed(h, "busy") and fake.unloads == []


def test_a_transient_load_error_is_retried(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    act = h.reconciler.actuator
    real = act.triton_for

    def down_for_loads(address: str) -> Any:
        client = real(address)

        def load_model(name: str) -> None:
            raise TritonUnreachable(address, f"load {name!r}", "connection reset")

        client.load_model = load_model  # type: ignore[method-assign]
        return client

    act.triton_for = down_for_loads
    assert place(h, 3) == "lease 1 placing calm on n3"
    act.triton_for = real
    r = h.tick(4)  # no answer, and Triton does not load it: the ask was lost
    assert [(e.step, e.kind) for e in r.errors] == [("load", "transient")], r.lines()
    assert "connection reset" in r.errors[0].message
    h.tick(5)  # within the backoff: nothing asked
    settled(h)
    assert "calm" not in fake.models and fake.loads == []
    h.tick(4 + h.config.leases.retry_base_s + 1)
    settled(h)
    assert fake.models.get("calm") == "READY" and fake.loads == ["calm"]


# ---- a load asked, the pass going on -----------------------------------------------------


def test_a_slow_load_does_not_hold_the_pass(h: Harness) -> None:
    """calm's load is held open: the pass that asked it ends, and the next one lends n5
    (another lease's work) while calm still loads; calm is routed once it is loaded."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    try:
        began = time.monotonic()
        assert place(h, 3) == "lease 1 placing calm on n3"
        assert time.monotonic() - began < 5.0  # the fake's held load would take 30 s
        until(lambda: fake.models.get("calm") == "LOADING")  # in Triton's hands, held
        h.requests.request_lend("n5", ["calm"], at(4))
        r = h.tick(4)
        assert "lease 1 n3: loading calm for 0s" in r.events, r.lines()
        assert h.store.by_node("n5", open_only=True)[0].state == S.SUBMITTED  # same pass
        assert fake.models["calm"] == "LOADING" and ADDR3 not in routed(h, "calm")
    finally:
        gate.set()
    settled(h)
    r = h.tick(5)
    assert any(e.startswith("lease 1 n3: loaded calm in ") for e in r.events), r.lines()
    assert ADDR3 in routed(h, "calm")


def test_the_load_time_runs_from_the_ask_to_its_answer(h: Harness) -> None:
    """Asked at 100 on the placer's clock, answered at 142, taken in at 500: 42 s."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    now = clock_of(h, 100.0)
    gate = held(h)
    place(h, 3)
    until(lambda: fake.loads == ["calm"])  # its call began (at 100)
    now[0] = 142.0
    gate.set()
    settled(h)
    now[0] = 500.0
    r = h.tick(4)
    assert "lease 1 n3: loaded calm in 42.0s (placement)" in r.events, r.lines()
    assert h.reconciler.loads.load_s["calm"] == 42.0


def test_a_load_in_flight_is_never_asked_again(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    try:
        place(h, 3)
        for t in (4, 5, 6, 30):
            r = h.tick(t)
            assert any("loading calm for" in e for e in r.events), r.lines()
        assert fake.loads == ["calm"]
    finally:
        gate.set()
    settled(h)
    h.tick(31)
    h.tick(32)
    assert fake.loads == ["calm"] and fake.unloads == ["busy"]


def test_a_load_answered_after_the_passs_observation_is_not_asked_again(h: Harness) -> None:
    """The answer comes between the pass's observation (calm not READY in it) and its
    placement sync: the sync takes calm as held, not as a gained model to ask for (a
    second ask answers at once, "already loaded", and recorded a second load time of
    about 0 s; seen on the lab)."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    place(h, 3)
    until(lambda: fake.models.get("calm") == "LOADING")
    rec = h.reconciler
    take_in = rec.placer._take_in

    def answer_first(obs: Any, now: datetime, report: Any) -> dict[str, set[str]]:
        gate.set()  # the load ends after this pass observed the server
        settled(h)
        return take_in(obs, now, report)

    rec.placer._take_in = answer_first  # type: ignore[method-assign]
    r = h.tick(4)
    rec.placer._take_in = take_in  # type: ignore[method-assign]
    assert any("loaded calm in" in e for e in r.events), r.lines()
    settled(h)
    h.tick(5)
    h.tick(6)
    assert fake.loads == ["calm"], r.lines()
    assert len(LoadStore.beside(h.store).measures()["calm"]) == 1  # one load, one measure


def test_a_refusal_taken_in_later_undoes_the_placement(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    place(h, 3)
    until(lambda: fake.models.get("calm") == "LOADING")
    h.tick(4)
    assert h.lease(1).models == ["calm"]  # under way: nothing undone yet
    fake.reject["load"] = "failed to load 'calm'"
    gate.set()
    settled(h)
    r = h.tick(5)
    assert [(e.step, e.kind) for e in r.errors] == [("load", "permanent")], r.lines()
    assert h.lease(1).models == ["busy"] and h.lease(1).state == S.SERVING
    assert any(e.startswith("place lease 1 on n3 undone: +busy -calm") for e in r.events)
    assert ADDR3 in routed(h, "busy")  # busy, never unloaded, is routed there again
    assert fake.unloads == [] and fake.loads == ["calm"]


def test_a_load_past_its_timeout_is_given_up_and_undone(h: Harness) -> None:
    """Still loading `model_load_timeout_s` after its ask: an error naming the model and
    the seconds, and the placement undone as a refusal is (never asked again); the
    model, loaded late after all, is a dropped one: out of routing, then unloaded."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    now = clock_of(h, 0.0)
    limit = h.config.leases.model_load_timeout_s
    gate = held(h)
    try:
        place(h, 3)
        now[0] = limit  # at the bound: still under way
        r = h.tick(4)
        assert f"lease 1 n3: loading calm for {limit:.0f}s" in r.events, r.lines()
        now[0] = limit + 1
        r = h.tick(5)
        assert [(e.step, e.kind) for e in r.errors] == [("load", "permanent")], r.lines()
        said = f"still loading {limit + 1:.0f}s after it was asked (model_load_timeout_s"
        assert "'calm'" in r.errors[0].message and said in r.errors[0].message
        assert h.lease(1).models == ["busy"] and "undone" in h.store.history(1)[-1].reason
        assert h.reconciler.placer.under_way == {}
    finally:
        gate.set()  # Triton ends the load after all
    until(lambda: fake.models.get("calm") == "READY")
    h.tick(6)
    assert ADDR3 not in routed(h, "calm") and ADDR3 in routed(h, "busy")
    h.tick(7)
    assert fake.unloads == ["calm"] and fake.loads == ["calm"]


def test_a_load_whose_ask_goes_unanswered_is_polled_in_triton_s_index(h: Harness) -> None:
    """The ask's call times out (the client's own timeout) while Triton goes on loading:
    no error, the index read each pass, loaded once it shows READY (timed from the ask,
    to the pass that saw it), never asked again."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    now = clock_of(h, 100.0)
    act = h.reconciler.actuator
    real = act.triton_for

    def slow(address: str) -> Any:
        client = real(address)

        def load_model(name: str) -> None:
            fake.loads.append(name)
            fake.models[name] = "LOADING"
            raise TritonUnreachable(address, f"load {name!r}", "TimeoutError('timed out')")

        client.load_model = load_model  # type: ignore[method-assign]
        return client

    act.triton_for = slow
    place(h, 3)
    for t in (4, 5):
        r = h.tick(t)
        assert r.errors == [], r.lines()
        assert (
            "lease 1 n3: loading calm for 0s (its ask went unanswered: Triton's index polled)"
            in (r.events)
        )
    fake.models["calm"] = "READY"
    now[0] = 160.0
    r = h.tick(6)
    assert "lease 1 n3: loaded calm in 60.0s (placement)" in r.events, r.lines()
    assert fake.loads == ["calm"]


def test_a_restarted_daemon_waits_for_a_load_triton_is_running(h: Harness) -> None:
    """The daemon died with calm's load in flight, and Triton still loads it: the next
    daemon waits for it (a second ask would start a second load beside the first), and
    takes it as loaded once READY, with no load time (its ask's time died with it)."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    try:
        place(h, 3)
        until(lambda: fake.models.get("calm") == "LOADING")
        again = h.restarted()
        r = again.run_once(at(20))
        said = "lease 1 n3: Triton loads calm already (asked before this daemon started)"
        assert f"{said}: waited for" in r.events, r.lines()
        r = again.run_once(at(21))
        assert "lease 1 n3: loading calm for 0s (asked before this daemon started)" in (r.events), (
            r.lines()
        )
        assert fake.loads == ["calm"]
    finally:
        gate.set()
    settled(h)
    r = again.run_once(at(22))
    assert "lease 1 n3: calm loaded (placement)" in r.events, r.lines()
    assert "calm" not in again.loads.load_s and fake.loads == ["calm"]
    again.run_once(at(23))
    assert ADDR3 in routed(h, "calm") and fake.unloads == ["busy"]


def test_a_restarted_daemon_asks_again_a_load_triton_does_not_run(h: Harness) -> None:
    """The daemon died with calm's load in flight, and the server shows nothing of it
    (the ask never got there, or Triton lost it): the next daemon asks again."""
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    gate = held(h)
    try:
        place(h, 3)
        until(lambda: fake.models.get("calm") == "LOADING")
        del fake.models["calm"]  # gone from Triton's index
        again = h.restarted()
        r = again.run_once(at(20))
        assert "lease 1 n3: asked Triton to load calm (placement)" in r.events, r.lines()
        until(lambda: fake.loads == ["calm", "calm"])
    finally:
        gate.set()
    assert again.placer.settle(5.0)
    r = again.run_once(at(21))
    assert any(e.startswith("lease 1 n3: loaded calm in ") for e in r.events), r.lines()


def test_a_load_in_flight_never_holds_the_daemon_s_stop(h: Harness) -> None:
    serving_busy(h)
    gate = held(h)
    try:
        place(h, 3)
        until(lambda: h.triton.servers[ADDR3].loads == ["calm"])
        began = time.monotonic()
        h.reconciler.placer.close()
        assert time.monotonic() - began < 1.0
        asking = [t for t in threading.enumerate() if t.name.startswith("stb-load-")]
        assert asking and all(t.daemon for t in asking)  # abandoned at the process's exit
    finally:
        gate.set()


def test_a_load_is_asked_on_a_connection_of_its_own_closed_once_answered() -> None:
    """An ask's thread keeps no connection to the server: Triton would hold its exit
    (when the lease is returned) on a connection kept alive there."""
    opened: list[int] = []
    closed = threading.Semaphore(0)

    class Triton(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            opened.append(1)
            try:
                super().handle()
            finally:
                closed.release()

        def do_GET(self) -> None:  # readiness
            self._answer()

        def do_POST(self) -> None:  # a load
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()

        def _answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        with TritonHttpClient(f"127.0.0.1:{http.server_address[1]}", api_key="k") as client:
            assert client.is_ready()  # the client's own connection, kept alive
            client.load_model("calm")
            client.load_model("busy")
            assert len(opened) == 3
            assert closed.acquire(timeout=5) and closed.acquire(timeout=5)  # both loads'
            assert not closed.acquire(timeout=0.2)  # the kept-alive one stays
    finally:
        http.shutdown()
        http.server_close()


def test_placements_refused(h: Harness) -> None:
    serving_busy(h)
    outcomes = [place(h, 3, ("nope",))]
    req = h.requests.request_place(99, ["calm"], at(4))
    h.tick(4)
    outcomes.append((h.requests.get(req.id or 0) or req).outcome)
    assert outcomes == ["refused: unknown models nope", "refused: no lease with id 99"]
    assert place(h, 5, ("busy",)) == "lease 1 on n3 holds busy"  # (or itself taken again)
    h.requests.request_return(1, at(6))
    h.tick(6)
    assert re.fullmatch(r"refused: lease 1 is (draining|releasing), not serving", place(h, 7))
    with pytest.raises(ValueError, match="at least one model"):
        h.requests.request_place(1, [], at(8))


def test_the_policy_s_placement_goes_through_act(h: Harness) -> None:
    serving_busy(h)
    rec = h.reconciler
    obs = rec.last_observation
    assert obs is not None
    r = h.tick(3)
    rec._act(Place(1, ("busy", "calm"), "calm late"), obs, at(3), r)
    assert "place lease 1 on n3: +calm: calm late" in r.events
    assert h.lease(1).models == ["busy", "calm"]
    assert h.triton.servers[ADDR3].models.get("calm") == "READY"


def test_the_store_places_only_a_serving_lease(h: Harness) -> None:
    h.requests.request_lend("n3", ["busy"], at(0))
    h.tick(0)
    with pytest.raises(UnexpectedState):
        h.store.place(1, ["calm"], datetime(2027, 1, 4, 12, 0, 1, tzinfo=UTC), "no")
    assert h.store.placed_at(1) is None


# ---- stb place ---------------------------------------------------------------------------


def test_stb_place_queues_a_request_or_says_why_not(tmp_path: Path) -> None:
    db = tmp_path / "bridge.db"
    toml = tmp_path / "bridge.toml"
    toml.write_text(
        f'database_url = "sqlite:///{db}"\n'
        "[models.busy]\nslo_p99_ms = 100\n[models.calm]\nslo_p99_ms = 200\n"
        f'[triton]\nmodel_repository = "{tmp_path / "no-repository"}"\n'
    )
    engine = make_engine(f"sqlite:///{db}")
    create_schema(engine)
    store = LeaseStore(engine)
    store.create("n3", "elastic", "preempt", ["busy"], "k1", at(0))
    run = CliRunner(env={"COLUMNS": "1000"})

    def stb(*args: str) -> tuple[int, str]:
        res = run.invoke(app, ["place", *args, "-c", str(toml), "--wait", "0"])
        return res.exit_code, res.output

    assert stb("1", "nope") == (1, "error: unknown models nope; known: busy, calm\n")
    assert stb("1", ",") == (1, "error: no model named: stb place LEASE MODEL[,MODEL...]\n")
    assert stb("1", "busy,busy")[1] == "error: a model is named twice in busy,busy\n"
    assert stb("9", "calm")[1] == "error: no lease with id 9\n"
    said = "error: lease 1 is requested, not serving: only a serving lease is placed\n"
    assert stb("1", "calm") == (1, said)
    for state in (S.SUBMITTED, S.STARTING, S.SERVING):
        store.set_status(1, state, at(1), "test")
    assert stb("1", "calm,busy") == (0, "request 1: place lease 1 on calm,busy\n")
    (req,) = RequestQueue(engine).pending()
    assert (req.kind, req.lease_id, req.models) == ("place", 1, ["calm", "busy"])
