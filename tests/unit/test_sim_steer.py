"""The simulator's routing past a replica's capacity (`bridge.sim.serving._steer`): the
even split, except that nginx's `least_conn` holds a replica at `STEER_BUSY` of its
executions and sends the rest of its models' requests to their replicas with room, as
bench/least_conn_split.py measured (a replica of 1 execution beside one of 8, at 110 req/s
of 20 ms: 38.6% of the requests to the small one, 85% busy). Literal groups and rates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bridge.policy import capacity
from bridge.sim import latency
from bridge.sim.engine import Engine
from bridge.sim.latency import LEAST_CONN_CA2
from bridge.sim.policies import Scenario, setup_for, size
from bridge.sim.serving import STEER_BUSY, Group, _steer
from bridge.sim.workload import ArrivalSeries

SVC = 0.02


def _groups(*servers: int, models: tuple[int, ...] = (0,)) -> list:
    """One replica a group, of `servers` executions each, every group holding `models`
    (indexes), each model's even share: its replicas counted over all the groups."""
    return [
        (Group(tuple(f"m{i}" for i in models), nodes=1, servers=c), [(i, len(servers), SVC)
                                                                       for i in models])
        for c in servers
    ]  # fmt: skip


def _share(layout: tuple, model: int, group: int) -> float:
    _, per_model = layout
    return per_model[model][group][0]


def test_below_the_hold_the_even_split_stands() -> None:
    # 80 req/s over 1 + 8 executions: the small one at 0.8 busy under the even split
    assert _steer(_groups(1, 8), [80.0], 1) is None


def test_past_it_the_small_replica_is_held_and_the_rest_goes_to_the_large_one() -> None:
    layout = _steer(_groups(1, 8), [110.0], 1)
    assert layout is not None
    small = _share(layout, 0, 0)
    assert small == pytest.approx(STEER_BUSY / SVC / 110.0)  # 38.6%, as measured
    assert small + _share(layout, 0, 1) == pytest.approx(1.0)
    per_group, _ = layout
    (i, r, _svc) = per_group[0][1][0]
    assert i == 0 and 110.0 / r * SVC == pytest.approx(STEER_BUSY)  # its load: 0.85 busy


def test_with_no_room_anywhere_the_load_stays_where_the_even_split_put_it() -> None:
    layout = _steer(_groups(1, 1), [200.0], 1)  # both at 2x their executions
    assert layout is not None
    assert _share(layout, 0, 0) == pytest.approx(0.5)
    assert _share(layout, 0, 1) == pytest.approx(0.5)


def test_a_replica_of_two_models_sheds_both_and_a_model_without_load_keeps_its_share() -> None:
    # models 0 and 1 on both replicas; model 1 sends nothing this tick
    layout = _steer(_groups(1, 8, models=(0, 1)), [110.0, 0.0], 2)
    assert layout is not None
    assert _share(layout, 0, 0) == pytest.approx(STEER_BUSY / SVC / 110.0)
    assert (_share(layout, 1, 0), _share(layout, 1, 1)) == (0.5, 0.5)


def _small_p99(ca2: float) -> float:
    """The model's p99 (s) of the small replica of bench/least_conn_split.py's 1 + 8 at
    110 req/s of 20 ms, held at STEER_BUSY, with arrivals of SCV `ca2`."""
    rate = STEER_BUSY / SVC
    return SVC + latency.step(1, rate * SVC, rate, 0.0, 5.0, 0.0, ca2).state.wait_quantile()


def test_least_conns_arrivals_give_the_p99_nginx_gave() -> None:
    # measured: the small replica took 38.8% of 110 req/s (0.85 busy), its p99 97.1 ms
    assert _small_p99(LEAST_CONN_CA2) == pytest.approx(0.0971, rel=0.2)
    assert _small_p99(1.0) > 3 * 0.0971  # Poisson arrivals: what the simulator took before


