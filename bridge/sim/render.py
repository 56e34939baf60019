"""A simulation report (`bridge.sim.result.SimReport`) for people and programs: rich tables
for the terminal, JSON, and a self-contained HTML page. Called by `stb simulate`
(`bridge.sim.cli`); pure functions of the report.

- `tables(report)`: service and GPU use per policy, queues and lending per policy, and,
  when `separate-peak` is in the report, each policy against it as Lyra reports
  (queueing and job completion times as "x shorter", GPU usage as "+%").
- `to_json(report, selection)`: exactly `report.as_dict()` (with the selection report's
  `as_dict()` under "selection" when one is given), keys sorted, infinities and NaN as
  null.
- `to_html(report, sections)`: one file with no scripts, fonts, images or URLs (as
  `accounting.html`): the scenario, the same tables, charts as inline SVG (matplotlib's
  object API, glyphs as paths, a fixed hash salt and no metadata, so the same report
  gives the same bytes) and each policy's decisions. The markup is
  `bridge/templates/sim_report.html.j2` (Jinja2, autoescaped: all text is escaped).
  `sections` (the selection report's, `bridge.sim.selection_render`) come before the
  comparison.

The tables and the page show the same cells: both are drawn from `grids(report)` (as
`Grid`s, which `rich_table`, `html_table` and `markdown_table` draw). The numbers
(utilisation, waits, ...) are `bridge.sim.measures`'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from markupsafe import Markup
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, PercentFormatter
from rich.markup import escape
from rich.table import Table

from bridge.page import WORKLOAD_COLOURS, Chart, drawing, environment, no_data, render_page, svg
from bridge.sim.measures import (
    GPU_USES,
    completion_mean_s,
    gpu_hours_by_use,
    human,
    utilisation,
    wait_mean_s,
)
from bridge.sim.result import USES, PolicyResult, QueueOutcome, SimReport
from bridge.sim.selection import Selection

#: the policy the others are compared against (as Lyra compares against separate pools)
BASELINE = "separate-peak"
#: pools in the order the nodes column shows them, with their short names
POOL_LABELS: Mapping[str, str] = {
    "inference": "inf",
    "loan": "loan",
    "training": "train",
    "elastic": "el",
}
#: decisions listed per policy on the HTML page
MAX_DECISIONS = 200
#: runs up to this long get an x axis in hours, longer ones in days
HOURS_UP_TO_S = 2 * 86400.0
#: the worst p99 / SLO chart is clipped to this range (log scale)
RATIO_RANGE = (0.01, 100.0)
SLO_COLOUR = "#d32f2f"
LENT_COLOUR = "#8e24aa"
KIND_COLOURS: Mapping[str, str] = {
    "training": WORKLOAD_COLOURS["training"],
    "elastic": WORKLOAD_COLOURS["elastic"],
}


# -- the numbers ------------------------------------------------------------------------


def nodes_text(pools: Mapping[str, int]) -> str:
    """Nodes per pool, e.g. "inf 3 / loan 12 / train 44 / el 5" (empty pools left out)."""
    order = [*POOL_LABELS, *sorted(set(pools) - set(POOL_LABELS))]
    return " / ".join(f"{POOL_LABELS.get(p, p)} {pools[p]}" for p in order if pools.get(p))


def _ratio(base: float, value: float) -> str:
    """How many times shorter `value` is than `base` ("1.53x"); "-" when undefined."""
    if value > 0 and base > 0:
        return f"{base / value:.2f}x"
    return "1.00x" if value == base else "-"


# -- the tables -------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """One table as cells of text: what both the terminal and the page show."""

    title: str
    #: column headers ("\n" breaks a header in two lines)
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    #: leading columns of text (the policy, ...): left-aligned; the rest are numbers
    text_columns: int = 1

    def numeric(self, column: int) -> bool:
        return column >= self.text_columns


def _queue_cells(q: QueueOutcome | None) -> tuple[str, str, str]:
    if q is None or not q.submitted:
        return "-", "-", "-"
    done = human(q.completion_mean_s) if q.finished else "-"
    return human(q.wait_mean_s), human(q.wait_p95_s), done


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def grids(report: SimReport) -> list[Grid]:
    """The comparison: service and GPU use, queues and lending, and (when BASELINE ran and
    another policy too) the ratios against the baseline."""
    use: list[tuple[str, ...]] = []
    queues: list[tuple[str, ...]] = []
    llm = any(r.ttft_share is not None for r in report.results)
    for r in report.results:
        hours = gpu_hours_by_use(r)
        use.append(
            (
                r.policy,
                nodes_text(r.pools),
                f"{100 * r.within_share:.2f}%",
                f"{100 * r.minutes_share:.2f}%",
                *((_share(r.ttft_share), _share(r.tpot_share)) if llm else ()),
                *(f"{hours[u]:,.0f}" for u in GPU_USES),
                f"{r.inference_used_gpu_hours:,.0f}",
                f"{100 * utilisation(r):.1f}%",
            )
        )
        queues.append(
            (
                r.policy,
                *_queue_cells(r.queues.get("training")),
                *_queue_cells(r.queues.get("elastic")),
                f"{r.preemptions:,}",
                f"{r.gpu_hours_lost:,.1f}",
                f"{r.lends:,} / {r.returns:,}",
            )
        )
    out = [
        Grid(
            title(report),
            (
                "policy",
                "nodes per pool",
                "requests\nwithin SLO",
                "minutes p99\nwithin SLO",
                *(("requests within\nTTFT SLO", "requests within\nTPOT SLO") if llm else ()),
                *(f"{u}\nGPU-h" for u in GPU_USES),
                "inference\nserving GPU-h",
                "utilisation",
            ),
            tuple(use),
            _inputs(report)
            + "idle GPU-hours include fenced (draining) GPUs; utilisation = GPU-hours at work "
            "(jobs, and inference GPUs busy serving) / all GPU-hours",
            text_columns=2,
        ),
        Grid(
            "Job queues and lending",
            (
                "policy",
                "training\nwait mean",
                "training\nwait p95",
                "training\ncompletion",
                "elastic\nwait mean",
                "elastic\nwait p95",
                "elastic\ncompletion",
                "preemptions",
                "GPU-h lost",
                "lends /\nreturns",
            ),
            tuple(queues),
            "wait: submit to first start (jobs never started: to the end of the run); "
            "completion: mean submit to end of finished jobs",
        ),
    ]
    out.append(pool_grid(report))
    ratios = ratio_grid(report)
    if ratios is not None:
        out.append(ratios)
    return out


def pool_grid(report: SimReport) -> Grid:
    """GPU allocation by pool: one row per policy and pool, GPU-hours by use."""
    rows = []
    for r in report.results:
        order = [*POOL_LABELS, *sorted(set(r.gpu_hours) - set(POOL_LABELS))]
        for pool in (p for p in order if p in r.gpu_hours):
            uses = r.gpu_hours[pool]
            total = sum(uses.values())
            busy = total - uses.get("idle", 0.0) - uses.get("fenced", 0.0)
            rows.append(
                (
                    r.policy,
                    pool,
                    *(f"{uses.get(u, 0.0):,.0f}" for u in USES),
                    f"{100 * busy / total:.1f}%" if total else "-",
                )
            )
    return Grid(
        "GPU allocation by pool (GPU-hours)",
        ("policy", "pool", *USES, "busy"),
        tuple(rows),
        "fenced: GPUs held by the bridge's drain fence and not in use; a lent node's GPUs "
        "count as inference in the pool that owns the node",
        text_columns=2,
    )


def ratio_grid(report: SimReport) -> Grid | None:
    """Each policy against BASELINE, as Lyra reports: queueing and completion times as
    "x shorter" (baseline / policy), GPU usage (utilisation) as +%, and the change of the
    minutes whose p99 met the SLO in percentage points. None without the baseline or with
    no other policy."""
    base = next((r for r in report.results if r.policy == BASELINE), None)
    if base is None or len(report.results) < 2:
        return None
    rows = []
    for r in report.results:
        base_util, util = utilisation(base), utilisation(r)
        usage = f"{100 * (util / base_util - 1):+.1f}%" if base_util else "-"
        rows.append(
            (
                r.policy,
                _ratio(wait_mean_s(base), wait_mean_s(r)),
                _ratio(completion_mean_s(base), completion_mean_s(r)),
                usage,
                f"{100 * (r.minutes_share - base.minutes_share):+.2f} pp",
            )
        )
    return Grid(
        f"Against {BASELINE}",
        ("policy", "queueing\n(x shorter)", "JCT\n(x shorter)", "GPU usage", "SLO minutes"),
        tuple(rows),
        "queueing: mean wait of all jobs; JCT: mean completion of finished jobs; "
        "GPU usage: utilisation relative to the baseline's",
    )


def title(report: SimReport) -> str:
    """The report's title: the fleet, horizon, models and jobs."""
    s = report.scenario
    parts = []
    if "nodes" in s:
        parts.append(f"{s['nodes']} nodes x {s.get('gpus_per_node', '?')} GPUs")
    if "horizon_s" in s:
        parts.append(f"{float(s['horizon_s']) / 86400:g} days")
    if isinstance(s.get("models"), Mapping):
        parts.append(f"{len(s['models'])} models")
    if "jobs" in s:
        parts.append(f"{s['jobs']:,} jobs")
    return "Simulated fleet" + (": " + ", ".join(parts) if parts else "")


