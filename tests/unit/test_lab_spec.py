"""The lab's shape and its rendered Slurm configuration (pure: no daemons)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bridge.lab import render
from bridge.lab.lab import left_router
from bridge.lab.spec import MIG_PROFILES, LabSpec, LabSpecError
from bridge.slurm.hostlist import expand


def _conf_lines(text: str, key: str) -> list[dict[str, str]]:
    return [
        dict(f.split("=", 1) for f in line.split())
        for line in text.splitlines()
        if line.startswith(key + "=")
    ]


def test_default_lab_has_two_train_one_elastic_one_reserved(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path)
    assert [(n.name, n.pool, n.addr) for n in spec.nodes] == [
        ("n1", "train", "127.0.1.1"),
        ("n2", "train", "127.0.1.2"),
        ("n3", "elastic", "127.0.1.3"),
        ("n4", "infer", "127.0.1.4"),
    ]
    assert len({n.port for n in spec.nodes}) == 4


def test_slurm_conf_partitions_and_preemption(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path, train_nodes=3, elastic_nodes=2, infer_nodes=2)
    conf = render.slurm_conf(spec)
    parts = {p["PartitionName"]: p for p in _conf_lines(conf, "PartitionName")}
    assert expand(parts["train"]["Nodes"]) == ["n1", "n2", "n3"]
    assert expand(parts["elastic"]["Nodes"]) == ["n4", "n5"]
    assert sorted(expand(parts["infer"]["Nodes"])) == ["n4", "n5", "n6", "n7"]
    assert parts["elastic"]["PreemptMode"] == "REQUEUE"
    assert int(parts["infer"]["PriorityTier"]) > int(parts["elastic"]["PriorityTier"])
    assert parts["train"]["PreemptMode"] == "OFF"
    # staging's partition: on the elastic nodes, below every other, preempted at once
    assert expand(parts["scavenger"]["Nodes"]) == ["n4", "n5"]
    assert parts["scavenger"]["PreemptMode"] == "REQUEUE"
    assert parts["scavenger"]["GraceTime"] == "0"
    assert all(
        int(parts[p]["PriorityTier"]) > int(parts["scavenger"]["PriorityTier"])
        for p in ("train", "elastic", "infer")
    )
    assert "PreemptType=preempt/partition_prio" in conf
    assert "$" not in conf  # every placeholder was filled
    nodes = _conf_lines(conf, "NodeName")
    assert [n["NodeAddr"] for n in nodes] == [f"127.0.1.{i}" for i in range(1, 8)]
    assert all(n["Gres"] == "gpu:h100:4" for n in nodes)
    # Triton fills reserved inference nodes before elastic ones.
    weight = {n["NodeName"]: int(n["Weight"]) for n in nodes}
    assert weight["n6"] < weight["n4"]


def test_one_node_of_mig_slices_in_a_hidden_partition_of_its_own(tmp_path: Path) -> None:
    assert LabSpec(lab_dir=tmp_path).mig_nodes == []  # only when asked (stb lab up --mig)
    spec = LabSpec(lab_dir=tmp_path, mig_profiles=MIG_PROFILES)
    assert [(n.name, n.pool, n.addr) for n in spec.mig_nodes] == [("n5", "mig", "127.0.1.5")]
    assert [n.name for n in spec.all_nodes] == ["n1", "n2", "n3", "n4", "n5"]
    assert "n5" not in {n.name for n in spec.nodes}  # every whole-GPU node, as before
    conf = render.slurm_conf(spec)
    node = next(n for n in _conf_lines(conf, "NodeName") if n["NodeName"] == "n5")
    assert node["Gres"] == "gpu:h100_4g.40gb:1,gpu:h100_2g.20gb:1,gpu:h100_1g.10gb:1"
    part = next(p for p in _conf_lines(conf, "PartitionName") if p["PartitionName"] == "mig")
    assert (part["Nodes"], part["Hidden"]) == ("n5", "YES")
    tres = next(line for line in conf.splitlines() if line.startswith("AccountingStorageTRES="))
    assert tres == (
        "AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:h100_4g.40gb,"
        "gres/gpu:h100_2g.20gb,gres/gpu:h100_1g.10gb"
    )
    gres = render.gres_conf(spec)
    assert f"NodeName=n5 Name=gpu Type=h100_1g.10gb File={tmp_path}/dev/n5-gpu2" in gres
    # none asked for: no such node, and the lab is the whole-GPU one
    plain = LabSpec(lab_dir=tmp_path, mig_profiles=())
    plain_parts = _conf_lines(render.slurm_conf(plain), "PartitionName")
    assert plain.mig_nodes == [] and "mig" not in {p["PartitionName"] for p in plain_parts}
    with pytest.raises(LabSpecError, match="mig_profiles"):
        LabSpec(lab_dir=tmp_path, mig_profiles=("3g",))


def test_gres_conf_points_at_the_lab_devices(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path, gpus_per_node=2)
    gres = render.gres_conf(spec)
    assert "AutoDetect=off" in gres
    assert f"NodeName=n1 Name=gpu Type=h100 File={tmp_path}/dev/n1-gpu[0-1]" in gres


def test_slurmdbd_conf_omits_an_empty_password(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path)
    text = render.slurmdbd_conf(spec, render.DbSettings())
    assert "StoragePass" not in text
    assert f"StorageLoc={spec.db_name}" in text
    with_pass = render.slurmdbd_conf(spec, render.DbSettings(password="s3cret"))
    assert "StoragePass=s3cret" in with_pass


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"infer_nodes": 0}, "infer_nodes"),
        ({"train_nodes": -1}, "train_nodes"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpu_type": "H100 SXM"}, "gpu_type"),
        ({"accounts": ("ok", "bad name")}, "account"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(LabSpecError, match=field):
        LabSpec(lab_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_spec_round_trips_through_lab_json(tmp_path: Path) -> None:
    spec = LabSpec(
        lab_dir=tmp_path, train_nodes=1, gpus_per_node=8, gpu_type="a100", mig_profiles=("1g.5gb",)
    )
    spec.save()
    assert LabSpec.load(tmp_path) == spec
    assert LabSpec.load(tmp_path / "missing") is None


def test_jwt_is_an_alternative_to_munge_in_both_daemons(tmp_path: Path) -> None:
    """slurmrestd's callers authenticate with JWTs (`scontrol token`); munge stays every
    daemon's and client's own. Without the auth/jwt plugin, neither file names it."""
    spec = LabSpec(lab_dir=tmp_path)
    key = f"AuthAltParameters=jwt_key={tmp_path}/etc/jwt_hs256.key"
    for text in (render.slurm_conf(spec), render.slurmdbd_conf(spec, render.DbSettings())):
        lines = text.splitlines()
        assert "AuthType=auth/munge" in lines
        assert "AuthAltTypes=auth/jwt" in lines and key in lines
    for text in (
        render.slurm_conf(spec, jwt=False),
        render.slurmdbd_conf(spec, render.DbSettings(), jwt=False),
    ):
        assert "AuthAltTypes" not in text and "AuthType=auth/munge" in text.splitlines()
    assert spec.rest_url == "http://127.0.0.1:6820"
    assert spec.rest_env()["STB_SLURM_REST_URL"] == spec.rest_url


def test_readable_by_others_needs_every_folder_searchable() -> None:
    import shutil
    import tempfile

    from bridge.lab.system import readable_by_others

    top = Path(tempfile.mkdtemp())  # pytest's tmp_path sits in a 0700 folder
    try:
        top.chmod(0o755)
        folder = top / "a" / "b"
        folder.mkdir(parents=True, mode=0o755)
        conf = folder / "slurm.conf"
        conf.write_text("x")
        conf.chmod(0o644)
        assert readable_by_others(conf) == all(q.stat().st_mode & 0o001 for q in top.parents)
        (top / "a").chmod(0o700)
        assert not readable_by_others(conf)
        (top / "a").chmod(0o755)
        conf.chmod(0o600)
        assert not readable_by_others(conf)
    finally:
        shutil.rmtree(top)


def _seen(pid: int, code: int | None) -> str:
    """What /proc shows of pid: its state and cmdline, or why they could not be read."""
    proc = Path("/proc") / str(pid)
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError as err:
        return f"pid {pid} (exit status {code}): /proc unreadable: {err}"
    return f"pid {pid} (exit status {code}): state {state}, cmdline {cmdline!r}"


def test_lab_down_finds_the_nginx_a_killed_bridge_left_on_the_lab_s_prefix(
    tmp_path: Path,
) -> None:
    spec = LabSpec(lab_dir=tmp_path)
    run = tmp_path / "nginx" / "run"
    run.mkdir(parents=True)
    assert left_router(spec) is None  # no pid file
    # a process titled as nginx titles its master, on this lab's prefix
    title = f"nginx: master process /usr/sbin/nginx -p {tmp_path / 'nginx'}/ -e x"
    other = f"nginx: master process /usr/sbin/nginx -p {tmp_path / 'nginx-other'}/"
    # (without the lab's marker: no lab's final sweep, on the lab's worker beside this one,
    # may take them for its own)
    env = {k: v for k, v in os.environ.items() if k != "STB_LAB_DIR"}
    with (
        subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 30', title], env=env) as mine,
        subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 30', other], env=env) as theirs,
    ):
        try:
            (run / "nginx.pid").write_text(f"{mine.pid}\n")
            deadline = time.monotonic() + 5
            while left_router(spec) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # until the shell has exec'd the titled process
            # (it failed once in CI, not since: should it again, the message says why)
            assert left_router(spec) == mine.pid, _seen(mine.pid, mine.poll())
            (run / "nginx.pid").write_text(f"{theirs.pid}\n")
            time.sleep(0.2)
            assert left_router(spec) is None  # another prefix's: not the lab's
            (run / "nginx.pid").write_text("not a pid\n")
            assert left_router(spec) is None
        finally:
            mine.kill()
            theirs.kill()
    (run / "nginx.pid").write_text(f"{mine.pid}\n")
    assert left_router(spec) is None  # gone
