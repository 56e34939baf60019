"""The bridge's side of the ledger's agreement with sreport: reads sreport for each
completed hour of a window and compares it with the ledger (`accounting.agreement`).
`stb accounting agree` and bench/sreport_agreement.py call `sreport_agreement`."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine

from accounting.agreement import (
    Agreement,
    Difference,
    HourFigures,
    Pending,
    changed_runs,
    compare,
    lagging_accounts,
    ledger_hour,
    pending_of,
    rollup_view,
)
from accounting.buckets import HOUR, floor_hour, hours
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.slices import SliceRules


def _sreport_hour(slurm: SlurmCLI, cluster: str, hour: datetime) -> HourFigures | None:
    """sreport's figures of one hour; None when it has no line of the cluster."""
    lines = [u for u in slurm.cluster_utilization(hour, hour + HOUR) if u.cluster == cluster]
    if not lines:
        return None
    u = lines[0]
    return HourFigures(
        allocated=u.allocated,
        down=u.down,
        planned_down=u.planned_down,
        idle=u.idle,
        reported=u.reported,
        accounts=slurm.account_utilization(hour, hour + HOUR),
        planned=u.planned,
    )


def sreport_agreement(
    slurm: SlurmCLI,
    ledger: Engine,
    cluster: str,
    start: datetime,
    end: datetime,
    *,
    reroll: bool = False,
    now: datetime | None = None,
    slices: SliceRules | None = None,
) -> Agreement:
    """Compare each hour of [start, end) (on hours) that slurmdbd has rolled up. An hour
    in which slurmdbd had no registration of the cluster (sreport has no line for it) is
    compared with zeros: the ledger must book nothing there either.

    An hour whose lines equal sreport's once counted by sreport's own rules (the cluster
    clamped as a whole; `accounting.agreement.rollup_view`) is reconciled, not a
    difference. An hour whose only difference is GPU time of accounts the ledger saw
    change lately is `Pending` (slurmdbd re-rolls it at its next pass), not a
    difference. `reroll`: an hour that differs is first rolled up again (`sacctmgr
    roll`, a Slurm administrator's right) and compared anew; what still differs then is
    a difference. `slices`: the rules the ledger booked MIG slices by
    (`[accounting.slices]`; the default's when None): sreport counts a slice as one
    gres/gpu, so the ledger's slice time is counted back to that."""
    now = now or datetime.now(UTC)
    out = Agreement()
    for hour in hours(start, floor_hour(end)):
        led = ledger_hour(ledger, cluster, hour, slices)
        srep = _sreport_hour(slurm, cluster, hour)
        if srep is None:
            # no line: slurmdbd has not rolled the hour up yet, or the cluster was not
            # registered in it at all; then sreport's figures are zero, and so must the
            # ledger's be
            registered = any(
                e.is_registration and e.cluster == cluster for e in slurm.events(hour, hour + HOUR)
            )
            if registered:
                out.not_rolled.append(hour)
                continue
            srep = HourFigures()
        diffs = compare(hour, led, srep)
        if diffs and reroll:
            slurm.reroll(hour, hour + HOUR)
            out.rerolled.append(hour)
            srep = _sreport_hour(slurm, cluster, hour) or HourFigures()
            diffs = compare(hour, led, srep)
        if diffs and not compare(
            hour, view := rollup_view(ledger, cluster, hour, now, slices), srep
        ):
            out.reconciled[hour] = view  # the lines differ only by sreport's own rules
            diffs = []
        out.hours.append(hour)
        out.figures[hour] = (led, srep)
        pending = None if reroll or not diffs else _pending(ledger, cluster, hour, diffs, now)
        if pending is not None:
            out.pending.append(pending)
        else:
            out.differences.extend(diffs)
    return out


def _pending(
    ledger: Engine, cluster: str, hour: datetime, diffs: list[Difference], now: datetime
) -> Pending | None:
    accounts = lagging_accounts(diffs)
    if accounts is None:
        return None
    return pending_of(hour, diffs, changed_runs(ledger, cluster, hour, accounts), now)
