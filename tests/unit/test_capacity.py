"""The capacity model (bridge.policy.capacity): Erlang C against its closed form and
published values, the predicted p99 against the queueing formula, sizing and removal."""

from __future__ import annotations

import math

import pytest

from bridge.policy import capacity
from bridge.policy.capacity import Demand, Group


def erlang_c_closed_form(c: int, a: float) -> float:
    """The textbook formula with factorials."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def test_erlang_c_known_values() -> None:
    assert capacity.erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert capacity.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # published tables: 10 agents at 8 Erlangs wait 40.9% of the time
    assert capacity.erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)
    assert capacity.erlang_c(8, 0.0) == 0.0
    assert capacity.erlang_c(8, 8.0) == 1.0
    for c, a in ((3, 2.5), (8, 6.0), (16, 12.0), (32, 30.0)):
        assert capacity.erlang_c(c, a) == pytest.approx(erlang_c_closed_form(c, a), rel=1e-9)
    # more servers at the same utilisation wait less often
    assert capacity.erlang_c(16, 12.0) < capacity.erlang_c(4, 3.0)


def test_wait_p99_is_the_exponential_tail_of_m_m_1() -> None:
    """M/M/1 (cv2 = 1): P(W > t) = rho exp(-(mu - lambda) t), so p99 = ln(100 rho)/(mu - lambda)."""
    mu, lam = 50.0, 40.0
    expect = math.log(100 * lam / mu) / (mu - lam)
    assert capacity.wait_p99_s(1, lam / mu, lam, cv2=1.0) == pytest.approx(expect)
    # deterministic service waits half as long (Allen-Cunneen)
    assert capacity.wait_p99_s(1, lam / mu, lam, cv2=0.0) == pytest.approx(expect / 2)
    assert capacity.wait_p99_s(1, 1.0, mu) == math.inf


def test_p99_grows_towards_saturation() -> None:
    values = [capacity.wait_p99_s(8, a, a / 0.02) for a in (2.0, 6.0, 7.5, 7.9)]
    assert values == sorted(values)
    assert capacity.wait_p99_s(8, 8.0, 400.0) == math.inf


def test_predict_splits_a_model_over_its_replicas_and_shares_gpus() -> None:
    demand = {"a": Demand(60.0, 0.02, 0.1, instances=1)}
    one = capacity.predict([Group(("a",), 1, 4)], demand)["a"]
    three = capacity.predict([Group(("a",), 3, 4)], demand)["a"]
    assert one == math.inf  # 60 req/s x 20 ms on one instance: saturated
    assert three == pytest.approx(0.02 + capacity.wait_p99_s(1, 0.4, 20.0))
    # without its own instances a model shares the node's GPUs with the others there
    shared = {"a": Demand(60.0, 0.02, 0.1), "b": Demand(100.0, 0.02, 0.1)}
    p = capacity.predict([Group(("a", "b"), 1, 4)], shared)
    assert p["a"] == pytest.approx(0.02 + capacity.wait_p99_s(4, 3.2, 160.0))
    assert p["a"] - 0.02 == pytest.approx(p["b"] - 0.02)
    # no replica at all: inf when it has load, its service time when idle
    assert capacity.predict([], {"a": Demand(1.0, 0.02, 0.1)})["a"] == math.inf
    assert capacity.predict([], {"a": Demand(0.0, 0.02, 0.1)})["a"] == 0.02


def test_plan_nodes_adds_the_fewest_nodes_and_respects_room() -> None:
    demand = {"a": Demand(75.0, 0.02, 0.1, instances=1)}
    base = [Group(("a",), 1, 4)]
    plan = capacity.plan_nodes(base, demand, [4] * 5, lambda m, n: True)
    assert plan == [("a",), ("a",)]  # 3 replicas: 25 req/s each, p99 98 ms
    assert capacity.carries([Group(("a",), 3, 4)], demand)
    assert not capacity.carries([Group(("a",), 2, 4)], demand)
    assert capacity.plan_nodes(base, demand, [4] * 5, lambda m, n: n < 2) == [("a",)]
    assert capacity.plan_nodes(base, demand, [4], lambda m, n: True) == [("a",)]  # one slot


def test_a_model_slower_than_its_slo_is_never_sized() -> None:
    demand = {"slow": Demand(10.0, 0.2, 0.1, instances=1)}
    assert not demand["slow"].feasible
    assert capacity.plan_nodes([], demand, [4] * 3, lambda m, n: True) == []


def test_only_the_models_still_over_go_on_the_next_node() -> None:
    demand = {
        "hot": Demand(75.0, 0.02, 0.1, instances=1),
        "cold": Demand(1.0, 0.02, 0.1, instances=1),
    }
    plan = capacity.plan_nodes([Group(("cold", "hot"), 1, 4)], demand, [4] * 4, lambda m, n: True)
    assert plan == [("hot",), ("hot",)]
