"""The simulator's node-local weight caches (`bridge.sim.weights`, `Timing.cache_models`,
`local_load_s`, `weights`): a model a node holds complete loads from its cache, the rest
from the shared repository; served copies stay, least recently used going first, never a
copy the plan wants or one in flight; staging copies size / bandwidth seconds after the
node's previous copy, at most `max_staging` in flight, and changes nothing but the caches;
a run with staging lends onto staged nodes, and its quiet-tick proof agrees with decide."""

from __future__ import annotations

import dataclasses

import pytest

from bridge.config import PolicyConfig
from bridge.sim.build import build_scenario, model_rates
from bridge.sim.engine import Engine, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.policies import Scenario, setup_for, size
from bridge.sim.weights import NodeCaches, SimCopy, WeightCache

GB = 1e9


def test_a_cached_model_loads_at_its_local_time_and_the_slowest_decides() -> None:
    t = Timing(model_load_s={"a": 300.0, "b": 200.0}, cache_models=2, local_load_s={"a": 10.0})
    assert t.load_s(["a"], cached=["a"]) == 10.0
    assert t.load_s(["a"], cached=[]) == 300.0
    assert t.load_s(["a", "b"], cached=["a", "b"]) == 200.0  # b has no local time
    assert t.load_s(["c"], cached=["c"]) == 0.0  # no load time known: none added
    # without a cache every load is from the shared repository
    assert Timing(model_load_s={"a": 300.0}, local_load_s={"a": 10.0}).load_s(["a"], ["a"]) == 300


def caches(spec: WeightCache) -> NodeCaches:
    return NodeCaches(spec, {"a": 300.0, "b": 300.0, "c": 300.0}, {"a": 10.0, "b": 10.0})


def test_served_copies_stay_and_the_least_recently_served_goes_first() -> None:
    cache = caches(Timing(cache_models=2).cache() or WeightCache())
    node = SimNode(0, "e0", "elastic", "elastic", 8)
    for at, m in ((0.0, "a"), (10.0, "b"), (20.0, "a"), (30.0, "c")):
        cache.served(node, [m], at, at)
    assert sorted(node.weights) == ["a", "c"]  # b, the least recently served, went
    # a copy is usable once loaded, and its load is local from then on
    cache.served(node, ["b"], 40.0, 340.0)
    assert "b" not in cache.cached(node, 100.0) and "b" in cache.cached(node, 340.0)
    assert cache.load_s(node, ["b"], 100.0) == 300.0 and cache.load_s(node, ["b"], 400.0) == 10


def test_a_served_copy_never_evicts_a_wanted_copy_or_one_in_flight() -> None:
    cache = caches(WeightCache(default_bytes=GB, budget_bytes=2 * GB))
    node = SimNode(0, "e0", "elastic", "elastic", 8)
    node.weights = {"a": SimCopy(GB, 0.0, 0.0), "b": SimCopy(GB, 500.0, 0.0)}  # b in flight
    cache.wanted = {"a"}
    cache.served(node, ["c"], 100.0, 400.0)
    assert sorted(node.weights) == ["a", "b"]  # no room could be made: c is not kept
    cache.wanted = set()
    cache.served(node, ["c"], 600.0, 900.0)
    assert sorted(node.weights) == ["b", "c"]  # a, complete and unwanted, made room


