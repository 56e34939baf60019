"""Load-time-aware timing (issue 29): the lend's lead time from the pools' measured lend
times and the models' measured loads (`bridge.policy.timing`, on literal inputs), what it
changes (the forecast's horizon, a return's break-even), the simulator's quiet proof
reading the same lead, the load times' store (`bridge.leases.loads`) and the daemon
measuring them on every start (`bridge.daemon.loadtimes`: a placement's `load_model`, a
lend's `starting -> serving`) and reading them back after a restart."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.daemon.planner import LeaseRecord
from bridge.daemon.reconciler import LendMemory
from bridge.leases.loads import LoadStore, estimate
from bridge.leases.store import create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.modelfacts import toml_models
from bridge.policy import ModelSample, Snapshot
from bridge.policy.demand import capacity_inputs, dwells
from bridge.policy.returns import ReturnHistory
from bridge.policy.timing import lead_s, lead_time, pool_lead_s, slowest_load
from bridge.sim.quiet import QuietProof
from tests.unit.fakes import N3, Harness, address_of, at, make_harness

T0 = 1_800_000_000.0
TICK = 5.0
#: the lab's figures: a lend serves in 6 s; loads within 5 s are held by it
CONFIG = BridgeConfig(
    models={
        "llm": ModelConfig(slo_p99_ms=500, min_replicas=1, max_replicas=6, instances=1),
        "small": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=6, instances=1),
    },
    policy=PolicyConfig(
        return_dwell_s=300,
        return_dwell_max_s=7200,
        relend_work_s=600,
        forecast_window_s=60,
        lend_lead_s=6,
        lend_lead_load_s=5,
    ),
)


def snap(
    load_s: dict[str, float] | None = None,
    lend_s: dict[str, float] | None = None,
    lend_load_s: dict[str, float] | None = None,
    *,
    history: dict[str, tuple[ModelSample, ...]] | None = None,
    returns: dict[str, ReturnHistory] | None = None,
) -> Snapshot:
    return Snapshot(
        (),
        (),
        history or {},
        (),
        lend_s=lend_s or {},
        models=toml_models(CONFIG),
        returns=returns or {},
        load_s=load_s or {},
        lend_load_s=lend_load_s or {},
    )


# ---- the lead from per-model loads (pure) ------------------------------------------


def test_the_lead_is_the_start_plus_the_slowest_load_beyond_what_it_holds() -> None:
    assert lead_s(snap(), CONFIG) == 6.0  # nothing measured: lend_lead_s
    assert lead_s(snap({"small": 1.2, "llm": 3.0}), CONFIG) == 6.0  # the lab's loads: held
    # a 300 s model: the horizon is about its load
    assert lead_s(snap({"small": 1.2, "llm": 300.0}), CONFIG) == 6.0 + 295.0
    # measured lends of it (306 s, 310 s, holding its 300 s load): the fastest measure, the
    # load not counted twice
    both = {"elastic": 300.0, "training": 300.0}
    measured = snap({"llm": 300.0}, {"elastic": 306.0, "training": 310.0}, both)
    assert lead_s(measured, CONFIG) == 306.0
    # the lab's measured lends (5.5 s, holding 2 s loads): today's figure
    lab = {"elastic": 5.5, "training": 5.5}
    assert lead_s(snap({"small": 2.0}, lab, {"elastic": 2.0, "training": 2.0}), CONFIG) == 5.5
    # pools whose lends carried the small model only: the llm's load is added, less the 5 s
    # a lend holds
    small = {"elastic": 2.0, "training": 2.0}
    assert lead_s(snap({"llm": 300.0}, lab, small), CONFIG) == 5.5 + 295.0
    # a lend measured shorter than that holds only its own seconds (a lend never serves
    # before its slowest load)
    fast = {"elastic": 2.0, "training": 2.0}
    assert lead_s(snap({"llm": 300.0}, fast, {"elastic": 1.0, "training": 1.0}), CONFIG) == 300.0


def test_an_unknown_model_falls_back_to_the_pools_figure() -> None:
    assert slowest_load({"llm": 300.0}, ["small"]) == 0.0
    assert slowest_load({}, ["llm"]) == 0.0
    assert pool_lead_s(CONFIG, "elastic", {"elastic": 7.0}, {}, 0.0) == 7.0
    assert pool_lead_s(CONFIG, "elastic", {}, {}, 0.0) == 6.0
    # a model measured but not scaled by the policy does not set the horizon
    assert lead_s(snap({"retired": 300.0}), CONFIG) == 6.0


def test_the_fastest_lendable_pool_gives_the_lead() -> None:
    lend_s = {"elastic": 306.0, "training": 40.0}
    lend_load_s = {"elastic": 300.0, "training": 0.0}
    # the training pool's 40 s lends held no load: its lead for a 300 s load is 335 s
    assert lead_time(CONFIG, lend_s, lend_load_s, 300.0) == 306.0
    assert lead_time(CONFIG, lend_s, lend_load_s, 0.0) == 40.0


def test_the_break_even_grows_with_the_load() -> None:
    """A return lent again 700 s later paid at a 6 s lead (break-even 606 s); with a 300 s
    load (break-even 901 s) it was a regret, so the model's dwell grows to the
    break-even."""
    history = {"llm": ReturnHistory((700.0,), None)}
    assert dwells(snap(returns=history), CONFIG, T0) == {}
    assert dwells(snap({"llm": 300.0}, returns=history), CONFIG, T0) == {"llm": 901.0}


def test_the_forecast_looks_as_far_ahead_as_the_slowest_load() -> None:
    """A rate rising 0.1 req/s a second: the demand to lend for is its forecast at the
    lead time, 6 s ahead without a load, 301 s with a 300 s one."""
    n = 13
    rising = tuple(
        ModelSample(T0 - (n - 1 - i) * TICK, 50.0, 10.0 + 0.5 * i, 0.0, 40.0, 20.0)
        for i in range(n)
    )
    history = {"llm": rising}
    _, _, fast = capacity_inputs(snap(history=history), CONFIG, T0)
    _, _, slow = capacity_inputs(snap({"llm": 300.0}, history=history), CONFIG, T0)
    head = CONFIG.policy.capacity_headroom
    assert fast["llm"].rate == pytest.approx(head * (16.0 + 0.1 * 6))
    assert slow["llm"].rate == pytest.approx(head * (16.0 + 0.1 * 301))


def test_the_quiet_proof_reads_the_same_lead() -> None:
    loads = {"llm": 300.0}
    proof = QuietProof(CONFIG, ["llm"], {"llm": [1.0] * 100}, TICK, 61, 1, load_s=loads)
    assert proof.lead_s({}) == lead_s(snap(loads), CONFIG) == 301.0
    lend_s, held = {"elastic": 306.0, "training": 306.0}, {"elastic": 300.0, "training": 300.0}
    assert proof.lead_s(lend_s, held) == lead_s(snap(loads, lend_s, held), CONFIG) == 306.0


def test_the_lend_memory_keeps_the_load_each_pools_lends_held() -> None:
    """A lend of the 300 s model timed at 306 s: the pool's lend time holds its load."""
    memory = LendMemory(load_s={"llm": 300.0})
    lent = LeaseRecord(1, "e0", "elastic", "preempt", LeaseState.SERVING, ("llm",), 0.0, 306.0)
    memory.measure([lent], snap())
    assert (memory.lend_s, memory.lend_load_s) == ({"elastic": 306.0}, {"elastic": 300.0})
    small = LeaseRecord(2, "e1", "training", "drain", LeaseState.SERVING, ("small",), 0.0, 9.0)
    memory.measure([lent, small], snap())
    assert memory.lend_load_s == {"elastic": 300.0, "training": 0.0}


