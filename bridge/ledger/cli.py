"""`stb accounting ...` (ingest, periods, rates, migrations) and `stb report`: the ledger
on the command line. Thin: parses options, calls `bridge.ledger.feed` and `accounting`, prints.

Times on the command line are ISO 8601 (a time without a zone is UTC) or relative to now:
`-2h`, `-30m`, `-7d`.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import select

from accounting.agreement import COLUMNS
from accounting.db import ensure as ensure_ledger
from accounting.db import open_ledger
from accounting.errors import LedgerError
from accounting.periods import close_period
from accounting.rates import RateBook, RateSpec, add_rates, list_rates, parse_price, show_price
from accounting.render import FORMATS, to_csv, to_json, to_table
from accounting.report import Window, build_report, parse_filters, parse_keys
from accounting.schema import Restatement
from accounting.section import to_rich
from accounting.usage import utilization_by_job
from bridge.config_cli import ConfigOpt, fail, load_or_exit
from bridge.db import SchemaError, make_engine
from bridge.leases.store import LeaseStore, create_schema
from bridge.ledger.feed import ingest_window, ledger_cluster, slice_rules
from bridge.ledger.sreport import sreport_agreement
from bridge.ledger.views import VIEWS, build_sections, parse_views
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend

console = Console(stderr=True)
accounting_app = typer.Typer(
    help="The GPU-hour ledger: ingest, periods, rates.", no_args_is_help=True
)
rates_app = typer.Typer(help="Prices per GPU-hour.", no_args_is_help=True)
accounting_app.add_typer(rates_app, name="rates")

_REL = re.compile(r"^-(\d+)([mhd])$")


def parse_time(text: str, now: datetime, what: str) -> datetime:
    m = _REL.match(text.strip())
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return (
            now - {"m": timedelta(minutes=n), "h": timedelta(hours=n), "d": timedelta(days=n)}[unit]
        )
    if text.strip() == "now":
        return now
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{what}: {text!r} is not an ISO time, 'now' or -N[mhd]") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@accounting_app.command()
def ingest(
    since: Annotated[str, typer.Option(help="Window start (ISO time or -N\\[mhd]).")] = "-2h",
    until: Annotated[str, typer.Option(help="Window end (ISO time, 'now' or -N\\[mhd]).")] = "now",
    restate: Annotated[
        bool, typer.Option(help="Allow changes to closed months (logged as restatements).")
    ] = False,
    reason: Annotated[str, typer.Option(help="Why a closed month is restated.")] = "",
    config: ConfigOpt = None,
) -> None:
    """Book every Slurm job run of the window (sacct), the capacity and the serving split
    into the ledger. Idempotent: re-running a window changes nothing."""
    cfg = load_or_exit(config)
    now = datetime.now(UTC)
    start, end = parse_time(since, now, "--since"), parse_time(until, now, "--until")
    if end <= start:
        raise typer.BadParameter(f"--until ({end.isoformat()}) is not after --since")
    try:
        ledger = open_ledger(cfg.accounting.ledger_url)
        lease_engine = make_engine(cfg.database_url)
        create_schema(lease_engine)
        leases = LeaseStore(lease_engine).touched_since(start)
        with Progress(
            TextColumn("sacct {task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} days, {task.fields[records]} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=not sys.stderr.isatty(),
        ) as progress:
            days = max(1, -(-int((end - start).total_seconds()) // 86400))
            task = progress.add_task("", total=days, records=0)
            seen = [0]

            def step(lo: datetime, hi: datetime, n: int) -> None:
                seen[0] += n
                progress.update(
                    task, advance=1, description=lo.strftime("%Y-%m-%d"), records=seen[0]
                )

            summary = ingest_window(
                cfg, open_backend(), ledger, start, end, leases=leases,
                restate=restate, reason=reason, now=now, on_step=step,
            )  # fmt: skip
    except (LedgerError, SlurmError) as exc:
        raise fail(exc) from exc
    console.print(
        escape(f"ingest {start.isoformat()} .. {end.isoformat()}: {summary.line()}"),
        soft_wrap=True,
    )
    for key, why in summary.deferred[:10]:
        console.print(escape(f"  deferred {key}: {why}"), soft_wrap=True)
    if summary.restated:
        console.print(
            escape(f"  restated closed month(s): {', '.join(summary.restated)} ({reason})"),
            soft_wrap=True,
        )
    if summary.overbooked:
        console.print(
            f"  [yellow]warning:[/yellow] {len(summary.overbooked)} pool-hour(s) allocated "
            "beyond the recorded capacity (no idle booked there)"
        )


@accounting_app.command()
def agree(
    window: Annotated[
        str, typer.Option(help="Completed hours to compare: YYYY-MM, YYYY-MM-DD or A..B.")
    ] = "",
    reroll: Annotated[
        bool,
        typer.Option(
            help="Have slurmdbd roll a differing hour up again first (sacctmgr roll; needs a "
            "Slurm administrator), then compare it anew."
        ),
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Compare the ledger with sreport (`-T gres/gpu cluster Utilization` and
    `AccountUtilizationByUser`) hour by hour; each difference is listed with its cause.
    An hour slurmdbd has not re-rolled since a job record of it changed is listed as
    pending, with the runs, and is no failure. Default window: the last 24 completed
    hours. Exit 1 when any hour differs."""
    cfg = load_or_exit(config)
    now = datetime.now(UTC)
    try:
        if window:
            w = Window.parse(window)
            start, end = w.start, min(w.end, now)
        else:
            end = now.replace(minute=0, second=0, microsecond=0)
            start = end - timedelta(hours=24)
        ledger = open_ledger(cfg.accounting.ledger_url)
        cluster = ledger_cluster(cfg, ledger, [], SlurmCLI())
        result = sreport_agreement(
            SlurmCLI(), ledger, cluster, start, end, reroll=reroll, slices=slice_rules(cfg)
        )
    except (LedgerError, SlurmError) as exc:
        raise fail(exc) from exc
    table = Table("hour (UTC)", *COLUMNS, "accounts", title=escape(f"ledger vs sreport, {cluster}"))
    for hour, (led, srep) in sorted(result.figures.items()):
        cells = [
            f"{led.column(c):,}"
            + ("" if led.column(c) == srep.column(c) else f" [red]/ {srep.column(c):,}[/red]")
            for c in COLUMNS
        ]
        bad = [d for d in result.differences if d.hour == hour and d.what.startswith("account")]
        table.add_row(f"{hour:%Y-%m-%d %H:00}", *cells, f"{len(bad)} differ" if bad else "equal")
    Console().print(table)
    for d in result.differences:
        console.print(
            escape(
                f"{d.hour:%Y-%m-%d %H:00} {d.what}: ledger {d.ledger:,} s, sreport "
                f"{d.sreport:,} s ({d.delta:+,}): {d.cause}"
            ),
            soft_wrap=True,
        )
    for p in result.pending:
        short = ", ".join(
            f"{d.what} {d.delta:+,} s" for d in p.differences if d.what.startswith("account")
        )
        runs = ", ".join(
            f"job {r.job_id} ({r.account}, {r.gpu_s:,} GPU-s in it, seen {r.changed_at:%H:%M})"
            for r in p.runs
        )
        console.print(
            escape(
                f"{p.hour:%Y-%m-%d %H:00} pending: sreport's rollup lacks {short}; slurmdbd "
                f"re-rolls the hour at its next pass (or: --reroll); changed runs: {runs}"
            ),
            soft_wrap=True,
        )
    for hour, view in sorted(result.reconciled.items()):
        led = result.figures[hour][0]
        moved = ", ".join(
            f"{c} {led.column(c):,} -> {view.column(c):,}"
            for c in COLUMNS
            if led.column(c) != view.column(c)
        )
        console.print(
            f"{hour:%Y-%m-%d %H:00} reconciled: equal to sreport once counted by its "
            f"cluster-wide rules ({moved}; docs/finance/sreport.md)",
            soft_wrap=True,
        )
    if result.rerolled:
        console.print(f"rolled up again by slurmdbd: {len(result.rerolled)} hour(s)")
    if result.not_rolled:
        console.print(f"not rolled up by slurmdbd yet: {len(result.not_rolled)} hour(s)")
    console.print(
        f"{len(result.agreed)} of {len(result.hours)} hour(s) agree (GPU-seconds, "
        "allocated / down / planned down / idle / reported and per account)"
        + (f", {len(result.pending)} pending" if result.pending else "")
    )
    if result.differences:
        raise typer.Exit(1)


