"""From training to serving, on the lab: the example training job publishes its model and
the model is then served through nginx; a broken config is refused with the repository
unchanged; a version whose load fails is rolled back and the previous version keeps
answering; concurrent publishes end in a consistent repository.

The bridge here serves a copy of triton_repo/ (the `triton_config` override), so the
project's own repository is never written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bridge.config import TritonJobConfig
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.models.repo import ModelRepository
from bridge.paths import project_root

from .helpers import sbatch, tick_until, wait_sacct_final

pytestmark = pytest.mark.lab
STB = str(Path(sys.executable).with_name("stb"))


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(
        project_root() / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


@pytest.fixture
def triton_config(lab: LabSpec, repo_root: Path) -> TritonJobConfig:
    return triton.job_config(lab).model_copy(update={"model_repository": repo_root})


@pytest.fixture
def config_file(tmp_path: Path, triton_config: TritonJobConfig) -> Path:
    path = tmp_path / "stb.toml"
    path.write_text(
        f'[triton]\nmodel_repository = "{triton_config.model_repository}"\n'
        f'key_file = "{triton_config.key_file}"\n'
    )
    return path


@pytest.fixture
def serving(bridge: tuple[Reconciler, str]) -> Iterator[tuple[Reconciler, str]]:
    """The bridge with its baseline replica up (it loads every model of the copy)."""
    rec, listen = bridge
    tick_until(rec, lambda: _routed(listen, "echo"), 120)
    yield rec, listen


def _routed(listen: str, model: str) -> bool:
    try:
        return httpx.get(f"http://{listen}/v2/models/{model}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _predict(listen: str, x: list[float]) -> float:
    body = {"inputs": [{"name": "X", "shape": [1, len(x)], "datatype": "FP32", "data": x}]}
    r = httpx.post(f"http://{listen}/v2/models/tiny/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


def _publish(src: Path, cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STB, "models", "publish", str(src), "--name", "tiny", "-c", str(cfg)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_a_training_job_publishes_and_its_model_is_served(
    lab: LabSpec,
    serving: tuple[Reconciler, str],
    repo_root: Path,
    config_file: Path,
    tmp_path: Path,
) -> None:
    rec, listen = serving
    env = os.environ | lab.env()

    # 1. The example training job trains and publishes; when it ends, tiny is served.
    job = sbatch(
        lab, "--partition=train", "--account=team-research", "--gres=gpu:1",
        f"--chdir={project_root()}",
        f"--export=ALL,STB_CONFIG={config_file},STB_PYTHON={sys.executable}",
        str(project_root() / "deploy" / "train" / "train-tiny.sbatch"),
    )  # fmt: skip
    record = wait_sacct_final(lab, job, timeout_s=180)
    log = (lab.log_dir / f"test-{job}.out").read_text()
    assert record["state"]["current"] == "COMPLETED", log
    assert "published tiny version 1" in log, log
    tick_until(rec, lambda: _routed(listen, "tiny"), 30)
    weights = np.load(repo_root / "tiny" / "1" / "weights.npy")
    x = [1.0, 2.0, 3.0, 4.0]
    assert _predict(listen, x) == pytest.approx(float(np.dot(weights[:-1], x) + weights[-1]), 1e-4)

    # 2. A broken config.pbtxt is refused; the repository is unchanged.
    src = tmp_path / "src"
    shutil.copytree(repo_root / "tiny" / "1", src)
    good_config = (repo_root / "tiny" / "config.pbtxt").read_text()
    (src / "config.pbtxt").write_text(good_config.replace("TYPE_FP32", "TYPE_FLOAT99", 1))
    before = _tree(repo_root)
    res = _publish(src, config_file, env)
    assert res.returncode == 1 and "not a Triton ModelConfig" in res.stderr, res.stderr
    assert _tree(repo_root) == before

    # 3. A version whose load fails is rolled back; version 1 keeps answering.
    (src / "config.pbtxt").write_text(good_config)
    (src / "model.py").write_text("raise RuntimeError('this checkpoint is corrupt')\n")
    res = _publish(src, config_file, env)
    assert res.returncode == 1, res.stderr
    assert "rolled back to version 1" in " ".join(res.stderr.split()), res.stderr
    assert ModelRepository(repo_root).versions("tiny") == [1]
    assert _tree(repo_root) == before
    assert _predict(listen, x) == pytest.approx(float(np.dot(weights[:-1], x) + weights[-1]), 1e-4)

    # 4. Concurrent publishes: serialized, both land, the repository is consistent and the
    #    highest version is the one served.
    shutil.copy(repo_root / "tiny" / "1" / "model.py", src / "model.py")
    np.save(src / "weights.npy", np.array([0, 0, 0, 0, 7.0]))
    procs = [
        subprocess.Popen(
            [STB, "models", "publish", str(src), "--name", "tiny", "-c", str(config_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert ModelRepository(repo_root).versions("tiny") == [1, 2, 3]
    assert not [p for p in (repo_root / "tiny").iterdir() if p.name.startswith(".")]
    assert _predict(listen, x) == pytest.approx(7.0)

    # 5. The history has every change with who and why: the training job's publish names
    #    its Slurm job, the failed one says why it was rolled back.
    shown = subprocess.run(
        [STB, "models", "history", "tiny", "--json", "-c", str(config_file)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    entries = json.loads(shown.stdout)["entries"]
    assert [(e["action"], e["version"]) for e in entries] == [
        ("publish", 1),
        ("publish-failed", 2),
        ("publish", 2),
        ("publish", 3),
    ]
    assert entries[0]["who"].endswith(f"(Slurm job {job})")
    assert "not ready" in entries[1]["why"] or "corrupt" in entries[1]["why"], entries[1]
    assert entries[1]["serving"] == 1 and entries[3]["serving"] == 3
    assert all(e["servers"] for e in entries), entries
