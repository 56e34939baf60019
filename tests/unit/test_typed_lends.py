"""Lends of GPUs of one type, MIG slices (issue 32): a model's `gpu_type` makes its lend
ask `--gres=gpu:<type>:k` of a node with that many of the type free, requeueing nothing.
Literal gres strings, nodes, leases and configs; a fixed clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.config import BridgeConfig, ModelConfig, ModelOverride, PolicyConfig, PoolConfig
from bridge.lifecycle import LeaseState
from bridge.modelfacts import Published, merge_models, toml_models
from bridge.policy import JobView, Lend, ModelSample, NodeView, ReplicaView, Snapshot, decide
from bridge.policy.gang import lend_type, replica_gpus
from bridge.policy.leasesync import LeaseWorld, Settings, sync_lease
from bridge.policy.nodes import choose_typed
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Submit
from bridge.slurm.model import JobSpec
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
        "small": ModelConfig(slo_p99_ms=100, max_replicas=4, gpu_type=ONE),
        "big": ModelConfig(slo_p99_ms=100, max_replicas=4),
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
    got = choose_typed(snap, CONFIG, 3, gpu_type=ONE, gpus=1)
    assert [n.name for n in got] == ["m1", "m2"]  # e1 has no slices; m1 keeps m2's two
    assert [n.name for n in choose_typed(snap, CONFIG, 3, gpu_type=ONE, gpus=2)] == ["m2"]
    assert choose_typed(snap, CONFIG, 3, gpu_type=TWO, gpus=1, taken={"m2"}) == []
    leased = LeaseView(1, "m1", "mig", "preempt", LeaseState.SERVING, ("small",), NOW)
    assert [
        n.name
        for n in choose_typed(replace(snap, leases=(leased,)), CONFIG, 3, gpu_type=ONE, gpus=1)
    ] == ["m2"]
    with pytest.raises(ValueError):
        choose_typed(snap, CONFIG, 1, gpu_type=ONE, gpus=0)


def samples(rate: float) -> tuple[ModelSample, ...]:
    """A minute of samples at `rate` req/s, 20 ms of compute each, p99 over the SLO."""
    return tuple(
        ModelSample(NOW - 5.0 * i, 150.0, rate, 5.0, 120.0, 20.0) for i in range(12, -1, -1)
    )


def test_decide_lends_a_typed_model_one_free_slice_and_requeues_nothing() -> None:
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
