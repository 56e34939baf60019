"""The policy's fast paths against the slow ones they replace, on literal inputs: each
must give exactly the same answer (==, not approx), for the decisions must not move.

- `capacity.wait_p99_s` works the queue's quantile out without building the `Queue`;
- `capacity.predict`, `over` and `carries` take each model's largest wait over its pools
  in one sorted pass, and `over`/`carries` read only the late models' p99;
- `capacity.Demand`'s own `__init__` sets its slots directly (still frozen, equal,
  hashable, replaceable);
- `decide._demands` reads each model once for the lend's demand, the return's and the
  backstop's candidates (`hot`); `decide._highest` reads the return's highest rates on a
  tick whose `_read` did not.

The slow paths are the code as it was, copied here (`_slow_*`)."""

from __future__ import annotations

import dataclasses
import math
import pickle
import random
from collections.abc import Mapping, Sequence

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.modelfacts import toml_models
from bridge.policy import ModelSample, Snapshot, capacity
from bridge.policy.capacity import Demand, Group
from bridge.policy.demand import demands as _demands
from bridge.policy.demand import highest as _highest
from bridge.policy.demand import read as _read
from bridge.policy.hysteresis import service_s
from bridge.policy.returns import RatePeaks

NOW = 1_800_000_000.0


# --- the slow paths, as they were ---------------------------------------------------------


def _slow_wait_p99_s(servers: int, load: float, rate: float, cv2: float = 0.0) -> float:
    q = capacity.queue(servers, load, rate, cv2)
    return math.inf if q is None else q.quantile()


def _weight(g: Group, d: Demand | None) -> int:
    return capacity.weight(g.gpus, None if d is None else d.instances)


def _slow_predict(
    groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0
) -> dict[str, float]:
    # a replica takes its weight's share of a model's requests (its GPUs; 1 each for a
    # model with instances of its own)
    total: dict[str, int] = {}
    for g in groups:
        for m in g.models:
            if g.nodes > 0:
                total[m] = total.get(m, 0) + g.nodes * _weight(g, demand.get(m))
    worst: dict[str, float] = {}
    for g in groups:
        if g.nodes <= 0:
            continue
        shared_rate = shared_load = 0.0
        shared: list[str] = []
        for m in g.models:
            d = demand.get(m)
            if d is None:
                continue
            share = d.rate * _weight(g, d) / total[m]
            load = share * d.service_s
            if d.instances is None:
                shared.append(m)
                shared_rate += share
                shared_load += load
            else:
                w = _slow_wait_p99_s(d.instances, load, share, cv2)
                worst[m] = max(worst.get(m, 0.0), w)
        if shared:
            w = _slow_wait_p99_s(max(1, g.gpus), shared_load, shared_rate, cv2)
            for m in shared:
                worst[m] = max(worst.get(m, 0.0), w)
    return {
        m: (d.service_s + worst[m]) if m in worst else (math.inf if d.rate > 0 else d.service_s)
        for m, d in demand.items()
    }


def _slow_over(groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float) -> list[str]:
    p99 = _slow_predict(groups, demand, cv2)
    late = [m for m, d in demand.items() if d.rate > 0 and d.feasible and p99[m] > d.slo_s]
    return sorted(late, key=lambda m: (-p99[m] / demand[m].slo_s, m))


def _slow_carries(groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float) -> bool:
    p99 = _slow_predict(groups, demand, cv2)
    return not any(d.rate > 0 and d.feasible and p99[m] > d.slo_s for m, d in demand.items())