# ---- the store ---------------------------------------------------------------------


def test_the_estimate_prefers_direct_measures_and_takes_the_median() -> None:
    assert estimate([]) is None
    assert estimate([("lend", 4.0), ("lend", 90.0), ("lend", 5.0)]) == 5.0
    assert estimate([("lend", 4.0), ("placement", 1.0), ("placement", 2.0)]) == 1.5
    assert estimate([("placement", s) for s in (100.0, 1.0, 2.0, 3.0, 4.0, 5.0)]) == 3.0


def test_the_load_store_records_and_reads_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    store = LoadStore(engine)
    when = datetime(2026, 12, 3, tzinfo=UTC)
    store.record("llm", 302.0, when, "lend")
    store.record("llm", 290.0, when, "placement", "3")
    store.record("small", 1.5, when, "lend")
    assert store.latest() == {"llm": 290.0, "small": 1.5}
    assert store.measures()["llm"] == [("lend", 302.0), ("placement", 290.0)]
    with pytest.raises(ValueError, match="unknown load source"):
        store.record("llm", 1.0, when, "guess")


# ---- the daemon measures on every start ----------------------------------------------


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def test_a_lend_and_a_placement_measure_load_times_that_reach_the_lead(h: Harness) -> None:
    addr = address_of(N3)
    h.triton.server(addr, models={"busy": "READY"})
    h.requests.request_lend("n3", ["busy"], at(0))
    for t in (0, 1, 2, 3):
        h.tick(t)
    assert h.lease(1).state.value == "serving"
    events = h.store.history(1)
    began = next(e.at for e in events if e.to_state.value == "starting")
    ready = next(e.at for e in events if e.to_state.value == "serving")
    rec = h.reconciler
    assert rec.loads.load_s == {"busy": (ready - began).total_seconds()}

    req = h.requests.request_place(1, ["calm"], at(4))
    h.tick(4)
    assert h.requests.get(req.id or 0) is not None
    assert rec.placer.settle(5.0)  # the load is asked off the pass; the next pass takes it in
    report = h.tick(4.5)
    assert any("loaded calm in " in e for e in report.events), report.lines()
    assert "calm" in rec.loads.load_s  # from the ask to its answer (a fake: next to nothing)
    stored = LoadStore.beside(h.store).measures()
    assert [s for s, _ in stored["busy"]] == ["lend"]
    assert [s for s, _ in stored["calm"]] == ["placement"]

    # a slow model's measured load reaches the lead time of the next snapshot
    rec.loads.placed("busy", 300.0, at(5))
    rec.loads.placed("busy", 300.0, at(5))
    h.tick(5)
    snap_now = rec.last_snapshot
    assert snap_now is not None
    assert snap_now.load_s["busy"] == 300.0
    assert lead_s(snap_now, h.config) >= 300.0

    # a restarted daemon reads them back
    again = h.restarted()
    again.run_once(at(6))
    assert again.loads.load_s == rec.loads.load_s


