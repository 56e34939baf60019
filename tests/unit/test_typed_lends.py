"""Lends of GPUs of one type, MIG slices (issue 32): a model's `gpu_type` makes its lend
ask `--gres=gpu:<type>:k` of a node with that many of the type free, requeueing nothing.
Literal gres strings, nodes, leases and configs; a fixed clock."""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.advise.advisory import key_figures
from bridge.config import BridgeConfig, ModelConfig, ModelOverride, PolicyConfig, PoolConfig
from bridge.daemon.observation import Observation, snapshot
from bridge.daemon.planner import operator_typed, victims_of
from bridge.lifecycle import LeaseState
from bridge.modelfacts import Published, merge_models, toml_models
from bridge.policy import JobView, Lend, ModelSample, NodeView, ReplicaView, Snapshot, decide
from bridge.policy.gang import replica_gpus
from bridge.policy.leasesync import LeaseWorld, Settings, sync_lease
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Submit
from bridge.policy.typed import choose_typed, lend_type, typed_victims, typed_view
from bridge.policy.weights import (
    CachedCopy,
    NodeCache,
    Wanted,
    lend_places,
    plan_cache,
)
from bridge.slurm.model import Job, JobSpec, Node
from bridge.slurm.parse import gpu_types_of
from bridge.slurm.scontrol import parse_nodes
from bridge.slurm.slices import free_gpu_types

DATA = Path(__file__).parent.parent / "data" / "slurm"
NOW = 1_800_000_000.0
ONE, TWO, FOUR = "h100_1g.10gb", "h100_2g.20gb", "h100_4g.40gb"
MIG_GRES = f"gpu:{FOUR}:1,gpu:{TWO}:1,gpu:{ONE}:2"


# ---- free slices from Slurm's strings ---------------------------------------------------


def test_free_slices_are_the_configured_less_the_allocated_of_each_type() -> None:
    used = f"cpu=2,mem=2G,gres/gpu=2,gres/gpu:{FOUR}=1,gres/gpu:{ONE}=1"
    assert free_gpu_types(MIG_GRES, used) == {FOUR: 0, TWO: 1, ONE: 1}
    assert free_gpu_types(MIG_GRES, "") == {FOUR: 1, TWO: 1, ONE: 2}
    # an untyped node lists no type; a typed whole-GPU node lists its type
    assert free_gpu_types("gpu:4", "gres/gpu=1") == {}
    assert free_gpu_types("gpu:h100:4(S:0-1)", "gres/gpu=3,gres/gpu:h100=3") == {"h100": 1}


def test_the_lab_nodes_scontrol_line_gives_its_free_slices() -> None:
    # recorded on the --mig lab (Slurm 22.05.8), a job on the 4g slice: AllocTRES names
    # the type of what it holds
    (node,) = parse_nodes((DATA / "scontrol-node-mig-22.05.txt").read_text())
    assert node.gpus == 3 and node.gpus_alloc == 1 and node.partitions == ("mig",)
    assert free_gpu_types(node.gres, node.alloc_tres) == {FOUR: 0, TWO: 1, ONE: 1}