def _slow_demand(
    snapshot: Snapshot,
    config: BridgeConfig,
    returning: bool,
    ahead: Mapping[str, float | None],
    highest: Mapping[str, float],
    now: float = 0.0,
    long_dwell: Mapping[str, float] | None = None,
) -> dict[str, Demand]:
    policy = config.policy
    factor = policy.return_headroom if returning else policy.capacity_headroom
    out: dict[str, Demand] = {}
    for name, model in snapshot.models.items():
        history = snapshot.history.get(name, ())
        if not history:
            continue
        last = history[-1]
        compute = last.compute_ms
        svc = compute / 1000.0 if compute is not None and compute > 0 else service_s(history)
        if returning:
            base = highest[name]
            if long_dwell and name in long_dwell and name in snapshot.peaks:
                base = max(base, snapshot.peaks[name].highest_since(now - long_dwell[name]))
        else:
            base = last.request_rate or 0.0
        if svc is None:
            if base > 0:
                continue
            svc = 0.0
        rate = max(base, ahead[name] or 0.0) * factor
        out[name] = Demand(rate, svc, model.slo_p99_ms / 1000.0, model.instances)
    return out


def _slow_hot(snapshot: Snapshot, config: BridgeConfig) -> list[str]:
    high = config.policy.high_watermark
    return [
        name
        for name, model in snapshot.models.items()
        if (h := snapshot.history.get(name))
        and (p99 := h[-1].p99_ms) is not None
        and p99 > high * model.slo_p99_ms
    ]


# --- the capacity model ---------------------------------------------------------------------


