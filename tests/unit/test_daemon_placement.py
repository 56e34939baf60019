"""Model placement carried out by the daemon (`bridge.daemon.placement`, the pure rules, on
literal inputs; `bridge.daemon.placer`, the reconciler carrying a placement out on the
fakes of tests/unit/fakes.py with a real lease store): recorded first, the dropped model
out of routing before it is unloaded, the gained one loaded then routed; resumed by a
restarted daemon from what the store and Triton say; a refused load undone; `stb place`.
(The policy's placement is tests/unit/test_placement.py's.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.daemon.observation import TritonServer
from bridge.daemon.placement import check_place, plan_placement, withheld
from bridge.daemon.planner import LeaseRecord
from bridge.leases.errors import UnexpectedState
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.policy import Place
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
    """Ask for a placement of lease 1 at `t` and take the pass; the request's outcome."""
    req = h.requests.request_place(1, list(models), at(t))
    h.tick(t)
    done = h.requests.get(req.id or 0)
    assert done is not None and done.done_at is not None
    return done.outcome


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
    fake = h.triton.servers[ADDR3]
    assert fake.models.get("calm") == "READY"
    assert ADDR3 not in routed(h, "busy")
    h.tick(5)
    assert fake.unloads == ["busy"]


def test_a_load_triton_refuses_undoes_the_placement(h: Harness) -> None:
    serving_busy(h)
    fake = h.triton.servers[ADDR3]
    fake.reject["load"] = "failed to load 'calm'"
    outcome = place(h, 3)
    assert outcome.startswith("failed: ") and "failed to load 'calm'" in outcome
    assert h.lease(1).models == ["busy"] and h.lease(1).state == S.SERVING
    assert "undone" in h.store.history(1)[-1].reason
    h.tick(4)
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
    outcome = place(h, 3)
    assert outcome.startswith("lease 1 placing calm on n3 (retrying: "), outcome
    act.triton_for = real
    h.tick(4)  # within the backoff: nothing asked
    assert "calm" not in fake.models
    h.tick(3 + h.config.leases.retry_base_s + 1)
    assert fake.models.get("calm") == "READY"


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
