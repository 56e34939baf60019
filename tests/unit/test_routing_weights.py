"""The daemon weighs each replica by its GPUs in nginx's routing (issue 32): a partial
lease's replica of 2 GPUs beside a whole node of 8 gets `weight=` 1 against 4 in its
models' upstreams, so `least_conn` sends it a second request only when the large one
holds four per unit (bench/least_conn_split.py); a model with instances of its own
(as many on every replica) and replicas alike get none. Two leases that share a node are
two replicas on their own ports, each weighed by its own GPUs. The actuator's `route` on a
literal observation, publishing to a recording router."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bridge.config import BridgeConfig, ModelConfig, PoolConfig
from bridge.daemon.actuator import Actuator
from bridge.daemon.observation import Observation, TritonServer, replica_gpus
from bridge.daemon.planner import LeaseRecord
from bridge.daemon.report import TickReport
from bridge.lifecycle import LeaseState
from bridge.modelfacts import merge_models
from bridge.routing.table import RoutingTable
from bridge.slurm.model import Node
from bridge.triton.ports import port_tag, server_address
from tests.unit.fakes import FakeRouter
from tests.unit.planner_literals import job

NOW = 1_800_000_000.0
CONFIG = BridgeConfig(
    pools={
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
    },
    models={
        "shared": ModelConfig(slo_p99_ms=100, max_replicas=4),
        "own": ModelConfig(slo_p99_ms=100, max_replicas=4, instances=1),
    },
)


def node(name: str, addr: str) -> Node:
    return Node(name, addr, ("infer",), "mixed", frozenset(), "", "a100", 8, 0)


def lease(
    lent_gpus: int | None, lease_id: int = 7, job_id: str = "200", slot: int = 0
) -> LeaseRecord:
    return LeaseRecord(
        lease_id, "n3", "elastic", "preempt", LeaseState.SERVING, ("shared", "own"), NOW - 600,
        NOW - 300, job_id, lent_gpus=lent_gpus, slot=slot,
    )  # fmt: skip


def route(servers: tuple[TritonServer, ...], leases: list[LeaseRecord]) -> RoutingTable:
    """The table the actuator's `route` publishes for `servers` on n1 and n3 (8 GPUs each)
    with `leases` open; `replica_gpus` checked beside it."""
    obs = Observation(
        NOW, {"n1": node("n1", "10.0.0.1"), "n3": node("n3", "10.0.0.3")},
        tuple(s.job for s in servers), frozenset(), servers, {},
        models=merge_models(None, CONFIG.models),
    )  # fmt: skip
    router = FakeRouter()
    actuator = Actuator(CONFIG, None, None, lambda _: None, router)  # type: ignore[arg-type]
    actuator.begin(obs, leases)
    actuator.route(TickReport(datetime.fromtimestamp(NOW)))
    (table,) = router.tables
    held = {lease.slurm_job_id: lease.lent_gpus or 8 for lease in leases}
    assert replica_gpus(obs, leases) == {"100": 8, **held}
    return table


def published(lent_gpus: int | None) -> RoutingTable:
    """The table `route` publishes for the baseline on n1 (8 GPUs) and lease 7's replica
    on n3 (its node's 8 GPUs, or `lent_gpus` of them), both holding both models."""
    held = lease(lent_gpus)
    servers = (
        TritonServer(job("100", on="n1"), "n1", "10.0.0.1:8000", True, ("shared", "own")),
        TritonServer(job("200", of=held, on="n3"), "n3", "10.0.0.3:8000", True, ("shared", "own")),
    )  # fmt: skip
    return route(servers, [held])


def test_a_partial_leases_replica_is_weighed_by_its_gpus_beside_a_whole_node() -> None:
    table = published(2)
    assert table.endpoints("shared") == ("10.0.0.1:8000", "10.0.0.3:8000")
    assert table.weight("shared", "10.0.0.1:8000") == 4
    assert table.weight("shared", "10.0.0.3:8000") == 1
    # one instance on each replica whatever its GPUs: no weights
    assert [m for m, _ in table.weights] == ["shared"]


def test_replicas_alike_are_routed_without_weights() -> None:
    assert published(None).weights == ()


def test_two_leases_on_one_node_are_two_replicas_each_weighed_by_its_gpus() -> None:
    """Leases 7 (2 GPUs, slot 0) and 8 (4 GPUs, slot 1) share n3: two endpoints on the
    node's address, each weighed by its own GPUs, each with its own metrics target."""
    two, four = lease(2), lease(4, lease_id=8, job_id="300", slot=1)
    tagged = job("300", of=four, on="n3")
    tagged = replace(tagged, comment=f"{tagged.comment},{port_tag(1)}")
    servers = (
        TritonServer(job("100", on="n1"), "n1", "10.0.0.1:8000", True, ("shared",)),
        TritonServer(job("200", of=two, on="n3"), "n3", "10.0.0.3:8000", True, ("shared",)),
        TritonServer(tagged, "n3", server_address("10.0.0.3", tagged.tags), True, ("shared",)),
    )  # fmt: skip
    table = route(servers, [two, four])  # replica GPUs 8, 2 and 4
    assert table.endpoints("shared") == ("10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.3:8010")
    assert [table.weight("shared", a) for a in table.endpoints("shared")] == [4, 1, 2]
    assert sorted(t.endpoint for t in table.targets) == [
        "10.0.0.1:8002", "10.0.0.3:8002", "10.0.0.3:8012"
    ]  # fmt: skip