@accounting_app.command()
def close(
    month: Annotated[str, typer.Argument(help="YYYY-MM")],
    note: Annotated[str, typer.Option(help="Why/who.")] = "",
    config: ConfigOpt = None,
) -> None:
    """Close a month: later changes to it need `ingest --restate --reason`."""
    cfg = load_or_exit(config)
    try:
        close_period(open_ledger(cfg.accounting.ledger_url), month, note)
    except LedgerError as exc:
        raise fail(exc) from exc
    console.print(escape(f"closed {month}"))


@accounting_app.command()
def restatements(config: ConfigOpt = None) -> None:
    """Every change made to a closed month, and why."""
    cfg = load_or_exit(config)
    engine = open_ledger(cfg.accounting.ledger_url)
    table = Table("at", "month", "source", "old GPU-h", "new GPU-h", "reason")
    t = Restatement.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        for r in conn.execute(select(t).order_by(t.c.id)):
            table.add_row(
                r.at.isoformat(timespec="seconds"), escape(r.month), escape(r.source),
                f"{r.old_gpu_ms / 3.6e6:.3f}", f"{r.new_gpu_ms / 3.6e6:.3f}", escape(r.reason),
            )  # fmt: skip
    Console().print(table)


@accounting_app.command()
def migrate(config: ConfigOpt = None) -> None:
    """Bring the ledger's schema to the latest migration, under the database's schema
    lock (`stb db upgrade` does this and the bridge's database)."""
    cfg = load_or_exit(config)
    engine = make_engine(cfg.accounting.ledger_url)
    try:
        change = ensure_ledger(engine)
    except SchemaError as exc:
        raise fail(exc) from exc
    console.print(f"ledger at revision {change.now}")


