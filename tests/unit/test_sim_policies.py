"""The compared set-ups (bridge.sim.policies): sizing from the load, the same fleet for
every policy, who may lend, and a small comparison whose ordering must hold."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.sim.policies import POLICIES, Scenario, compare, setup_for, size
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
