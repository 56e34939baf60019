"""`sreport -P -n -t Seconds -T gres/gpu` -> GPU-seconds: a cluster's utilization lines
and the accounts' use, the reference the ledger's agreement check compares with
(`bridge.ledger.sreport`, through `SlurmCLI.cluster_utilization` and `account_utilization`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.slurm.errors import UnparseableOutput


@dataclass(frozen=True)
class GpuUtilization:
    """One cluster's line of `sreport -T gres/gpu cluster Utilization`, GPU-seconds."""

    cluster: str
    allocated: int
    down: int
    planned_down: int
    idle: int
    planned: int
    reported: int


def parse_sreport_utilization(text: str) -> list[GpuUtilization]:
    """Lines `Cluster|TRES Name|Allocated|Down|PLND Down|Idle|Planned|Reported`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        try:
            if len(parts) != 8 or parts[1] != "gres/gpu":
                raise ValueError(f"{len(parts)} fields, TRES {parts[1:2]}")
            a, d, pd, i, pl, r = (int(x) for x in parts[2:])
        except ValueError as exc:
            raise UnparseableOutput(f"sreport cluster Utilization ({exc})", line) from exc
        out.append(GpuUtilization(parts[0], a, d, pd, i, pl, r))
    return out


def parse_sreport_accounts(text: str) -> dict[str, int]:
    """Lines `Cluster|Account|Login|Proper Name|TRES Name|Used`: the account lines (no
    login) -> GPU-seconds."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        try:
            if len(parts) != 6 or parts[4] != "gres/gpu":
                raise ValueError(f"{len(parts)} fields, TRES {parts[4:5]}")
            used = int(parts[5])
        except ValueError as exc:
            raise UnparseableOutput(f"sreport AccountUtilizationByUser ({exc})", line) from exc
        if not parts[2]:
            out[parts[1]] = out.get(parts[1], 0) + used
    return out
