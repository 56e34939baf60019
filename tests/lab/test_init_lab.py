"""`stb init` on the lab: from the live cluster's partitions and nodes it writes a
configuration that `stb config check --live` accepts, with the lab's own pools; the live
check also refuses a configuration the cluster contradicts. (The demo runs with `stb
init`'s pools in `test_bridge_e2e.py`.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.lab.spec import LabSpec
from bridge.paths import project_root

from .helpers import stb

pytestmark = pytest.mark.lab


def test_init_writes_what_the_cluster_accepts(lab: LabSpec, tmp_path: Path) -> None:
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