@pytest.mark.parametrize("servers", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("cv2", [0.0, 0.5, 1.0, 2.0, -1.0])
def test_wait_p99_s_is_the_queues_own_quantile(servers: int, cv2: float) -> None:
    for share in (0.0, 1e-9, 0.001, 0.005, 0.0101, 0.3, 0.7, 0.95, 0.999999, 1.0, 1.5):
        load = share * servers
        for rate in (0.0, -1.0, 1e-6, 0.5, 20.0, 400.0, 1e6):
            expect = _slow_wait_p99_s(servers, load, rate, cv2)
            assert capacity.wait_p99_s(servers, load, rate, cv2) == expect, (load, rate)
    with pytest.raises(ValueError):
        capacity.wait_p99_s(0, 1.0, 1.0)


#: literal cases: (groups, demand, cv2)
CASES: list[tuple[list[Group], dict[str, Demand], float]] = [
    # a model on its own instances, one saturated, one idle, one without a replica
    (
        [Group(("a",), 3, 4), Group(("b",), 1, 4)],
        {
            "a": Demand(60.0, 0.02, 0.1, instances=1),
            "b": Demand(75.0, 0.02, 0.1, instances=1),
            "c": Demand(1.0, 0.02, 0.1),
            "d": Demand(0.0, 0.02, 0.1),
        },
        0.0,
    ),
    # models sharing the GPUs with others in several groups, an infeasible one, a model
    # named twice in a group, a model no demand knows, a group of none of them
    (
        [
            Group(("a", "b"), 2, 4),
            Group(("b", "c", "x"), 1, 2),
            Group(("c", "c"), 1, 1),
            Group(("y",), 2, 4),
            Group(("a",), 0, 4),
        ],
        {
            "a": Demand(150.0, 0.02, 0.1),
            "b": Demand(90.0, 0.03, 0.2),
            "c": Demand(10.0, 0.3, 0.1),
            "e": Demand(5.0, 0.01, 0.05),
        },
        1.0,
    ),
    # waits of exactly none (nobody waits: wait_p under 1%), equal waits in two pools
    (
        [Group(("a", "b"), 1, 8), Group(("b", "a"), 1, 8), Group(("c",), 5, 1)],
        {
            "a": Demand(0.1, 0.001, 0.01),
            "b": Demand(0.2, 0.001, 0.01),
            "c": Demand(250.0, 0.0199, 0.02, instances=1),
        },
        0.0,
    ),
    # own instances and shared in one group, a zero-instance-free mix, no groups at all
    (
        [Group(("a", "b", "c"), 2, 2)],
        {"a": Demand(40.0, 0.02, 0.1, 2), "b": Demand(30.0, 0.02, 0.1), "c": Demand(0.0, 0.5, 1)},
        0.25,
    ),
    ([], {"a": Demand(1.0, 0.02, 0.1), "b": Demand(0.0, 0.02, 0.1)}, 0.0),
    # a request exactly as long as the objective (not feasible), beside one that waits
    ([Group(("a", "b"), 1, 1)], {"a": Demand(5.0, 0.1, 0.1), "b": Demand(5.0, 0.01, 0.5)}, 0.0),
    # a service time that is not a number: its pool's wait counts as none for the others
    (
        [Group(("a", "b"), 1, 2), Group(("b",), 1, 2)],
        {"a": Demand(5.0, math.nan, 0.1), "b": Demand(50.0, 0.01, 0.1)},
        0.0,
    ),
]


def _random_cases(seed: int, n: int) -> list[tuple[list[Group], dict[str, Demand], float]]:
    """Seeded cases of a dozen models on a few groups, near and past saturation."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        names = [f"m{i}" for i in range(rng.randint(1, 12))]
        demand = {
            m: Demand(
                rng.choice([0.0, rng.uniform(0.1, 5.0), rng.uniform(5.0, 300.0)]),
                rng.choice([0.0, rng.uniform(0.001, 0.05), rng.uniform(0.05, 0.5)]),
                rng.choice([0.02, 0.1, 0.25]),
                rng.choice([None, None, 1, 2]),
            )
            for m in names
            if rng.random() < 0.9
        }
        groups = [
            Group(
                tuple(rng.sample(names, rng.randint(1, len(names)))),
                rng.choice([0, 1, 1, 2, 3]),
                rng.choice([1, 2, 4, 8]),
            )
            for _ in range(rng.randint(0, 6))
        ]
        out.append((groups, demand, rng.choice([0.0, 0.0, 1.0])))
    return out


@pytest.mark.parametrize("case", CASES + _random_cases(7, 300))
def test_predict_over_and_carries_are_the_slow_paths_answers(
    case: tuple[list[Group], dict[str, Demand], float],
) -> None:
    groups, demand, cv2 = case
    fast, slow = capacity.predict(groups, demand, cv2), _slow_predict(groups, demand, cv2)
    # the same values (a NaN as a NaN), in the same order
    assert [(m, repr(v)) for m, v in fast.items()] == [(m, repr(v)) for m, v in slow.items()]
    assert capacity.over(groups, demand, cv2) == _slow_over(groups, demand, cv2)
    assert capacity.carries(groups, demand, cv2) == _slow_carries(groups, demand, cv2)


def test_the_cases_cover_late_and_carried_models() -> None:
    cases = CASES + _random_cases(7, 300)
    assert any(_slow_over(g, d, c) for g, d, c in cases)
    assert any(_slow_carries(g, d, c) for g, d, c in cases if d)


def test_a_demand_is_the_frozen_dataclass_it_was() -> None:
    d = Demand(60.0, 0.02, 0.1, 2)
    assert (d.rate, d.service_s, d.slo_s, d.instances) == (60.0, 0.02, 0.1, 2)
    assert Demand(60.0, 0.02, 0.1) == Demand(rate=60.0, service_s=0.02, slo_s=0.1, instances=None)
    assert d != Demand(60.0, 0.02, 0.1) and hash(d) == hash(Demand(60.0, 0.02, 0.1, 2))
    assert dataclasses.replace(d, rate=5.0) == Demand(5.0, 0.02, 0.1, 2)
    assert pickle.loads(pickle.dumps(d)) == d
    assert repr(d) == "Demand(rate=60.0, service_s=0.02, slo_s=0.1, instances=2)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.rate = 1.0  # type: ignore[misc]


# --- the policy's per-model pass ------------------------------------------------------------

CONFIG = BridgeConfig(
    models={
        "steady": ModelConfig(slo_p99_ms=100),
        "hot": ModelConfig(slo_p99_ms=50, instances=2),
        "edge": ModelConfig(slo_p99_ms=50),  # p99 exactly at the high watermark
        "cold": ModelConfig(slo_p99_ms=200),  # no compute time measured lately
        "never": ModelConfig(slo_p99_ms=200),  # no compute time ever, no requests
        "loaded": ModelConfig(slo_p99_ms=200),  # requests but no compute time ever
        "gaps": ModelConfig(slo_p99_ms=100),  # rates missing in places
        "silent": ModelConfig(slo_p99_ms=100),  # samples without any rate
        "empty": ModelConfig(slo_p99_ms=100),  # no samples
        "unseen": ModelConfig(slo_p99_ms=100),  # not in the history at all
    },
    policy=PolicyConfig(return_dwell_s=20, forecast_window_s=30),
)


def _series(
    rates: Sequence[float | None],
    p99: float | None = 40.0,
    compute: Sequence[float | None] | float | None = 10.0,
) -> tuple[ModelSample, ...]:
    n = len(rates)
    computes = compute if isinstance(compute, Sequence) else [compute] * n
    return tuple(
        ModelSample(NOW - (n - 1 - i) * 5.0, p99, r, 0.0, 20.0, c)
        for i, (r, c) in enumerate(zip(rates, computes, strict=True))
    )


HISTORY = {
    "steady": _series([10.0, 12.0, 11.0, 13.0, 12.0, 12.5, 14.0]),
    "hot": _series([80.0, 90.0, 120.0, 30.0, 95.0], p99=61.0),
    "edge": _series([7.0, 8.0], p99=50.0),
    "cold": _series([5.0, 4.0, 3.0, 0.0, 0.0], compute=[8.0, 9.0, None, None, None]),
    "never": _series([0.0, 0.0, 0.0], p99=None, compute=None),
    "loaded": _series([3.0, 4.0], compute=None),
    "gaps": _series([None, 50.0, None, 20.0, None, 10.0]),
    "silent": _series([None, None, None], p99=None, compute=None),
    "empty": (),
}
SNAPSHOT = Snapshot(
    (),
    (),
    HISTORY,
    (),
    models=toml_models(CONFIG),
    peaks={"steady": RatePeaks(((NOW - 120.0, 40.0),), NOW - 60.0, 30.0), "gaps": RatePeaks()},
)


@pytest.mark.parametrize("horizon", [0.0, 30.0, 300.0])
def test_the_highest_alone_is_reads_highest(horizon: float) -> None:
    reads = _read(SNAPSHOT, CONFIG, NOW, horizon, True)
    assert _highest(SNAPSHOT, CONFIG) == reads.highest
    assert reads.highest["hot"] == 120.0 and reads.highest["silent"] == 0.0


@pytest.mark.parametrize("long_dwell", [None, {}, {"steady": 600.0, "gaps": 300.0, "cold": 60.0}])
def test_one_pass_gives_each_demand_the_slow_path_gave(
    long_dwell: dict[str, float] | None,
) -> None:
    reads = _read(SNAPSHOT, CONFIG, NOW, 30.0, True)
    both = _demands(SNAPSHOT, CONFIG, reads, keep=True, now=NOW, long_dwell=long_dwell)
    lend = _slow_demand(SNAPSHOT, CONFIG, False, reads.ahead, reads.highest)
    keep = _slow_demand(SNAPSHOT, CONFIG, True, reads.ahead, reads.highest, NOW, long_dwell)
    assert list(both.lend.items()) == list(lend.items())
    assert list(both.keep.items()) == list(keep.items())
    assert both.hot == _slow_hot(SNAPSHOT, CONFIG) == ["hot"]
    # each part alone is the same as both at once
    assert _demands(SNAPSHOT, CONFIG, reads).lend == lend
    alone = _demands(SNAPSHOT, CONFIG, reads, lend=False, keep=True, now=NOW, long_dwell=long_dwell)
    assert (alone.lend, alone.keep, alone.hot) == ({}, keep, [])
    # the cases the slow path tells apart: a model with load and no compute time is left
    # out, one without load is sized at no service time, one found further back keeps it
    assert "loaded" not in lend and lend["never"].service_s == 0.0
    assert lend["cold"].service_s == 0.009
