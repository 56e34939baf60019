"""The simulator's proof of quiet ticks (`bridge.sim.quiet`): its forecast bound holds the
policy's own forecast, it spares `assess` on most ticks, and results do not change with it
(`tests/unit/test_sim_golden.py` also runs `assess` on every proven tick)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy import ModelSample
from bridge.policy.forecast import forecast_rate
from bridge.sim import build as sim_build
from bridge.sim.engine import Engine
from bridge.sim.policies import setup_for, size
from bridge.sim.quiet import QuietProof
from bridge.sim.result import PolicyResult
from bridge.sim.setup import Setup


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("window_s", "samples"), [(180.0, 37), (30.0, 7)])
def test_the_forecast_bound_holds_the_policys_forecast(
    seed: int, window_s: float, samples: int
) -> None:
    # (30 s: a window of fewer samples than FULL_SLOPE_SAMPLES, whose rising slopes the
    # forecast shrinks by their t-statistic: the proof's arrays must do the same; a
    # rising line in every fourth stretch keeps some slopes whole or partly so)
    rng = np.random.default_rng(seed)
    ticks, tick = 400, 5.0
    rates = list(rng.uniform(0.0, 5000.0, ticks) * rng.uniform(0.0, 1.0, ticks))
    for k in range(0, ticks, 40):
        rates[k : k + 10] = [100.0 * (j + 1) + rng.uniform(0.0, 30.0) for j in range(10)]
    config = BridgeConfig(
        models={"a": ModelConfig(slo_p99_ms=100.0)},
        policy=PolicyConfig(forecast_window_s=window_s),
    )
    proof = QuietProof(config, ["a"], {"a": rates}, tick, 61, 8)
    assert proof.enabled and proof.window == samples
    history = [ModelSample((j + 1) * tick, 50.0, rates[j]) for j in range(ticks)]
    for horizon in (0.0, 30.0, 97.5):
        for k in range(proof.window, ticks, 7):
            now = (k + 1) * tick
            want = forecast_rate(history[: k + 1], now, config.policy.forecast_window_s, horizon)
            assert want is not None
            got = float(proof.level["a"][k] + proof.slope["a"][k] * horizon)
            tol = proof.tol["a"] * (1.0 + horizon)
            assert max(0.0, got - tol) <= want <= max(0.0, got + tol)


def checked_run(setup: Setup) -> tuple[Engine, PolicyResult]:
    """The run with the proof, every tick it proves quiet checked by `assess`
    (`check_quiet`), after asserting it is the run with `assess` on every tick."""
    engine = Engine(replace(setup, check_quiet=True))
    fast = engine.run()
    slow = Engine(replace(setup, prove_quiet=False)).run()
    a, b = fast.as_dict(), slow.as_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    return engine, fast


def test_the_proof_spares_assess_on_most_ticks_and_changes_nothing() -> None:
    scenario = sim_build.build_scenario(
        days=0.25,
        nodes=48,
        gpus_per_node=8,
        rates=sim_build.model_rates(3, 1800.0),
        slo_ms=100.0,
        service_ms=20.0,
        arrivals="synthetic",
        arrivals_trace=None,
        jobs="synthetic",
        jobs_trace=None,
        load=0.9,
        policies=["bridge"],
        seed=2,
    )
    engine, fast = checked_run(setup_for("bridge", scenario, size(scenario)))
    assert fast.lends > 0 and fast.returns > 0
    assert engine.proven >= 0.9 * fast.ticks


@pytest.mark.parametrize("arrivals", ["ramps", "bursty"])
def test_the_proof_with_a_return_slack_changes_nothing(arrivals: str) -> None:
    """`[policy] return_slack` lets a return leave a model already past its objective a
    little further past it, so a refusal no longer holds for every higher demand: the
    proof's return certificates are bounded above as well. Five models of different
    objectives on ramps and bursts (some returns go back only by the slack); every tick
    the proof calls quiet is checked by `assess`, and the run is the one with `assess` on
    every tick."""
    rates = sim_build.model_rates(5, 1500.0)
    slos = (100.0, 150.0, 200.0, 250.0, 300.0)
    scenario = sim_build.build_scenario(
        days=0.25,
        nodes=64,
        gpus_per_node=8,
        rates=rates,
        slo_ms=100.0,
        service_ms=20.0,
        arrivals=arrivals,
        arrivals_trace=None,
        jobs="synthetic",
        jobs_trace=None,
        load=1.1,
        policies=["bridge"],
        seed=4,
        policy=PolicyConfig(return_slack=0.1, placement=False),
        models={m: (slos[i], 20.0) for i, m in enumerate(rates)},
        lend_cap="50",
    )
    engine, fast = checked_run(setup_for("bridge", scenario, size(scenario)))
    assert any("within return_slack" in d.reason for d in fast.decisions if d.kind == "return")
    assert engine.proven >= 0.1 * fast.ticks


def test_a_tick_that_is_not_whole_seconds_turns_the_proof_off() -> None:
    config = BridgeConfig(
        tick_s=2.5, models={"a": ModelConfig(slo_p99_ms=100.0)}, policy=PolicyConfig()
    )
    assert not QuietProof(config, ["a"], {"a": [1.0] * 500}, 2.5, 200, 8).enabled


@pytest.mark.parametrize("seed", [1, 3])
def test_ticks_on_which_a_place_is_possible_are_not_proven_quiet(seed: int) -> None:
    """Two models of different objectives on bursty arrivals: some lends carry `a` alone,
    and model placement later gives those replicas `b` as well. Every tick the proof
    calls quiet is checked by `assess` (`check_quiet`), and the run is the same as with
    `assess` on every tick."""
    from bridge.sim.policies import Scenario
    from bridge.sim.workload import synthetic_jobs, synthetic_series

    horizon = 4 * 3600.0
    arrivals = synthetic_series(
        {"a": 600.0, "b": 250.0}, horizon, bursts_per_day=24, burst_s=300, seed=seed
    )
    scenario = Scenario(
        nodes=32,
        gpus_per_node=8,
        arrivals=arrivals,
        jobs=synthetic_jobs(horizon, 20 * 8, 0.9, seed=seed),
        models={"a": (100.0, 20.0), "b": (150.0, 30.0)},
        horizon_s=horizon,
        policy=PolicyConfig(return_dwell_s=30.0, scale_in_cooldown_s=120, drain_wait_s=300),
    )
    engine, fast = checked_run(setup_for("bridge", scenario, size(scenario)))
    assert any(d.kind == "place" for d in fast.decisions)
    assert engine.proven > 0
