"""The selection report (`bridge.sim.selection.Selection`) for people: as grids (the
terminal's rich tables), as markdown, and as a section of the simulator's HTML page with
the trade-off curve as an inline SVG chart. Called by `stb simulate` (`bridge.sim.cli`);
pure functions of the selection (and, for the page and the markdown, the report).

Every number sits beside its definition (`bridge.sim.measures.DEFINITIONS`), every
threshold beside its reason (`bridge.sim.criteria.REASONS`); the recommendation's reasons
and the flips are the selection's own sentences, made from the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from markupsafe import Markup
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bridge import page
from bridge.page import WORKLOAD_COLOURS, Chart, drawing, no_data, svg
from bridge.sim import render
from bridge.sim.criteria import REASONS, Criteria
from bridge.sim.measures import DEFINITIONS, SEPARATE, Dimensions, human
from bridge.sim.render import Grid
from bridge.sim.result import SimReport
from bridge.sim.selection import Selection

#: the attainment axis of the trade-off chart: requests outside SLO from 1 in 100,000
#: to all of them, drawn as "nines" (99.999% at the top)
MISS_RANGE = (1e-5, 1.0)
SEPARATE_COLOUR = "#757575"


def _pct(v: float, digits: int = 2) -> str:
    return f"{100 * v:.{digits}f}%"


def _done(finished: int, submitted: int) -> str:
    return f"{finished:,} / {submitted:,}" if submitted else "-"


#: a row of the dimensions table: (key in DEFINITIONS, label, cell of a set-up's numbers)
Row = tuple[str, str, Callable[[Dimensions], str]]


def _jobs_rows(kind: str) -> tuple[Row, ...]:
    """The rows of one kind of job (training, elastic): its waits, completion, finished."""

    def of(d: Dimensions, name: str) -> Any:
        return getattr(d, f"{kind}_{name}")

    return (
        (f"{kind}_wait_mean_s", f"{kind} wait mean", lambda d: human(of(d, "wait_mean_s"))),
        (f"{kind}_wait_p95_s", f"{kind} wait p95", lambda d: human(of(d, "wait_p95_s"))),
        (
            f"{kind}_completion_mean_s",
            f"{kind} completion",
            lambda d: human(of(d, "completion_mean_s")) if of(d, "finished") else "-",
        ),
        (
            f"{kind}_finished",
            f"{kind} finished",
            lambda d: _done(of(d, "finished"), of(d, "submitted")),
        ),
    )


#: the dimensions table's rows
ROWS: tuple[Row, ...] = (
    ("reserved_nodes", "reserved nodes", lambda d: f"{d.reserved_nodes:,}"),
    ("reserved_gpus", "reserved GPUs", lambda d: f"{d.reserved_gpus:,}"),
    ("peak_serving_nodes", "peak serving nodes", lambda d: f"{d.peak_serving_nodes:,}"),
    ("requests_within", "requests within SLO", lambda d: _pct(d.requests_within, 3)),
    ("minutes_within", "minutes within SLO", lambda d: _pct(d.minutes_within, 2)),
    ("ttft_within", "requests within TTFT SLO", lambda d: _pct_or_none(d.ttft_within)),
    ("tpot_within", "requests within TPOT SLO", lambda d: _pct_or_none(d.tpot_within)),
    *_jobs_rows("training"),
    *_jobs_rows("elastic"),
    ("job_wait_mean_s", "job wait mean", lambda d: human(d.job_wait_mean_s)),
    ("preemptions", "preemptions", lambda d: f"{d.preemptions:,}"),
    ("gpu_hours_lost", "GPU-hours lost", lambda d: f"{d.gpu_hours_lost:,.1f}"),
    ("lost_per_day", "GPU-hours lost a day", lambda d: f"{d.lost_per_day:,.1f}"),
    ("lost_share", "lost share of elastic", lambda d: _pct(d.lost_share, 2)),
    ("utilisation", "utilisation", lambda d: _pct(d.utilisation, 1)),
    ("allocation", "allocation", lambda d: _pct(d.allocation, 1)),
    ("lends", "lends", lambda d: f"{d.lends:,}"),
    ("lends_per_day", "lends a day", lambda d: f"{d.lends_per_day:,.1f}"),
    ("exposure_replicas", "replicas on lendable nodes", lambda d: f"{d.exposure_replicas:,}"),
    ("exposure_share", "fault-domain exposure", lambda d: _pct(d.exposure_share, 0)),
)
#: the rows only a run with LLM models fills
TOKEN_ROWS = ("ttft_within", "tpot_within")


def _pct_or_none(x: float | None) -> str:
    return "-" if x is None else _pct(x, 2)


#: the criteria as the reports name them
CRITERIA_LABELS = {
    "target": "SLO attainment target (requests within SLO)",
    "budget_slack": "slack below the separate reference (share of the error budget)",
    "max_lends_per_day": "most lends a day (operations)",
    "max_lost_share": "most elastic GPU-hours lost to preemption (batch users)",
    "max_exposure": "most of the peak's replicas on lendable nodes (fault domain)",
    "min_wait_cut": "least cut of the mean job wait (gain)",
    "min_nodes_saved": "least share of a separate pool's nodes freed (resources)",
}
#: the checks' column headers
CHECK_LABELS = {
    "target": "target",
    "slack": "below reference",
    "lends": "lends a day",
    "losses": "lost share",
    "exposure": "exposure",
    "wait_cut": "wait cut",
    "nodes_saved": "nodes saved",
}


def _needed(selection: Selection, d: Dimensions) -> str:
    n = selection.needed.get(d.name)
    return "-" if n is None else f"{n:,}"


def dimensions_grid(selection: Selection) -> Grid:
    """Every dimension (row, beside its definition) for every set-up (column)."""
    k = selection.criteria
    rows = [
        (
            "nodes needed to meet the SLO",
            f"{DEFINITIONS['needed_nodes']} (target: {_pct(k.target)} of requests within SLO)",
            *(_needed(selection, d) for d in selection.setups),
        )
    ]
    llm = any(d.ttft_within is not None for d in selection.setups)
    for key, label, cell in ROWS:
        if key in TOKEN_ROWS and not llm:  # no LLM model: the rows would say nothing
            continue
        rows.append((label, DEFINITIONS[key], *(cell(d) for d in selection.setups)))
    return Grid(
        "Shared or separate: the set-ups side by side",
        ("dimension", "definition", *(d.name for d in selection.setups)),
        tuple(rows),
        f"over {selection.days:g} simulated days, {selection.gpus_per_node} GPUs a node; "
        + "; ".join(f"{d.name}: {d.description}" for d in selection.setups),
        text_columns=2,
    )


def tradeoff_grid(selection: Selection) -> Grid | None:
    """Per reserved size: the bridge's service, queues and costs there, and a separate
    pool of that size's service (run with no jobs). None without trade-off runs."""
    bridge = {d.reserved_nodes: d for d in selection.points}
    separate = {p.nodes: p for p in selection.separate}
    if not bridge:
        return None
    rows = []
    for n in sorted(set(bridge) | set(separate)):
        b, s = bridge.get(n), separate.get(n)
        rows.append(
            (
                f"{n:,}",
                _pct(b.requests_within, 3) if b else "-",
                _pct(b.minutes_within, 2) if b else "-",
                human(b.training_wait_mean_s) if b else "-",
                human(b.training_wait_p95_s) if b else "-",
                human(b.elastic_wait_mean_s) if b else "-",
                human(b.elastic_wait_p95_s) if b else "-",
                f"{b.lends_per_day:,.1f}" if b else "-",
                f"{b.lost_per_day:,.1f}" if b else "-",
                _pct(b.exposure_share, 0) if b else "-",
                _pct(s.requests_within, 3) if s else "-",
                _pct(s.minutes_within, 2) if s else "-",
            )
        )
    return Grid(
        "Trade-off: reserved inference nodes, SLO attainment and job queueing",
        (
            "reserved\nnodes",
            "bridge requests\nwithin SLO",
            "bridge minutes\nwithin SLO",
            "training\nwait mean",
            "training\nwait p95",
            "elastic\nwait mean",
            "elastic\nwait p95",
            "lends\na day",
            "GPU-h lost\na day",
            "exposure",
            "separate requests\nwithin SLO",
            "separate minutes\nwithin SLO",
        ),
        tuple(rows),
        "bridge: the bridge with that many reserved nodes (a full run, jobs included); "
        "separate: a separate pool of that many nodes, run with no jobs (it lends nothing, "
        "so its service does not depend on them); '-': not run at that size. The separate "
        "sizes include those the search for the smallest pool meeting the target visited.",
    )


