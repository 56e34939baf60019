"""`stb`: the command line. Thin: parses options, calls the modules that do the work,
prints with rich. Each sub-application maps to one package."""

from __future__ import annotations

import typer

from bridge.advise.cli import advise_app
from bridge.config_cli import config_app, init
from bridge.db_cli import db_app
from bridge.lab.cli import lab_app
from bridge.ledger.budget_cli import budget_app
from bridge.ledger.cli import accounting_app, report
from bridge.load.cli import load_app
from bridge.models.cli import models_app
from bridge.ops.cli import daemon, drain, lend, resume, return_, status, token
from bridge.sim.cli import simulate

app = typer.Typer(
    help="Slurm-Triton bridge: one GPU fleet for training and inference.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(lab_app, name="lab")
app.add_typer(load_app, name="load")
app.add_typer(config_app, name="config")
app.add_typer(accounting_app, name="accounting")
app.add_typer(budget_app, name="budget")
app.add_typer(models_app, name="models")
app.add_typer(advise_app, name="advise")
app.add_typer(db_app, name="db")
app.command()(report)
app.command()(daemon)
app.command()(status)
app.command()(lend)
app.command("return")(return_)
app.command()(drain)
app.command()(resume)
app.command()(token)
app.command()(simulate)
app.command()(init)


if __name__ == "__main__":
    app()
