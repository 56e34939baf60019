"""Budgets enforced by Slurm itself: a team's monthly GPU-hour budget becomes
`GrpTRESMins=gres/gpu=<minutes>` on its Slurm account, so Slurm holds the account's jobs
(reason AssocGrpGRESMinutes) once the month's usage reaches it. The bridge never cancels
or requeues a job for a budget.

Slurm enforces such a limit only when slurm.conf has `PriorityType=priority/multifactor`
(it counts an association's usage) and `AccountingStorageEnforce` includes `limits`; the
usage must neither decay (`PriorityDecayHalfLife=0`) nor outlive the month
(`PriorityUsageResetPeriod=MONTHLY`), or the limit would not be a month's budget.
`check_enforcement` refuses, naming each setting, where one is missing.
"""

from __future__ import annotations

from bridge.config import BridgeConfig
from bridge.slurm.cli import SlurmCLI

#: slurm.conf settings a monthly GrpTRESMins budget needs -> what each must hold
REQUIRED = {
    "PriorityType": "priority/multifactor",
    "AccountingStorageEnforce": "limits",
    "PriorityDecayHalfLife": "00:00:00",
    "PriorityUsageResetPeriod": "MONTHLY",
}


class EnforcementError(RuntimeError):
    """Slurm cannot enforce the budget as set (the message says what to change)."""


def check_enforcement(slurm_config: dict[str, str]) -> None:
    missing = []
    for key, want in REQUIRED.items():
        have = slurm_config.get(key, "")
        ok = want in have.split(",") if key == "AccountingStorageEnforce" else have == want
        if not ok:
            missing.append(f"{key}={want} (now {have or 'unset'})")
    if missing:
        raise EnforcementError(
            "Slurm would not enforce a monthly GPU-minute limit; slurm.conf needs "
            + "; ".join(missing)
        )


def team_account(config: BridgeConfig, team: str, account: str = "") -> str:
    """The Slurm account whose association carries the team's limit: `account` when given,
    else the one account `[accounting.teams]` maps to the team, else the team's own name
    when no account maps to it."""
    if account:
        return account
    mapped = sorted(a for a, t in config.accounting.teams.items() if t == team)
    if len(mapped) == 1:
        return mapped[0]
    if len(mapped) > 1:
        raise EnforcementError(
            f"team {team} has accounts {', '.join(mapped)}: name the parent account that "
            "holds them all with --account (a limit on each would multiply the budget)"
        )
    return team


def enforce(slurm: SlurmCLI, account: str, gpu_hours: float) -> int:
    """Set the limit and read it back from slurmdbd; returns the GPU-minutes set."""
    check_enforcement(slurm.config())
    minutes = int(gpu_hours * 60)
    slurm.set_account_gpu_minutes(account, minutes)
    got = slurm.account_gpu_minutes(account)
    if got != minutes:
        raise EnforcementError(
            f"sacctmgr shows GrpTRESMins gres/gpu={got} on {account}, not {minutes}"
        )
    return minutes


def lift(slurm: SlurmCLI, account: str) -> None:
    slurm.set_account_gpu_minutes(account, None)
