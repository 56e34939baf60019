"""GPU-granular lending in the simulator (`bridge.sim.lending`, `Setup.granularity`): a
lend of a k-GPU replica requeues only the jobs `choose_victims` picks and leaves the rest
of the node running; a replica of 16 GPUs takes two whole 8-GPU nodes or none, and
returns them together; work lost to a requeue is counted the same way in both modes.
Literal fleets, the engine driven action by action."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.lifecycle import LeaseState
from bridge.policy import Lend, Return
from bridge.policy.gang import lend_gpus
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.lending import check_granularity, parse_replica_gpus
from bridge.sim.workload import ArrivalSeries, SimJob

TICK = 5.0
HORIZON = 3600.0
#: replica GPUs of the models: small 2, whole 8, huge 16 (a gang of two nodes)
SIZES = {"small": 2, "whole": 8, "huge": 16}
#: on el0 (8 GPUs): a holds 4, b 2, c 1; one GPU free
BUSY = (
    SimJob("a", "elastic", 0.0, 9000.0, 4),
    SimJob("b", "elastic", 0.0, 9000.0, 2),
    SimJob("c", "elastic", 0.0, 9000.0, 1),
)


def _setup(granularity: str, elastic: int = 1, jobs: tuple[SimJob, ...] = BUSY) -> Setup:
    nodes = [SimNode(0, "inf0", "inference", None, 8)]
    nodes += [SimNode(1 + i, f"el{i}", "elastic", "elastic", 8) for i in range(elastic)]
    models = {m: ModelConfig(slo_p99_ms=100, tensor_parallel=g) for m, g in SIZES.items()}
    config = BridgeConfig(
        tick_s=TICK,
        pools={
            "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
            "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        },
        policy=PolicyConfig(max_lent_nodes=4, partial_lends=granularity == "gpu"),
    )
    steps = int(HORIZON / TICK)
    return Setup(
        name="t",
        description="test",
        config=config,
        nodes=nodes,
        jobs=jobs,
        arrivals=ArrivalSeries(TICK, {m: np.full(steps, 1.0) for m in SIZES}),
        service_s=dict.fromkeys(SIZES, 0.02),
        horizon_s=HORIZON,
        models=models,
        granularity=granularity,
    )


def _at(engine: Engine, t: float) -> None:
    """Events up to `t`, then the leases' sync (as a tick does)."""
    engine._advance(t)
    engine._sync()


def _lend(engine: Engine, node: str, model: str) -> None:
    """The policy's lend of `node` for `model`: of its replica's GPUs where the run is
    GPU-granular (`[policy] partial_lends`) and the replica is smaller than the node."""
    k = lend_gpus(engine.specs, (model,))
    partial = engine.s.config.policy.partial_lends and k is not None
    share = k if partial and k < engine.by_name[node].gpus else None
    engine._act(Lend(node, "elastic", "preempt", (model,), "test", share))


def test_a_partial_lend_requeues_only_the_chosen_victims() -> None:
    engine = Engine(_setup("gpu"))
    _at(engine, 10.0)
    _lend(engine, "el0", "small")  # 2 GPUs: the free one, and c's
    _at(engine, 20.0)
    runs, node = engine.fleet.runs, engine.by_name["el0"]
    assert [runs[j].restarts for j in "abc"] == [0, 0, 1]
    assert sorted(node.jobs) == ["a", "b"]  # the rest of the node runs on
    assert (node.held, node.free) == (2, 0)
    lease = next(iter(engine.leases.values()))
    assert lease.running_at == pytest.approx(10.0 + Timing().preempt_start_s)


def test_a_node_granular_lend_requeues_every_job_of_the_node() -> None:
    engine = Engine(_setup("node"))
    _at(engine, 10.0)
    _lend(engine, "el0", "small")
    _at(engine, 20.0)
    runs, node = engine.fleet.runs, engine.by_name["el0"]
    assert [runs[j].restarts for j in "abc"] == [1, 1, 1]
    assert node.triton and not node.jobs and node.held == 0


