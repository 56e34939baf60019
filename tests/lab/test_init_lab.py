"""`stb init` on the lab: from the live cluster's partitions and nodes it writes a
configuration that `stb config check --live` accepts and with whose pools the demo runs
(`stb lab demo --config FILE`: a load step lends the elastic node, the lease returns).
The live check also refuses a configuration the cluster contradicts."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.lab.spec import LabSpec
from bridge.paths import project_root

pytestmark = pytest.mark.lab

STB = str(Path(sys.executable).with_name("stb"))


def stb(lab: LabSpec, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STB, *args],
        cwd=project_root(),
        env=os.environ | lab.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_init_writes_what_the_cluster_and_the_demo_accept(lab: LabSpec, tmp_path: Path) -> None:
    out = tmp_path / "bridge.toml"
    made = stb(lab, "init", "-o", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    cfg = load_config(out)
    lab_cfg = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    assert cfg.pools == lab_cfg.pools, made.stdout
    assert "busy" in out.read_text() and "echo" in out.read_text()  # the repository's models

    # the accepted file and a pool on a partition Slurm does not have, checked side by side
    # (each `stb` spends seconds importing before it asks Slurm anything)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(out.read_text().replace('partition = "elastic"', 'partition = "nosuch"'))
    with ThreadPoolExecutor(2) as pool:
        checking = pool.submit(stb, lab, "config", "check", str(out), "--live")
        refusing = pool.submit(stb, lab, "config", "check", str(wrong), "--live")
    checked, refused = checking.result(), refusing.result()
    assert checked.returncode == 0 and "the cluster agrees" in checked.stdout, checked.stdout
    # the wrong one: refused, by name
    assert refused.returncode == 1
    assert "pools.elastic: partition 'nosuch' does not exist" in refused.stdout

    demo = stb(lab, "lab", "demo", "--no-wait", "--config", str(out), timeout=540)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
    assert "-> returned" in demo.stdout, demo.stdout[-4000:]
