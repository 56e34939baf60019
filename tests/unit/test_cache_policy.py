"""The policy's side of the node-local weight caches (issue 31) on literal snapshots with a
fixed clock: `choose_nodes` takes, within a cost rank, the nodes holding a lend's weights
first (idle and busy), never across ranks; the lend lead time counts each model at its
local load time on the node a lend would take and at its shared one elsewhere
(`bridge.policy.timing`); decide gives each lend the node holding its own models; the
defaults (no cache) change nothing."""

from __future__ import annotations

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import JobView, LeaseView, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy.decide import decide
from bridge.policy.nodes import choose_nodes, load_on
from bridge.policy.timing import lead_s, pool_lead_s, pool_slowest

NOW = 1_800_000_000.0

CONFIG = BridgeConfig(
    models={
        "a": ModelConfig(slo_p99_ms=100, max_replicas=8, instances=1),
        "b": ModelConfig(slo_p99_ms=100, max_replicas=8, instances=1),
    },
    pools={
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        "training": PoolConfig(partition="train", lend_mode="drain", cost_rank=2),
    },
    policy=PolicyConfig(max_lent_nodes=4, lend_lead_s=30, lend_lead_load_s=5, forecast_window_s=60),
)
MODELS = toml_models(CONFIG)
LOAD = {"a": 300.0, "b": 200.0}
LOCAL = {"a": 10.0, "b": 8.0}


def node(
    name: str,
    pool: str = "elastic",
    cached: frozenset[str] = frozenset(),
    jobs: tuple[JobView, ...] = (),
) -> NodeView:
    return NodeView(name, pool, True, 4, jobs, cached=cached)


def job(started: float) -> tuple[JobView, ...]:
    return (JobView("j", 4, started_at=started),)


def snap(
    *nodes: NodeView,
    local: dict[str, float] | None = None,
    leases: tuple[LeaseView, ...] = (),
    **kw: object,
) -> Snapshot:
    return Snapshot(
        nodes,
        (),
        {},
        leases,
        models=MODELS,
        load_s=LOAD,
        local_load_s=LOCAL if local is None else local,
        **kw,  # type: ignore[arg-type]
    )


def names(nodes: list[NodeView]) -> list[str]:
    return [n.name for n in nodes]


def test_an_idle_node_holding_the_weights_goes_first_within_its_rank_only() -> None:
    s = snap(
        node("e1"),
        node("e2", cached=frozenset({"a"})),
        node("e3", cached=frozenset({"a", "b"})),
        node("t1", "training", cached=frozenset({"a", "b"})),
    )
    assert names(choose_nodes(s, CONFIG, NOW, 4, models=("a", "b"))) == ["e3", "e2", "e1", "t1"]
    # a's lend: e2 and e3 load it at 10 s alike; the name decides between them
    assert names(choose_nodes(s, CONFIG, NOW, 2, models=("a",))) == ["e2", "e3"]
    # no models given, or no cache: by name, as before
    assert names(choose_nodes(s, CONFIG, NOW, 3)) == ["e1", "e2", "e3"]


def test_the_slowest_load_orders_and_then_the_models_held() -> None:
    # e1 holds b only: a still loads in 300 s, no sooner than on e2 which holds nothing
    # of the lend, but it holds more of it; e3's slowest is 10 s
    s = snap(node("e2"), node("e1", cached=frozenset({"b"})), node("e3", cached=frozenset("a")))
    assert names(choose_nodes(s, CONFIG, NOW, 3, models=("a", "b"))) == ["e3", "e1", "e2"]
    assert load_on(s.nodes[1], ("a", "b"), LOAD, LOCAL) == 300.0
    assert load_on(s.nodes[2], ("a", "b"), LOAD, LOCAL) == 200.0
    assert load_on(s.nodes[2], ("a",), LOAD, {}) == 300.0  # no local time known


def test_a_busy_node_holding_the_weights_goes_before_less_work_lost() -> None:
    s = snap(
        node("e1", jobs=job(NOW - 60)),
        node("e2", cached=frozenset({"a", "b"}), jobs=job(NOW - 3600)),
    )
    assert names(choose_nodes(s, CONFIG, NOW, 2, models=("a", "b"))) == ["e2", "e1"]
    # without the lend's models: the least work lost first, as before
    assert names(choose_nodes(s, CONFIG, NOW, 2)) == ["e1", "e2"]
    # an idle node without the weights still goes before a busy one with them
    s = snap(node("e1", jobs=job(NOW - 60)), node("e3"), node("e2", cached=frozenset("ab")))
    assert names(choose_nodes(s, CONFIG, NOW, 1, models=("a",))) == ["e2"]
    s = snap(node("e3"), node("e2", cached=frozenset("ab"), jobs=job(NOW - 60)))
    assert names(choose_nodes(s, CONFIG, NOW, 1, models=("a",))) == ["e3"]


