"""`stb`: the command line. Thin: parses options, calls the modules that do the work,
prints with rich. Each sub-application maps to one package.

The commands are loaded when they are named (`LazyGroup`): `stb lend` imports the
operator CLI and what it needs, not the simulator's plots, the ledger's reports and the
web server as well. Importing everything took seconds on a small machine, paid by every
`stb` a script or a test runs; `stb --help` still lists every command (and imports them)."""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

#: command name -> (module, attribute): a Typer sub-application or a command function,
#: in the order `stb --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "lab": ("bridge.lab.cli", "lab_app"),
    "load": ("bridge.load.cli", "load_app"),
    "config": ("bridge.config_cli", "config_app"),
    "accounting": ("bridge.ledger.cli", "accounting_app"),
    "budget": ("bridge.ledger.budget_cli", "budget_app"),
    "models": ("bridge.models.cli", "models_app"),
    "weights": ("bridge.weights_cli", "weights_app"),
    "advise": ("bridge.advise.cli", "advise_app"),
    "db": ("bridge.db_cli", "db_app"),
    "report": ("bridge.ledger.cli", "report"),
    "daemon": ("bridge.ops.cli", "daemon"),
    "status": ("bridge.ops.cli", "status"),
    "lend": ("bridge.ops.cli", "lend"),
    "return": ("bridge.ops.cli", "return_"),
    "place": ("bridge.ops.place", "place"),
    "drain": ("bridge.ops.cli", "drain"),
    "resume": ("bridge.ops.cli", "resume"),
    "token": ("bridge.ops.cli", "token"),
    "audit": ("bridge.audit.cli", "audit_app"),
    "fleet": ("bridge.fleet.cli", "fleet_app"),
    "simulate": ("bridge.sim.cli", "simulate"),
    "init": ("bridge.config_cli", "init"),
}


def load_command(name: str) -> Any:
    """The click command `stb NAME` runs, its module imported now."""
    module, attr = COMMANDS[name]
    target: Any = getattr(importlib.import_module(module), attr)
    # registered on a group of its own as the eager `stb` registered it (add_typer keeps a
    # one-command sub-application a group; its help is the sub-application's)
    holder = typer.Typer(add_completion=False)
    holder.callback()(_main)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    group = typer.main.get_command(holder)
    assert isinstance(group, TyperGroup)
    return group.commands[name]


class LazyGroup(TyperGroup):
    """The top-level group: the commands of `COMMANDS`, each loaded when named."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in COMMANDS:
            found = load_command(cmd_name)
        return found


app = typer.Typer(
    cls=LazyGroup,
    help="Slurm-Triton bridge: one GPU fleet for training and inference.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    """Slurm-Triton bridge: one GPU fleet for training and inference."""


if __name__ == "__main__":
    app()