def _inputs(report: SimReport) -> str:
    """The workload in one sentence (from `stb simulate`'s scenario keys), or ""."""
    s = report.scenario
    arrivals, jobs = s.get("arrivals"), s.get("batch_jobs")
    if not (isinstance(arrivals, Mapping) and isinstance(jobs, Mapping)):
        return ""
    load = s.get("load")
    at = f" at {100 * load:.0f}% load" if isinstance(load, int | float) else ""
    implied = s.get("implied")
    by = implied if isinstance(implied, Mapping) else {}

    def chosen(flag: str) -> str:  # a kind a file chose (`stb simulate --arrivals-trace F`)
        return f" (implied by {by[flag]})" if flag in by else ""

    return (
        f"{arrivals.get('source', '?')} arrivals{chosen('--arrivals')}, "
        f"{jobs.get('source', '?')} jobs{chosen('--jobs')}{at}, seed {s.get('seed', '?')}. "
    )


def tables(report: SimReport) -> list[Table]:
    """The comparison as rich tables, one row per policy (see `grids`)."""
    return [rich_table(grid) for grid in grids(report)]


def rich_table(grid: Grid) -> Table:
    """A grid as a rich table (numbers right-aligned; no text read as markup: a file's
    or a model's name prints as it is)."""
    table = Table(title=escape(grid.title), caption=escape(grid.caption) or None)
    for i, head in enumerate(grid.headers):
        table.add_column(escape(head), justify="right" if grid.numeric(i) else "left")
    for row in grid.rows:
        table.add_row(*map(escape, row))
    return table