@pytest.mark.parametrize("granularity", ["node", "gpu"])
def test_work_lost_is_counted_the_same_way_in_both_modes(granularity: str) -> None:
    engine = Engine(_setup(granularity))
    _at(engine, 100.0)
    _lend(engine, "el0", "small")
    _at(engine, 110.0)
    requeued_at = 100.0 + Timing().preempt_start_s  # every job ran from 0
    gpus = {"node": 4 + 2 + 1, "gpu": 1}[granularity]  # the GPUs of the jobs requeued
    assert engine.fleet.lost_gpu_s == pytest.approx(gpus * requeued_at)
    result = engine.tally.result(
        engine.s, engine.nodes, engine.fleet, engine.serving, 1, engine.now, 0.0
    )
    assert result.gpu_hours_lost == pytest.approx(gpus * requeued_at / 3600.0)


def test_the_engine_lends_the_policys_node_and_gpus() -> None:
    # el1 has two GPUs free; the policy chose it (`choose_nodes`: a busy node with the
    # GPUs free is as cheap as an idle one): the 2-GPU replica requeues nothing there
    jobs = (*BUSY, SimJob("d", "elastic", 0.0, 9000.0, 6))
    engine = Engine(_setup("gpu", elastic=2, jobs=jobs))
    _at(engine, 10.0)
    assert sorted(engine.by_name["el1"].jobs) == ["d"]
    _lend(engine, "el1", "small")
    _at(engine, 20.0)
    assert engine.fleet.preemptions == 0
    assert engine.by_name["el1"].held == 2 and engine.by_name["el0"].held == 0
    assert engine.tally.decisions[-1].node == "el1"


@pytest.mark.parametrize("granularity", ["node", "gpu"])
def test_a_16_gpu_replica_takes_two_whole_nodes_and_returns_them_together(
    granularity: str,
) -> None:
    engine = Engine(_setup(granularity, elastic=3, jobs=BUSY))
    _at(engine, 10.0)
    _lend(engine, "el1", "huge")  # el1 and el2 are idle: the gang
    _at(engine, 20.0)
    lease = next(iter(engine.leases.values()))
    assert sorted(n.name for n in lease.nodes) == ["el1", "el2"]
    assert engine.fleet.preemptions == 0  # el0's jobs are left alone
    for name in ("el1", "el2"):
        node = engine.by_name[name]
        assert node.triton or (node.held, node.free) == (8, 0)
    t = 20.0
    while lease.view.state != LeaseState.SERVING:
        t += TICK
        _at(engine, t)
    engine._act(Return(lease.id, "test"))
    while lease.id in engine.leases:
        t += TICK
        _at(engine, t)
    for name in ("el1", "el2"):
        node = engine.by_name[name]
        assert (node.free, node.held, node.triton, node.fenced) == (8, 0, False, False)


@pytest.mark.parametrize("granularity", ["node", "gpu"])
def test_a_16_gpu_replica_without_two_whole_nodes_takes_none(granularity: str) -> None:
    # el0 runs jobs, el1 is idle: one whole node only, with a guarded job on el0
    jobs = (SimJob("a", "elastic", 0.0, 9000.0, 4),)
    engine = Engine(_setup(granularity, elastic=2, jobs=jobs))
    _at(engine, 10.0)
    engine.fleet.runs["a"].restarts = engine.s.config.policy.max_requeues_per_job
    engine._nodes()
    _lend(engine, "el1", "huge")
    _at(engine, 20.0)
    assert not engine.leases and engine.tally.lends == 0
    assert engine.tally.decisions[-1].kind == "refused"
    assert [(n.free, n.held, n.fenced, n.triton) for n in engine.nodes[1:]] == [
        (4, 0, False, False),
        (8, 0, False, False),
    ]


def test_a_replica_of_no_stated_size_takes_its_node_whole_in_both_modes() -> None:
    setup = _setup("gpu")
    setup.models = {m: ModelConfig(slo_p99_ms=100) for m in SIZES}
    engine = Engine(setup)
    _at(engine, 10.0)
    _lend(engine, "el0", "small")
    _at(engine, 20.0)
    assert engine.fleet.preemptions == 3 and engine.by_name["el0"].triton


