"""Stacked partial lends (`[policy] stacked_lends`), on literal inputs: a node only partly
lent may be lent more of its GPUs as a lease of its own; a node wholly lent or a gang's
never; the GPUs its leases hold count whether or not their Triton jobs have started;
the pools' shares count such a node once; the daemon, whose Triton jobs share one set of
ports per node, refuses the setting. (The simulator carrying two leases on one node:
tests/unit/test_sim_gpu_granular.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.daemon.service import DaemonError, build
from bridge.policy import JobView, LeaseView, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy.nodes import choose_nodes, share_room, stacked

T0 = 1_800_000_000.0
HOUR = 3600.0


def config(on: bool = True, **policy: object) -> BridgeConfig:
    return BridgeConfig(
        models={"busy": ModelConfig(slo_p99_ms=100, min_replicas=1, instance_gpus=2)},
        policy=PolicyConfig(stacked_lends=on, max_lent_nodes=4, **policy),
    )


def lease(lease_id: int, node: str, lent: int | None, members: tuple[str, ...] = ()) -> LeaseView:
    return LeaseView(
        lease_id, node, "elastic", "preempt", "serving", ("busy",), T0 - HOUR,
        lent_gpus=lent, gpus=8, members=members,
    )  # fmt: skip


def elastic(name: str, *jobs: JobView, triton_gpus: int = 0) -> NodeView:
    return NodeView(
        name, "elastic", True, 8, jobs, has_triton=triton_gpus > 0, triton_gpus=triton_gpus
    )


def job(job_id: str, gpus: int) -> JobView:
    return JobView(job_id, gpus, T0 - HOUR)


def snap(*nodes: NodeView, leases: tuple[LeaseView, ...] = ()) -> Snapshot:
    reserved = NodeView("r1", "inference", True, 8, has_triton=True)
    sample = ModelSample(T0, 50.0, 10.0)
    return Snapshot(
        (*nodes, reserved), (ReplicaView("r1", ("busy",)),), {"busy": (sample,)}, leases
    )


def names(nodes: list[NodeView]) -> list[str]:
    return [n.name for n in nodes]


def test_only_nodes_partly_lent_are_stacked_with_the_gpus_their_leases_hold() -> None:
    leases = (lease(1, "e1", 2), lease(2, "e1", 4), lease(3, "e2", None), lease(4, "e3", 2))
    gang = lease(5, "e4", None, members=("e5",))
    assert stacked(snap(leases=(*leases, gang))) == {"e1": 6, "e3": 2}
    # a node this pass lends already is not stacked on in the same pass
    assert stacked(snap(leases=leases), taken=frozenset({"e3"})) == {"e1": 6}


def test_a_node_partly_lent_takes_another_partial_lend_only_with_the_setting() -> None:
    # e1: 2 GPUs lent, its Triton job running, 6 free; e2: a whole-node lease
    e1, e2 = elastic("e1", triton_gpus=2), elastic("e2", triton_gpus=8)
    s = snap(e1, e2, leases=(lease(1, "e1", 2), lease(2, "e2", None)))
    assert names(choose_nodes(s, config(), T0, 2, gpus=2)) == ["e1"]
    assert names(choose_nodes(s, config(), T0, 2, gpus=6)) == ["e1"]
    assert choose_nodes(s, config(), T0, 2, gpus=7) == []  # 6 GPUs left on e1
    assert choose_nodes(s, config(on=False), T0, 2, gpus=2) == []
    assert choose_nodes(s, config(), T0, 2) == []  # a whole-node lend: never on a lent node


def test_a_lease_whose_triton_job_has_not_started_holds_its_gpus_for_the_choice() -> None:
    # e1: a pending lease of 4 GPUs (its Triton job holds none yet), jobs on 4 GPUs: a lend
    # of 2 more requeues a job, it does not take the pending lease's free GPUs
    e1 = NodeView("e1", "elastic", True, 8, (job("10", 2), job("11", 2)), has_triton=True)
    s = snap(e1, leases=(lease(1, "e1", 4),))
    (got,) = choose_nodes(s, config(), T0, 1, gpus=2)
    assert got.name == "e1" and got.triton_gpus == 4
    # with the elastic work guarded (no requeue budget left), nothing is free to give
    assert choose_nodes(s, config(max_preemptions_per_hour=0), T0, 1, gpus=2) == []
    # an idle node is cheaper than victims on a stacked one
    idle = elastic("e9")
    assert names(choose_nodes(snap(e1, idle, leases=s.leases), config(), T0, 1, gpus=2)) == ["e9"]


def test_a_node_lent_to_two_stacked_leases_counts_once_in_the_pools_share() -> None:
    nodes = [elastic(f"e{i}") for i in range(4)]
    s = snap(*nodes, leases=(lease(1, "e0", 2), lease(2, "e0", 2)))
    shared = config(max_lent_share=0.5)
    assert share_room(s, shared) == {"elastic": 1, "training": 0}


def test_the_daemon_refuses_stacked_lends_before_it_opens_anything(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    with pytest.raises(DaemonError, match=r"stacked_lends is for the simulator"):
        build(config().model_copy(update={"database_url": url}))
    assert not (tmp_path / "bridge.db").exists()