def test_staging_takes_size_over_bandwidth_one_copy_after_another_on_a_node() -> None:
    scenario = _scenario(0.05)
    setup = setup_for("bridge", scenario, size(scenario))
    spec = WeightCache(default_bytes=10 * GB, budget_bytes=40 * GB, stage_bytes_s=GB, max_staging=3)
    cache = NodeCaches(spec, {}, {})
    nodes = [n for n in setup.nodes if n.pool == "elastic"][:2]
    by_name = {n.name: n for n in nodes}
    engine = Engine(dataclasses.replace(setup, timing=Timing(weights=spec)))
    # two lent replicas of each of two models expected: 4 copies, 3 may start now
    snap = engine.snapshot()
    snap = dataclasses.replace(snap, nodes=tuple(v for v in snap.nodes if v.name in by_name))
    cache.rates = {"m0": [(0.0, 1e9)], "m1": [(0.0, 1e9)]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("bridge.policy.staging.expected_lends", lambda s, c, r: {"m0": 2, "m1": 2})
        cache.plan(snap, setup.config, 100.0, by_name)
    first, second = nodes
    assert {m: c.ready_at for m, c in first.weights.items()} == {"m0": 110.0, "m1": 120.0}
    assert {m: c.ready_at for m, c in second.weights.items()} == {"m0": 110.0}
    assert cache.cached(first, 115.0) == {"m0"} and cache.cached(first, 120.0) == {"m0", "m1"}
    assert sorted(cache.ready(115.0)) == sorted([first.index, second.index])
    assert cache.staged == 3  # max_staging: the fourth waits for a plan with room


def _scenario(days: float, staging: bool = True) -> Scenario:
    rates = model_rates(2, 400.0)
    weights = WeightCache(default_bytes=10 * GB, budget_bytes=20 * GB, stage_bytes_s=GB)
    timing = Timing(
        model_load_s=dict.fromkeys(rates, 300.0),
        local_load_s=dict.fromkeys(rates, 10.0),
        weights=weights if staging else None,
    )
    return build_scenario(
        days=days, nodes=16, gpus_per_node=8, rates=rates, slo_ms=100.0, service_ms=20.0,
        arrivals="ramps", arrivals_trace=None, jobs="synthetic", jobs_trace=None, load=1.1,
        policies=["bridge"], timing=timing, policy=PolicyConfig(), models=None,
        lend_cap="peak", reserve="mean",
    )  # fmt: skip


def _fleet_state(engine: Engine) -> object:
    fleet = engine.fleet
    return (
        [(n.free, sorted(n.jobs), n.fenced, n.triton) for n in engine.nodes],
        {p: [e[:2] for e in q] for p, q in fleet.pending.items()},
        {p: dict(u) for p, u in fleet.usage.gpus.items()},
    )


def test_a_cache_plan_changes_the_caches_and_nothing_else() -> None:
    scenario = _scenario(0.25)
    engine = Engine(setup_for("bridge", scenario, size(scenario)))
    engine.ticks = 720  # an hour: jobs run, a plan or more has been carried out
    engine.run()
    assert engine.caches is not None and engine.caches.staged > 0
    before = _fleet_state(engine)
    engine.caches.next_plan = 0.0
    engine.caches.plan(engine.snapshot(), engine.s.config, engine.now, engine.by_name)
    assert _fleet_state(engine) == before


def test_a_run_with_staging_lends_onto_staged_nodes_and_its_quiet_ticks_are_proven() -> None:
    scenario = dataclasses.replace(_scenario(0.25), warmup_s=1800.0)
    setup = setup_for("bridge", scenario, size(scenario))
    proven = Engine(dataclasses.replace(setup, check_quiet=True))
    loads: list[float] = []
    run_event = proven._event

    def event(kind: str, payload: object) -> None:
        run_event(kind, payload)
        if kind == "triton_run":
            loads.append(payload.held_load_s)  # type: ignore[attr-defined]

    proven._event = event  # type: ignore[method-assign]
    result = proven.run()
    assert proven.proven > 0 and proven.caches is not None and proven.caches.staged > 0
    assert 10.0 in loads  # some lends found their weights staged
    plain = Engine(dataclasses.replace(setup, always_decide=True)).run()
    assert [d.__dict__ for d in result.decisions] == [d.__dict__ for d in plain.decisions]
    assert result.warm_share is not None and 0 < result.warm_requests < result.requests
    # without staging, the same workload lends as often but loads from the shared
    # repository at its first lends
    cold = Engine(setup_for("bridge", _scenario(0.25, staging=False), size(scenario))).run()
    assert cold.within_share <= result.within_share
