"""The per-GPU ranking of sized lends (`[policy] lend_ranking = "per_gpu"`,
`nodes.choose_sized`), its charge a lease (`lease_cost_gpu_s`), and lends beside a node's
partial leases on a sustained breach (`shared_lends`, `nodes.choose_beside`, `decide`).
Literal nodes, leases and samples; a fixed clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.modelfacts import toml_models
from bridge.policy import JobView, LeaseView, Lend, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy import decide as policy_decide
from bridge.policy.nodes import choose_beside, choose_sized

NOW = 1_800_000_000.0
HOUR = 3600.0

PER_GPU = PolicyConfig(
    max_lent_nodes=8,
    preempt_guard_s=600,
    capacity_headroom=1.0,
    sized_lends=True,
    lend_ranking="per_gpu",
)
POOLS = {
    "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
    "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
    "training": PoolConfig(partition="train", lend_mode="drain", cost_rank=2),
}
MODELS = {"a": ModelConfig(slo_p99_ms=100, max_replicas=8, instance_gpus=1)}


def config(**policy: object) -> BridgeConfig:
    return BridgeConfig(pools=POOLS, models=MODELS, policy=PER_GPU.model_copy(update=policy))


def jobs(prefix: str, count: int, gpus: int, age_s: float) -> tuple[JobView, ...]:
    return tuple(JobView(f"{prefix}{i}", gpus, NOW - age_s) for i in range(count))


#: three 2-GPU jobs an hour old: 2 GPUs free, the rest by requeueing
BUSY = NodeView("e1", "elastic", True, 8, jobs("b", 3, 2, HOUR))
IDLE = NodeView("e2", "elastic", True, 8)
#: eight 1-GPU jobs a minute old: nothing free, cheap victims
YOUNG = NodeView("e3", "elastic", True, 8, jobs("y", 8, 1, 60.0))
RESERVED = NodeView("r1", "inference", True, 8, has_triton=True, triton_gpus=8)


def snapshot(*nodes: NodeView, leases: tuple[LeaseView, ...] = ()) -> Snapshot:
    return Snapshot((*nodes, RESERVED), (ReplicaView("r1", ("a",), gpus=8),), {}, leases)


def picked(got: list[tuple[NodeView, int]]) -> list[tuple[str, int]]:
    return [(node.name, gpus) for node, gpus in got]


# ---- the ranking ------------------------------------------------------------------------


def test_free_gpus_go_before_any_victim_and_an_idle_node_whole_first() -> None:
    # the planned 8 GPUs: e2 whole (idle: nothing lost), then e1's 2 free GPUs, not e1's
    # 8 at three hour-old jobs' cost
    got = choose_sized(snapshot(BUSY, IDLE), config(), NOW, 2, gpus=8, step=1)
    assert picked(got) == [("e2", 8), ("e1", 2)]
    # the largest ranking takes e1's planned 8, requeueing its jobs
    largest = config(lend_ranking="largest")
    got = choose_sized(snapshot(BUSY, IDLE), largest, NOW, 2, gpus=8, step=1)
    assert picked(got) == [("e2", 8), ("e1", 8)]


def test_victims_are_ranked_by_the_work_they_lose_per_gpu_lent() -> None:
    # replicas of 4 GPUs: e1's 4 lose one 2-GPU job's hour (1,800 GPU-s a GPU); e3's 4
    # lose four minute-old jobs (60 GPU-s a GPU): e3 goes first
    got = choose_sized(snapshot(BUSY, YOUNG), config(), NOW, 1, gpus=4, step=4)
    assert picked(got) == [("e3", 4)]
    # replicas of 2: e1's free 2 GPUs cost nothing and go before e3's victims
    got = choose_sized(snapshot(BUSY, YOUNG), config(), NOW, 2, gpus=4, step=2)
    assert picked(got) == [("e1", 2), ("e3", 4)]


def test_a_charge_a_lease_ranks_larger_leases_before_many_small_ones() -> None:
    # e1: 2 free GPUs (no work lost) or 4 at one hour-old 2-GPU job (7,200 GPU-s).
    # Charged 14,400 GPU-s a lease, 2 GPUs cost 7,200 a GPU, 4 cost 5,400: the 4 go
    got = choose_sized(snapshot(BUSY), config(lease_cost_gpu_s=14_400), NOW, 1, gpus=4, step=2)
    assert picked(got) == [("e1", 4)]
    got = choose_sized(snapshot(BUSY), config(), NOW, 1, gpus=4, step=2)
    assert picked(got) == [("e1", 2)]


def test_the_hours_budget_and_the_guard_are_kept() -> None:
    # a budget of two requeues: e3's 4 GPUs would take four of its jobs; e3 gives 2
    tight = config(max_preemptions_per_hour=2)
    got = choose_sized(snapshot(YOUNG), tight, NOW, 1, gpus=4, step=1)
    assert picked(got) == [("e3", 2)]
    # a job requeued within the guard is never a victim: the node gives what is left
    guarded = replace(
        YOUNG, jobs=tuple(replace(j, restarts=1, submitted_at=NOW - 60) for j in YOUNG.jobs)
    )
    assert choose_sized(snapshot(guarded), config(), NOW, 1, gpus=4, step=1) == []


def test_the_options_that_would_do_nothing_are_refused() -> None:
    with pytest.raises(ValidationError, match="needs partial_lends and sized_lends"):
        PolicyConfig(lend_ranking="per_gpu")
    with pytest.raises(ValidationError, match="need lend_ranking 'per_gpu'"):
        PolicyConfig(shared_lends=True)
    with pytest.raises(ValidationError, match="need lend_ranking 'per_gpu'"):
        PolicyConfig(lease_cost_gpu_s=600.0)


# ---- lends beside a node's leases -------------------------------------------------------


def lease(
    lease_id: int, node: str, gpus: int | None, *, state: str = "serving", mode: str = "preempt"
) -> LeaseView:
    return LeaseView(
        lease_id, node, "elastic", mode, state, ("a",), NOW - HOUR, gpus=8, lent_gpus=gpus
    )


#: e1 with a 2-GPU lease serving on its 2 free GPUs: its jobs hold the other 6
LENT = replace(BUSY, has_triton=True, triton_gpus=2)


def test_a_node_whose_leases_each_hold_some_of_its_gpus_is_lent_beside_them() -> None:
    got = choose_beside(
        snapshot(LENT, leases=(lease(1, "e1", 2),)), config(), NOW, 1, gpus=4, step=2
    )
    assert picked(got) == [("e1", 4)]
    # the planned 8 is more than the 6 no lease holds: the 6
    got = choose_beside(
        snapshot(LENT, leases=(lease(1, "e1", 2),)), config(), NOW, 1, gpus=8, step=2
    )
    assert picked(got) == [("e1", 6)]
    # in steps of one replica: 4-GPU replicas get 4 of the 6
    got = choose_beside(
        snapshot(LENT, leases=(lease(1, "e1", 2),)), config(), NOW, 1, gpus=8, step=4
    )
    assert picked(got) == [("e1", 4)]


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(lease(1, "e1", None), id="a whole-node lease"),
        pytest.param(lease(1, "e1", 2, state="submitted"), id="a lease not yet serving"),
        pytest.param(lease(1, "e1", 2, mode="drain"), id="a drain lease"),
        pytest.param(replace(lease(1, "e1", 2), members=("e9",)), id="a gang"),
    ],
)
def test_no_lend_beside_a_lease_that_does_not_share_its_node(held: LeaseView) -> None:
    assert choose_beside(snapshot(LENT, leases=(held,)), config(), NOW, 1, gpus=2, step=2) == []


def test_a_node_without_a_lease_or_in_taken_is_not_lent_beside() -> None:
    assert choose_beside(snapshot(BUSY), config(), NOW, 1, gpus=2, step=2) == []
    snap = snapshot(LENT, leases=(lease(1, "e1", 2),))
    assert choose_beside(snap, config(), NOW, 1, gpus=2, step=2, taken=frozenset({"e1"})) == []
    # two leases hold 4 and 4: nothing left
    full = snapshot(LENT, leases=(lease(1, "e1", 4), lease(2, "e1", 4)))
    assert choose_beside(full, config(), NOW, 1, gpus=2, step=1) == []


# ---- decide: a lend beside the leases only on a sustained breach -------------------------


def samples(p99_ms: float, rate: float = 450.0) -> tuple[ModelSample, ...]:
    """A minute of samples at `rate` req/s, 20 ms of compute each, p99 at `p99_ms`."""
    return tuple(
        ModelSample(NOW - 5.0 * i, p99_ms, rate, 0.0, 60.0, 20.0) for i in range(12, -1, -1)
    )


@pytest.mark.parametrize(("p99_ms", "beside"), [(90.0, False), (150.0, True)])
def test_decide_lends_beside_the_leases_only_on_a_sustained_breach(
    p99_ms: float, beside: bool
) -> None:
    # the only elastic node holds a 1-GPU lease of a's; the baseline's 8 GPUs fall short
    # of 450 req/s. Within the SLO the lend waits; in a sustained breach it is made
    # beside the lease, of some of the GPUs no lease holds
    cfg = config(shared_lends=True)
    node = replace(BUSY, has_triton=True, triton_gpus=1, jobs=jobs("b", 3, 2, HOUR))
    snap = replace(
        snapshot(node, leases=(lease(1, "e1", 1),)),
        replicas=(ReplicaView("r1", ("a",), gpus=8), ReplicaView("e1", ("a",), 1, gpus=1)),
        history={"a": samples(p99_ms)},
        models=toml_models(cfg),
    )
    lends = [a for a in policy_decide(snap, cfg, NOW) if isinstance(a, Lend)]
    if not beside:
        assert lends == []
        return
    (lend,) = lends
    assert lend.node == "e1" and lend.gpus is not None and 1 <= lend.gpus <= 7
    # without shared_lends the breach is the backstop's, which finds no node either
    assert [a for a in policy_decide(snap, config(), NOW) if isinstance(a, Lend)] == []


def test_decide_lends_a_gangs_small_models_apart_with_the_per_gpu_ranking() -> None:
    # a (1 GPU) and g (a 16-GPU gang) both late, one elastic node: a lend of both would
    # be g's gang of two whole nodes, which the pool cannot give. With the per-GPU ranking
    # a is lent GPUs of its own on e1; with the default ranking the pair waits for a gang
    models = {**MODELS, "g": ModelConfig(slo_p99_ms=100, max_replicas=8, tensor_parallel=16)}

    def lends(cfg: BridgeConfig) -> list[Lend]:
        snap = replace(
            snapshot(BUSY),
            replicas=(ReplicaView("r1", ("a", "g"), gpus=8),),
            history={"a": samples(150.0), "g": samples(150.0)},
            models=toml_models(cfg),
        )
        return [a for a in policy_decide(snap, cfg, NOW) if isinstance(a, Lend)]

    per_gpu = BridgeConfig(pools=POOLS, models=models, policy=PER_GPU)
    (lend,) = lends(per_gpu)
    assert lend.node == "e1" and lend.models == ("a",)
    assert lend.gpus is not None and 1 <= lend.gpus < 8
    largest = per_gpu.model_copy(
        update={"policy": PER_GPU.model_copy(update={"lend_ranking": "largest"})}
    )
    assert all(lend.models != ("a",) for lend in lends(largest))