def checks_grid(selection: Selection) -> Grid:
    """Each shared candidate's checks: its number, and whether it passed (yes / no)."""
    rec = selection.recommendation
    names = list(dict.fromkeys(c.name for v in rec.verdicts for c in (*v.required, *v.gains))) or [
        "target"
    ]
    rows = []
    for v in rec.verdicts:
        by = {c.name: c for c in (*v.required, *v.gains)}
        cells = []
        for name in names:
            c = by.get(name)
            if c is None:
                cells.append("-")
                continue
            digits = {"target": 3, "slack": 3, "losses": 2}.get(name, 1)
            shown = f"{c.value:,.1f}" if name == "lends" else _pct(c.value, digits)
            cells.append(f"{shown} {'yes' if c.passed else 'no'}")
        rows.append((v.candidate, *cells, "yes" if v.passed else "no"))
    k = selection.criteria
    limits = {
        "target": f"at least {_pct(k.target)}",
        "slack": f"at most {_pct(k.budget_slack * (1 - k.target), 3)} below {rec.reference}",
        "lends": f"at most {k.max_lends_per_day:g}",
        "losses": f"at most {_pct(k.max_lost_share, 1)}",
        "exposure": f"at most {_pct(k.max_exposure, 1)}",
        "wait_cut": f"at least {_pct(k.min_wait_cut, 1)}",
        "nodes_saved": f"at least {_pct(k.min_nodes_saved, 1)}",
    }
    return Grid(
        "Checks of the shared set-ups",
        ("candidate", *(CHECK_LABELS.get(n, n) for n in names), "passes"),
        tuple(rows),
        "each cell: the candidate's number and whether it passed ("
        + "; ".join(f"{CHECK_LABELS.get(n, n)}: {limits.get(n, '')}" for n in names)
        + "); a candidate passes with every check but the gains, and at least one gain "
        "(wait cut or nodes saved) when there is a separate reference",
    )


