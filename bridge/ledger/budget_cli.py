"""`stb budget set|status|remove`: team budgets per month, their burn rate and forecast,
and (opt-in) the limit Slurm enforces. Thin: parses options, calls `accounting.budget` and
`bridge.ledger.limits`, prints."""

from __future__ import annotations

import contextlib
import getpass
import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accounting.budget import (
    BudgetError,
    BudgetSpec,
    budget_status,
    budgets,
    parse_amount,
    remove_budget,
    set_budget,
)
from accounting.db import open_ledger
from accounting.errors import LedgerError
from accounting.rates import RateBook, list_rates
from bridge.cli_text import fail, say
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.ledger.limits import EnforcementError, enforce, lift, team_account
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import SlurmError

console = Console(stderr=True)
budget_app = typer.Typer(help="Team budgets: GPU-hours or money per month.", no_args_is_help=True)


@budget_app.command("set")
def set_(
    team: Annotated[str, typer.Argument(help="The team (as reports name it).")],
    amount: Annotated[str, typer.Argument(help="How much per period.")],
    unit: Annotated[str, typer.Option(help="gpu-hours or currency.")] = "gpu-hours",
    currency: Annotated[str, typer.Option(help="ISO code of a money budget.")] = "",
    period: Annotated[str, typer.Option(help="Only 'month'.")] = "month",
    enforce_: Annotated[
        bool,
        typer.Option(
            "--enforce",
            help="Have Slurm enforce it: GrpTRESMins=gres/gpu on the team's account.",
        ),
    ] = False,
    account: Annotated[
        str, typer.Option(help="The Slurm account to limit (default: the team's one account).")
    ] = "",
    note: Annotated[str, typer.Option(help="Why / who approved it.")] = "",
    config: ConfigOpt = None,
) -> None:
    """Set (or replace) a team's budget. With --enforce, Slurm holds the team's jobs once
    the month's GPU-minutes reach it; nothing is written unless Slurm took the limit, and
    Slurm's limit is put back as it was if the budget cannot be written. Replacing an
    enforced budget with one that is not lifts the limit it set."""
    cfg = load_or_exit(config)
    slurm = SlurmCLI()
    restore: tuple[str, int | None] | None = None
    try:
        spec = BudgetSpec(
            team, parse_amount(amount), unit, currency.upper(), period, enforce_, "", note
        ).validate()
        ledger = open_ledger(cfg.accounting.ledger_url)
        before = next((b for b in budgets(ledger) if (b.team, b.period) == (team, period)), None)
        if enforce_:
            acct = team_account(cfg, team, account)
            restore = (acct, slurm.account_gpu_minutes(acct))
            minutes = enforce(slurm, acct, float(spec.amount))
            spec = BudgetSpec(
                spec.team, spec.amount, spec.unit, spec.currency, spec.period, True, acct, note
            )
            say(console, f"Slurm: GrpTRESMins=gres/gpu={minutes} on account {acct}")
        new = set_budget(ledger, spec, getpass.getuser(), datetime.now(UTC))
        restore = None  # written: Slurm's new limit stands
        if before is not None and before.enforce and before.slurm_account != spec.slurm_account:
            lift(slurm, before.slurm_account)
            say(console, f"Slurm: the limit on account {before.slurm_account} lifted")
    except (BudgetError, EnforcementError, LedgerError, SlurmError, ValueError) as exc:
        if restore is not None:  # the budget was not written: Slurm's limit as it was
            with contextlib.suppress(SlurmError):
                slurm.set_account_gpu_minutes(*restore)
        raise fail(exc) from exc
    what = f"{spec.amount} {spec.currency or 'GPU-hours'} per {spec.period}"
    say(console, f"{'set' if new else 'replaced'} budget of {team}: {what}")


@budget_app.command()
def status(
    month: Annotated[str, typer.Option(help="YYYY-MM (default: this month).")] = "",
    json_: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Each budget: used so far, burn rate per day, forecast for the month's end."""
    cfg = load_or_exit(config)
    try:
        ledger = open_ledger(cfg.accounting.ledger_url)
        rates = RateBook(list_rates(ledger))
        rows = budget_status(ledger, datetime.now(UTC), rates=rates or None, month=month or None)
    except (BudgetError, LedgerError) as exc:
        raise fail(exc) from exc
    if json_:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    if not rows:
        console.print("no budgets (stb budget set TEAM AMOUNT)")
        return
    table = Table("team", "budget", "used", "used %", "burn/day", "forecast", "state", "Slurm")
    for r in rows:
        b = r.budget
        unit = b.currency or "GPU-h"
        table.add_row(
            escape(b.team), escape(f"{b.amount} {unit}"), f"{r.used:.1f}",
            f"{100 * r.used_ratio:.0f}%",
            f"{r.burn_per_day:.2f}", f"{r.forecast:.1f} ({100 * r.forecast_ratio:.0f}%)",
            r.state, escape(b.slurm_account) if b.enforce else "-",
        )  # fmt: skip
    Console().print(table)


@budget_app.command()
def remove(
    team: Annotated[str, typer.Argument()],
    config: ConfigOpt = None,
) -> None:
    """Remove a team's budget (and the Slurm limit it set)."""
    cfg = load_or_exit(config)
    try:
        ledger = open_ledger(cfg.accounting.ledger_url)
        spec = next((b for b in budgets(ledger) if b.team == team), None)
        if spec is None:
            raise BudgetError(f"team {team} has no budget")
        if spec.enforce and spec.slurm_account:
            lift(SlurmCLI(), spec.slurm_account)
        remove_budget(ledger, team)
    except (BudgetError, LedgerError, SlurmError) as exc:
        raise fail(exc) from exc
    say(console, f"removed the budget of {team}")