def markdown_table(grid: Grid) -> str:
    """A grid as a GitHub-flavoured markdown table under a "###" title, its caption
    after it; "|" in a cell is escaped, a header's line break is a space."""

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace(chr(10), " ")

    heads = "| " + " | ".join(cell(h) for h in grid.headers) + " |"
    rule = (
        "|"
        + "|".join("---:" if grid.numeric(i) else ":---" for i in range(len(grid.headers)))
        + "|"
    )
    rows = ["| " + " | ".join(cell(c) for c in row) + " |" for row in grid.rows]
    caption = [f"\n{grid.caption}"] if grid.caption else []
    return "\n".join([f"### {grid.title}", "", heads, rule, *rows, *caption]) + "\n"


# -- JSON -------------------------------------------------------------------------------


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None (JSON has no inf)."""
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(report: SimReport, selection: Selection | None = None) -> str:
    """`report.as_dict()` as JSON (and `selection.as_dict()` under "selection"): keys
    sorted, indent 2, infinities and NaN as null."""
    data = report.as_dict()
    if selection is not None:
        data["selection"] = selection.as_dict()
    return json.dumps(_finite(data), sort_keys=True, indent=2, allow_nan=False) + "\n"


# -- HTML -------------------------------------------------------------------------------


def to_html(report: SimReport, sections: Sequence[str] = ()) -> str:
    """The report as one self-contained HTML document (`templates/sim_report.html.j2`);
    the same report, the same bytes. `sections`: HTML fragments, self-contained and
    escaped by their maker (put in as they are), placed after the list of policies,
    before the comparison."""
    with drawing():
        summary = [_slo_chart(report.results), _wait_chart(report.results)]
        timelines = [_timeline_chart(r, i) for i, r in enumerate(report.results)]
    return render_page(
        "bridge",
        "sim_report.html.j2",
        title=title(report),
        scenario=[(str(k), _text(v)) for k, v in sorted(report.scenario.items())],
        results=report.results,
        sections=[Markup(s) for s in sections],
        grids=grids(report),
        summary=summary,
        timelines=timelines,
        decisions=[_decisions(r) for r in report.results],
    )


def _text(value: Any) -> str:
    """A scenario value as one line: mappings as "key value, ...", nested in parentheses."""
    if isinstance(value, Mapping):
        inner = [
            f"{k} ({_text(v)})" if isinstance(v, Mapping) else f"{k} {_text(v)}"
            for k, v in value.items()
        ]
        return ", ".join(inner) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def html_table(grid: Grid) -> Markup:
    """A grid as an HTML table under an h3 title, its caption after it (all escaped):
    the `grid_table` macro of `bridge/templates/macros.html.j2`."""
    macros = environment().get_template("macros.html.j2").module
    # a template's macros are attributes of its module (Jinja's way to call one from Python)
    table: Markup = macros.grid_table(grid)  # type: ignore[attr-defined]
    return table


def _decisions(result: PolicyResult) -> dict[str, str]:
    """A policy's decisions for its fold on the page: the summary line, and the first
    MAX_DECISIONS as lines of text ("" when there are none)."""
    shown = result.decisions[:MAX_DECISIONS]
    lines = [
        f"{_clock(d.at_s)}  {d.kind:<8} {d.node:<8} {','.join(d.models) or '-'}  {d.reason}"
        for d in shown
    ]
    more = len(result.decisions) - len(shown)
    if more > 0:
        lines.append(f"... and {more:,} more (the JSON has every decision the run kept)")
    summary = (
        f"{result.policy}: {len(result.decisions):,} decisions "
        f"({result.lends:,} lends, {result.returns:,} returns)"
    )
    return {"summary": summary, "text": "\n".join(lines)}


def _clock(seconds: float) -> str:
    """Simulated time as "Dd HH:MM:SS" from the start."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}d {hours:02d}:{minutes:02d}:{secs:02d}"


