"""The policy's view of an observation (bridge.daemon.observation.snapshot): site
reservations keep nodes off the lend list, a job's reported checkpoint reaches the
policy, lent nodes' GPUs and a drain lend's wait are filled in, and so are each job's
end and each node's GPUs held by Triton, from literal jobs and from recorded Slurm
output (the lab's nodes and each release's squeue)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.daemon.observation import Observation, reserved_nodes, snapshot
from bridge.daemon.observe import ACTIVE_STATES
from bridge.policy import LeaseView
from bridge.policy.victims import DrainWait, drain_wait
from bridge.slurm.model import Job, Node, Reservation, checkpoint_of
from bridge.slurm.scontrol import parse_nodes
from bridge.slurm.squeue import filter_jobs, parse_squeue_json

NOW = 1_800_000_000.0
DATA = Path(__file__).parent.parent / "data" / "slurm"
RELEASES = sorted(p.name.removeprefix("squeue-matrix-").removesuffix(".json")
                  for p in DATA.glob("squeue-matrix-*.json"))  # fmt: skip
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


def triton(job_id: str, on: tuple[str, ...], gpus: int, state: str = "RUNNING") -> Job:
    return Job(
        job_id, "stb-triton", "infer", "bridge", "u", state, "None", on, "stb:triton", gpus, 0,
        ts(-60), None if state == "PENDING" else ts(-30), () if on else ("n3",),
    )  # fmt: skip


def test_snapshot_fills_job_ends_and_the_gpus_triton_holds() -> None:
    lab = (node("n1", "train", 8), node("n2", "train", 8), node("n3", "elastic"))
    nodes = {n.name: n for n in lab}
    ending = Job(
        "7", "exp", "elastic", "team-nlp", "u", "RUNNING", "None", ("n3",), "", 2, 0,
        ts(-700), ts(-600), end_time=ts(3000),
    )  # fmt: skip
    jobs = (
        triton("40", ("n1", "n2"), 16),  # a replica over two nodes: 8 GPUs on each
        triton("41", ("n3",), 1, "COMPLETING"),  # still holds its GPU
        triton("42", (), 2, "PENDING"),  # bound for n3 (--nodelist), holds nothing yet
        ending,
        job("8", "n3"),  # no time limit: no end
    )
    obs = Observation(NOW, nodes, jobs, frozenset(), (), {}, ())
    views = {v.name: v for v in snapshot(obs, CONFIG, [], {}).nodes}
    assert views["n1"].triton_gpus == views["n2"].triton_gpus == 8
    assert views["n3"].triton_gpus == 1 and views["n3"].has_triton
    ends = {j.job_id: j.ends_at for j in views["n3"].jobs}
    assert ends == {"7": NOW + 3000, "8": None}


@pytest.mark.parametrize("release", RELEASES)
def test_recorded_slurm_output_gives_ends_and_tritons_gpus(release: str) -> None:
    """The lab's nodes (4 GPUs each; n1 in `train`, n4 in `infer`) with each release's
    squeue: a training job of 2 GPUs runs on n1, the bridge's Triton job of 1 on n4."""
    nodes = {n.name: n for n in parse_nodes((DATA / "scontrol-nodes-22.05.txt").read_text())}
    everything = parse_squeue_json((DATA / f"squeue-matrix-{release}.json").read_text())
    jobs = tuple(filter_jobs(everything, states=ACTIVE_STATES))  # as the observer asks
    obs = Observation(NOW, nodes, jobs, frozenset(), (), {}, ())
    views = {v.name: v for v in snapshot(obs, CONFIG, [], {}).nodes}
    assert views["n4"].triton_gpus == 1  # 22.05's ended Triton jobs there hold none
    assert views["n1"].triton_gpus == views["n3"].triton_gpus == 0
    (running,) = views["n1"].jobs
    assert running.gpus == 2 and running.started_at is not None
    if release == "26.05":  # a year's time limit on that lab; UNLIMITED on the others
        end = running.started_at + timedelta(minutes=525600).total_seconds()
        assert running.ends_at == end
        # a 3-GPU drain lend there (2 free) waits for that job: a year, as Slurm says
        assert drain_wait(views["n1"], 3, NOW) == DrainWait((running.job_id,), end)
    else:
        assert running.ends_at is None
        assert drain_wait(views["n1"], 3, NOW) is None  # no end: no wait to speak of
    assert drain_wait(views["n1"], 2, NOW) == DrainWait((), NOW)
