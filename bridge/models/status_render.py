"""A model's status for a terminal (`stb models status M` without --json): the facts, the
versions with where they serve, their live figures and their last hour, the rollouts, the
servers, the weight cache, replicas and lends, GPU-hours and cost, as rich tables and lines
(`render`). Reads only the `bridge.models.status_views.ModelStatus` it is given.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.leases.rollouts import OPEN
from bridge.models.status_views import (
    LAST_HOUR_P99_NOTE,
    LIVE_NOTE,
    TOKEN_LIVE_NOTE,
    Facts,
    ModelStatus,
    RolloutView,
    Tokens,
)
from bridge.weights.view import print_table


def render(status: ModelStatus, console: Console) -> None:
    """The status for a terminal: the facts, the versions with where they serve, their
    live figures and their last hour (where Prometheus gives it), the rollouts, the
    servers, replicas and lends, GPU-hours and cost."""
    f = status.facts
    head = f"[bold]{escape(status.model)}[/bold]"
    if f is None:
        head += "  [yellow]no facts: the repository and the TOML do not name it[/yellow]"
    else:
        slo = f"{f.slo_p99_ms:g} ms" if f.slo_p99_ms is not None else "none"
        head += f"  team {escape(f.team or '-')}  SLO p99 {slo}{_src(f, 'slo_p99_ms')}"
        for label, key in (("TTFT", "slo_ttft_p99_ms"), ("TPOT", "slo_tpot_p99_ms")):
            if (token_slo := getattr(f, key)) is not None:
                head += f"  {label} p99 {token_slo:g} ms{_src(f, key)}"
        if f.min_replicas is not None and f.max_replicas is not None:
            head += f"  replicas {f.min_replicas}{_src(f, 'min_replicas')}"
            head += f"-{f.max_replicas}{_src(f, 'max_replicas')}"
        if not f.scaled:
            head += f"  [yellow]{escape(f.why)}[/yellow]"
    console.print(head, highlight=False)
    for problem in f.problems if f else ():
        console.print(f"  [red]{escape(problem)}[/red]", highlight=False)
    r = status.replicas
    now = "unknown" if r.now is None else str(r.now)
    line = f"replicas now {now} ({r.lent} on lent nodes); lends today {r.lends_today}"
    console.print(line + (f"  [dim]{escape(r.note)}[/dim]" if r.note else ""), highlight=False)
    console.print(_versions_table(status))
    console.print(f"[dim]{LIVE_NOTE}[/dim]", highlight=False)
    console.print(f"[dim]last hour: {escape(status.last_hour_note)}[/dim]", highlight=False)
    if any(v.last_hour is not None for v in status.versions):
        console.print(f"[dim]{LAST_HOUR_P99_NOTE}[/dim]", highlight=False)
    if any(v.tokens is not None or v.tokens_hour is not None for v in status.versions):
        console.print(_tokens_table(status))
        console.print(f"[dim]{TOKEN_LIVE_NOTE}[/dim]", highlight=False)
    if status.rollout is not None:
        console.print(f"rollout open: {_rollout_line(status.rollout)}", highlight=False)
    if status.last_rollout is not None:
        console.print(f"last rollout: {_rollout_line(status.last_rollout)}", highlight=False)
    if status.rollout is None and status.last_rollout is None:
        console.print("no rollout", highlight=False)
    console.print(_servers_table(status))
    print_table(status.weights.to_json(), console, per_model=False)
    c = status.cost
    if c.ledger:
        console.print(
            f"GPU-hours: this month ({c.month}) {c.month_gpu_hours:.2f}"
            f"{_money_text(c.month_cost, c.currency)}, today ({c.today}) "
            f"{c.today_gpu_hours:.2f}{_money_text(c.today_cost, c.currency)}",
            highlight=False,
        )
    else:
        console.print("GPU-hours: no ledger", highlight=False)
    for note in (*c.notes, *status.notes):
        console.print(f"[dim]{escape(note)}[/dim]", highlight=False)


def _src(f: Facts, name: str) -> str:
    return " (toml)" if f.sources.get(name) == "toml" else ""


def _when(at: datetime | None) -> str:
    return "-" if at is None else f"{at:%Y-%m-%d %H:%M:%S}"


def _versions_table(status: ModelStatus) -> Table:
    slo = status.facts.slo_p99_ms if status.facts else None
    p99 = f"p99 ms\n(SLO {slo:g})" if slo is not None else "p99 ms"
    # the figures' headers on two lines: the table fits 200 columns
    table = Table(
        "version", "state", "published (UTC)", "by", "served on",
        "succeeded", "failed", "failure\n%", p99,
        "1h\nrequests", "1h\nfailure %", "1h p99 ms\n(max)", title="versions",
    )  # fmt: skip
    for v in status.versions:
        live, hour = v.live, v.last_hour
        if live is None:
            figures: tuple[str, ...] = ("-", "-", "-", "-")
        else:
            figures = (
                _count(live.succeeded), _count(live.failed),
                _percent(live.failure_rate), _p99(live.p99_ms, live.breach),
            )  # fmt: skip
        if hour is None:
            figures += ("-", "-", "-")
        else:
            requests = None if hour.requests is None else round(hour.requests)
            figures += (
                _count(requests), _percent(hour.failure_rate), _p99(hour.p99_ms, hour.breach)
            )  # fmt: skip
        state = escape(v.label)
        if v.state == "rolled_back":
            state = f"[red]{state}[/red]"
        elif v.state == "serving":
            state = f"[green]{state}[/green]"
        table.add_row(
            str(v.version), state, _when(v.published_at), escape(v.published_by) or "-",
            escape(", ".join(v.served_on)) or "-", *figures,
        )  # fmt: skip
    return table


def _tokens_table(status: ModelStatus) -> Table:
    """An LLM's versions in tokens: TTFT and TPOT p99 against its token SLOs, prompt and
    output tokens, since start (the servers' pages) and over the last hour (Prometheus)."""
    f = status.facts
    ttft = f.slo_ttft_p99_ms if f else None
    tpot = f.slo_tpot_p99_ms if f else None
    ttft_h = "TTFT p99 ms" + (f"\n(SLO {ttft:g})" if ttft is not None else "")
    tpot_h = "TPOT p99 ms" + (f"\n(SLO {tpot:g})" if tpot is not None else "")
    table = Table(
        "version", "since start\nrequests", f"since start\n{ttft_h}", f"since start\n{tpot_h}",
        "since start\nprompt tok", "since start\noutput tok", "1h\nrequests", f"1h {ttft_h}",
        f"1h {tpot_h}", "1h prompt\ntok/s", "1h output\ntok/s", title="tokens",
    )  # fmt: skip
    for v in status.versions:
        if v.tokens is None and v.tokens_hour is None:
            continue
        table.add_row(str(v.version), *_token_cells(v.tokens), *_token_cells(v.tokens_hour, True))
    return table


def _token_cells(t: Tokens | None, rates: bool = False) -> tuple[str, ...]:
    if t is None:
        return ("-",) * 5
    cells = (
        _amount(t.requests), _p99(t.ttft_p99_ms, t.ttft_breach), _p99(t.tpot_p99_ms, t.tpot_breach),
    )  # fmt: skip
    if rates:
        return (*cells, _rate(t.prompt_tps), _rate(t.output_tps))
    return (*cells, _amount(t.prompt_tokens), _amount(t.output_tokens))


def _amount(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.2f}"


def _p99(ms: float | None, breach: bool) -> str:
    shown = "-" if ms is None else f"{ms:.1f}"
    return f"[red]{shown} breach[/red]" if breach else shown


def _rollout_line(r: RolloutView) -> str:
    what = f"version {r.new_version} beside {r.old_version}, {r.state.replace('_', ' ')}"
    if r.state in OPEN:
        steps = "?" if r.steps is None else str(r.steps)
        share = "?" if r.percent is None else f"{r.percent:g}"
        what += f", step {r.step} of {steps} at {share}% since {_when(r.since)}"
    else:
        what += f" at {_when(r.updated_at)}"
    if r.reason:
        what += f": {r.reason}"
    return escape(what)


def _servers_table(status: ModelStatus) -> Table:
    table = Table("server", "state", escape(f"{status.model} READY"), title="servers")
    if status.servers is None:
        table.add_row("[yellow]unknown[/yellow]", escape(status.servers_note) or "-", "-")
        return table
    if not status.servers:
        table.add_row("-", "no running Triton server", "-")
    for s in status.servers:
        if not s.reachable:
            table.add_row(escape(s.address), f"[red]unreachable[/red]: {escape(s.error)}", "-")
            continue
        state = "up" + (f" (metrics: {escape(s.metrics_error)})" if s.metrics_error else "")
        ready = ", ".join(f"v{v}" for v in s.versions) or ("yes" if s.holds else "-")
        table.add_row(escape(s.address), state, ready)
    return table


def _money_text(amount: Decimal | None, currency: str | None) -> str:
    return "" if amount is None else f", {amount} {currency or ''}".rstrip()
