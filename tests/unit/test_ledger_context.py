"""The bridge's side of the ledger (`bridge.ledger`): capacity from Slurm's nodes, the
workload of each partition from the pools, the team map, and the lease tag -> pool map."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bridge.config import BridgeConfig
from bridge.leases.models import Lease, LendMode
from bridge.leases.states import LeaseState
from bridge.ledger import context, inventory
from bridge.slurm.model import Node

NOW = datetime(2026, 11, 3, 12, tzinfo=UTC)


def node(name: str, partitions: tuple[str, ...], state: str = "idle", gpus: int = 4) -> Node:
    return Node(name, "127.0.1.1", partitions, state, frozenset(), "", "h100", gpus, 0)


NODES = [
    node("n1", ("train",)),
    node("n2", ("train",), state="down"),
    node("n3", ("elastic", "infer")),
    node("n4", ("infer",)),
    node("n5", ("debug",)),
    node("c1", ("train",), gpus=0),
]


def test_capacity_counts_in_service_gpu_nodes_in_their_pool() -> None:
    got = {(c.node, c.pool, c.gpu_type, c.gpus) for c in inventory(NODES, BridgeConfig())}
    # n2 is down, n5 is in no pool, c1 has no GPU; n3 belongs to elastic, not inference.
    assert got == {
        ("n1", "training", "h100", 4),
        ("n3", "elastic", "h100", 4),
        ("n4", "inference", "h100", 4),
    }


def test_context_maps_partitions_teams_models_and_leases() -> None:
    config = BridgeConfig.model_validate(
        {
            "accounting": {"teams": {"bridge": "platform"}, "workloads": {"debug": "elastic"}},
            "triton": {"model_repository": Path("triton_repo")},
        }
    )
    lease = Lease(
        id=7, node="n1", pool="training", lend_mode=LendMode.DRAIN, models=["busy"],
        state=LeaseState.SERVING, request_key="k", created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    ctx = context(config, NODES, [lease], horizon=NOW, cluster="lab")
    assert ctx.workload_of_partition == {
        "train": "training", "elastic": "elastic", "infer": "inference", "debug": "elastic",
    }  # fmt: skip
    assert ctx.pool_of_node["n3"] == "elastic" and "n5" not in ctx.pool_of_node
    assert ctx.team_of_account == {"bridge": "platform"}
    assert ctx.team_of_model["busy"] == "team-vision"  # from triton_repo/busy/config.pbtxt
    assert ctx.pool_of_lease == {f"7.{int(NOW.timestamp())}": "training"}
    assert ctx.known_gpu_types == frozenset({"h100"})
