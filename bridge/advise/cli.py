"""`stb advise report --window W`: what the advisory daemon (`stb daemon --advise`) would
have done over a window, and what that would have done to the SLOs and the queues.

Thin: parses options, reads the advisory's tables (`bridge.leases.advice`), summarises
them (`bridge.advise.summary`), replays the window through the simulator with and without
lending (`bridge.advise.replay`: Slurm's nodes and sacct are read for it; `--no-replay`
skips it) and prints a table or one JSON document.

Windows: `YYYY-MM`, `YYYY-MM-DD`, `-N[mhd]` (the last N minutes, hours or days), or
`A..B` with A and B ISO times (a time without a zone is UTC), `-N[mhd]` or `now`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accounting.errors import WindowError
from accounting.report import Window
from bridge.advise.summary import Summary, arrivals, summarise
from bridge.cli_text import say
from bridge.config import BridgeConfig, ModelConfig
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.db import make_engine
from bridge.leases.advice import AdviceSample, AdviceStore
from bridge.leases.store import create_schema
from bridge.ledger.cli import parse_time
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend
from bridge.triton.catalog import site_models

if TYPE_CHECKING:
    from bridge.advise.replay import Replay

console = Console()
errors = Console(stderr=True)
advise_app = typer.Typer(
    help="The advisory mode's record (stb daemon --advise): what the bridge would have done.",
    no_args_is_help=True,
)
FORMATS = ("table", "json")


def parse_window(text: str, now: datetime) -> tuple[datetime, datetime, str]:
    """[start, end) in UTC and the window's label (see the module docstring)."""
    t = text.strip()
    if t.startswith("-") and ".." not in t:
        return parse_time(t, now, "--window"), now, t
    if ".." in t:
        a, _, b = t.partition("..")
        start, end = parse_time(a, now, "--window"), parse_time(b, now, "--window")
        if end <= start:
            raise typer.BadParameter(f"--window {text!r}: its end is not after its start")
        return start, end, t
    try:
        w = Window.parse(t)
    except WindowError as exc:
        raise typer.BadParameter(str(exc)) from exc
    return w.start, w.end, w.label


def replay_span(
    samples: list[AdviceSample], start: datetime, end: datetime, step_s: float
) -> tuple[datetime, datetime] | None:
    """The part of the window the samples cover: from one step before the first (its
    reading covers the tick before it) to the last."""
    if not samples:
        return None
    first = min(s.at for s in samples) - timedelta(seconds=step_s)
    last = max(s.at for s in samples)
    lo, hi = max(start, first), min(end, last)
    return (lo, hi) if hi > lo else None


@advise_app.command("report")
def report(
    window: Annotated[str, typer.Option(help="YYYY-MM, YYYY-MM-DD, -N\\[mhd] or START..END.")],
    config: ConfigOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="|".join(FORMATS))] = "table",
    with_replay: Annotated[
        bool,
        typer.Option(
            "--replay/--no-replay",
            help="Replay the window through the simulator, with and without lending "
            "(reads Slurm's nodes and sacct).",
        ),
    ] = True,
) -> None:
    """Decisions per day, lends per pool and model, breach minutes per model, and the
    window replayed with and without lending."""
    if fmt not in FORMATS:
        raise typer.BadParameter(f"--format {fmt!r}: choose from {', '.join(FORMATS)}")
    cfg = load_or_exit(config)
    start, end, label = parse_window(window, datetime.now(UTC))
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = AdviceStore(engine)
    advice = store.advice_between(start, end)
    samples = store.samples_between(start, end)
    # the models as the daemon scales them: the repository's with the TOML's overrides
    specs = site_models(cfg).scaled
    summary = summarise(advice, samples, cfg, start, end, label, models=specs)
    replayed: Replay | None = None
    problem = None
    span = replay_span(samples, start, end, cfg.tick_s)
    if with_replay and span is not None:
        replayed, problem = _replay(cfg, specs, samples, summary, *span)
    elif with_replay:
        problem = "no samples in the window: nothing to replay"
    if fmt == "json":
        doc: dict[str, Any] = {"summary": summary.as_dict(), "advice": [_row(a) for a in advice]}
        doc["replay"] = _replay_doc(replayed) if replayed is not None else None
        doc["replay_error"] = problem
        print(json.dumps(doc, indent=2))
        return
    _print(summary, replayed, problem)


def _replay(
    cfg: BridgeConfig,
    specs: Mapping[str, ModelConfig],
    samples: list[AdviceSample],
    summary: Summary,
    start: datetime,
    end: datetime,
) -> tuple[Replay | None, str | None]:
    # the simulator: loaded only for the replay
    from bridge.advise.replay import replay
    from bridge.sim.inputs import InputError

    try:
        slurm = open_backend()
        nodes = slurm.nodes()
        records = slurm.accounting(start, end)
    except SlurmError as exc:  # the summary stands without the replay
        return None, f"Slurm: {exc}"
    load = arrivals(samples, list(specs), start, end, cfg.tick_s)
    try:
        return replay(cfg, nodes, records, load, summary, models=specs), None
    except InputError as exc:  # sacct's records the simulator cannot take
        return None, str(exc)