def _run(routing_ca2: float, replicas: int) -> float:
    """Share within SLO of one model at 0.7 busy on each of `replicas` one-GPU replicas."""
    rate = 0.7 / SVC * replicas
    scenario = Scenario(
        nodes=replicas + 4, gpus_per_node=1,
        arrivals=ArrivalSeries(60.0, {"m": np.full(30, rate)}), jobs=[],
        models={"m": (60.0, SVC * 1000.0)}, horizon_s=1800.0, routing_ca2=routing_ca2,
    )  # fmt: skip
    sizing = size(scenario)
    setup = setup_for(f"separate-{replicas}", scenario, sizing)
    return Engine(setup).run().within_share


def test_a_model_on_several_replicas_gets_least_conns_arrivals_and_on_one_poissons() -> None:
    assert _run(LEAST_CONN_CA2, 2) > _run(1.0, 2)  # routed: smoother, fewer late
    assert _run(LEAST_CONN_CA2, 1) == _run(1.0, 1)  # nothing to route: Poisson either way


def test_a_routing_scv_that_is_not_positive_is_refused() -> None:
    scenario = Scenario(
        nodes=6, gpus_per_node=1, arrivals=ArrivalSeries(60.0, {"m": np.full(5, 10.0)}),
        jobs=[], models={"m": (60.0, 20.0)}, horizon_s=300.0, routing_ca2=0.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"routing_ca2 0\.0"):
        setup_for("bridge", scenario, size(scenario))


# ---- replicas weighed by their GPUs (nginx's `weight=`, `RoutingTable.weights`) ---------


def test_the_simulator_splits_a_model_over_its_replicas_by_their_gpus() -> None:
    scenario = Scenario(
        nodes=4, gpus_per_node=8, arrivals=ArrivalSeries(60.0, {"m": np.full(30, 100.0)}),
        jobs=[], models={"m": (100.0, SVC * 1000.0)}, horizon_s=1800.0,
    )  # fmt: skip
    serving = Engine(setup_for("separate-1", scenario, size(scenario))).serving
    serving.groups.clear()
    serving.join(("m",), 1, 0.0)  # a whole node: 8 GPUs
    serving.join(("m",), 1, 0.0, gpus=2)  # a partial lease of 2
    _, per_model = serving._lay_out()
    assert sorted(share for share, _ in per_model[0]) == pytest.approx([0.2, 0.8])
    # replicas alike: the even split
    serving.join(("m",), -1, 0.0, gpus=2)
    serving.join(("m",), 2, 0.0)
    _, per_model = serving._lay_out()
    assert [share for share, _ in per_model[0]] == pytest.approx([1.0])  # one group of 3
    assert per_model[0][0][1].nodes == 3


def test_the_capacity_model_splits_by_gpus_and_a_model_of_its_own_instances_evenly() -> None:
    # 180 req/s of 20 ms over replicas of 8 GPUs and 1: evenly, the small one would take
    # 90 (1.8 busy: saturated); by GPUs it takes 20 (0.4 busy)
    groups = [capacity.Group(("a",), 1, 8), capacity.Group(("a",), 1, 1)]
    (p99,) = capacity.predict(groups, {"a": capacity.Demand(180.0, SVC, 0.1)}).values()
    assert SVC < p99 < 0.1
    assert capacity.weight(8, None) == 8 and capacity.weight(1, None) == 1
    # one instance on each replica whatever its GPUs: even, 90 req/s each, saturated
    own = {"a": capacity.Demand(180.0, SVC, 0.1, instances=1)}
    assert capacity.weight(8, 1) == 1
    assert capacity.predict(groups, own)["a"] == math.inf


def test_what_no_replica_has_room_for_goes_back_by_gpus() -> None:
    # 1,000 req/s of 20 ms over replicas of 8 GPUs and 1 (9 executions for 20 busy): both
    # are over the hold and neither has room, so the split by GPUs stands
    groups = [
        (Group(("m0",), nodes=1, servers=8, gpus=8), [(0, 9 / 8, SVC)]),
        (Group(("m0",), nodes=1, servers=1, gpus=1), [(0, 9.0, SVC)]),
    ]
    layout = _steer(groups, [1000.0], 1)
    assert layout is not None
    assert _share(layout, 0, 0) == pytest.approx(8 / 9)
    assert _share(layout, 0, 1) == pytest.approx(1 / 9)