# -- charts -----------------------------------------------------------------------------


def _grouped_bars(
    ax: Axes, policies: Sequence[str], groups: Mapping[str, tuple[list[float], str]]
) -> list[Any]:
    """Bars per policy, one per group (label -> (values, colour)), side by side."""
    width = 0.8 / max(1, len(groups))
    containers = []
    for i, (label, (values, colour)) in enumerate(groups.items()):
        x = np.arange(len(policies)) + (i - (len(groups) - 1) / 2) * width
        containers.append(ax.bar(x, values, width=width * 0.95, color=colour, label=label))
    ax.set_xticks(range(len(policies)), list(policies))
    ax.grid(axis="y", color="#e0e0e0")
    ax.set_axisbelow(True)
    return containers


def _policy_bars(
    results: Sequence[PolicyResult], groups: Mapping[str, tuple[list[float], str]], ncols: int
) -> tuple[Figure, Axes, list[Any]]:
    """A chart of bars per policy (`_grouped_bars`), its legend (`ncols` columns) above:
    the figure, its axes and the bars to label; with no policy, the axes say so (no bars)."""
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    ax = fig.subplots()
    if not results:
        no_data(ax, "no policy in this report")
        return fig, ax, []
    bars = _grouped_bars(ax, [r.policy for r in results], groups)
    fig.legend(loc="outside upper right", ncols=ncols, frameon=False)
    return fig, ax, bars


def _slo_chart(results: Sequence[PolicyResult]) -> Chart:
    requests = [100 * r.within_share for r in results]
    minutes = [100 * r.minutes_share for r in results]
    low = min([*requests, *minutes], default=100.0)
    # zoom in on the top of the scale (bars near 100% differ by little), on 5% steps
    bottom = max(0.0, 5 * math.floor((low - max(1.0, (100 - low) / 2)) / 5))
    groups = {
        "requests within SLO": (requests, WORKLOAD_COLOURS["inference"]),
        "minutes with p99 within SLO": (minutes, "#00695c"),
    }
    fig, ax, bars = _policy_bars(results, groups, ncols=2)
    if bars:
        for container in bars:
            ax.bar_label(container, fmt="%.2f%%", padding=2, fontsize=8)
        ax.set_ylim(bottom, 101)
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    caption = (
        "Per policy: the share of requests answered within their model's SLO, and of the "
        "minutes (with requests) whose p99 met it, over all models."
    )
    if bottom > 0:
        caption += f" The y axis starts at {bottom:g}%."
    return Chart("Inference within SLO", svg(fig, "slo"), caption)


