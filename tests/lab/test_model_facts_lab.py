"""One place for each model fact, on the lab: a model published with SLO metadata and no
TOML entry is lent for when it breaches, from the tick after the publish, with no
restart.

A copy of `busy` (one instance, 20 ms a request: one replica serves 50 req/s) is
published under a new name with `stb.slo_p99_ms` in its config.pbtxt through `stb models
publish` while the bridge runs; the bridge's TOML (deploy/lab/bridge.toml) names no such
model. The next tick's facts scale it; a load step of 70 req/s on it through nginx makes
the reconciler lend the elastic node for it; the lease serves (the lent Triton loaded the
new model), is returned by an operator request, and the model is retired (unloaded,
moved out of the repository).

The bridge here serves a copy of triton_repo/ (the `triton_config` override), so the
project's own repository is never written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridge.audit.asks import ask_return
from bridge.config import TritonJobConfig
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.leases.models import Lease
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson
from bridge.models.repo import ModelRepository
from bridge.paths import project_root

from .helpers import Sender, tick_until

pytestmark = pytest.mark.lab
STB = str(Path(sys.executable).with_name("stb"))
NEW = "busy-fresh"
SLO_MS = 100
RATE = 70.0  # req/s: 1.4 x what one 20 ms instance serves
LOAD_S = 120.0  # the schedule's length; the sender is stopped once the lease serves


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


def _routed(listen: str, model: str) -> bool:
    try:
        return httpx.get(f"http://{listen}/v2/models/{model}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _stb(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STB, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _lease_of(rec: Reconciler, model: str) -> Lease | None:
    return next((x for x in rec.store.open_leases() if model in x.models), None)


@contextlib.contextmanager
def _published(
    env: dict[str, str], repo_root: Path, config_file: Path, src: Path
) -> Iterator[None]:
    """`NEW` published from `src` for the block; then retired (unloaded everywhere and
    moved out of the repository, into the archive beside it)."""
    res = _stb(env, "models", "publish", str(src), "--name", NEW, "-c", str(config_file))
    assert res.returncode == 0, res.stderr
    try:
        yield
    finally:
        out = _stb(env, "models", "retire", NEW, "-c", str(config_file), "--reason", "test")
        assert out.returncode == 0, out.stderr
        assert NEW not in ModelRepository(repo_root).models()


def test_a_published_model_with_slo_metadata_is_lent_for_without_a_toml_entry(
    lab: LabSpec,
    bridge: tuple[Reconciler, str],
    repo_root: Path,
    config_file: Path,
    tmp_path: Path,
) -> None:
    rec, listen = bridge
    env = os.environ | lab.env()
    log: list[str] = []
    tick_until(rec, lambda: _routed(listen, "busy"), 120, log)  # the baseline serves
    assert NEW not in rec.config.models  # the bridge's TOML names no such model
    assert NEW not in rec.observer.models().names

    # busy under a new name, its SLO in its config.pbtxt (the only place it is written)
    src = tmp_path / "src"
    shutil.copytree(repo_root / "busy" / "1", src)
    text = (repo_root / "busy" / "config.pbtxt").read_text()
    assert 'key: "stb.slo_p99_ms"' in text
    (src / "config.pbtxt").write_text(text.replace('name: "busy"', f'name: "{NEW}"', 1))

    with _published(env, repo_root, config_file, src):
        # the next tick scales it: its facts come from the repository
        tick_until(rec, lambda: _routed(listen, NEW), 30, log)
        fact = rec.observer.models().facts[NEW]
        assert fact.model is not None and fact.model.slo_p99_ms == SLO_MS
        assert fact.model.instances == 1 and not fact.in_toml
        assert set(fact.sources.values()) <= {"repository", "default"}

        sender = Sender(listen, poisson(RATE, LOAD_S, seed=21), NEW)
        sender.start()
        try:
            tick_until(rec, lambda: _lease_of(rec, NEW) is not None, 90, log)
            lease = _lease_of(rec, NEW)
            assert lease is not None and lease.id is not None
            elastic = lab.pool_nodes("elastic")[0].name
            assert (lease.node, lease.pool) == (elastic, "elastic"), "\n".join(log)
            assert NEW in lease.models
            # the lent replica serves the new model (Triton loaded it from the repository)
            tick_until(
                rec,
                lambda: rec.store.get(lease.id or 0).state == LeaseState.SERVING,
                120,
                log,
            )
        finally:
            sender.stop()
        assert sender.counters.ok > 0
        assert rec.requests is not None
        ask_return(rec.requests, lease.id, who="test")
        tick_until(rec, lambda: rec.store.get(lease.id or 0).state == LeaseState.RETURNED, 90, log)
        print("\n".join(log))  # the bridge's timeline (pytest -s)
        history = [e.to_state for e in rec.store.history(lease.id)]
        assert history[-1] == LeaseState.RETURNED and LeaseState.FAILED not in history