def test_the_lead_time_counts_the_local_load_on_the_node_a_lend_would_take() -> None:
    shared = pool_lead_s(CONFIG, "elastic", {}, {}, 300.0)
    assert shared == 30 + 300 - 5
    assert lead_s(snap(node("e1")), CONFIG) == shared  # nothing cached: shared loads
    # the first idle elastic node holds both: a loads in 10 s there, the slowest
    warm = snap(node("e1", cached=frozenset({"a", "b"})), node("e2"))
    assert lead_s(warm, CONFIG) == 30 + 10 - 5
    assert pool_slowest(CONFIG, warm.nodes, (), ("a", "b"), LOAD, LOCAL) == {"elastic": 10.0}
    # holding a alone: b's shared 200 s is the slowest
    half = snap(node("e1", cached=frozenset({"a"})))
    assert lead_s(half, CONFIG) == 30 + 200 - 5
    # unknown local times: the shared ones, whatever the nodes hold
    assert lead_s(snap(node("e1", cached=frozenset({"a", "b"})), local={}), CONFIG) == shared


def test_the_lead_time_leaves_out_lent_reserved_and_unlendable_nodes() -> None:
    lease = LeaseView(1, "e1", "elastic", "preempt", "serving", ("a", "b"), NOW - 99, NOW - 9)
    lent = snap(node("e1", cached=frozenset({"a", "b"})), node("e2"), leases=(lease,))
    assert lead_s(lent, CONFIG) == 30 + 300 - 5
    infer = snap(node("i1", "inference", cached=frozenset({"a", "b"})), node("e2"))
    assert lead_s(infer, CONFIG) == 30 + 300 - 5
    # a busy preempt node counts when its pool has no idle one; a busy drain node never
    busy = snap(node("e1", cached=frozenset("ab"), jobs=job(NOW - 60)))
    assert lead_s(busy, CONFIG) == 30 + 10 - 5
    drain = snap(node("t1", "training", cached=frozenset("ab"), jobs=job(NOW - 60)))
    assert lead_s(drain, CONFIG) == 30 + 300 - 5


def test_a_measured_lend_holds_its_local_load() -> None:
    # lends measured at 45 s that held a 10 s local load: the next lend on a warm node
    # keeps 45 s, one on a cold node adds the shared load beyond what they held
    # (the training pool, without a node here, counts its shared loads: 45 + 300 - 10)
    measured = {"elastic": 45.0, "training": 45.0}
    held = {"elastic": 10.0, "training": 10.0}
    s = snap(node("e1", cached=frozenset({"a", "b"})), lend_s=measured, lend_load_s=held)
    s2 = snap(node("e1"), lend_s=measured, lend_load_s=held)
    assert lead_s(s, CONFIG) == 45.0
    assert lead_s(s2, CONFIG) == 45 + 300 - 10


def history(rate: float) -> tuple[ModelSample, ...]:
    return tuple(
        ModelSample(NOW - 5 * (12 - i), 60.0, rate, mean_ms=30.0, compute_ms=20.0)
        for i in range(13)
    )


def test_decide_gives_each_lend_the_node_holding_its_models() -> None:
    # b alone is late (a replica of one instance carries under 50 req/s), and the one
    # idle elastic node holding b takes its lend although e1 comes first by name
    s = Snapshot(
        (
            node("e1", cached=frozenset({"a"})),
            node("e2", cached=frozenset({"b"})),
            node("n0", "inference"),
        ),
        (ReplicaView("n0", ("a", "b"), gpus=4),),
        {"a": history(10.0), "b": history(120.0)},
        (),
        models=MODELS,
        load_s=LOAD,
        local_load_s=LOCAL,
    )
    lends = [a for a in decide(s, CONFIG, NOW) if a.__class__.__name__ == "Lend"]
    assert lends and {lend.node for lend in lends} >= {"e2"}
    first = lends[0]
    assert first.node == "e2" and first.models == ("b",)
    # the same world without caches lends e1 first, by name
    plain = Snapshot(
        (node("e1"), node("e2"), node("n0", "inference")),
        s.replicas,
        s.history,
        (),
        models=MODELS,
        load_s=LOAD,
    )
    first_plain = next(a for a in decide(plain, CONFIG, NOW) if a.__class__.__name__ == "Lend")
    assert first_plain.node == "e1"
