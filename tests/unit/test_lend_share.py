"""`[policy] max_lent_share` (the site's lend cap, a share of each lendable pool) on literal
snapshots: a lend past the share is refused, one within it made; the smaller of it and
`max_lent_nodes` wins; 1.0 (the default) caps nothing. And the simulator's `--lend-cap`:
its forms, the bridge set-up it makes, a bad value refused naming it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from bridge.cli import app
from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import LeaseView, Lend, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy import decide as policy_decide
from bridge.policy.nodes import choose_nodes, share_room
from bridge.sim.build import BadInput, build_scenario
from bridge.sim.engine import Engine
from bridge.sim.policies import Scenario, parse_lend_cap, setup_for, size
from bridge.sim.workload import ArrivalSeries

T0 = 1_800_000_000.0
TICK = 5.0
POOLS = {
    "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
    "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
    "training": PoolConfig(partition="train", lend_mode="drain", cost_rank=2),
}
#: one reserved node, four elastic, two training; all idle
NODES = (
    NodeView("r1", "inference", True, 4, has_triton=True),
    *(NodeView(f"e{i}", "elastic", True, 4) for i in range(1, 5)),
    NodeView("t1", "training", True, 4),
    NodeView("t2", "training", True, 4),
)
#: a sustained breach of `busy` (p99 over its 100 ms SLO three ticks running)
BREACH = tuple(
    ModelSample(T0 - (2 - i) * TICK, p, 10.0, 0.0, p / 2) for i, p in enumerate((150, 160, 170))
)


def config(
    share: float = 1.0, max_lent: int = 10, pools: dict[str, PoolConfig] = POOLS
) -> BridgeConfig:
    return BridgeConfig(
        pools=pools,
        models={"busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=20)},
        policy=PolicyConfig(max_lent_nodes=max_lent, max_lent_share=share, return_dwell_s=20),
    )


def lease(i: int, node: str, pool: str = "elastic", state: str = "serving") -> LeaseView:
    mode = "preempt" if pool == "elastic" else "drain"
    return LeaseView(i, node, pool, mode, state, ("busy",), T0 - 700, T0 - 600)


def snap(leases: tuple[LeaseView, ...] = (), nodes: tuple[NodeView, ...] = NODES) -> Snapshot:
    replicas = (
        ReplicaView("r1", ("busy",)),
        *(ReplicaView(x.node, ("busy",), x.id) for x in leases),
    )
    return Snapshot(nodes, replicas, {"busy": BREACH}, leases, {})


def lends(s: Snapshot, cfg: BridgeConfig) -> list[Lend]:
    actions = policy_decide(replace(s, models=toml_models(cfg)), cfg, T0)
    return [a for a in actions if isinstance(a, Lend)]


def test_the_default_share_caps_nothing_and_keeps_max_lent_nodes() -> None:
    assert PolicyConfig().max_lent_share == 1.0
    assert share_room(snap(), config()) is None
    assert [n.name for n in choose_nodes(snap(), config(), T0, 6)] == [
        "e1", "e2", "e3", "e4", "t1", "t2",
    ]  # fmt: skip


def test_a_lend_past_the_pools_share_is_refused() -> None:
    """Half of four elastic nodes: two lent already, so no elastic node goes (and the
    idle training nodes are the training pool's own half)."""
    cfg = config(share=0.5, pools={k: v for k, v in POOLS.items() if k != "training"})
    nodes = tuple(n for n in NODES if n.pool != "training")
    held = (lease(1, "e1"), lease(2, "e2"))
    assert share_room(snap(held, nodes), cfg) == {"elastic": 0}
    assert lends(snap(held, nodes), cfg) == []
    assert choose_nodes(snap(held, nodes), cfg, T0, 1) == []


def test_a_lend_within_the_share_is_made() -> None:
    cfg = config(share=0.5, pools={k: v for k, v in POOLS.items() if k != "training"})
    nodes = tuple(n for n in NODES if n.pool != "training")
    (a,) = lends(snap((lease(1, "e1"),), nodes), cfg)
    assert (a.node, a.pool) == ("e2", "elastic")


def test_each_pool_is_capped_apart() -> None:
    """0.5 of 4 elastic and of 2 training nodes: two elastic, then one training node."""
    picked = choose_nodes(snap(), config(share=0.5), T0, 6)
    assert [n.name for n in picked] == ["e1", "e2", "t1"]
    # a lease in the training pool takes the training pool's one, not an elastic one
    picked = choose_nodes(snap((lease(1, "t2", "training"),)), config(share=0.5), T0, 6)
    assert [n.name for n in picked] == ["e1", "e2"]


def test_the_smaller_of_the_share_and_max_lent_nodes_wins() -> None:
    assert [n.name for n in choose_nodes(snap(), config(share=0.5), T0, 1)] == ["e1"]
    # max_lent_nodes 1 below the share's 3: one slot
    (a,) = lends(snap(), config(share=0.5, max_lent=1))
    assert a.node == "e1"
    assert lends(snap((lease(1, "e1"),)), config(share=0.5, max_lent=1)) == []


def test_a_lease_returned_this_tick_frees_its_share() -> None:
    cfg = config(share=0.5)
    held = (lease(1, "e1"), lease(2, "e2"))
    assert share_room(snap(held), cfg, freed={1}) == {"elastic": 1, "training": 1}
    assert [n.name for n in choose_nodes(snap(held), cfg, T0, 1, freed=frozenset({1}))] == ["e3"]


def test_the_share_rounds_down_exactly() -> None:
    nodes = tuple(NodeView(f"e{i}", "elastic", True, 4) for i in range(100))
    pools = {k: v for k, v in POOLS.items() if k != "training"}
    assert share_room(snap(nodes=nodes), config(share=0.29, pools=pools)) == {"elastic": 29}
    assert share_room(snap(nodes=nodes[:3]), config(share=0.5, pools=pools)) == {"elastic": 1}


def test_a_pools_own_share_wins_and_zero_never_lends() -> None:
    """[policy] 0.5 for every pool; training's own 0: only the elastic half goes."""
    pools = dict(POOLS, training=POOLS["training"].model_copy(update={"max_lent_share": 0.0}))
    cfg = config(share=0.5, pools=pools)
    assert share_room(snap(), cfg) == {"elastic": 2, "training": 0}
    assert [n.name for n in choose_nodes(snap(), cfg, T0, 6)] == ["e1", "e2"]
    # elastic's own 1.0 under a [policy] 0.5: elastic uncapped, training at its half
    pools = dict(POOLS, elastic=POOLS["elastic"].model_copy(update={"max_lent_share": 1.0}))
    cfg = config(share=0.5, pools=pools)
    assert share_room(snap(), cfg) == {"training": 1}
    assert [n.name for n in choose_nodes(snap(), cfg, T0, 6)] == ["e1", "e2", "e3", "e4", "t1"]


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_a_share_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match="max_lent_share"):
        PolicyConfig(max_lent_share=bad)
    with pytest.raises(ValidationError, match="max_lent_share"):
        PoolConfig(partition="elastic", lend_mode="preempt", max_lent_share=bad)


