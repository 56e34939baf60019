"""Fault 4: a Triton job that Slurm rejects.

The bridge's `[triton] account` is `team-vision`, which the `infer` partition refuses
(`AllowAccounts=bridge`, and the lab's job_submit.lua says why). The reserved node's
baseline runs already (submitted with the right account), so the only Triton job the
bridge submits is the lent one. An operator lend of the elastic node then goes through the
reconciler (`run_once`). Expected: exactly one lease, which goes `failed` with Slurm's own
message in its reason and then `returned`; one sbatch in all, and over 10 more ticks no
other sbatch and no other lease (no retry storm); `stb status --json` lists the failure.
"""

from __future__ import annotations

import json
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend
from bridge.config import TritonJobConfig
from bridge.daemon import launcher
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.slurm.model import JobSpec
from tests.lab.helpers import tick_until, wait_state

from .tools import lab_env, stb

pytestmark = pytest.mark.lab
REFUSED_ACCOUNT = "team-vision"
#: job_submit.lua's refusal, as sbatch prints it
SLURM_SAYS = "may not use it"


@pytest.fixture
def triton_config(lab: LabSpec) -> TritonJobConfig:
    return triton.job_config(lab).model_copy(update={"account": REFUSED_ACCOUNT})


def test_rejected_triton_job_fails_its_lease_once(
    lab: LabSpec,
    bridge: tuple[Reconciler, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec, _ = bridge
    assert rec.requests is not None
    store, queue = rec.store, rec.requests
    lent, reserved = lab.pool_nodes("elastic")[0], lab.pool_nodes("infer")[0]
    baseline = rec.slurm.submit(launcher.triton_job(triton.job_config(lab), node=reserved.name))
    wait_state(lab, baseline, {"RUNNING"}, 60)

    submitted: list[JobSpec] = []
    sbatch = rec.slurm.submit

    def counting_submit(spec: JobSpec) -> str:
        submitted.append(spec)
        return sbatch(spec)

    monkeypatch.setattr(rec.slurm, "submit", counting_submit)
    t0 = datetime.now(UTC) - timedelta(seconds=1)
    request = ask_lend(queue, lent.name, ["busy"])
    log: list[str] = []

    def leases() -> list[int]:
        return sorted(x.id or 0 for x in store.touched_since(t0))

    tick_until(
        rec,
        lambda: bool(leases()) and store.get(leases()[0]).state == LeaseState.RETURNED,
        60,
        log,
    )
    for _ in range(10):  # ten more ticks: no retry
        report = rec.run_once(datetime.now(UTC))
        log += report.lines()
    print("\n".join(log))

    (lease_id,) = leases()
    history = store.history(lease_id)
    states = [e.to_state.value for e in history]
    assert states[-2:] == ["failed", "returned"], states
    failed = next(e for e in history if e.to_state == LeaseState.FAILED)
    print(f"lease {lease_id} failed: {failed.reason}")
    assert SLURM_SAYS in failed.reason and REFUSED_ACCOUNT in failed.reason, failed.reason
    assert len(submitted) == 1, [s.name for s in submitted]  # one sbatch, no retry
    assert submitted[0].account == REFUSED_ACCOUNT
    outcome = (queue.get(request.id or 0) or request).outcome
    print(f"operator request: {outcome}")
    assert outcome

    # `stb status --json` lists the failure with Slurm's words.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    config = tmp_path / "status.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "bridge.db"}"\n'
        f'[daemon]\nexporter_listen = "127.0.0.1:{unused}"\n'
    )
    done = subprocess.run(
        [stb(), "status", "--json", "-c", str(config)],
        env=lab_env(lab), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    doc = json.loads(done.stdout)
    assert [f["id"] for f in doc["failed"]] == [lease_id], doc["failed"]
    assert SLURM_SAYS in doc["failed"][0]["reason"], doc["failed"]
    assert doc["leases"] == []  # nothing left open