def criteria_grid(criteria: Criteria) -> Grid:
    """The thresholds the recommendation applied, each with its reason."""
    values = {
        "target": _pct(criteria.target),
        "budget_slack": _pct(criteria.budget_slack, 0),
        "max_lends_per_day": f"{criteria.max_lends_per_day:g}",
        "max_lost_share": _pct(criteria.max_lost_share, 1),
        "max_exposure": _pct(criteria.max_exposure, 0),
        "min_wait_cut": _pct(criteria.min_wait_cut, 0),
        "min_nodes_saved": _pct(criteria.min_nodes_saved, 0),
    }
    return Grid(
        "Criteria",
        ("criterion", "name", "why the default is what it is", "value"),
        tuple(
            (CRITERIA_LABELS[name], name, REASONS[name], value) for name, value in values.items()
        ),
        "set with stb simulate --slo-target and --criteria name=value,...",
        text_columns=3,
    )


def grids(selection: Selection) -> list[Grid]:
    """The selection's tables, in the order the reports show them."""
    out = [dimensions_grid(selection)]
    trade = tradeoff_grid(selection)
    if trade is not None:
        out.append(trade)
    if selection.recommendation.verdicts:
        out.append(checks_grid(selection))
    out.append(criteria_grid(selection.criteria))
    return out


def headline(selection: Selection) -> str:
    """The recommendation in one line."""
    rec = selection.recommendation
    kind = "a shared fleet" if rec.kind != SEPARATE else "separate fleets"
    return f"Recommended: {rec.choice} ({kind})"


# -- the terminal ---------------------------------------------------------------------------


def print_tables(selection: Selection, console: Console) -> None:
    """The selection on a terminal: the headline, its reasons and flips, then the tables."""
    rec = selection.recommendation
    console.print(Text(headline(selection), style="bold"))
    for reason in rec.reasons:
        console.print(Text(f"  - {reason}"))
    if selection.flips:
        console.print(Text("Would flip:", style="bold"))
        for flip in selection.flips:
            console.print(Text(f"  - {flip.text}"))
    for grid in grids(selection):
        table: Table = render.rich_table(grid)
        console.print(table)


# -- markdown -------------------------------------------------------------------------------


def to_markdown(report: SimReport, selection: Selection) -> str:
    """The selection report as markdown: the recommendation, its reasons and flips, the
    selection's tables, then the comparison's tables (`bridge.sim.render.grids`)."""
    rec = selection.recommendation
    lines = [
        f"# Selection: shared or separate fleet ({render.title(report)})",
        "",
        f"## {headline(selection)}",
        "",
        *(f"- {_md(r)}" for r in rec.reasons),
        "",
        "## Would flip",
        "",
        *([f"- {_md(f.text)}" for f in selection.flips] or ["- no criterion within its range"]),
        "",
    ]
    parts = ["\n".join(lines)]
    parts += [render.markdown_table(g) for g in grids(selection)]
    parts.append("## The comparison\n")
    parts += [render.markdown_table(g) for g in render.grids(report)]
    return "\n".join(parts)


def _md(text: str) -> str:
    """Plain text safe in a markdown paragraph (no emphasis, no HTML)."""
    for ch in ("\\", "*", "_", "`", "<", ">", "[", "]"):
        text = text.replace(ch, "\\" + ch)
    return text