def _wait_chart(results: Sequence[PolicyResult]) -> Chart:
    groups: dict[str, tuple[list[float], str]] = {}
    for kind, colour in KIND_COLOURS.items():
        qs = [r.queues.get(kind) for r in results]
        groups[f"{kind} mean"] = ([q.wait_mean_s if q else 0.0 for q in qs], colour)
        groups[f"{kind} p95"] = ([q.wait_p95_s if q else 0.0 for q in qs], colour + "80")
    top = max((v for values, _ in groups.values() for v in values), default=0.0)
    unit, per = (
        ("hours", 3600.0) if top >= 3 * 3600 else ("minutes", 60.0) if top >= 180 else ("s", 1.0)
    )
    scaled = {k: ([v / per for v in values], c) for k, (values, c) in groups.items()}
    fig, ax, bars = _policy_bars(results, scaled, ncols=4)
    if bars:
        for container, values in zip(bars, (v for v, _ in groups.values()), strict=True):
            ax.bar_label(container, labels=[human(v) for v in values], padding=2, fontsize=7)
        ax.set_ylabel(f"wait ({unit})")
        ax.set_ylim(0, top / per * 1.15 if top > 0 else 1.0)  # no waits at all: 0..1 s
    caption = (
        "Per policy: how long jobs waited in the queue before their first start, mean and "
        "95th percentile (lighter), training and elastic. Jobs never started count until "
        "the end of the run."
    )
    return Chart("Job queueing time", svg(fig, "waits"), caption)


def _timeline_chart(result: PolicyResult, index: int) -> Chart:
    s = result.series
    names = ("gpus_training", "gpus_elastic", "gpus_inference", "gpus_idle")
    n = min((len(s.get(k, [])) for k in (*names, "worst_p99_over_slo", "lent_nodes")), default=0)
    step = result.series_step_s
    span = n * step
    unit, per = ("days", 86400.0) if span > HOURS_UP_TO_S else ("hours", 3600.0)
    x = (np.arange(n) + 1) * step / per  # each sample closes its step

    # fixed margins, not the constrained layout: it draws every panel twice
    fig = Figure(figsize=(10, 6.2))
    fig.subplots_adjust(left=0.07, right=0.83, top=0.94, bottom=0.08, hspace=0.12)
    use_ax, p99_ax, lent_ax = fig.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1.4, 1]}
    )
    if n == 0:
        for ax in (use_ax, p99_ax, lent_ax):
            no_data(ax, "the run is shorter than one series step")
    else:
        stacks = [np.asarray(s[k][:n], dtype=float) for k in names]
        use_ax.stackplot(
            x,
            *stacks,
            colors=[WORKLOAD_COLOURS[u] for u in GPU_USES],
            labels=list(GPU_USES),
            linewidth=0,
        )
        use_ax.set_ylabel("GPUs")
        use_ax.set_ylim(0, max(1.0, float(np.sum(stacks, axis=0).max())) * 1.02)
        use_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ratio = np.clip(np.asarray(s["worst_p99_over_slo"][:n], dtype=float), *RATIO_RANGE)
        p99_ax.plot(x, ratio, color="#37474f", linewidth=0.8, label="worst p99 / SLO")
        p99_ax.axhline(1.0, color=SLO_COLOUR, linestyle="--", linewidth=1, label="SLO")
        p99_ax.set_yscale("log")
        p99_ax.set_ylim(*RATIO_RANGE)
        # plain numbers: math text is off ("$" in a name is no math), so no 10^k labels
        p99_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        p99_ax.yaxis.set_minor_formatter(NullFormatter())
        p99_ax.set_ylabel("worst p99 / SLO")
        p99_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        lent_ax.step(x, s["lent_nodes"][:n], where="post", color=LENT_COLOUR, linewidth=1)
        lent_ax.set_ylabel("lent nodes")
        lent_ax.set_ylim(0, max(1.0, max(s["lent_nodes"][:n])) * 1.15)
        lent_ax.set_xlabel(f"simulated time ({unit})")
        lent_ax.set_xlim(0, span / per)
        for ax in (use_ax, p99_ax, lent_ax):
            ax.grid(color="#e0e0e0")
            ax.set_axisbelow(True)
    fig.suptitle(f"{result.policy}: {result.description}", x=0.01, ha="left", fontsize=9)
    caption = (
        f"{result.policy}, one sample every {human(step)}: GPUs by use over all pools "
        "(idle includes fenced), the worst model's p99 over its SLO (log scale, clipped to "
        f"{RATIO_RANGE[0]:g}..{RATIO_RANGE[1]:g}; the dashed line is the SLO), and nodes "
        "lent to inference."
    )
    return Chart(f"{result.policy} over time", svg(fig, f"timeline-{index}"), caption)