# -- the simulator's --lend-cap -------------------------------------------------------------


def test_parse_lend_cap() -> None:
    assert parse_lend_cap("peak") == ("peak", 0.0)
    assert parse_lend_cap("share:0.5") == ("share", 0.5)
    assert parse_lend_cap("share:1") == ("share", 1.0)
    assert parse_lend_cap("12") == ("nodes", 12.0)
    for bad in ("share:0", "share:1.5", "share:x", "share:nan", "half", "-3", ""):
        with pytest.raises(ValueError, match="lend cap"):
            parse_lend_cap(bad)


def _scenario(cap: str) -> Scenario:
    series = ArrivalSeries(step_s=60.0, rates={"m": [100.0] * 60 + [400.0] * 5})
    return Scenario(
        nodes=40, gpus_per_node=8, arrivals=series, jobs=[], models={"m": (100.0, 20.0)},
        horizon_s=3900.0, lend_cap=cap,
    )  # fmt: skip


def test_the_bridge_setup_takes_its_cap_from_lend_cap() -> None:
    peak = _scenario("peak")
    sizing = size(peak)
    lendable = sizing.peak_nodes - sizing.reserved_nodes
    assert lendable >= 1
    today = setup_for("bridge", peak, sizing).config.policy
    assert (today.max_lent_nodes, today.max_lent_share) == (lendable, 1.0)
    shared = setup_for("bridge", _scenario("share:0.5"), sizing)
    elastic = [n for n in shared.nodes if n.pool == "elastic"]
    assert shared.config.policy.max_lent_nodes == len(elastic) > lendable
    assert shared.config.policy.max_lent_share == 0.5
    assert shared.config.pools["training"].max_lent_share == 0.0  # training is not lent
    assert setup_for("bridge", _scenario("7"), sizing).config.policy.max_lent_nodes == 7
    # the separate set-up lends nothing whatever the cap
    assert (
        setup_for("separate-peak", _scenario("share:1"), sizing).config.policy.max_lent_nodes == 0
    )


def test_a_bad_lend_cap_is_refused_naming_it() -> None:
    with pytest.raises(BadInput, match="--lend-cap 'share:2'"):
        build_scenario(
            days=0.01, nodes=16, gpus_per_node=8, rates={"m0": 10.0}, slo_ms=100.0,
            service_ms=20.0, arrivals="synthetic", arrivals_trace=None, jobs="synthetic",
            jobs_trace=None, load=0.5, policies=["bridge"], lend_cap="share:2",
        )  # fmt: skip
    res = CliRunner().invoke(
        app,
        ["simulate", "--days", "0.01", "--nodes", "16", "--lend-cap", "lots", "--tradeoff", "none"],
    )
    assert res.exit_code == 2 and "--lend-cap 'lots'" in res.output


def test_a_share_capped_run_is_the_same_with_and_without_the_quiet_proof() -> None:
    """`assess` reads no nodes (the cap is held in `choose_nodes`): the quiet-tick proof
    stays exact under a share, and the run never holds more than the share lent."""
    scenario = _scenario("share:0.5")
    setup = setup_for("bridge", scenario, size(scenario))
    elastic = sum(1 for n in setup.nodes if n.pool == "elastic")
    proven = Engine(replace(setup, check_quiet=True)).run()
    plain = Engine(replace(setup, prove_quiet=False)).run()
    assert proven.within_share == plain.within_share and proven.lends == plain.lends
    assert proven.lends > 0
    assert max(proven.series["lent_nodes"]) <= elastic // 2


def test_leases_that_share_a_node_count_it_once() -> None:
    """Two leases of some GPUs of e1 (an operator's, sharing it on two port slots) hold
    one node of the pool's share and one of `max_lent_nodes`, not two."""
    shared = (
        replace(lease(1, "e1"), lent_gpus=1),
        replace(lease(2, "e1"), lent_gpus=2, slot=1),
    )
    cfg = config(share=0.5)  # 4 elastic nodes: 2 may be lent
    assert share_room(snap(shared), cfg) == {"elastic": 1, "training": 1}
    # max_lent_nodes 2: e1 is one node, so one more lend is made
    assert len(lends(snap(shared), config(max_lent=2))) == 1
