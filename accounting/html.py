"""The HTML finance report: one self-contained file (inline CSS, inline SVG charts; no
scripts, fonts, images or URLs), readable offline and safe to mail or archive.

`render_html(engine, report, rates)` renders a `Report` (its table, totals, notes, the
rounding statement, window and generation time) and three charts, computed again from the
ledger over the report's window:

- GPU-hours per team per day, stacked by workload: one small panel per team (narrowed by
  the report's filters); idle capacity has no team and gets its own "(idle)" panel;
- utilization by pool, allocated / capacity, hourly for windows of two days or less, else
  daily; always the whole fleet (`report.utilization` takes no filters);
- cost by team, or GPU-hours by team when there are no rates.

The markup is `templates/report.html.j2` (Jinja2, autoescaped: all report text is
escaped), on `bridge.page`'s page, CSS and chart helpers (shared with the simulator's
report).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter
from sqlalchemy import Engine

from accounting.buckets import HOUR, floor_hour, utc
from accounting.rates import ROUNDING, RateBook
from accounting.report import Report, Window, build_report, utilization
from accounting.schema import IDLE_TEAM, WORKLOADS
from accounting.section import Section
from accounting.section import to_html as section_html
from bridge.page import WORKLOAD_COLOURS, Chart, drawing, no_data, render_page, svg

#: pool lines of the utilization chart: hues apart from the workload colours
POOL_COLOURS = ("#8e24aa", "#d81b60", "#00796b", "#6d4c41", "#546e7a", "#9e9d24", "#283593")
COST_COLOUR = "#6a1b9a"
IDLE_LABEL = IDLE_TEAM
#: teams drawn as their own panel in the per-team chart; the rest share one
MAX_TEAM_PANELS = 8
#: windows up to this long get an hourly utilization chart, longer ones a daily one
HOURLY_UP_TO = timedelta(days=2)
#: the report table's numeric columns, right-aligned
NUMERIC = ("gpu_hours", "cost")


def render_html(
    engine: Engine,
    report: Report,
    rates: RateBook | None = None,
    *,
    generated_at: datetime | None = None,
    sections: Sequence[Section] = (),
) -> str:
    """The report as one HTML document. `rates` prices the cost chart (pass the book the
    report was built with); `generated_at` defaults to now; `sections` (unit economics,
    lending, capacity plan, budgets) follow the report's table."""
    generated = utc(generated_at or datetime.now(UTC))
    # glyphs as paths (no font needed to read them); "$" in a team name is no math
    with drawing():
        charts = [
            _team_day_chart(engine, report),
            _utilization_chart(engine, report),
            _team_cost_chart(engine, report, rates),
        ]
    w = report.window
    meta = {
        "window": f"{w.label}: [{w.start.isoformat()}, {w.end.isoformat()}) UTC",
        "grouped by": ", ".join(report.by) or "(nothing)",
        "step": report.step or "none (whole window)",
        "idle": (
            "shared within each pool in proportion to use"
            if report.idle == "shared"
            else "its own line (team empty)"
        ),
        "filters": ", ".join(f"{k}={v}" for k, v in report.filters.items()) or "none",
        "currency": report.currency or "none (GPU-hours only)",
        "generated": generated.isoformat(timespec="seconds"),
    }
    return render_page(
        "accounting",
        "report.html.j2",
        title=f"GPU-hour report {w.label}",
        meta=meta,
        charts=charts,
        table=_table(report),
        sections=[section_html(s) for s in sections],
        notes=report.notes or ["none"],
        rounding=ROUNDING if report.currency else "no money amounts in this report",
        generated=generated.isoformat(timespec="seconds"),
    )


def _table(report: Report) -> dict[str, Any]:
    """The report's table for the template: the headers as (text, numeric), each line's
    cells and the totals as (text, numeric), and how many key columns the total spans."""
    cols = report.columns()
    heads = {"gpu_hours": "GPU-hours", "cost": f"cost ({report.currency})"}

    def cell(col: str, value: Any) -> tuple[str, bool]:
        if col in NUMERIC:
            return (f"{value:,.3f}" if isinstance(value, float) else str(value)), True
        return str(value), False

    total = report.as_dict()["total"]
    rows = []
    for line in report.lines:
        d = line.as_dict()
        rows.append([cell(c, d.get(c, "")) for c in cols])
    return {
        "heads": [(heads[c], True) if c in NUMERIC else (c, False) for c in cols],
        "rows": rows,
        "key_columns": len([c for c in cols if c not in NUMERIC]),
        "totals": [cell(c, total.get(c, "")) for c in cols if c in NUMERIC],
    }


