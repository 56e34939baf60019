"""The simulator's fleet from Slurm's recorded `scontrol show node|partition -o` output
(Slurm 22.05, the lab) and its actuation times from a real lease store's history (SQLite,
through `LeaseStore`): pools by the daemon's rule, hostile listings refused by name, the
medians with their counts, the defaults where the history shows nothing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, PoolConfig
from bridge.db import make_engine
from bridge.leases.store import LeaseStore, create_schema
from bridge.lifecycle import LeaseState
from bridge.sim.engine import Timing
from bridge.sim.inputs import (
    InputError,
    fleet_from_scontrol,
    lend_modes,
    read_fleet,
    read_lease_timelines,
    timing_from_leases,
)

SLURM = Path(__file__).resolve().parents[1] / "data" / "slurm"
NODES = SLURM / "scontrol-nodes-22.05.txt"
PARTITIONS = SLURM / "scontrol-partitions-22.05.txt"
S = LeaseState


def test_the_lab_fleet_from_its_recorded_listing() -> None:
    shape = read_fleet(NODES, PARTITIONS, BridgeConfig())
    assert [(n.name, n.pool, n.gpus) for n in shape.nodes] == [
        ("n1", "training", 4),
        ("n2", "training", 4),
        ("n3", "elastic", 4),  # also in infer: a lendable pool wins over the reserved one
        ("n4", "inference", 4),
    ]
    assert shape.gpus_per_node == 4
    assert shape.pools() == {"elastic": 1, "inference": 1, "training": 2}
    assert shape.about["partitions"] == {"elastic": 1, "infer": 2, "train": 2}
    assert shape.about["states"] == {"idle": 1, "idle+drain": 1, "mixed": 2}
    assert shape.about["source"] == [
        "nodes file scontrol-nodes-22.05.txt",
        "partitions file scontrol-partitions-22.05.txt",
    ]


def test_without_the_partitions_the_nodes_own_partitions_say() -> None:
    shape = read_fleet(NODES, None, BridgeConfig())
    assert [n.partitions for n in shape.nodes] == [
        ("train",), ("train",), ("elastic", "infer"), ("infer",),
    ]  # fmt: skip


def test_nodes_in_no_pool_or_without_gpus_are_left_out_and_counted() -> None:
    text = NODES.read_text()
    lines = text.splitlines()
    cpu = lines[0].replace("NodeName=n1 ", "NodeName=c1 ").replace("Gres=gpu:h100:4", "Gres=(null)")
    other = (
        lines[1]
        .replace("NodeName=n2 ", "NodeName=x1 ")
        .replace("Partitions=train", "Partitions=cpu")
    )
    shape = fleet_from_scontrol("\n".join([*lines, cpu, other]), None, BridgeConfig())
    assert len(shape.nodes) == 4
    assert shape.about["left_out"] == {"in no pool (partitions cpu)": 1, "no GPU": 1}


def test_a_mixed_fleet_says_so_and_how_to_go_on() -> None:
    text = NODES.read_text().replace("NodeName=n4 ", "NodeName=n4 ", 1)
    mixed = text.replace("Gres=gpu:h100:4 NodeAddr=127.0.1.4", "Gres=gpu:h100:8 NodeAddr=127.0.1.4")
    shape = fleet_from_scontrol(mixed, None, BridgeConfig())
    with pytest.raises(InputError, match=r"3 nodes of 4 GPUs, 1 node of 8 GPUs.*--gpus-per-node"):
        _ = shape.gpus_per_node


@pytest.mark.parametrize(
    ("nodes", "partitions", "message"),
    [
        ("", None, "no node (is it `scontrol show node -o` output?)"),
        ("NodeName=n1 Gres=gpu:4\nnot a record\n", None, "cannot parse scontrol output"),
        ("Gres=gpu:4 State=IDLE\n", None, "cannot parse scontrol show node"),
        ("{nodes}", "", "no partition"),
        (
            "{nodes}",
            "PartitionName=train Nodes=n[1-2,9]\n",
            "partition train lists node n9, which nodes does not have",
        ),
        ("{nodes}", "PartitionName=train Nodes=n[1-2]\n", "pool 'elastic': partition 'elastic'"),
        ("{nodes}{nodes}", None, "node n1 is listed 2 times"),
    ],
)
def test_hostile_listings_are_refused_by_name(
    nodes: str, partitions: str | None, message: str
) -> None:
    real = NODES.read_text()
    with pytest.raises(InputError, match=re.escape(message)):
        fleet_from_scontrol(
            nodes.replace("{nodes}", real), partitions, BridgeConfig(), nodes_source="nodes"
        )


def test_a_configuration_for_another_cluster_is_named() -> None:
    site = BridgeConfig(
        pools={
            "gpu": PoolConfig(partition="gpu", lend_mode="preempt"),
            "serve": PoolConfig(partition="infer", lend_mode="reserved"),
        },
    )
    with pytest.raises(InputError, match=r"pool 'gpu': partition 'gpu' is not in partitions"):
        read_fleet(NODES, PARTITIONS, site)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"nodes file {tmp_path / 'gone'}: cannot read it"):
        read_fleet(tmp_path / "gone", None, BridgeConfig())


# ---- actuation times from the lease history -------------------------------------------

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _lease(
    store: LeaseStore, node: str, pool: str, mode: str, moves: list[tuple[LeaseState, float]]
) -> None:
    """A lease created at T0 + the first move's seconds, then moved through the others."""
    (_, created), *rest = moves
    lease = store.create(
        node, pool, mode, ["busy"], f"{node}-{created}", T0 + timedelta(seconds=created)
    )
    assert lease.id is not None
    for state, at in rest:
        store.set_status(lease.id, state, T0 + timedelta(seconds=at), "test")