# -- the HTML page ---------------------------------------------------------------------------


def html_section(selection: Selection) -> Markup:
    """The selection as a section of the simulator's page (`render.to_html(...,
    sections=[...])`), from `bridge/templates/sim_selection.html.j2`: the recommendation,
    its reasons and flips, the trade-off chart and the tables; all text escaped."""
    with drawing():
        chart = tradeoff_chart(selection) if selection.points else None
    return page.render(
        "bridge",
        "sim_selection.html.j2",
        headline=headline(selection),
        reasons=selection.recommendation.reasons,
        flips=[f.text for f in selection.flips],
        chart=chart,
        grids=grids(selection),
    )


def to_html(report: SimReport, selection: Selection) -> str:
    """The simulator's page with the selection section first."""
    return render.to_html(report, sections=[html_section(selection)])


def _nines(ax: Axes) -> None:
    """An axis of requests outside SLO on a log scale, labelled as shares within."""
    ax.set_yscale("log")
    ax.set_ylim(MISS_RANGE[1], MISS_RANGE[0])  # (inverted: better is up)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * (1 - v):g}%"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def tradeoff_chart(selection: Selection) -> Chart:
    """The trade-off curve: reserved inference nodes against the share of requests within
    SLO (the bridge's, and a separate pool's of that size) and the bridge's job waits."""
    fig = Figure(figsize=(10, 5.6))
    fig.subplots_adjust(left=0.1, right=0.78, top=0.95, bottom=0.1, hspace=0.15)
    slo_ax, wait_ax = fig.subplots(2, 1, sharex=True)
    points = list(selection.points)
    k = selection.criteria

    def miss(values: Sequence[float]) -> list[float]:
        return [float(np.clip(1.0 - v, *MISS_RANGE)) for v in values]

    if not points:
        for ax in (slo_ax, wait_ax):
            no_data(ax, "no trade-off runs")
    else:
        x = [d.reserved_nodes for d in points]
        sep = list(selection.separate)
        slo_ax.plot(
            x,
            miss([d.requests_within for d in points]),
            marker="o",
            color=WORKLOAD_COLOURS["inference"],
            label="bridge: requests",
        )
        slo_ax.plot(
            x,
            miss([d.minutes_within for d in points]),
            marker="o",
            linestyle="--",
            color="#00695c",
            label="bridge: minutes",
        )
        if sep:
            slo_ax.plot(
                [p.nodes for p in sep],
                miss([p.requests_within for p in sep]),
                marker="s",
                color=SEPARATE_COLOUR,
                label="separate pool: requests",
            )
        slo_ax.axhline(
            max(MISS_RANGE[0], 1.0 - k.target),
            color=render.SLO_COLOUR,
            linestyle="--",
            linewidth=1,
            label=f"target {_pct(k.target)}",
        )
        _nines(slo_ax)
        slo_ax.set_ylabel("within SLO")
        slo_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        waits = {
            "training mean": ([d.training_wait_mean_s for d in points], "training", "-"),
            "training p95": ([d.training_wait_p95_s for d in points], "training", ":"),
            "elastic mean": ([d.elastic_wait_mean_s for d in points], "elastic", "-"),
            "elastic p95": ([d.elastic_wait_p95_s for d in points], "elastic", ":"),
        }
        top = max((v for values, _, _ in waits.values() for v in values), default=0.0)
        unit, per = (
            ("hours", 3600.0)
            if top >= 3 * 3600
            else ("minutes", 60.0)
            if top >= 180
            else ("s", 1.0)
        )
        for label, (values, kind, style) in waits.items():
            wait_ax.plot(
                x,
                [v / per for v in values],
                marker="o",
                linestyle=style,
                color=render.KIND_COLOURS[kind],
                label=label,
            )
        wait_ax.set_ylim(0, top / per * 1.15 if top > 0 else 1.0)
        wait_ax.set_ylabel(f"bridge: job wait ({unit})")
        wait_ax.set_xlabel("reserved inference nodes")
        wait_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        for ax in (slo_ax, wait_ax):
            ax.grid(color="#e0e0e0")
            ax.set_axisbelow(True)
    caption = (
        "Per reserved size: the share of requests (and of minutes) within SLO for the "
        "bridge with that many reserved inference nodes, and for a separate pool of that "
        "many nodes (run with no jobs), on a scale of nines (99.999% at the top; the "
        f"dashed red line is the target, {_pct(k.target)}); below, the bridge's job waits, "
        "mean and 95th percentile (dotted), training and elastic."
    )
    return Chart("Trade-off: reserved inference nodes", svg(fig, "tradeoff"), caption)