def test_local_loads_are_kept_apart_from_the_shared_ones() -> None:
    measures = [("lend", 300.0), ("local", 4.0), ("placement", 290.0), ("local", 6.0)]
    assert estimate(measures) == 290.0  # never the cache's
    assert estimate(measures, local=True) == 5.0
    assert estimate([("lend", 300.0)], local=True) is None


def test_a_lend_from_the_nodes_weight_cache_says_so_and_times_the_local_load(
    tmp_path: Path,
) -> None:
    from bridge.config import WeightsConfig
    from bridge.daemon.reconciler import Reconciler

    h = make_harness(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    config = h.config.model_copy(
        update={
            "triton": h.config.triton.model_copy(update={"log_dir": logs}),
            "weights": WeightsConfig(cache_root=tmp_path / "cache"),
        }
    )
    rec = Reconciler(
        config, h.slurm, h.store, h.reconciler.observer, h.triton, h.router, h.metrics, h.requests
    )
    h.triton.server(address_of(N3), models={"busy": "READY", "calm": "READY"})
    h.requests.request_lend("n3", ["busy", "calm"], at(0))
    rec.run_once(at(0))
    job = h.store.get(1).slurm_job_id
    assert job
    # what the Triton job's overlay printed (bridge.weights.overlay.Choice.line)
    (logs / f"triton-{job}.log").write_text(
        "stb-triton: starting\n"
        "stb-weights: model=busy version=1 source=local path=/c/busy/1 reason=verified\n"
        "stb-weights: model=calm version=2 source=shared path=/r/calm/2 reason=no copy\n"
    )
    for t in (1, 2, 3):
        rec.run_once(at(t))
    assert h.store.get(1).state.value == "serving"
    served = next(e for e in h.store.history(1) if e.to_state.value == "serving")
    assert "weights: busy=local calm=shared" in served.reason
    took = served.at - next(e.at for e in h.store.history(1) if e.to_state.value == "starting")
    assert rec.loads.local_load_s == {"busy": took.total_seconds()}
    assert rec.loads.load_s == {"calm": took.total_seconds()}
    stored = LoadStore.beside(h.store).measures()
    assert [s for s, _ in stored["busy"]] == ["local"]
    rec.run_once(at(4))
    assert rec.last_snapshot is not None
    assert rec.last_snapshot.local_load_s == {"busy": took.total_seconds()}
