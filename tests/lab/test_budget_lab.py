"""Budgets Slurm enforces, on the lab: `stb budget set --enforce` puts GrpTRESMins on the
team's account (sacctmgr shows it), a job that would go over is held by Slurm with its own
reason (AssocGrpGRESMinutes), `stb budget status` reports the budget, and `stb budget
remove` lifts the limit so the job runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.slurm.cli import SlurmCLI

from .helpers import sbatch, squeue_state

pytestmark = pytest.mark.lab

TEAM = "team-research"


def _wait_reason(lab: LabSpec, job: str, want: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        state, reason = squeue_state(lab, job)
        seen = f"{state} {reason}"
        if want in (state, reason):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"job {job}: {seen!r}, not {want!r} within {timeout_s}s")


def test_budget_reaches_slurm_and_slurm_holds_the_job(
    lab: LabSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(
        f'database_url = "sqlite:///{tmp_path / "bridge.db"}"\n[accounting]\n'
        f'ledger_url = "sqlite:///{tmp_path / "ledger.db"}"\ncluster = "{lab.cluster}"\n'
    )
    cli = SlurmCLI(env=lab.env())
    runner = CliRunner()
    # 0.05 GPU-hours: 3 GPU-minutes, less than one 1-GPU job with a 10-minute limit
    res = runner.invoke(app, ["budget", "set", TEAM, "0.05", "--enforce", "-c", str(cfg)])
    job = ""
    try:
        assert res.exit_code == 0, res.output
        assert cli.account_gpu_minutes(TEAM) == 3
        shown = slurm(lab, "sacctmgr", "-P", "-n", "show", "assoc", "where", f"account={TEAM}",
                      "format=account,user,grptresmins")  # fmt: skip
        assert f"{TEAM}||gres/gpu=3" in shown.splitlines(), shown

        job = sbatch(lab, "--partition=elastic", f"--account={TEAM}", "--gres=gpu:1",
                     "--time=10", "--wrap", "sleep 20")  # fmt: skip
        _wait_reason(lab, job, "AssocGrpGRESMinutes")

        res = runner.invoke(app, ["budget", "status", "--json", "-c", str(cfg)])
        assert res.exit_code == 0, res.output
        (row,) = json.loads(res.stdout)
        assert row["team"] == TEAM and row["enforced_by_slurm"] and row["slurm_account"] == TEAM

        res = runner.invoke(app, ["budget", "remove", TEAM, "-c", str(cfg)])
        assert res.exit_code == 0, res.output
        assert cli.account_gpu_minutes(TEAM) is None
        state, reason = squeue_state(lab, job)
        deadline = time.monotonic() + 60
        while reason == "AssocGrpGRESMinutes" and time.monotonic() < deadline:
            time.sleep(0.5)
            state, reason = squeue_state(lab, job)
        assert reason != "AssocGrpGRESMinutes", (state, reason)
    finally:
        cli.set_account_gpu_minutes(TEAM, None)
        if job:
            slurm(lab, "scancel", job, check=False)


def test_enforce_refuses_a_money_budget(lab: LabSpec, tmp_path: Path) -> None:
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[accounting]\nledger_url = "sqlite:///{tmp_path / "ledger.db"}"\n')
    res = CliRunner().invoke(
        app, ["budget", "set", TEAM, "100", "--unit", "currency", "--currency", "EUR",
              "--enforce", "-c", str(cfg)],
    )  # fmt: skip
    assert res.exit_code == 1 and "GPU-hour budget" in res.output
    assert SlurmCLI(env=lab.env()).account_gpu_minutes(TEAM) is None