@rates_app.command("add")
def rates_add(
    gpu_type: Annotated[str, typer.Option("--gpu-type", help="GPU type, e.g. h100.")],
    price: Annotated[str, typer.Option(help="Price per GPU-hour, e.g. 2.50.")],
    valid_from: Annotated[str, typer.Option("--from", help="First day (YYYY-MM-DD).")],
    valid_to: Annotated[
        str | None, typer.Option("--to", help="First day no longer covered (exclusive).")
    ] = None,
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    qos: Annotated[str | None, typer.Option(help="Only this QOS.")] = None,
    currency: Annotated[str, typer.Option(help="ISO currency code.")] = "USD",
    note: Annotated[str, typer.Option(help="Free text.")] = "",
    config: ConfigOpt = None,
) -> None:
    """Add a rate; one that overlaps a rate of the same scope is refused."""
    cfg = load_or_exit(config)
    try:
        spec = RateSpec(
            gpu_type=gpu_type,
            price=parse_price(price),
            valid_from=_day(valid_from, "--from"),
            valid_to=_day(valid_to, "--to") if valid_to else None,
            pool=pool,
            qos=qos,
            currency=currency,
            note=note,
        )
        add_rates(open_ledger(cfg.accounting.ledger_url), [spec])
    except LedgerError as exc:
        raise fail(exc) from exc
    console.print(escape(f"added {spec.describe()}"), soft_wrap=True)


