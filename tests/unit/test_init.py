"""`stb init` and `stb config check --live` (`bridge.init`) on the lab's recorded
`scontrol show partition/node -o` output: the proposal's pools, the TOML it writes (valid,
and the lab's own pools), and every problem the live check names, each from a changed
partition."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, load_config
from bridge.init import InitError, live_problems, propose, render
from bridge.paths import project_root
from bridge.slurm.model import Node, Partition
from bridge.slurm.scontrol import parse_nodes, parse_partitions

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
PARTITIONS = DATA / "scontrol-partitions-22.05.txt"
NODES = DATA / "scontrol-nodes-22.05.txt"
STB = str(Path(sys.executable).with_name("stb"))


def cluster() -> tuple[list[Partition], list[Node]]:
    return parse_partitions(PARTITIONS.read_text()), parse_nodes(NODES.read_text())


def lab_config() -> BridgeConfig:
    return load_config(project_root() / "deploy" / "lab" / "bridge.toml")


def test_the_labs_partitions_give_the_labs_pools() -> None:
    partitions, nodes = cluster()
    proposal = propose(partitions, nodes, models={"busy": "stb.slo_p99_ms = 100 ms"})
    got = {p.name: (p.partition, p.lend_mode, p.cost_rank, p.nodes) for p in proposal.pools}
    assert got == {
        "training": ("train", "drain", 2, ("n1", "n2")),
        "elastic": ("elastic", "preempt", 1, ("n3",)),
        "inference": ("infer", "reserved", 0, ("n3", "n4")),
    }
    assert proposal.triton_partition == "infer"
    assert proposal.gpu_types == {"h100": 16}
    text = render(proposal, source="the lab")
    path_cfg = BridgeConfig(**tomllib.loads(text))
    # the written file is what deploy/lab/bridge.toml says of the pools
    assert path_cfg.pools == lab_config().pools
    assert path_cfg.triton.partition == "infer" and path_cfg.triton.account == "bridge"
    assert not path_cfg.models  # the model repository is where models' facts live
    assert "busy: stb.slo_p99_ms = 100 ms" in text
    assert "n3 also in a lendable pool" in text and "n4 reserved" in text
    assert "PreemptMode=OFF" in text and "PreemptMode=REQUEUE" in text


def _with(partitions: list[Partition], part: str, **changes: object) -> list[Partition]:
    return [dataclasses.replace(p, **changes) if p.name == part else p for p in partitions]


def test_the_labs_own_configuration_passes_the_live_check() -> None:
    partitions, nodes = cluster()
    assert live_problems(lab_config(), partitions, nodes) == []


@pytest.mark.parametrize(
    ("name", "changes", "expected"),
    [
        ("infer", {"name": "gone"}, "[triton] partition 'infer' does not exist"),
        ("infer", {"allow_accounts": ("team-nlp",)}, "not the bridge's 'bridge'"),
        ("infer", {"nodes": ("n4",)}, "pools.elastic: node(s) n3 are not in the Triton"),
        ("elastic", {"preempt_mode": "OFF"}, "lend mode preempt, but partition elastic has"),
        ("train", {"preempt_mode": "REQUEUE"}, "Slurm would preempt its jobs"),
        ("train", {"name": "training-x"}, "pools.training: partition 'train' does not exist"),
        ("train", {"allow_accounts": ("team-vision",)}, "a drain lend runs its Triton job"),
    ],
)
def test_the_live_check_names_what_the_cluster_breaks(
    name: str, changes: dict[str, object], expected: str
) -> None:
    partitions, nodes = cluster()
    problems = live_problems(lab_config(), _with(partitions, name, **changes), nodes)
    assert any(expected in p for p in problems), problems


def test_a_drain_pool_under_a_lower_tier_may_preempt() -> None:
    # PreemptMode=REQUEUE on a drain pool is only a problem where the Triton partition
    # outranks it: at an equal tier Slurm does not preempt for the Triton job
    partitions, nodes = cluster()
    changed = _with(_with(partitions, "train", preempt_mode="REQUEUE"), "infer", priority_tier=1)
    assert not [p for p in live_problems(lab_config(), changed, nodes) if "pools.training" in p]


def test_no_bridge_partition_or_no_gpus_is_said() -> None:
    partitions, nodes = cluster()
    with pytest.raises(InitError, match="AllowAccounts is 'bridge' alone"):
        propose(_with(partitions, "infer", allow_accounts=None, name="serve"), nodes)
    no_gpus = [dataclasses.replace(n, gpus=0) for n in nodes]
    with pytest.raises(InitError, match="no partition has a node with GPUs"):
        propose(partitions, no_gpus)


def test_a_partition_without_gpus_is_left_out_and_said() -> None:
    partitions, nodes = cluster()
    cpu = dataclasses.replace(partitions[0], name="cpu", nodes=("c1",))
    proposal = propose([*partitions, cpu], nodes)
    assert "cpu" not in {p.partition for p in proposal.pools}
    assert proposal.notes == ["partition cpu: no node with GPUs, not a pool"]


def test_a_scavenger_partition_is_no_pool_and_is_proposed_for_staging() -> None:
    """The lab's staging partition: the elastic node again, PriorityTier 0 (below elastic's
    1), REQUEUE. It is no pool (its node is the elastic pool's), said, and written as a
    commented [weights] partition; a partition of a lower tier with a node no partition
    above it holds stays a pool."""
    partitions, nodes = cluster()
    elastic = next(p for p in partitions if p.name == "elastic")
    scavenger = dataclasses.replace(elastic, name="scavenger", priority_tier=0)
    proposal = propose([*partitions, scavenger], nodes)
    assert {p.name for p in proposal.pools} == {"training", "elastic", "inference"}
    assert proposal.scavenger == "scavenger"
    assert proposal.notes == [
        "partition scavenger: below elastic on all its nodes (a lower PriorityTier): work "
        "there yields to theirs, not a pool (the weight cache's staging jobs may run there: "
        "[weights] partition)"
    ]
    text = render(proposal, source="the lab")
    assert '# partition = "scavenger"' in text
    assert BridgeConfig(**tomllib.loads(text)).pools == lab_config().pools
    # a low partition with a node no lendable partition above it holds (n4: only the
    # reserved one) stays a pool
    low = dataclasses.replace(scavenger, name="low", nodes=("n3", "n4"))
    kept = propose([*partitions, low], nodes)
    assert kept.scavenger is None and "low" in {p.partition for p in kept.pools}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STB, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_command_writes_a_file_config_check_accepts(tmp_path: Path) -> None:
    out = tmp_path / "bridge.toml"
    recorded = ["--partitions", str(PARTITIONS), "--nodes", str(NODES)]
    done = run("init", *recorded, "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pool elastic: partition elastic, preempt" in done.stdout
    checked = run("config", "check", str(out), cwd=tmp_path)
    assert checked.returncode == 0 and "valid" in checked.stdout, checked.stdout
    # not over an existing file without --force; half an input pair is refused
    again = run("init", *recorded, "-o", str(out), cwd=tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr
    half = run(
        "init", "--partitions", str(PARTITIONS), "-o", str(tmp_path / "x.toml"), cwd=tmp_path
    )
    assert half.returncode == 1 and "go together" in half.stderr
    assert not (tmp_path / "x.toml").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bridge.toml"]  # no temp file left
