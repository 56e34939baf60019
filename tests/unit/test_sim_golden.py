"""The simulator reproduces the results recorded before its speed-ups (issue 15): every
policy on small synthetic fleets, several seeds, arrivals and options. The recording,
`tests/data/sim/golden.json`, is the full `PolicyResult.as_dict()` of each run less its
wall time, made with the engine as it was before the speed-ups; integers and strings must
match exactly, floats within 1e-9 relative (sums may add in another order).

Regenerate only when a change is meant to change results:
    .venv/bin/python -m tests.unit.test_sim_golden --write
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.config import PolicyConfig
from bridge.paths import project_root
from bridge.sim import build as sim_build
from bridge.sim.engine import Engine
from bridge.sim.policies import POLICIES, setup_for, size

GOLDEN = project_root() / "tests" / "data" / "sim" / "golden.json"
REL = 1e-9

#: name -> build_scenario arguments (synthetic inputs only: no trace needed)
CASES: dict[str, dict[str, Any]] = {
    "synthetic-24n-s1": dict(days=0.25, nodes=24, models=2, mean_rps=900.0, seed=1),
    "synthetic-48n-s2": dict(days=0.25, nodes=48, models=3, mean_rps=1800.0, seed=2),
    "ramps-32n-s3": dict(days=0.25, nodes=32, models=2, mean_rps=1200.0, seed=3, arrivals="ramps"),
    "ckpt-p75-40n-s4": dict(
        days=0.25, nodes=40, models=2, mean_rps=1500.0, seed=4, checkpoint_s=900.0, reserve="p75"
    ),
    "short-dwell-32n-s5": dict(
        days=0.2,
        nodes=32,
        models=2,
        mean_rps=1200.0,
        seed=5,
        arrivals="ramps",
        policy=PolicyConfig(return_dwell_s=30.0, scale_in_cooldown_s=120.0, drain_wait_s=300.0),
    ),
    "busy-48n-s6": dict(days=0.25, nodes=48, models=4, mean_rps=2400.0, seed=6, load=1.2),
}


def run_case(name: str, check: bool = True) -> list[dict[str, Any]]:
    """Each policy's full result (as_dict, less wall_s) for case `name`, as `compare` runs
    it; `check`: run `assess` on the ticks the engine proves quiet too (it must agree)."""
    args = dict(CASES[name])
    models, mean_rps = args.pop("models"), args.pop("mean_rps")
    arrivals = args.pop("arrivals", "synthetic")
    load = args.pop("load", 0.9)
    scenario = sim_build.build_scenario(
        gpus_per_node=8,
        rates=sim_build.model_rates(models, mean_rps),
        slo_ms=100.0,
        service_ms=20.0,
        arrivals=arrivals,
        arrivals_trace=None,
        jobs="synthetic",
        jobs_trace=None,
        load=load,
        policies=list(POLICIES),
        **args,
    )
    sizing = size(scenario)
    out = []
    for policy in POLICIES:
        setup = replace(setup_for(policy, scenario, sizing), check_quiet=check)
        d = Engine(setup).run().as_dict()
        d.pop("wall_s")
        out.append(json.loads(json.dumps(d)))  # tuples as lists, as the recording has them
    return out


def _same(want: Any, got: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(want) == sorted(got), f"{where}: keys differ"
        for k in want:
            _same(want[k], got[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(want) == len(got), f"{where}: length differs"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            _same(w, g, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), where
        if math.isinf(want) or math.isnan(want):
            assert want == got or (math.isnan(want) and math.isnan(got)), f"{where}"
        else:
            assert math.isclose(want, got, rel_tol=REL, abs_tol=1e-12), (
                f"{where}: {got!r} != recorded {want!r}"
            )
    else:
        assert want == got, f"{where}: {got!r} != recorded {want!r}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_engine_reproduces_the_recorded_results(name: str) -> None:
    recorded = json.loads(GOLDEN.read_text())[name]
    got = run_case(name)
    assert [r["policy"] for r in got] == [r["policy"] for r in recorded]
    for want, have in zip(recorded, got, strict=True):
        assert have["lends"] == want["lends"] and have["decisions"] == want["decisions"]
        _same(want, have, f"{name}/{want['policy']}")


def test_the_recording_exercises_lends_returns_and_preemptions() -> None:
    recorded = json.loads(GOLDEN.read_text())
    results = [r for case in recorded.values() for r in case]
    assert sum(r["lends"] for r in results) >= 20
    assert sum(r["returns"] for r in results) >= 10
    assert sum(r["preemptions"] for r in results) >= 10
    assert any(r["lends_by_pool"].get("training") for r in results), "no drain lend"


def _write(path: Path) -> None:
    data = {name: run_case(name) for name in CASES}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.unit.test_sim_golden --write")
    _write(GOLDEN)