def test_the_options_are_checked() -> None:
    assert check_granularity("gpu") == "gpu"
    with pytest.raises(ValueError, match="choose from node, gpu"):
        check_granularity("rack")
    with pytest.raises(ValueError, match="choose from node, gpu"):
        Engine(_setup("GPU"))
    models = ["m0", "m1", "m2", "m3", "m4", "m5"]
    assert parse_replica_gpus("1,2,4,8,16", models) == {
        "m0": 1,
        "m1": 2,
        "m2": 4,
        "m3": 8,
        "m4": 16,
        "m5": 1,
    }
    assert parse_replica_gpus("4,m1=16", models[:2]) == {"m0": 4, "m1": 16}
    assert parse_replica_gpus("", models) == {}
    for bad in ("0", "x", "m9=2", "m0=1.5"):
        with pytest.raises(ValueError, match="--replica-gpus"):
            parse_replica_gpus(bad, models)
    specs = {m: ModelConfig(slo_p99_ms=100, tensor_parallel=g) for m, g in SIZES.items()}
    assert lend_gpus(specs, ("small", "whole")) == 8  # models on one replica share it
    assert lend_gpus(specs, ("other",)) is None


@pytest.mark.parametrize(("granularity", "servers"), [("node", 8), ("gpu", 2)])
def test_a_partial_leases_replica_serves_on_its_own_gpus(granularity: str, servers: int) -> None:
    # the 2-GPU replica lent 2 GPUs of el0 runs 2 executions, not one per GPU of the
    # node; the policy sees it as the daemon's observation does (`ReplicaView.gpus` and
    # `LeaseView.gpus` its lent GPUs), so neither side counts capacity the lease lacks
    engine = Engine(_setup(granularity))
    _at(engine, 10.0)
    _lend(engine, "el0", "small")
    lease = next(iter(engine.leases.values()))
    view = engine._lease_view(lease)
    assert (view.gpus, view.lent_gpus) == (servers, None if granularity == "node" else 2)
    t = 10.0
    while lease.view.state != LeaseState.SERVING:
        t += TICK
        _at(engine, t)
    (replica,) = [r for r in engine.snapshot().replicas if r.lease_id == lease.id]
    assert replica.gpus == servers
    group = next(g for g in engine.serving.groups.values() if g.models == ("small",))
    assert (group.nodes, group.servers, group.gpus) == (1, servers, servers)
    engine._act(Return(lease.id, "test"))
    while lease.id in engine.leases:
        t += TICK
        _at(engine, t)
    assert all(g.models != ("small",) for g in engine.serving.groups.values())


def _serve(engine: Engine, lease_id: int, t: float) -> float:
    """Ticks until lease `lease_id` serves; the time then."""
    while engine.leases[lease_id].view.state != LeaseState.SERVING:
        t += TICK
        _at(engine, t)
    return t


def test_a_lend_beside_a_serving_partial_lease_shares_its_node() -> None:
    # the store's rule (`[policy] shared_lends` makes such lends): a second 2-GPU lease of
    # el0 beside the first, once it serves, requeues b (2 GPUs) and leaves a running
    engine = Engine(_setup("gpu"))
    _at(engine, 10.0)
    _lend(engine, "el0", "small")  # the free GPU and c's
    (first,) = engine.leases
    _lend(engine, "el0", "small")  # refused while the first is not serving
    assert list(engine.leases) == [first]
    assert engine.tally.decisions[-1].kind == "refused"
    t = _serve(engine, first, 10.0)
    _lend(engine, "el0", "small")
    second = max(engine.leases)
    assert second != first
    _serve(engine, second, t)
    runs, node = engine.fleet.runs, engine.by_name["el0"]
    assert [runs[j].restarts for j in "abc"] == [0, 1, 1]
    assert sorted(node.jobs) == ["a"] and node.held == 4
    # a whole-node lend is never beside them, nor one of more GPUs than are left
    _lend(engine, "el0", "whole")
    engine._act(Lend("el0", "elastic", "preempt", ("small",), "test", 6))
    assert sorted(engine.leases) == [first, second]