# -- charts -------------------------------------------------------------------------------


def _periods(window: Window, step: str) -> list[str]:
    """Every period label of `window` at `step` ("hour" or "day"), as the report writes
    them, so periods without ledger rows still get their place on the axis."""
    out = []
    if step == "hour":
        t, end = floor_hour(window.start), utc(window.end)
        while t < end:
            out.append(t.isoformat())
            t += HOUR
        return out
    d, last = utc(window.start).date(), (utc(window.end) - timedelta(microseconds=1)).date()
    while d <= last:
        out.append(d.isoformat())
        d += timedelta(days=1)
    return out


def _x_ticks(ax: Axes, periods: Sequence[str], step: str) -> None:
    if step == "hour":  # "MM-DD HH:00" is wide: at most 8 labels, every 1, 2, 3, 4, 6... hours
        want = len(periods) / 8
        every = next((n for n in (1, 2, 3, 4, 6, 12) if n >= want), 24 * math.ceil(want / 24))
    else:
        every = max(1, math.ceil(len(periods) / 14))
    fmt = "%m-%d %H:00" if step == "hour" else "%m-%d"
    ticks = list(range(0, len(periods), every))
    ax.set_xticks(ticks, [datetime.fromisoformat(periods[i]).strftime(fmt) for i in ticks])
    ax.set_xlim(-0.6, len(periods) - 0.4)


def _team_label(team: str) -> str:
    return team or "(no team)"


def _team_day_chart(engine: Engine, report: Report) -> Chart:
    daily = build_report(
        engine, report.window, ("team", "workload"), step="day", filters=report.filters
    )
    days = _periods(report.window, "day")
    index = {d: i for i, d in enumerate(days)}
    series: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for line in daily.lines:
        per_wl = series[line.keys["team"]]
        values = per_wl.setdefault(line.keys["workload"], [0.0] * len(days))
        values[index[line.period or ""]] += line.gpu_hours
    total = {team: sum(map(sum, wl.values())) for team, wl in series.items()}
    teams = sorted((t for t in series if t not in ("", IDLE_TEAM)), key=lambda t: (-total[t], t))
    groups = [(t, series[t]) for t in teams[:MAX_TEAM_PANELS]]
    rest = teams[MAX_TEAM_PANELS:]
    if rest:
        merged: dict[str, list[float]] = {}
        for t in rest:
            for wl, values in series[t].items():
                acc = merged.setdefault(wl, [0.0] * len(days))
                merged[wl] = [a + v for a, v in zip(acc, values, strict=True)]
        groups.append((f"({len(rest)} other teams)", merged))
    for special in ("", IDLE_TEAM):  # jobs with no account, then idle capacity: last
        if special in series:
            groups.append((_team_label(special), series[special]))
    order = [*WORKLOADS, *sorted({wl for _, s in groups for wl in s} - set(WORKLOADS))]

    fig = Figure(figsize=(10, 0.9 + 1.45 * max(1, len(groups))), layout="constrained")
    axes = fig.subplots(max(1, len(groups)), 1, sharex=True, squeeze=False)[:, 0]
    if not groups:
        no_data(axes[0], "no GPU-hours in this window")
    for ax, (label, per_wl) in zip(axes, groups, strict=False):
        bottom = [0.0] * len(days)
        for wl in order:
            stack = per_wl.get(wl) or []
            if not any(stack):
                continue
            colour = WORKLOAD_COLOURS.get(wl, "#555555")
            ax.bar(range(len(days)), stack, bottom=bottom, width=0.8, color=colour)
            bottom = [b + v for b, v in zip(bottom, stack, strict=True)]
        ax.set_title(f"{label}: {sum(bottom):,.1f} GPU-h", loc="left", fontsize=9)
        ax.set_ylabel("GPU-h")
        ax.grid(axis="y", color="#e0e0e0")
        ax.set_axisbelow(True)
    if groups:
        _x_ticks(axes[-1], days, "day")
    handles = [Patch(color=WORKLOAD_COLOURS.get(wl, "#555555"), label=wl) for wl in order]
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), frameon=False)
    caption = (
        "GPU-hours per UTC day, stacked by workload, one panel per team (largest first). "
        f"Idle capacity belongs to no team and is shown as its own {IDLE_LABEL} panel."
    )
    if rest:
        caption += f" Teams beyond the {MAX_TEAM_PANELS} largest share one panel."
    if report.filters:
        caption += " Narrowed by the report's filters."
    return Chart("GPU-hours per team per day, by workload", svg(fig, "team-day"), caption)


