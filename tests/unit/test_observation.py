"""The policy's view of an observation (bridge.daemon.observation.snapshot): site
reservations keep nodes off the lend list, a job's reported checkpoint reaches the
policy, lent nodes' GPUs and a drain lend's wait are filled in."""

from __future__ import annotations

from datetime import UTC, datetime

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.daemon.observation import Observation, reserved_nodes, snapshot
from bridge.policy import LeaseView
from bridge.slurm.model import Job, Node, Reservation, checkpoint_of

NOW = 1_800_000_000.0
CONFIG = BridgeConfig(
    pools={
        "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
        "training": PoolConfig(partition="train", lend_mode="drain", cost_rank=2),
        "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
    },
    models={"busy": ModelConfig(slo_p99_ms=100)},
    policy=PolicyConfig(reservation_lookahead_s=3600),
)


def ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(NOW + seconds, UTC)


def resv(name: str, nodes: tuple[str, ...], start: float | None, end: float | None) -> Reservation:
    return Reservation(
        name,
        nodes,
        ts(start) if start is not None else None,
        ts(end) if end is not None else None,
        frozenset({"MAINT"}),
        ("root",),
        "ACTIVE",
    )


def node(name: str, partition: str, gpus: int = 4) -> Node:
    return Node(name, f"10.0.0.{name[1:]}", (partition,), "idle", frozenset(), "", "a100", gpus, 0)


def job(job_id: str, on: str, comment: str = "") -> Job:
    return Job(
        job_id, "exp", "elastic", "team-nlp", "u", "RUNNING", "None", (on,), comment, 4, 0,
        ts(-600), ts(-700),
    )  # fmt: skip


def test_reservations_active_or_starting_soon_hold_their_nodes() -> None:
    reservations = [
        resv("maint", ("n1",), -60, 3600),  # active now
        resv("soon", ("n2",), 1800, 7200),  # starts within the look-ahead
        resv("later", ("n3",), 7200, 9000),  # beyond it
        resv("over", ("n4",), -7200, -60),  # ended
        resv("open", ("n5",), None, None),  # no times: taken as active
    ]
    assert reserved_nodes(reservations, NOW, 3600) == {"n1", "n2", "n5"}
    assert reserved_nodes(reservations, NOW, 0) == {"n1", "n5"}


def test_a_jobs_checkpoint_tag_is_read_and_garbage_is_none() -> None:
    assert checkpoint_of(job("1", "n1", f"stb:elastic,stb:ckpt={NOW - 30:.0f}").tags) == NOW - 30
    assert checkpoint_of(job("1", "n1", "stb:ckpt=yesterday").tags) is None
    assert checkpoint_of(job("1", "n1", "ckpt=5").tags) is None


def test_snapshot_marks_reserved_nodes_checkpoints_and_lent_nodes() -> None:
    nodes = {n.name: n for n in (node("n1", "elastic"), node("n2", "train", gpus=8))}
    obs = Observation(
        NOW,
        nodes,
        (job("7", "n1", f"stb:ckpt={NOW - 30:.0f}"), job("8", "n2")),
        frozenset(),
        (),
        {},
        (resv("maint", ("n1",), -60, 3600),),
    )
    lease = LeaseView(1, "n2", "training", "drain", "submitted", ("busy",), NOW - 10)
    snap = snapshot(obs, CONFIG, [lease], {}, {"elastic": 6.5}, 3)
    views = {v.name: v for v in snap.nodes}
    assert views["n1"].reserved and not views["n2"].reserved
    assert views["n1"].jobs[0].checkpoint_at == NOW - 30
    assert views["n2"].jobs[0].checkpoint_at is None
    (lent,) = snap.leases
    assert lent.gpus == 8 and lent.waiting  # a drain lend whose node still runs a job
    assert snap.lend_s == {"elastic": 6.5} and snap.preemptions_last_hour == 3


def test_a_held_pools_nodes_are_reserved() -> None:
    nodes = {n.name: n for n in (node("n1", "elastic"), node("n2", "train"))}
    obs = Observation(NOW, nodes, (), frozenset(), (), {}, ())
    held = snapshot(obs, CONFIG, [], {}, held_pools=frozenset({"training"}))
    views = {v.name: v for v in held.nodes}
    assert views["n2"].reserved and not views["n1"].reserved
    free = {v.name: v for v in snapshot(obs, CONFIG, [], {}).nodes}
    assert not free["n2"].reserved
