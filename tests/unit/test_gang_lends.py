"""Replicas that span nodes through the daemon (issue 32), on literal inputs: the policy
lends a gang of whole nodes of one pool for a model whose replica takes more GPUs than a
node has (all or nothing, counted in nodes against `max_lent_nodes`, whatever
`partial_lends` says); a gang lease's sync fences, submits (`-N n`) and requeues on all
its nodes and fails when one of them vanishes; an operator's lend of one node completes
its gang or is refused; the Triton job asks Slurm for the nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, TritonJobConfig
from bridge.daemon.launcher import triton_job
from bridge.daemon.observation import Observation
from bridge.daemon.planner import (
    Fence,
    LeaseRecord,
    Move,
    Requeue,
    Settings,
    Step,
    Submit,
    operator_gang,
    plan_lease,
    plan_orphans,
)
from bridge.lifecycle import LeaseState
from bridge.modelfacts import merge_models, toml_models
from bridge.policy import decide as policy_decide
from bridge.policy.actions import Lend
from bridge.policy.gang import plan_sized_gangs, spans
from bridge.policy.snapshot import LeaseView, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import Job, JobSpec, Node
from tests.unit.planner_literals import job

S = LeaseState
T0 = 1_800_000_000.0

#: big's replica takes 8 GPUs (tensor parallel 8): two of the lab's 4-GPU nodes
CONFIG = BridgeConfig(
    models={
        "big": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=4, tensor_parallel=8),
        "small": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=4, instance_gpus=1),
    },
    policy=PolicyConfig(breach_evaluations=3, max_lent_nodes=4, scale_out_cooldown_s=60),
)
RESERVED = NodeView("n9", "inference", True, 4, has_triton=True)
BREACH = tuple(
    ModelSample(T0 - (2 - i) * 5.0, p, 10.0, 0.0, p / 2) for i, p in enumerate((150, 160, 170))
)


def decide(snapshot: Snapshot, config: BridgeConfig = CONFIG) -> list[Lend]:
    actions = policy_decide(replace(snapshot, models=toml_models(config)), config, T0)
    return [a for a in actions if isinstance(a, Lend)]


def snap(*nodes: NodeView, leases: tuple[LeaseView, ...] = ()) -> Snapshot:
    replicas = (ReplicaView("n9", ("big", "small"), gpus=8),)
    return Snapshot((*nodes, RESERVED), replicas, {"big": BREACH}, leases)


def idle(name: str, pool: str = "elastic", gpus: int = 4) -> NodeView:
    return NodeView(name, pool, True, gpus)


# ---- the policy ------------------------------------------------------------------------


def test_a_replica_larger_than_a_node_is_lent_as_a_gang_of_one_pool() -> None:
    # one idle elastic node cannot hold it alone: the two training nodes do, fenced whole
    (a,) = decide(snap(idle("e1"), idle("t1", "training"), idle("t2", "training")))
    assert (a.node, a.members, a.pool, a.lend_mode, a.gpus) == (
        "t1",
        ("t2",),
        "training",
        "drain",
        None,
    )
    assert a.nodes == ("t1", "t2") and "one replica of 8 GPUs on 2 nodes" in a.reason
    # two idle elastic nodes come first (elastic is the cheaper pool)
    (a,) = decide(snap(idle("e1"), idle("e2"), idle("t1", "training"), idle("t2", "training")))
    assert (a.node, a.members, a.lend_mode) == ("e1", ("e2",), "preempt")
    # the same without partial lends: a gang is no partial lend
    whole = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"partial_lends": False})}
    )
    (a,) = decide(snap(idle("e1"), idle("e2")), whole)
    assert a.nodes == ("e1", "e2")


def test_a_gang_is_all_or_nothing_and_counts_its_nodes() -> None:
    # one node of each pool: no gang of one pool, so nothing (never half a replica)
    assert decide(snap(idle("e1"), idle("t1", "training"))) == []
    # where a node holds the replica alone, it is lent (no gang), never a smaller node
    (a,) = decide(snap(idle("e1"), idle("t1", "training", gpus=8)))
    assert a.nodes == ("t1",) and a.gpus is None
    # the lend cap counts nodes: one node of room left is no room for a gang
    capped = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"max_lent_nodes": 3})}
    )
    held = LeaseView(
        1, "e3", "elastic", "preempt", "serving", ("small",), T0 - 900, members=("e4",)
    )
    assert (
        decide(snap(idle("e1"), idle("e2"), idle("e3"), idle("e4"), leases=(held,)), capped) == []
    )
    # a gang's member is lent: never chosen again
    held = LeaseView(
        1, "e1", "elastic", "preempt", "serving", ("small",), T0 - 900, members=("e2",)
    )
    (a,) = decide(snap(idle("e1"), idle("e2"), idle("e3"), idle("e4"), leases=(held,)))
    assert a.nodes == ("e3", "e4")


def test_sized_gangs_follow_each_nodes_gpus() -> None:
    nodes = [idle("a1", gpus=8), idle("b1"), idle("a2", gpus=8), idle("b2"), idle("b3"), idle("b4")]
    gangs = plan_sized_gangs(nodes, 16, 2)
    assert [tuple(n.name for n in g) for g in gangs] == [("a1", "a2"), ("b1", "b2", "b3", "b4")]
    assert spans(nodes, {"elastic"}, 16) and not spans(nodes, {"elastic"}, 8)
    assert not spans(nodes, {"elastic"}, None) and not spans(nodes, {"training"}, 16)


# ---- the sync of a gang lease ------------------------------------------------------------

NOW = T0
SETTINGS = Settings(drain_wait_s=1800)


def node(name: str, partitions: tuple[str, ...], state: str = "idle") -> Node:
    return Node(name, f"10.0.0.{name[1:]}", partitions, state, frozenset(), "", "a100", 4, 0)


def victim(job_id: str, on: str) -> Job:
    return Job(
        job_id, "train", "elastic", "team-a", "alice", "RUNNING", "None", (on,), "", 4, 0,
        None, None,
    )  # fmt: skip


def observe(
    *, jobs: tuple[Job, ...] = (), nodes: tuple[str, ...] = ("n1", "n2", "n3", "n4")
) -> Observation:
    parts = {
        "n1": ("train",),
        "n2": ("train",),
        "n3": ("elastic", "infer"),
        "n4": ("elastic", "infer"),
    }
    known = {n: node(n, parts[n]) for n in nodes}
    return Observation(
        NOW, known, jobs, frozenset(), (), {}, models=merge_models(None, CONFIG.models)
    )


def gang(state: LeaseState, mode: str = "preempt", job_id: str | None = None) -> LeaseRecord:
    first, other, pool = ("n3", "n4", "elastic") if mode == "preempt" else ("n1", "n2", "training")
    return LeaseRecord(
        1, first, pool, mode, state, ("big",), NOW - 3600, NOW - 10, job_id, members=(other,)
    )


def test_a_gang_submits_one_job_on_all_its_nodes_and_requeues_on_each() -> None:
    lse = gang(S.REQUESTED)
    step = plan_lease(lse, observe(jobs=(victim("7", "n3"), victim("8", "n4"))), NOW, SETTINGS)
    assert step is not None and step.commands == (
        Submit("n3", ("big",), (1, int(NOW - 3600)), "elastic", None, None, ("n4",)),
        Requeue("n3", ("7", "8")),
    )
    drained = gang(S.REQUESTED, mode="drain")
    step = plan_lease(drained, observe(), NOW, SETTINGS)
    assert step is not None and isinstance(step.commands[0], Fence)
    assert step.commands[0].members == ("n2",)
    assert isinstance(step.commands[1], Submit) and step.commands[1].members == ("n2",)


def test_a_gang_fails_when_one_of_its_nodes_vanishes() -> None:
    lse = gang(S.SERVING, job_id="100")
    j = replace(job("100", of=lse, on="n3"), nodes=("n3", "n4"))
    gone = plan_lease(lse, observe(jobs=(j,), nodes=("n1", "n2", "n3")), NOW, SETTINGS)
    assert gone == Step(
        1, move=Move(1, S.SERVING, S.FAILED, "a node of its gang n3,n4 vanished from Slurm")
    )


def test_an_orphan_gang_job_is_adopted_with_its_members() -> None:
    j = replace(job("100", on="n3", comment="stb:triton,stb:lease=5.100"), nodes=("n3", "n4"))
    (step,) = plan_orphans(observe(jobs=(j,)), [], {}, CONFIG)
    (adopt,) = step.commands
    assert (adopt.node, adopt.members) == ("n3", ("n4",))  # type: ignore[union-attr]


def test_an_operator_lend_completes_its_gang_or_is_refused() -> None:
    config = CONFIG
    obs = replace(observe(), models=merge_models(None, config.models))
    assert operator_gang("n3", ("big",), obs, [], config) == ("n4",)
    assert operator_gang("n1", ("big",), obs, [], config) == ("n2",)
    held = LeaseView(2, "n4", "elastic", "preempt", "serving", ("big",), NOW - 60)
    refused = operator_gang("n3", ("big",), obs, [held], config)
    assert refused == "refused: a replica of big takes 8 GPUs, 2 nodes of 4 in pool elastic; 1 free"
    # a replica that fits the node: no gang
    small = replace(
        obs, models=merge_models(None, {"s": ModelConfig(slo_p99_ms=1, instance_gpus=2)})
    )
    assert operator_gang("n3", ("s",), small, [], config) == ()


# ---- the job -------------------------------------------------------------------------------


def test_the_gang_job_asks_for_its_nodes_one_task_each(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key)
    spec = triton_job(
        cfg, node="n3", members=("n4",), models=["big"], lease=(1, 100), exclusive=True, gpus=4
    )
    assert spec.nodelist == ("n3", "n4") and spec.nodes == 2 and spec.exclusive
    assert triton_job(cfg, node="n3", models=["big"]).nodes is None
    seen: list[tuple[str, ...]] = []

    class Recording(SlurmCLI):
        def _run(self, *argv: str, env: object = None) -> str:  # type: ignore[override]
            seen.append(argv)
            return "42\n"

    assert Recording().submit(spec) == "42"
    assert {"--nodelist=n[3-4]", "--nodes=2", "--ntasks=2", "--exclusive"} <= set(seen[0])
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        JobSpec(partition="p", account="a", wrap="true", nodes=0)