def test_the_pyslurm_backend_gives_a_jobs_allocated_slices_as_slurm_prints_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyslurm is not installed here: its `Job.allocated_tres` is given in the shape of
    pyslurm 25.11.2's `TrackableResources` (a `gres` dict of `GPU` and `TrackableResource`
    objects, each with `type_and_name` and `count`), the backend imported beside a stand-in
    module, and dropped again so no other test sees it."""
    monkeypatch.setitem(sys.modules, "pyslurm", types.ModuleType("pyslurm"))
    try:
        from bridge.slurm.pyslurm_backend import _job_gres_tres
    finally:
        sys.modules.pop("bridge.slurm.pyslurm_backend", None)
        monkeypatch.delattr("bridge.slurm.pyslurm_backend", raising=False)

    def res(type_and_name: str, count: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(type_and_name=type_and_name, count=count)

    gres = {"gpu": res("gres/gpu", 2), f"gpu:{ONE}": res(f"gres/gpu:{ONE}", 2),
            "shard": res("gres/shard", 4)}  # fmt: skip
    tres = _job_gres_tres(types.SimpleNamespace(gres=gres))
    assert tres == f"gres/gpu=2,gres/gpu:{ONE}=2,gres/shard=4"
    assert gpu_types_of(tres) == {ONE: 2}
    assert _job_gres_tres(None) == ""  # a job that holds none


# ---- the model's fact and the job's gres ------------------------------------------------


def test_a_models_gpu_type_is_checked_and_merged_from_the_repository_or_the_toml() -> None:
    with pytest.raises(ValidationError, match="gpu_type"):
        ModelConfig(slo_p99_ms=100, gpu_type="h100:1g")
    merged = merge_models(
        {"a": Published(slo_p99_ms=100, gpu_type=ONE), "b": Published(slo_p99_ms=100)},
        {"b": ModelOverride(gpu_type=TWO)},
    )
    assert merged.scaled["a"].gpu_type == ONE and merged.facts["a"].source_of("gpu_type") == (
        "repository"
    )
    assert merged.scaled["b"].gpu_type == TWO and merged.facts["b"].source_of("gpu_type") == "toml"
    # a typed model that says no size takes one of its type; an untyped one whole nodes
    assert replica_gpus(merged.scaled["a"]) == 1
    assert replica_gpus(ModelConfig(slo_p99_ms=100)) is None
    models = {"a": merged.scaled["a"], "c": ModelConfig(slo_p99_ms=100)}
    assert lend_type(models, ["c", "a"]) == ONE and lend_type(models, ["c"]) is None


def test_the_job_asks_for_gpus_of_its_type() -> None:
    spec = JobSpec(partition="mig", account="bridge", wrap="true", gpus_per_node=1, gpu_type=ONE)
    assert spec.gres == f"gpu:{ONE}:1"
    assert JobSpec(partition="p", account="a", wrap="t", gpus_per_node=2).gres == "gpu:2"
    with pytest.raises(ValueError, match="gpu_type"):
        JobSpec(partition="p", account="a", wrap="t", gpu_type=ONE)


# ---- the node choice and the lend -------------------------------------------------------

CONFIG = BridgeConfig(
    pools={
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        "mig": PoolConfig(partition="mig", lend_mode="preempt", cost_rank=2),
    },
    models={
        "small": ModelOverride(slo_p99_ms=100, max_replicas=4, gpu_type=ONE),
        "big": ModelOverride(slo_p99_ms=100, max_replicas=4),
    },
    policy=PolicyConfig(max_lent_nodes=4, capacity_headroom=1.0),
)
#: an elastic node with no slices, and two MIG nodes: one with one 1g slice free (its
#: other slices busy with a job), one with two
ELASTIC = NodeView("e1", "elastic", True, 4)
JOB = JobView("j1", 2, NOW - 3600)
M1 = NodeView("m1", "mig", True, 4, (JOB,), free_types=((FOUR, 0), (ONE, 1), (TWO, 0)))
M2 = NodeView("m2", "mig", True, 4, free_types=((FOUR, 1), (ONE, 2), (TWO, 1)))
RESERVED = NodeView("r1", "inference", True, 4, has_triton=True, triton_gpus=4)


def test_a_typed_lend_takes_a_node_with_the_type_free_the_fewest_free_first() -> None:
    snap = Snapshot((ELASTIC, M1, M2, RESERVED), (), {}, ())
    got = choose_typed(snap, CONFIG, NOW, 3, gpu_type=ONE, gpus=1)
    assert [n.name for n in got] == ["m1", "m2"]  # e1 has no slices; m1 keeps m2's two
    assert [n.name for n in choose_typed(snap, CONFIG, NOW, 3, gpu_type=ONE, gpus=2)] == ["m2"]
    assert choose_typed(snap, CONFIG, NOW, 3, gpu_type=TWO, gpus=1, taken={"m2"}) == []
    leased = LeaseView(1, "m1", "mig", "preempt", LeaseState.SERVING, ("small",), NOW)
    assert [
        n.name
        for n in choose_typed(replace(snap, leases=(leased,)), CONFIG, NOW, 3, gpu_type=ONE, gpus=1)
    ] == ["m2"]
    with pytest.raises(ValueError):
        choose_typed(snap, CONFIG, NOW, 1, gpu_type=ONE, gpus=0)


#: a MIG node whose 1g slice a job holds (an hour old), its 4g one another (younger)
HOLDER = JobView("j1g", 1, NOW - 3600, gpu_types=((ONE, 1),))
FOUR_JOB = JobView("j4g", 1, NOW - 60, gpu_types=((FOUR, 1),))
M3 = NodeView("m3", "mig", True, 3, (HOLDER, FOUR_JOB), free_types=((FOUR, 0), (ONE, 0), (TWO, 1)))


def test_a_typed_lend_requeues_only_the_jobs_holding_its_type_after_free_nodes() -> None:
    view = typed_view(M3, ONE)
    assert (view.gpus, [j.job_id for j in view.jobs], view.jobs[0].held_here) == (1, ["j1g"], 1)
    snap = Snapshot((M3, M2, RESERVED), (), {}, ())
    # the free slices first; then the node whose job on the 1g slice is requeued
    assert [n.name for n in choose_typed(snap, CONFIG, NOW, 2, gpu_type=ONE, gpus=1)] == [
        "m2",
        "m3",
    ]
    assert typed_victims(M3, ONE, 1, NOW, CONFIG.policy) == 1
    assert typed_victims(M3, TWO, 1, NOW, CONFIG.policy) == 0  # free: none
    # none where the holder is guarded (requeued within the guard), the budget is spent,
    # or the pool lends by drain
    guarded = replace(M3, jobs=(replace(HOLDER, restarts=1, submitted_at=NOW - 60), FOUR_JOB))
    alone = Snapshot((guarded, RESERVED), (), {}, ())
    assert choose_typed(alone, CONFIG, NOW, 1, gpu_type=ONE, gpus=1) == []
    spent = Snapshot((M3, RESERVED), (), {}, (), preemptions_last_hour=10**6)
    assert choose_typed(spent, CONFIG, NOW, 1, gpu_type=ONE, gpus=1) == []
    drain = CONFIG.model_copy(
        update={
            "pools": {
                **CONFIG.pools,
                "mig": PoolConfig(partition="mig", lend_mode="drain", cost_rank=2),
            }
        }
    )
    assert (
        choose_typed(Snapshot((M3, RESERVED), (), {}, ()), drain, NOW, 1, gpu_type=ONE, gpus=1)
        == []
    )


def test_the_planner_requeues_the_job_on_the_slice_not_the_one_an_untyped_lend_would() -> None:
    mig = Node(
        "m3", "10.0.0.3", ("mig",), "mixed", frozenset(), "", FOUR, 3, 2,
        gres=f"gpu:{FOUR}:1,gpu:{TWO}:1,gpu:{ONE}:1",
        alloc_tres=f"cpu=2,gres/gpu=2,gres/gpu:{FOUR}=1,gres/gpu:{ONE}=1",
    )  # fmt: skip
    started = datetime.fromtimestamp(NOW - 3600, UTC)

    def job(job_id: str, held: str) -> Job:
        return Job(
            job_id, "w", "mig", "team", "u", "RUNNING", "None", ("m3",), "", 1, 0,
            started, started, alloc_tres=f"cpu=1,gres/gpu=1,gres/gpu:{held}=1",
        )  # fmt: skip

    obs = Observation(
        NOW,
        {"m3": mig},
        (job("40", FOUR), job("10", ONE)),
        frozenset(),
        (),
        {},
        models=merge_models(None, CONFIG.models),
    )
    typed = LeaseView(
        7, "m3", "mig", "preempt", LeaseState.REQUESTED, ("small",), NOW, lent_gpus=1, gpu_type=ONE
    )
    assert victims_of(typed, obs, Settings()) == ("10",)
    # a lend of any GPU takes the free 2g slice: none requeued
    assert victims_of(replace(typed, gpu_type=None), obs, Settings()) == ()
    # and the operator's lend of the 2g type, free, or the 1g one, held: both lent
    assert operator_typed("m3", ["small"], "preempt", obs) == (ONE, 1)
    assert operator_typed("m3", ["small"], "drain", obs) == (
        f"refused: a replica of small takes 1 GPU(s) of type {ONE}; node m3 has 0 of them free"
    )
    # the policy's snapshot reads the types where a model is lent by type, else not
    (view,) = snapshot(obs, CONFIG, [], {}).nodes
    assert dict(view.free_types) == {ONE: 0, TWO: 1, FOUR: 0}
    assert {j.job_id: j.gpu_types for j in view.jobs} == {"40": ((FOUR, 1),), "10": ((ONE, 1),)}
    untyped = {"big": CONFIG.models["big"]}
    plain = replace(obs, models=merge_models(None, untyped))
    (view,) = snapshot(plain, CONFIG.model_copy(update={"models": untyped}), [], {}).nodes
    assert view.free_types == () and all(j.gpu_types == () for j in view.jobs)


def samples(rate: float) -> tuple[ModelSample, ...]:
    """A minute of samples at `rate` req/s, 20 ms of compute each, p99 over the SLO."""
    return tuple(
        ModelSample(NOW - 5.0 * i, 150.0, rate, 5.0, 120.0, 20.0) for i in range(12, -1, -1)
    )


def test_decide_lends_a_typed_model_a_slice_of_its_type_free_or_held_by_a_job() -> None:
    snap = Snapshot(
        (ELASTIC, M1, RESERVED),
        (ReplicaView("r1", ("small", "big"), gpus=1),),
        {"small": samples(120.0)},
        (),
        models=toml_models(CONFIG),
    )
    lends = [a for a in decide(snap, CONFIG, NOW) if isinstance(a, Lend)]
    assert lends, "the typed model over its objective is lent for"
    (lend,) = lends
    assert (lend.node, lend.gpus, lend.gpu_type, lend.models) == ("m1", 1, ONE, ("small",))
    # with no slice of its type free nothing is lent for it: not a whole elastic node
    none_free = replace(snap, nodes=(ELASTIC, replace(M1, free_types=((ONE, 0),)), RESERVED))
    assert [a for a in decide(none_free, CONFIG, NOW) if isinstance(a, Lend)] == []
    # where a job holds one on a preempt-mode node, that node is lent (its job requeued)
    held = replace(snap, nodes=(ELASTIC, M3, RESERVED))
    (lend,) = [a for a in decide(held, CONFIG, NOW) if isinstance(a, Lend)]
    assert (lend.node, lend.gpus, lend.gpu_type) == ("m3", 1, ONE)


def test_the_lease_submits_its_typed_gres_and_requeues_nothing() -> None:
    lease = LeaseView(
        7, "m1", "mig", "preempt", LeaseState.REQUESTED, ("small",), NOW, lent_gpus=1, gpu_type=ONE
    )
    step = sync_lease(lease, LeaseWorld(node_listed=True, victims=("j1",)), NOW, Settings())
    assert step is not None
    # (the planner gives a typed lease no victims: `victims_of`; were it given one, the
    # Requeue would follow the Submit as a partial lend's)
    submit = step.commands[0]
    assert isinstance(submit, Submit) and (submit.gpus, submit.gpu_type) == (1, ONE)


# ---- the weight cache's staging follows the typed lends ---------------------------------


def test_a_typed_models_weights_are_staged_only_where_its_lends_could_go() -> None:
    models = merge_models(None, CONFIG.models).scaled
    # a drain-mode training node with a free 1g slice: an untyped lend never takes it busy
    train = NodeView("t1", "training", True, 4, (JOB,), free_types=((ONE, 1),))
    config = CONFIG.model_copy(
        update={
            "pools": CONFIG.pools
            | {"training": PoolConfig(partition="train", lend_mode="drain", cost_rank=3)}
        }
    )
    lent = LeaseView(9, "m3", "mig", "preempt", LeaseState.SERVING, ("small",), NOW, gpus=1,
                     lent_gpus=1, gpu_type=ONE)  # fmt: skip
    snap = Snapshot((ELASTIC, M1, M2, train, RESERVED), (), {}, (lent,), models=models)
    nodes, places = lend_places(snap, config, NOW, ["small", "big"])
    order = [n.name for n in nodes]
    # the untyped order (idle first, then m1 by requeueing its job), then t1, which only a
    # typed lend takes (its free slice; busy, a drain-mode node is no whole-node lend)
    assert order == ["e1", "m2", "m1", "t1"]
    assert places == {"small": frozenset({"m1", "m2", "t1", "m3"})}  # "big" goes anywhere

    caches = [NodeCache(n, 10, ()) for n in ("e1", "m1", "m2")]
    want = [Wanted("small", "1", 4, 2), Wanted("big", "1", 4, 1)]
    plan = plan_cache(caches, want, max_staging=3, only=places)
    assert {(s.node, s.model) for s in plan.stage} == {
        ("e1", "big"),
        ("m1", "small"),
        ("m2", "small"),
    }
    # without `only` the first node in lend order, which has no slice, took "small" too
    plain = plan_cache(caches, want, max_staging=3)
    assert ("e1", "small") in {(s.node, s.model) for s in plain.stage}
    # a copy on a node its lends never take counts for none of its replicas
    held = [NodeCache("e1", 10, (CachedCopy("small", "1", 4),)), *caches[1:]]
    again = plan_cache(held, want[:1], max_staging=3, only=places)
    assert {s.node for s in again.stage} == {"m1", "m2"} and again.unplaced == ()


def test_the_advisorys_figures_count_the_nodes_a_typed_lend_could_take_by_type() -> None:
    models = merge_models(None, CONFIG.models).scaled
    snap = Snapshot((ELASTIC, M1, M2, RESERVED), (), {}, (), models=models)
    figures = key_figures(snap, CONFIG, NOW)
    # the elastic node is lendable whole but has no 1g slice; both MIG nodes have one
    assert figures["pools"]["elastic"]["lendable"] == 1
    assert figures["lendable_by_type"] == {ONE: {"mig": 2}}
    untyped = {"big": models["big"]}
    assert "lendable_by_type" not in key_figures(replace(snap, models=untyped), CONFIG, NOW)
