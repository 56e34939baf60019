"""The bridge's side of the ledger's agreement with sreport: reads sreport for each
completed hour of a window and compares it with the ledger (`accounting.agreement`).
`stb accounting agree` and bench/sreport_agreement.py call `sreport_agreement`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine

from accounting.agreement import Agreement, HourFigures, compare, ledger_hour
from accounting.buckets import HOUR, floor_hour, hours
from bridge.slurm.cli import SlurmCLI


def sreport_agreement(
    slurm: SlurmCLI,
    ledger: Engine,
    cluster: str,
    start: datetime,
    end: datetime,
) -> Agreement:
    """Compare each hour of [start, end) (on hours) that slurmdbd has rolled up. An hour
    in which slurmdbd had no registration of the cluster (sreport has no line for it) is
    compared with zeros: the ledger must book nothing there either."""
    out = Agreement()
    for hour in hours(start, floor_hour(end)):
        lines = [u for u in slurm.cluster_utilization(hour, hour + HOUR) if u.cluster == cluster]
        led = ledger_hour(ledger, cluster, hour)
        if not lines:
            # no line: slurmdbd has not rolled the hour up yet, or the cluster was not
            # registered in it at all; then sreport's figures are zero, and so must the
            # ledger's be
            registered = any(
                e.is_registration and e.cluster == cluster for e in slurm.events(hour, hour + HOUR)
            )
            if registered:
                out.not_rolled.append(hour)
                continue
            out.hours.append(hour)
            out.figures[hour] = (led, HourFigures())
            out.differences.extend(compare(hour, led, HourFigures()))
            continue
        u = lines[0]
        srep = HourFigures(
            allocated=u.allocated,
            down=u.down,
            planned_down=u.planned_down,
            idle=u.idle,
            reported=u.reported,
            accounts=slurm.account_utilization(hour, hour + HOUR),
            planned=u.planned,
        )
        out.hours.append(hour)
        out.figures[hour] = (led, srep)
        out.differences.extend(compare(hour, led, srep))
    return out
