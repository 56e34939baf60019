"""The simulator's event loop with the real `decide`: lends and returns happen when and
where the policy says, with the lab's timings; preemption requeues with Slurm's delay;
drain never kills; GPU-hours add up; the quiet-tick shortcut changes nothing; every lease
moves only along the lifecycle's table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.lifecycle import IllegalMove, LeaseState, allowed
from bridge.sim.engine import Engine, Setup, SimLease, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.result import PolicyResult
from bridge.sim.workload import ArrivalSeries, SimJob

TICK = 5.0


def _rates(*phases: tuple[float, float]) -> np.ndarray:
    """(seconds, req/s) phases as a 5 s step series."""
    return np.concatenate([np.full(int(s / TICK), r) for s, r in phases])


def _setup(
    *,
    pools: tuple[str, ...] = ("elastic", "training"),
    jobs: tuple[SimJob, ...] = (),
    rates: np.ndarray | None = None,
    policy: PolicyConfig | None = None,
    horizon: float = 2400.0,
) -> Setup:
    nodes = [
        SimNode(0, "inf0", "inference", None, 1),
        SimNode(1, "el0", "elastic", "elastic", 1),
        SimNode(2, "tr0", "training", "training", 1),
    ]
    pool_cfg = {"inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0)}
    if "elastic" in pools:
        pool_cfg["elastic"] = PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1)
    if "training" in pools:
        pool_cfg["training"] = PoolConfig(partition="train", lend_mode="drain", cost_rank=2)
    if rates is None:  # light, a burst over one replica's 50 req/s, then calm
        rates = _rates((300, 20.0), (400, 70.0), (horizon - 700, 5.0))
    config = BridgeConfig(
        tick_s=TICK,
        pools=pool_cfg,
        models={"busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=2)},
        policy=policy
        or PolicyConfig(
            max_lent_nodes=1,
            return_dwell_s=6 * TICK,
            scale_in_cooldown_s=60,
            scale_out_cooldown_s=60,
        ),
    )
    return Setup(
        name="t",
        description="test",
        config=config,
        nodes=nodes,
        jobs=jobs,
        arrivals=ArrivalSeries(TICK, {"busy": rates}),
        service_s={"busy": 0.020},
        horizon_s=horizon,
        replica_servers=1,
    )


LONG = (
    SimJob("e1", "elastic", 0.0, 5000.0, 1),
    SimJob("t1", "training", 0.0, 5000.0, 1),
)


def _run(setup: Setup) -> tuple[PolicyResult, Engine]:
    engine = Engine(setup)
    return engine.run(), engine


def test_a_burst_lends_the_elastic_node_and_calm_returns_it() -> None:
    result, engine = _run(_setup(jobs=LONG))
    kinds = [(d.kind, d.node) for d in result.decisions]
    assert kinds == [("lend", "el0"), ("return", "el0")]
    lend, ret = result.decisions
    # breach_evaluations (3) ticks over the SLO once the backlog shows, after t=300
    assert 300 < lend.at_s <= 300 + 60
    assert ret.at_s > 700  # only once the burst is over and calm held
    # the elastic job was requeued once, and ran again after the return
    e1 = engine.fleet.runs["e1"]
    assert e1.restarts == 1
    assert result.preemptions == 1
    lost = lend.at_s + Timing().preempt_start_s
    assert result.gpu_hours_lost == pytest.approx(lost / 3600.0, abs=1e-6)
    assert e1.started_at is not None and e1.started_at >= ret.at_s
    # the training job was never touched
    assert engine.fleet.runs["t1"].restarts == 0
    assert result.lends == result.returns == 1
    assert result.lends_by_pool == {"elastic": 1}


def test_the_lent_replica_brings_p99_back_within_the_slo() -> None:
    with_lend, _ = _run(_setup(jobs=LONG))
    without, _ = _run(_setup(jobs=LONG, policy=PolicyConfig(max_lent_nodes=0)))
    assert without.lends == 0
    assert with_lend.within_share > without.within_share + 0.1
    assert with_lend.minutes_share > without.minutes_share


def test_idle_nodes_go_first_and_need_no_preemption() -> None:
    # the training job ends before the burst: the idle training node beats the busy
    # elastic one, and a drain of an idle node starts Triton at once
    jobs = (SimJob("e1", "elastic", 0.0, 5000.0, 1), SimJob("t1", "training", 0.0, 100.0, 1))
    result, engine = _run(_setup(jobs=jobs))
    assert result.decisions[0].kind == "lend" and result.decisions[0].node == "tr0"
    assert result.preemptions == 0
    assert engine.fleet.runs["e1"].restarts == 0


def test_drain_waits_for_the_training_job_and_never_kills_it() -> None:
    jobs = (SimJob("t1", "training", 0.0, 500.0, 1),)
    result, engine = _run(_setup(pools=("training",), jobs=jobs))
    assert result.decisions[0].kind == "lend" and result.decisions[0].node == "tr0"
    t1 = engine.fleet.runs["t1"]
    assert t1.restarts == 0 and t1.ended_at == pytest.approx(500.0, abs=TICK)
    assert result.preemptions == 0
    # held but unused only between the job's end and Triton's start (sbatch to running)
    assert result.gpu_hours["training"]["fenced"] == pytest.approx(1.37 / 3600.0)
    assert result.gpu_hours["training"]["inference"] > 0


def test_a_drain_that_waits_too_long_is_abandoned_and_the_fence_lifted() -> None:
    jobs = (SimJob("t1", "training", 0.0, 5000.0, 1), SimJob("t2", "training", 10.0, 60.0, 1))
    policy = PolicyConfig(max_lent_nodes=1, drain_wait_s=120, return_dwell_s=6 * TICK)
    result, engine = _run(_setup(pools=("training",), jobs=jobs, policy=policy))
    assert [d.kind for d in result.decisions[:2]] == ["lend", "return"]
    assert result.decisions[1].reason.startswith("drain wait over")
    assert result.decisions[1].at_s - result.decisions[0].at_s == pytest.approx(125.0)
    assert engine.fleet.runs["t1"].restarts == 0
    assert not engine.fleet.nodes[2].fenced


def test_gpu_hours_add_up_to_the_fleet() -> None:
    result, _ = _run(_setup(jobs=LONG))
    for pool, uses in result.gpu_hours.items():
        assert sum(uses.values()) == pytest.approx(2400.0 / 3600.0), pool
        assert min(uses.values()) >= 0.0


def test_skipping_quiet_ticks_changes_no_decision() -> None:
    setup = _setup(jobs=LONG)
    fast, _ = _run(setup)
    slow, _ = _run(replace(setup, always_decide=True))
    assert slow.decide_calls == slow.ticks > fast.decide_calls
    assert fast.decisions == slow.decisions
    a, b = fast.as_dict(), slow.as_dict()
    for d in (a, b):
        d.pop("wall_s")
        d.pop("decide_calls")
    assert a == b


def test_requeued_job_waits_for_slurms_requeue_delay() -> None:
    # two busy elastic nodes: e1 started last, so its node loses the least work; e0's
    # node frees up soon after, but e1 may start there only 121 s after its requeue
    jobs = (SimJob("e0", "elastic", 0.0, 400.0, 1), SimJob("e1", "elastic", 1.0, 5000.0, 1))
    setup = _setup(jobs=jobs, pools=("elastic",))
    spare = SimNode(3, "el1", "elastic", "elastic", 1)
    setup = replace(setup, nodes=[*setup.nodes, spare])
    result, engine = _run(setup)
    lend = result.decisions[0]
    e1 = engine.fleet.runs["e1"]
    preempted_at = lend.at_s + Timing().preempt_start_s
    assert e1.restarts == 1
    assert e1.started_at is not None
    assert e1.started_at >= preempted_at + 121.0
    assert e1.started_at <= preempted_at + 121.0 + TICK


def test_bad_setups_are_named() -> None:
    setup = _setup()
    with pytest.raises(ValueError, match="no arrivals for models busy"):
        Engine(replace(setup, arrivals=ArrivalSeries(TICK, {"other": np.zeros(3)})))
    with pytest.raises(ValueError, match="no service time"):
        Engine(replace(setup, service_s={}))
    typed = {
        m: s.model_copy(update={"gpu_type": "h100_1g.10gb"}) for m, s in Engine(setup).specs.items()
    }
    with pytest.raises(ValueError, match=r"does not model GPU types.*busy \(h100_1g.10gb\)"):
        Engine(replace(setup, models=typed))
    gpu_job = SimJob("x", "elastic", 0.0, 1.0, 1)
    with pytest.raises(ValueError, match="job x: no elastic nodes"):
        Engine(replace(setup, nodes=setup.nodes[:1] + setup.nodes[2:], jobs=[gpu_job]))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("policy", ["bridge", "idle-loan"])
def test_quiet_ticks_skip_no_decision_on_random_workloads(seed: int, policy: str) -> None:
    from bridge.sim.policies import Scenario, setup_for, size
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
        policy=PolicyConfig(return_dwell_s=6 * TICK, scale_in_cooldown_s=120, drain_wait_s=300),
    )
    setup = setup_for(policy, scenario, size(scenario))
    fast, _ = _run(setup)
    slow, _ = _run(replace(setup, always_decide=True))  # a Setup runs again from scratch
    assert fast.lends > 0, "the workload should make the policy lend"
    assert fast.decisions == slow.decisions
    assert fast.decide_calls < slow.decide_calls == slow.ticks


# ---- the lease lifecycle ---------------------------------------------------------------

S = LeaseState


def test_the_engine_refuses_a_move_the_table_forbids() -> None:
    engine = Engine(_setup())
    lease = SimLease.born(1, engine.nodes[1], "elastic", "preempt", ("busy",), 0.0)
    assert lease.state == S.SUBMITTED
    engine.now = 10.0
    # serving straight from submitted skips starting (Triton cannot be ready before its
    # job runs); draining a lease that never served; anything out of returned
    for new in (S.SERVING, S.DRAINING, S.REQUESTED):
        with pytest.raises(IllegalMove, match=f"lease 1: illegal lease move submitted -> {new}"):
            engine._move(lease, new)
    assert (lease.state, lease.updated_at, engine.moves) == (S.SUBMITTED, 0.0, {})
    for new in (S.STARTING, S.SERVING, S.DRAINING, S.RELEASING, S.RETURNED):
        engine._move(lease, new)
    assert lease.updated_at == 10.0
    with pytest.raises(IllegalMove, match="returned -> failed"):
        engine._move(lease, S.FAILED)
    assert sum(engine.moves.values()) == 5


#: the moves a simulated lease makes: the preempt/drain lend carried to serving and given
#: back, and a drain lend abandoned while its Triton job pends
SIM_MOVES = {
    (S.SUBMITTED, S.STARTING),
    (S.STARTING, S.SERVING),
    (S.SERVING, S.DRAINING),
    (S.DRAINING, S.RELEASING),
    (S.RELEASING, S.RETURNED),
    (S.SUBMITTED, S.RELEASING),
}


def test_every_move_of_simulated_runs_is_in_the_table() -> None:
    from bridge.sim.policies import Scenario, setup_for, size
    from bridge.sim.workload import synthetic_jobs, synthetic_series

    abandon = PolicyConfig(max_lent_nodes=1, drain_wait_s=120, return_dwell_s=6 * TICK)
    drain_jobs = (SimJob("t1", "training", 0.0, 5000.0, 1), SimJob("t2", "training", 10.0, 60.0, 1))
    horizon = 3 * 3600.0
    scenario = Scenario(
        nodes=24,
        gpus_per_node=8,
        arrivals=synthetic_series(
            {"a": 600.0, "b": 250.0}, horizon, bursts_per_day=24, burst_s=300, seed=4
        ),
        jobs=synthetic_jobs(horizon, 16 * 8, 0.9, seed=4),
        models={"a": (100.0, 20.0), "b": (150.0, 30.0)},
        horizon_s=horizon,
        policy=PolicyConfig(return_dwell_s=6 * TICK, scale_in_cooldown_s=120, drain_wait_s=300),
    )
    setups = [
        _setup(jobs=LONG),
        _setup(pools=("training",), jobs=(SimJob("t1", "training", 0.0, 500.0, 1),)),
        _setup(pools=("training",), jobs=drain_jobs, policy=abandon),
        setup_for("bridge", scenario, size(scenario)),
    ]
    seen: set[tuple[LeaseState, LeaseState]] = set()
    for setup in setups:
        result, engine = _run(setup)
        assert result.lends > 0
        for old, new in engine.moves:
            assert allowed(old, new), (setup.name, old, new)
        # every lend starts one lease's path (born submitted) and each lease left the
        # fleet through releasing -> returned, or is still open at the end
        out_of_submitted = engine.moves[S.SUBMITTED, S.STARTING]
        out_of_submitted += engine.moves[S.SUBMITTED, S.RELEASING]
        assert out_of_submitted <= result.lends
        assert engine.moves[S.RELEASING, S.RETURNED] + len(engine.leases) == result.lends
        seen |= set(engine.moves)
    assert seen == SIM_MOVES


def test_a_checkpointing_job_loses_only_the_work_since_its_checkpoint() -> None:
    """The elastic job has run about 300 s when its node is lent; checkpointing every
    120 s it loses only what it did since its last checkpoint, and resumes from there."""
    without, engine_without = _run(_setup(jobs=LONG))
    with_ckpt, engine_ckpt = _run(replace(_setup(jobs=LONG), checkpoint_s=120.0))
    lend = with_ckpt.decisions[0]
    ran = lend.at_s + Timing().preempt_start_s
    assert without.gpu_hours_lost == pytest.approx(ran / 3600.0, abs=1e-6)
    assert with_ckpt.gpu_hours_lost == pytest.approx((ran - ran // 120 * 120) / 3600.0, abs=1e-6)
    e1 = engine_ckpt.fleet.runs["e1"]
    assert e1.done_s == ran // 120 * 120 and e1.remaining_s == 5000.0 - e1.done_s
    assert engine_without.fleet.runs["e1"].done_s == 0.0