def _row(a: Any) -> dict[str, Any]:
    return {
        "at": a.at.isoformat(),
        "kind": a.kind,
        "node": a.node,
        "pool": a.pool,
        "lend_mode": a.lend_mode,
        "models": a.models,
        "reason": a.reason,
        "shadow_lease": a.shadow_lease,
        "shadow_serving": a.shadow_serving,
        "figures": a.figures,
    }


def _replay_doc(r: Replay) -> dict[str, Any]:
    results = {}
    for name, res in r.results.items():
        results[name] = {
            "description": res.description,
            "models": {
                m: {
                    "requests": round(o.requests, 1),
                    "within_slo_share": o.within_share,
                    "minutes": o.minutes,
                    "minutes_within_slo": o.minutes_within,
                }
                for m, o in res.models.items()
            },
            "queues": {kind: vars(q) for kind, q in res.queues.items()},
            "lends": res.lends,
            "returns": res.returns,
            "lends_by_pool": res.lends_by_pool,
            "preemptions": res.preemptions,
            "gpu_hours_lost": res.gpu_hours_lost,
            "decisions": [
                {"at_s": d.at_s, "kind": d.kind, "node": d.node, "models": list(d.models)}
                for d in res.decisions
            ],
        }
    return {
        "start": r.start.isoformat(),
        "end": r.end.isoformat(),
        "nodes": r.nodes,
        "jobs": r.jobs,
        "service_ms": r.service_ms,
        "results": results,
        "notes": r.notes,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _s(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.0f} s"


def _print(summary: Summary, replayed: Replay | None, problem: str | None) -> None:
    say(
        console,
        f"advice {summary.label}: {summary.decisions} decisions, {summary.ticks} ticks "
        f"recorded"
        + (
            f" ({summary.first_sample:%Y-%m-%d %H:%M:%S} .. {summary.last_sample:%H:%M:%S} UTC)"
            if summary.first_sample and summary.last_sample
            else ""
        ),
    )
    days = Table(title="advice per day (UTC)")
    for col in ("day", "lend", "return", "place", "baseline"):
        days.add_column(col, justify="right" if col != "day" else "left")
    for day, kinds in sorted(summary.per_day.items()):
        days.add_row(day, *(str(kinds.get(k, 0)) for k in ("lend", "return", "place", "baseline")))
    console.print(days)
    lends = Table(title="lends")
    lends.add_column("by")
    lends.add_column("name")
    lends.add_column("lends", justify="right")
    for pool, n in sorted(summary.lends_by_pool.items()):
        lends.add_row("pool", escape(pool), str(n))
    for model, n in sorted(summary.lends_by_model.items()):
        lends.add_row("model", escape(model), str(n))
    console.print(lends)
    if summary.under_shadow:
        console.print(
            f"[yellow]{summary.under_shadow} decisions were taken while an advised lend was "
            "serving: the latency they read does not show that replica[/yellow]"
        )
    models = Table(title="models as observed")
    for col in ("model", "SLO ms", "minutes", "breach minutes", "max p99 ms", "peak req/s"):
        models.add_column(col, justify="left" if col == "model" else "right")
    for name, m in summary.models.items():
        models.add_row(
            escape(name),
            f"{m.slo_p99_ms:g}",
            str(m.minutes),
            str(m.breach_minutes),
            "-" if m.p99_max_ms is None else f"{m.p99_max_ms:.0f}",
            "-" if m.rate_max is None else f"{m.rate_max:.1f}",
        )
    console.print(models)
    if replayed is None:
        if problem:
            console.print(f"[yellow]replay: {escape(problem)}[/yellow]", soft_wrap=True)
        return
    names = list(replayed.results)
    table = Table(
        title=f"replay {replayed.start:%Y-%m-%d %H:%M:%S} .. {replayed.end:%H:%M:%S} UTC "
        f"({replayed.jobs} batch jobs, nodes {replayed.nodes})"
    )
    table.add_column("")
    for name in names:
        table.add_column(escape(name), justify="right")
    results = [replayed.results[n] for n in names]
    for model in results[0].models:
        shown = escape(model)
        table.add_row(
            f"{shown}: requests within SLO", *(_pct(r.models[model].within_share) for r in results)
        )
        table.add_row(
            f"{shown}: minutes within SLO", *(_pct(r.models[model].minutes_share) for r in results)
        )
    for kind in results[0].queues:
        table.add_row(f"{kind}: wait mean", *(_s(r.queues[kind].wait_mean_s) for r in results))
        table.add_row(f"{kind}: wait p95", *(_s(r.queues[kind].wait_p95_s) for r in results))
        table.add_row(f"{kind}: finished", *(str(r.queues[kind].finished) for r in results))
    table.add_row("lends", *(str(r.lends) for r in results))
    table.add_row("preemptions", *(str(r.preemptions) for r in results))
    table.add_row("GPU-hours lost", *(f"{r.gpu_hours_lost:.2f}" for r in results))
    console.print(table)
    advised = sum(summary.lends_by_pool.values())
    console.print(
        f"  the advisory advised {advised} lends over the window; the replay's lending lent "
        f"{replayed.results['lending'].lends}"
    )
    for note in replayed.notes:
        say(console, f"  note: {note}")


__all__ = ["advise_app", "parse_window", "replay_span", "report"]