def _history(path: Path) -> str:
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    create_schema(engine)
    store = LeaseStore(engine)
    full = [S.REQUESTED, S.SUBMITTED, S.STARTING, S.SERVING, S.DRAINING, S.RELEASING, S.RETURNED]
    # two preempt lends that went the whole way: starting seen 10 s and 6 s after the lend
    _lease(
        store,
        "n3",
        "elastic",
        "preempt",
        list(zip(full, [0, 0.2, 10, 14, 100, 110, 120], strict=True)),
    )
    _lease(
        store,
        "n3",
        "elastic",
        "preempt",
        list(zip(full, [200, 200.1, 206, 212, 300, 305, 310], strict=True)),
    )
    # a drain lend: its wait for the node's jobs is no Slurm start time
    _lease(
        store, "n1", "training", "drain", list(zip(full[:4], [400, 400.1, 700, 704], strict=True))
    )
    # a lend that failed before it started counts for no step
    _lease(store, "n3", "elastic", "preempt", [(S.REQUESTED, 800), (S.SUBMITTED, 800.1),
                                               (S.FAILED, 830), (S.RETURNED, 835)])  # fmt: skip
    engine.dispose()
    return url


def test_timing_is_the_median_of_each_step_with_its_count(tmp_path: Path) -> None:
    url = _history(tmp_path / "bridge.db")
    leases = read_lease_timelines(url, T0 - timedelta(days=1), T0 + timedelta(days=1))
    assert len(leases) == 4
    timing, about = timing_from_leases(
        leases, lend_mode_of_pool=lend_modes(BridgeConfig()), tick_s=5.0
    )
    # requested -> starting less half a tick: 7.5 and 3.5
    assert timing.preempt_start_s == pytest.approx(5.5)
    # starting -> serving: 4, 6 and 4 (the drain lease too)
    assert timing.triton_ready_s == pytest.approx(4.0)
    # releasing -> returned less half a tick: 7.5 and 2.5 (the failed lease not counted)
    assert timing.cancel_s == pytest.approx(5.0)
    assert timing.slurm_start_s == Timing().slurm_start_s  # not in the history
    assert timing.requeue_delay_s == Timing().requeue_delay_s
    fields = about["fields"]
    assert isinstance(fields, dict)
    assert fields["preempt_start_s"] == {
        "value": 5.5,
        "leases": 2,
        "from": "lease history (median)",
    }
    assert fields["triton_ready_s"]["leases"] == 3
    assert fields["slurm_start_s"]["leases"] == 0
    assert "default" in fields["slurm_start_s"]["from"]
    assert about["leases"] == 4
    others = about["other_steps"]
    assert isinstance(others, dict)
    assert others["drain lend: requested -> starting (holds the wait for jobs)"] == {
        "median_s": 300.0,
        "leases": 1,
    }


def test_no_history_keeps_the_defaults() -> None:
    timing, about = timing_from_leases([], lend_mode_of_pool={}, tick_s=5.0)
    assert timing == Timing()
    assert about["leases"] == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///{tmp}/gone.db", "lease database: no database file"),
        ("sqlite://", "in-memory database: it holds no history"),
        ("nonsense", "is not a database URL"),
        ("sqlite:///{tmp}/empty.db", "cannot read the lease history"),
    ],
)
def test_a_missing_or_wrong_database_is_named_and_never_made(
    tmp_path: Path, url: str, message: str
) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(InputError, match=message):
        read_lease_timelines(url.replace("{tmp}", str(tmp_path)), T0, T0 + timedelta(days=1))
    assert not (tmp_path / "gone.db").exists()
