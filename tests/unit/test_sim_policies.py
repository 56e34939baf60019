"""The compared set-ups (bridge.sim.policies): sizing from the load, the same fleet for
every policy, who may lend, a small comparison whose ordering must hold, a separate pool
of a chosen size, and the selection report's trade-off runs."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from bridge.sim.engine import Engine
from bridge.sim.policies import (
    POLICIES,
    Scenario,
    auto_sizes,
    compare,
    known,
    separate_size,
    setup_for,
    size,
    tradeoff,
    tradeoff_sizes,
    with_separate,
)
from bridge.sim.workload import ArrivalSeries, SimJob

STEP = 5.0
HOURS = 6


def _scenario(nodes: int = 24, jobs: int = 400) -> Scenario:
    steps = int(HOURS * 3600 / STEP)
    t = np.arange(steps) * STEP
    base = 150.0 + 120.0 * np.sin(2 * np.pi * t / (HOURS * 3600))
    base[600:720] *= 2.5  # a ten-minute burst
    rng = np.random.default_rng(3)
    work = [
        SimJob(
            f"j{i:04d}",
            "elastic" if i % 3 == 0 else "training",
            float(rng.uniform(0, HOURS * 3600 * 0.8)),
            float(rng.lognormal(np.log(1800), 0.8)),
            int(rng.choice([1, 2, 4, 8])),
        )
        for i in range(jobs)
    ]
    return Scenario(
        nodes=nodes,
        gpus_per_node=8,
        arrivals=ArrivalSeries(STEP, {"a": base, "b": base / 2}),
        jobs=sorted(work, key=lambda j: j.submit_s),
        models={"a": (100.0, 20.0), "b": (150.0, 30.0)},
        horizon_s=HOURS * 3600,
    )


def test_peak_needs_more_nodes_than_mean() -> None:
    sizing = size(_scenario())
    assert sizing.peak_load > sizing.mean_load > 0
    assert sizing.peak_nodes > sizing.mean_nodes >= 1


def test_every_policy_gets_the_same_fleet_and_only_lenders_may_lend() -> None:
    scenario = _scenario()
    sizing = size(scenario)
    setups = {p: setup_for(p, scenario, sizing) for p in POLICIES}
    for p, setup in setups.items():
        assert len(setup.nodes) == scenario.nodes, p
        assert [n.index for n in setup.nodes] == list(range(scenario.nodes))
    assert setups["separate-peak"].config.policy.max_lent_nodes == 0
    assert setups["separate-mean"].config.policy.max_lent_nodes == 0
    lendable = sizing.peak_nodes - sizing.mean_nodes
    assert setups["bridge"].config.policy.max_lent_nodes == lendable
    assert set(setups["bridge"].config.pools) == {"inference", "elastic", "training"}
    assert set(setups["idle-loan"].config.pools) == {"inference", "loan"}
    loan = [n for n in setups["idle-loan"].nodes if n.pool == "loan"]
    assert len(loan) == lendable and all(n.partition == "elastic" for n in loan)


def test_unknown_policy_and_small_fleet_are_refused() -> None:
    scenario = _scenario()
    sizing = size(scenario)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        setup_for("nope", scenario, sizing)
    tiny = _scenario(nodes=sizing.peak_nodes + 1)
    with pytest.raises(ValueError, match="leave 1 for training and elastic"):
        compare(tiny, ["separate-peak"])


def test_the_comparison_orders_as_expected() -> None:
    report = compare(_scenario())
    by = {r.policy: r for r in report.results}
    assert [r.policy for r in report.results] == list(POLICIES)
    # sized for peak meets the SLO; sized for mean without lending does not
    assert by["separate-peak"].within_share > 0.99
    assert by["separate-mean"].within_share < by["separate-peak"].within_share
    # lending recovers most of what sizing for the mean loses
    assert by["bridge"].within_share > by["separate-mean"].within_share
    assert by["bridge"].lends > 0 and by["bridge"].lends >= by["bridge"].returns
    # training gets more GPU-hours when inference does not hold its peak all day
    train = {p: sum(u["training"] for u in r.gpu_hours.values()) for p, r in by.items()}
    assert train["bridge"] >= train["separate-peak"]
    for r in report.results:
        assert r.queues["training"].submitted + r.queues["elastic"].submitted == 400


def test_separate_at_a_chosen_size_is_laid_out_like_the_others() -> None:
    scenario = _scenario()
    sizing = size(scenario)
    n = sizing.mean_nodes + 1
    setup = setup_for(f"separate-{n}", scenario, sizing)
    pools = Counter(node.pool for node in setup.nodes)
    peak = Counter(node.pool for node in setup_for("separate-peak", scenario, sizing).nodes)
    assert len(setup.nodes) == scenario.nodes and pools["inference"] == n
    assert pools["training"] == peak["training"]  # training keeps its guarantee
    assert pools["elastic"] == scenario.nodes - n - peak["training"]
    assert setup.config.policy.max_lent_nodes == 0 and set(setup.config.pools) == {"inference"}
    assert f"inference owns {n} nodes" in setup.description

    # above the peak, the extra nodes come from elastic, then from training
    def layout(nodes: int) -> Counter[str]:
        return Counter(node.pool for node in setup_for(f"separate-{nodes}", scenario, sizing).nodes)

    assert peak["elastic"] > 2
    above = layout(sizing.peak_nodes + 2)
    assert (above["training"], above["elastic"]) == (peak["training"], peak["elastic"] - 2)
    beyond = layout(sizing.peak_nodes + peak["elastic"] + 1)
    assert (beyond["training"], beyond["elastic"]) == (peak["training"] - 2, 1)
    with pytest.raises(ValueError, match="leave 1 for training and elastic"):
        setup_for("separate-23", scenario, sizing)
    for bad in ("separate-0", f"separate-{scenario.nodes + 1}"):
        with pytest.raises(ValueError, match="give a separate pool of 1 to 24 nodes"):
            setup_for(bad, scenario, sizing)


def test_policy_names() -> None:
    assert separate_size("separate-12") == 12
    assert separate_size("separate-peak") is None and separate_size("bridge") is None
    assert known("separate-3") and known("idle-loan") and not known("separate-x")
    assert with_separate(list(POLICIES), 7) == [
        "separate-peak", "separate-mean", "separate-7", "idle-loan", "bridge",
    ]  # fmt: skip
    assert with_separate(["bridge"], 7) == ["separate-7", "bridge"]
    assert with_separate(["bridge", "separate-7"], 7) == ["bridge", "separate-7"]
    assert with_separate(["bridge"], 0) == ["bridge"]


def test_tradeoff_sizes() -> None:
    sizing = size(_scenario())
    assert auto_sizes(sizing) == sorted(
        {1, sizing.mean_nodes, sizing.peak_nodes}
        | {round(1 + (sizing.peak_nodes - 1) * i / 3) for i in (1, 2)}
    )
    assert tradeoff_sizes("auto", sizing, 24) == auto_sizes(sizing)
    assert tradeoff_sizes("none", sizing, 24) == []
    assert tradeoff_sizes(" 8,2,8 ", sizing, 24) == [2, 8]
    for bad in ("0", "23", "x", "2,,3"):
        with pytest.raises(ValueError, match="from 1 to 22"):
            tradeoff_sizes(bad, sizing, 24)
    with pytest.raises(ValueError, match="at most 12"):
        tradeoff_sizes(",".join(str(i) for i in range(1, 14)), sizing, 24)


def test_a_separate_pool_serves_the_same_with_or_without_jobs() -> None:
    """What lets the trade-off run separate pools with no jobs: nothing is lent, so the
    jobs never touch the inference nodes (an overloaded pool, the mean's, included)."""
    scenario = _scenario()
    sizing = size(scenario)
    for n in (sizing.mean_nodes, sizing.peak_nodes):
        full = Engine(setup_for(f"separate-{n}", scenario, sizing)).run()
        alone = Engine(
            setup_for(f"separate-{n}", dataclasses.replace(scenario, jobs=[]), sizing)
        ).run()
        assert full.queues["training"].submitted > 0 and alone.queues["training"].submitted == 0
        assert full.models == alone.models
        assert full.series["replicas"] == alone.series["replicas"]


def test_the_tradeoff_runs_the_bridge_and_searches_the_separate_pool() -> None:
    scenario = _scenario()
    sizing = size(scenario)
    report = compare(scenario, ["separate-peak", "bridge"])
    target = 0.99
    mean, more = sizing.mean_nodes, sizing.mean_nodes + 1
    seen: set[str] = set()
    runs = tradeoff(
        scenario, [more, mean], target, lambda name, t, total: seen.add(name),
        done=report.results,
    )  # fmt: skip
    assert [r.policy for r in runs.bridge] == [f"bridge@{more}", f"bridge@{mean}"]
    assert [r.pools["inference"] for r in runs.bridge] == [more, mean]
    # the comparison's bridge (reserved: the mean) stands for its size, kept slim
    given = report.results[1]
    assert runs.bridge[1].within_share == given.within_share and runs.bridge[1].lends == given.lends
    assert f"bridge@{more}" in seen and f"bridge@{mean}" not in seen
    for r in (*runs.bridge, *runs.separate):
        assert r.decisions == [] and set(r.series) <= {"replicas"}
    # separate pools: ascending, the peak's from the comparison, and the search's bracket
    nodes = [r.pools["inference"] for r in runs.separate]
    assert nodes == sorted(set(nodes)) and runs.target == target
    assert {mean, more, sizing.peak_nodes} <= set(nodes)
    by = dict(zip(nodes, runs.separate, strict=True))
    assert by[sizing.peak_nodes].within_share == report.results[0].within_share
    assert f"separate-{sizing.peak_nodes}" not in seen  # not run again
    least = min(n for n, r in by.items() if r.within_share >= target)
    assert least == 1 or by[least - 1].within_share < target  # exact: both sides were run
