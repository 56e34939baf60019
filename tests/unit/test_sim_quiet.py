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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_forecast_bound_holds_the_policys_forecast(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ticks, tick = 400, 5.0
    rates = list(rng.uniform(0.0, 5000.0, ticks) * rng.uniform(0.0, 1.0, ticks))
    config = BridgeConfig(models={"a": ModelConfig(slo_p99_ms=100.0)}, policy=PolicyConfig())
    proof = QuietProof(config, ["a"], {"a": rates}, tick, 61, 8)
    assert proof.enabled and proof.window == 37
    history = [ModelSample((j + 1) * tick, 50.0, rates[j]) for j in range(ticks)]
    for horizon in (0.0, 30.0, 97.5):
        for k in range(proof.window, ticks, 7):
            now = (k + 1) * tick
            want = forecast_rate(history[: k + 1], now, config.policy.forecast_window_s, horizon)
            assert want is not None
            got = float(proof.level["a"][k] + proof.slope["a"][k] * horizon)
            tol = proof.tol["a"] * (1.0 + horizon)
            assert max(0.0, got - tol) <= want <= max(0.0, got + tol)


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
    setup = setup_for("bridge", scenario, size(scenario))
    engine = Engine(replace(setup, check_quiet=True))
    fast = engine.run()
    slow = Engine(replace(setup, prove_quiet=False)).run()
    assert fast.lends > 0 and fast.returns > 0
    assert engine.proven >= 0.9 * fast.ticks
    a, b = fast.as_dict(), slow.as_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_a_tick_that_is_not_whole_seconds_turns_the_proof_off() -> None:
    config = BridgeConfig(
        tick_s=2.5, models={"a": ModelConfig(slo_p99_ms=100.0)}, policy=PolicyConfig()
    )
    assert not QuietProof(config, ["a"], {"a": [1.0] * 500}, 2.5, 200, 8).enabled