def _utilization_chart(engine: Engine, report: Report) -> Chart:
    w = report.window
    step = "hour" if w.end - w.start <= HOURLY_UP_TO else "day"
    periods = _periods(w, step)
    index = {p: i for i, p in enumerate(periods)}
    by_pool: dict[str, list[float]] = {}
    for row in utilization(engine, w, step):
        if row["utilization"] is None or row["period"] not in index:
            continue
        values = by_pool.setdefault(row["pool"], [math.nan] * len(periods))
        values[index[row["period"]]] = 100.0 * row["utilization"]

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax = fig.subplots()
    if not by_pool:
        no_data(ax, "no capacity or allocation in this window")
    for i, (pool, values) in enumerate(sorted(by_pool.items())):
        ax.plot(
            range(len(periods)),
            values,
            color=POOL_COLOURS[i % len(POOL_COLOURS)],
            marker="o" if len(periods) <= 60 else None,
            markersize=3,
            linewidth=1.6,
            label=pool,
        )
    if by_pool:
        ax.set_ylim(0, 105)
        ax.yaxis.set_major_formatter(PercentFormatter())
        ax.set_ylabel("allocated / capacity")
        ax.grid(color="#e0e0e0")
        _x_ticks(ax, periods, step)
        fig.legend(title="pool", loc="outside right upper", frameon=False)
    caption = (
        f"Per pool and {step} (UTC): allocated GPU-hours / capacity GPU-hours, where capacity "
        "is allocation plus the capacity lines (idle, down) from slurmdbd's events or the node "
        "inventory (a pool they do not cover shows 100%)."
    )
    if report.filters:
        caption += " The whole fleet: the report's filters do not apply to this chart."
    return Chart(f"Utilization by pool, per {step}", svg(fig, "utilization"), caption)


def _team_cost_chart(engine: Engine, report: Report, rates: RateBook | None) -> Chart:
    priced = bool(rates)
    rep = build_report(
        engine,
        report.window,
        ("team",),
        idle=report.idle,
        rates=rates if priced else None,
        filters=report.filters,
    )
    items = []
    for line in rep.lines:
        team = line.keys["team"]
        value = float(line.cost or 0) if priced else line.gpu_hours
        items.append((_team_label(team), value, team == IDLE_TEAM))
    items.sort(key=lambda it: (it[2], -it[1], it[0]))
    unit = (rep.currency or "") if priced else "GPU-h"

    fig = Figure(figsize=(10, max(2.2, 0.8 + 0.38 * len(items))), layout="constrained")
    ax = fig.subplots()
    if not items:
        no_data(ax, "no GPU-hours in this window")
    else:
        colours = [WORKLOAD_COLOURS["idle"] if idle else COST_COLOUR for _, _, idle in items]
        bars = ax.barh([label for label, _, _ in items], [v for _, v, _ in items], color=colours)
        ax.bar_label(bars, labels=[f"{v:,.2f} {unit}" for _, v, _ in items], padding=3)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.margins(x=0.15)
        ax.grid(axis="x", color="#e0e0e0")
        ax.set_axisbelow(True)
    if priced:
        title = f"Cost by team ({rep.currency})"
        caption = f"Cost per team over the window, in {rep.currency}, priced per day's rate."
        caption += (
            " Idle cost is shared into the teams of each pool."
            if report.idle == "shared"
            else f" Idle capacity's cost is its own {IDLE_LABEL} bar."
        )
    else:
        title = "GPU-hours by team (no rates)"
        caption = "No rates are defined, so this chart shows GPU-hours by team instead of cost."
    if report.filters:
        caption += " Narrowed by the report's filters."
    return Chart(title, svg(fig, "team-cost"), caption)
