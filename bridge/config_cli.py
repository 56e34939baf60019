"""`stb config check FILE`: validate a configuration and say what is wrong, by field.
Also what every command that reads the configuration shares: the `--config` option,
`load_or_exit` and `fail` (an error printed on stderr, exit 1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from bridge.config import BridgeConfig, ConfigError, load_config, unknown_env

config_app = typer.Typer(help="The bridge's configuration file.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True)
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="Bridge TOML file.")]


def load_or_exit(path: Path | None) -> BridgeConfig:
    """The configuration, or exit 1 naming each bad field."""
    try:
        return load_config(path)
    except ConfigError as exc:
        errors.print(f"[red]{exc}[/red]")
        raise typer.Exit(code=1) from exc


def fail(exc: Exception) -> typer.Exit:
    """Print `exc` as the command's error (one unwrapped line) and return the exit. The
    text is escaped: an error quoting `[gpu:1]` or `[/x]` from its input prints as is."""
    errors.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
    return typer.Exit(code=1)


@config_app.command()
def check(path: Annotated[Path, typer.Argument(help="TOML configuration file.")]) -> None:
    """Validate FILE (with STB_ environment overrides); exit 1 naming each bad field."""
    for name in unknown_env(dict(os.environ)):
        console.print(f"[yellow]warning:[/yellow] environment variable {name} names no setting")
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        console.print(f"[red]{exc.source}: invalid[/red]")
        for field, msg in exc.problems:
            console.print(f"  [bold]{field}[/bold]: {msg}")
        raise typer.Exit(code=1) from exc
    console.print(
        f"[green]{path}: valid[/green] ({len(cfg.pools)} pools, {len(cfg.models)} models, "
        f"tick {cfg.tick_s:g}s, database {cfg.database_url})"
    )
