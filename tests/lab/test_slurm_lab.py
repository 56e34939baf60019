"""The lab's Slurm: partitions, GPU gres, accounting of a training job (real Slurm)."""

from __future__ import annotations

import pytest

from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.slurm.hostlist import expand

from .helpers import gpu_count, sbatch, scontrol_show, wait_sacct_final

pytestmark = pytest.mark.lab


def test_partitions_have_the_designed_nodes_and_tiers(lab: LabSpec) -> None:
    parts = scontrol_show(lab, "partition")
    assert set(parts) == {"train", "elastic", "infer", "scavenger"}
    names = {p: set(expand(parts[p]["Nodes"])) for p in parts}
    assert names["train"] == {n.name for n in lab.pool_nodes("train")}
    assert names["elastic"] == {n.name for n in lab.pool_nodes("elastic")}
    assert names["infer"] == {n.name for n in lab.pool_nodes("infer") + lab.pool_nodes("elastic")}
    assert int(parts["infer"]["PriorityTier"]) > int(parts["elastic"]["PriorityTier"])
    assert parts["elastic"]["PreemptMode"] == "REQUEUE"
    assert parts["train"]["PreemptMode"] == "OFF"
    assert int(parts["elastic"]["GraceTime"]) == lab.grace_time_s
    assert parts["infer"]["AllowAccounts"] == "bridge"
    # staging's: the elastic nodes, below every other partition, preempted with no grace
    assert names["scavenger"] == names["elastic"]
    assert all(
        int(parts[p]["PriorityTier"]) > int(parts["scavenger"]["PriorityTier"])
        for p in ("train", "elastic", "infer")
    )
    assert parts["scavenger"]["PreemptMode"] == "REQUEUE"
    assert int(parts["scavenger"]["GraceTime"]) == 0
    config = slurm(lab, "scontrol", "show", "config")
    assert "preempt/partition_prio" in config


def test_every_node_has_its_address_and_gpu_gres(lab: LabSpec) -> None:
    nodes = scontrol_show(lab, "node")
    assert set(nodes) == {n.name for n in lab.nodes}
    for node in lab.nodes:
        f = nodes[node.name]
        assert f["NodeAddr"] == node.addr
        assert f["Gres"] == f"gpu:{lab.gpu_type}:{lab.gpus_per_node}"
        assert f"gres/gpu={lab.gpus_per_node}" in f["CfgTRES"]
        assert not f["State"].startswith(("DOWN", "UNKNOWN"))


def test_training_job_is_booked_with_its_gpus_and_elapsed_time(lab: LabSpec) -> None:
    job = sbatch(
        lab, "--partition=train", "--gres=gpu:2", "--account=team-vision", "--wrap", "sleep 3"
    )
    rec = wait_sacct_final(lab, job, timeout_s=60)
    assert rec["state"]["current"] == "COMPLETED"
    assert rec["partition"] == "train"
    assert rec["account"] == "team-vision"
    assert gpu_count(rec) == 2
    assert 3 <= rec["time"]["elapsed"] <= 30
    typed = [t for t in rec["tres"]["allocated"] if t["name"] == f"gpu:{lab.gpu_type}"]
    assert typed and typed[0]["count"] == 2


def test_inference_partition_is_reserved_for_the_bridge_account(lab: LabSpec) -> None:
    from bridge.lab.slurmctl import SlurmCommandError

    with pytest.raises(SlurmCommandError, match=r"(?i)account|partition"):
        sbatch(lab, "--partition=infer", "--account=team-nlp", "--wrap", "true")


def test_up_again_is_harmless_and_status_names_daemons_and_logs(lab: LabSpec) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from bridge.lab import lab as lab_mod

    before = {d.name: d.pid for d in lab_mod.status(lab)}
    lab_mod.up(lab, say=print, install=False)
    assert {d.name: d.pid for d in lab_mod.status(lab)} == before
    stb = Path(sys.executable).with_name("stb")
    done = subprocess.run(
        [str(stb), "lab", "status", "--dir", str(lab.lab_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name, pid in before.items():
        assert name in done.stdout and str(pid) in done.stdout
    assert str(lab.log_dir / "slurmctld.log") in done.stdout
    assert f"SLURM_CONF={lab.slurm_conf}" in done.stdout
