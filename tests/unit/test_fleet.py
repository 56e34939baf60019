"""The fleet's mode (issue 33's migration path): what each mode makes a pass do (pure, and
through the reconciler on the fakes with a real SQLite store), the switches as stored, the
figures a switch takes (training from accounting records, pure; the inference queries),
and `stb fleet` refusing a bad switch with nothing written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bridge.daemon.reconciler as reconciler_mod
from bridge.config import BridgeConfig
from bridge.fleet import mode
from bridge.fleet.baseline import compare, inference_queries, training
from bridge.fleet.cli import fleet_app
from bridge.leases.fleet import FleetError, FleetStore, FleetSwitch
from bridge.lifecycle import LeaseState
from bridge.policy.actions import Lend, Return, StartBaseline
from bridge.slurm.model import AccountingRecord
from tests.unit.fakes import N3, Harness, address_of, at, make_harness

S = LeaseState
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def switch(kind: str, cap: int | None = None) -> FleetSwitch:
    return FleetSwitch(at=T0, mode=kind, max_lent_nodes=cap, who="ops", why="test")


# ---- pure ----------------------------------------------------------------------------


def test_separate_and_advisory_hold_every_lendable_pool_shared_none() -> None:
    config = BridgeConfig()
    for kind in ("separate", "advisory"):
        held = mode.holds(switch(kind), config)
        assert sorted(held) == ["elastic", "training"]  # the reserved pool is never lent
        assert held["elastic"].held_by == f"fleet mode {kind} (ops)"
    assert mode.holds(switch("shared"), config) == {} and mode.holds(None, config) == {}


def test_a_shared_step_caps_the_lends_never_above_the_configuration() -> None:
    config = BridgeConfig()
    assert mode.configured(switch("shared", 2), config).policy.max_lent_nodes == 2
    big = config.policy.max_lent_nodes + 5
    assert mode.configured(switch("shared", big), config).policy.max_lent_nodes == (
        config.policy.max_lent_nodes
    )
    assert mode.configured(switch("shared"), config) is config
    assert mode.configured(None, config) is config


def test_advice_says_the_lends_and_returns_only() -> None:
    said = mode.advice(
        [
            Lend("n1", "training", "drain", ("big",), "capacity", None, ("n2",)),
            Lend("n3", "elastic", "preempt", ("small",), "breach", 1),
            Return(7, "quiet"),
            StartBaseline("n4", "no Triton job"),
        ]
    )
    assert said == [
        "advisory: would lend n1,n2 for big: capacity",
        "advisory: would lend n3 (1 GPUs) for small: breach",
        "advisory: would return lease 7: quiet",
    ]


def _run(
    job: str, partition: str, submit: int, start: int, end: int | None, **kw: object
) -> AccountingRecord:
    return AccountingRecord(
        "lab", job, None, None, "j", partition, "team", "u", "normal",
        str(kw.get("state", "COMPLETED")), T0 + timedelta(seconds=submit),
        T0 + timedelta(seconds=start), None if end is None else T0 + timedelta(seconds=end),
        0, ("n1",), int(kw.get("gpus", 4)), "h100", str(kw.get("comment", "")), 0,
    )  # fmt: skip


def test_training_figures_count_the_sites_runs_in_the_window() -> None:
    records = [
        _run("1", "train", 0, 60, 3660),  # waited 60 s, ran an hour on 4 GPUs
        _run("2", "train", 100, 400, None, state="RUNNING"),  # waited 300 s, runs on
        _run("3", "elastic", 0, 10, 20, state="REQUEUED", gpus=2),
        _run("4", "infer", 0, 5, 50),  # no lendable pool's
        _run("5", "elastic", 0, 5, 50, comment="stb:triton,stb:lease=1.2"),  # the bridge's
        _run("6", "train", -900, -800, 100),  # started before the window
    ]
    end = T0 + timedelta(seconds=7200)
    figures = training(records, {"train": "training", "elastic": "elastic"}, T0, end)
    assert figures["training"] == {
        "jobs": 2,
        "gpu_hours": round((3600 * 4 + 6800 * 4) / 3600, 3),
        "jobs_per_h": 1.0,
        "gpu_hours_per_h": round((3600 * 4 + 6800 * 4) / 3600 / 2, 3),
        "wait_mean_s": 180.0,
        "wait_p95_s": 300.0,
        "requeued": 0,
    }
    assert figures["elastic"]["jobs"] == 1 and figures["elastic"]["requeued"] == 1
    rows = compare({"training": figures}, {"training": {"training": {"jobs": 4, "x": 1}}})
    assert rows == [
        {
            "part": "training",
            "of": "training",
            "figure": "jobs",
            "before": 2,
            "after": 4,
            "ratio": 2.0,
        }
    ]
    queries = inference_queries(3600)
    assert "[3600s:30s]" in queries["p99_ms_typical"] and 'job="triton"' in queries["failed"]


def test_the_store_refuses_a_bad_switch_and_keeps_the_history(tmp_path: Path) -> None:
    from bridge.leases.store import create_schema, make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'b.db'}")
    create_schema(engine)
    store = FleetStore(engine)
    assert store.current() is None
    with pytest.raises(FleetError, match="not one of separate, advisory, shared"):
        store.switch("mixed", T0)
    with pytest.raises(FleetError, match="shared step's, not separate's"):
        store.switch("separate", T0, max_lent_nodes=2)
    store.switch("advisory", T0, who="ops", baseline={"window_s": 60})
    store.switch("shared", T0 + timedelta(seconds=1), max_lent_nodes=1)
    assert [(r.mode, r.max_lent_nodes) for r in store.history()] == [
        ("advisory", None),
        ("shared", 1),
    ]
    current = store.current()
    assert current is not None and current.mode == "shared"


# ---- through the reconciler ------------------------------------------------------------------


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def test_separate_returns_the_lease_and_refuses_lends_until_shared(h: Harness) -> None:
    h.triton.server(address_of(N3), models={"busy": "READY"})
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in range(3):
        h.tick(t)
    assert h.lease(1).state == S.SERVING
    fleet = FleetStore.beside(h.store)
    fleet.switch("separate", at(3), who="ops")
    r = h.tick(3)
    assert h.lease(1).state == S.DRAINING
    assert any("held by fleet mode separate (ops)" in e for e in r.events), r.events
    for t in (4, 5):
        h.tick(t)
    assert h.lease(1).state == S.RETURNED
    req = h.requests.request_lend("n3", ["busy"], at(6))
    h.tick(6)
    done = h.requests.get(req.id or 0)
    assert done is not None and done.outcome == (
        "refused: pool elastic is held by fleet mode separate (ops) (stb fleet mode shared)"
    )
    fleet.switch("shared", at(7))
    req = h.requests.request_lend("n3", ["busy"], at(7))
    h.tick(7)
    done = h.requests.get(req.id or 0)
    assert done is not None and done.outcome.startswith("lease 2 lending n3")


def test_advisory_says_what_shared_would_lend_and_lends_nothing(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the policy here lends n3 whenever n3 may be lent: held by the mode, it may not, so
    # the pass acts on nothing; the same pass without the mode's holds would lend it
    def decide(snapshot, config, now):  # type: ignore[no-untyped-def]
        free = [n for n in snapshot.nodes if n.name == "n3" and not n.reserved]
        return [Lend("n3", "elastic", "preempt", ("busy",), "wanted")] if free else []

    monkeypatch.setattr(reconciler_mod, "decide", decide)
    FleetStore.beside(h.store).switch("advisory", at(0))
    r = h.tick(0)
    assert "advisory: would lend n3 for busy: wanted" in r.events
    assert h.store.open_leases() == []
    FleetStore.beside(h.store).switch("shared", at(1))
    r = h.tick(1)
    assert not any(e.startswith("advisory:") for e in r.events)
    assert [lease.node for lease in h.store.open_leases()] == ["n3"]


# ---- the command ---------------------------------------------------------------------------------


def test_the_command_refuses_a_bad_switch_and_records_a_good_one(tmp_path: Path) -> None:
    db = tmp_path / "bridge.db"
    toml = tmp_path / "bridge.toml"
    toml.write_text(
        f'database_url = "sqlite:///{db}"\n'
        '[observe]\nprometheus_url = "http://127.0.0.1:9"\n'
        "[policy]\nmax_lent_nodes = 3\n"
    )
    runner = CliRunner()
    bad = runner.invoke(fleet_app, ["mode", "mixed", "--config", str(toml)])
    assert bad.exit_code != 0 and "not one of separate, advisory, shared" in bad.output
    over = runner.invoke(
        fleet_app, ["mode", "shared", "--max-lent-nodes", "9", "--config", str(toml)]
    )
    assert over.exit_code != 0 and "above [policy] max_lent_nodes 3" in over.output
    ok = runner.invoke(
        fleet_app,
        ["mode", "shared", "--max-lent-nodes", "1", "--why", "step 1", "--config", str(toml)],
    )
    assert ok.exit_code == 0, ok.output
    assert "at most 1 nodes" in ok.output and "Prometheus" in ok.output
    shown = runner.invoke(fleet_app, ["status", "--config", str(toml)])
    assert "fleet mode shared, at most 1 nodes" in shown.output and "step 1" in shown.output