def _day(text: str, what: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{what}: {text!r} is not a date (YYYY-MM-DD)") from None


@rates_app.command("list")
def rates_list(config: ConfigOpt = None) -> None:
    """The rates, by GPU type and date."""
    cfg = load_or_exit(config)
    table = Table("gpu type", "pool", "qos", "from", "to", "price/GPU-h", "currency", "note")
    for r in list_rates(open_ledger(cfg.accounting.ledger_url)):
        table.add_row(*map(escape, (
            r.gpu_type, r.pool or "*", r.qos or "*", r.valid_from.isoformat(),
            r.valid_to.isoformat() if r.valid_to else "-", show_price(r.price), r.currency, r.note,
        )))  # fmt: skip
    Console().print(table)


def report(
    window: Annotated[str, typer.Option(help="YYYY-MM, YYYY-MM-DD or START..END.")],
    by: Annotated[str, typer.Option(help="Keys to group by, comma-separated.")] = "team,workload",
    fmt: Annotated[str, typer.Option("--format", help="|".join(FORMATS))] = "table",
    step: Annotated[str | None, typer.Option(help="hour, day or month.")] = None,
    idle: Annotated[str | None, typer.Option(help="line or shared (default: config).")] = None,
    where: Annotated[list[str] | None, typer.Option(help="Filter KEY=VALUE (repeatable).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file.")] = None,
    usage: Annotated[
        bool, typer.Option(help="Add measured and used GPU-hours (GPU sampler records).")
    ] = False,
    views: Annotated[
        str | None,
        typer.Option(
            "--with",
            help=f"Views beside the report: {','.join(VIEWS)} or none (default: all in HTML; "
            "economics when --by has model).",
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """GPU-hours and cost from the ledger, as a table, CSV, JSON, XLSX or an HTML page,
    with the unit economics per model, the lending view, the capacity plan and the budgets
    beside it (--with)."""
    cfg = load_or_exit(config)
    if fmt not in FORMATS:
        raise typer.BadParameter(f"--format {fmt!r}: choose from {', '.join(FORMATS)}")
    if fmt == "xlsx" and output is None:
        raise typer.BadParameter("--format xlsx needs --output FILE")
    idle_mode = idle or cfg.accounting.idle_cost
    if idle_mode not in ("line", "shared"):
        raise typer.BadParameter(f"--idle {idle_mode!r}: choose line or shared")
    try:
        engine = open_ledger(cfg.accounting.ledger_url)
        rates = RateBook(list_rates(engine))
        win = Window.parse(window)
        rep = build_report(
            engine, win, parse_keys(by), step=step, idle=idle_mode,  # type: ignore[arg-type]
            rates=rates, filters=parse_filters(where or []),
            usage=utilization_by_job(engine) if usage else None,
        )  # fmt: skip
        chosen = parse_views(views, fmt, rep.by)
        if chosen and fmt in ("csv", "xlsx"):
            raise typer.BadParameter(f"--with: the {fmt} format holds the report's lines only")
        now = datetime.now(UTC)
        sections = build_sections(cfg, engine, win, chosen, rates, rep.filters, now, rep.step)
        if fmt == "xlsx":
            from accounting.xlsx import render_xlsx

            assert output is not None
            render_xlsx(rep, output)
            console.print(escape(f"wrote {output}"))
            return
        if fmt == "html":
            from accounting.html import render_html

            text = render_html(engine, rep, rates, sections=sections)
        elif fmt == "json":
            text = to_json(rep, sections)
        elif fmt == "csv":
            text = to_csv(rep)
        else:
            out = Console(width=160)
            out.print(to_table(rep))
            for section in sections:
                out.print(to_rich(section))
            return
    except LedgerError as exc:
        raise fail(exc) from exc
    if output:
        output.write_text(text)
        console.print(escape(f"wrote {output}"))
    else:
        sys.stdout.write(text)
