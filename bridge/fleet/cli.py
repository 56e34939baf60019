"""`stb fleet`: move a live site between a separate and a shared fleet, gradually or at
once, with the figures before and after each switch.

    stb fleet mode separate|advisory|shared [--max-lent-nodes N] [--why TEXT]
    stb fleet fallback [--why TEXT]      # separate, now: every lease returned
    stb fleet status [--json]
    stb fleet report [--json]

Each switch is appended to the bridge's database (`bridge.leases.fleet`) with the figures
of the window before it (`bridge.fleet.baseline`, `--window`) and recorded in the audit
trail (`fleet.mode`); the daemon reads the mode in force at its next pass
(`bridge.fleet.mode`). `report` sets each switch's figures (the window before it) beside
those of the period the switch began, measured over exactly that period."""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.audit.asks import switch_fleet
from bridge.audit.trail import open_trail
from bridge.cli_text import fail, say
from bridge.config import BridgeConfig
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.fleet.baseline import DEFAULT_WINDOW_S, compare, measure
from bridge.leases.fleet import MODES, FleetError, FleetStore, FleetSwitch, check
from bridge.leases.store import create_schema, make_engine
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend

console = Console()
fleet_app = typer.Typer(
    help="The fleet's mode: separate, advisory or shared, switched gradually or at once.",
    no_args_is_help=True,
    add_completion=False,
)

WhyOpt = Annotated[str, typer.Option("--why", help="Why, for the record.")]
WindowOpt = Annotated[
    float,
    typer.Option("--window", help="Seconds before the switch its figures cover.", min=60),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document.")]


def _store(cfg: BridgeConfig) -> FleetStore:
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    return FleetStore(engine)


def _measure(cfg: BridgeConfig, at: datetime, window_s: float) -> dict[str, Any]:
    try:
        slurm = open_backend()
    except SlurmError as exc:
        return measure(cfg, None, at, window_s) | {"training_error": f"Slurm: {exc}"}
    return measure(cfg, slurm, at, window_s)


def _switch(
    cfg: BridgeConfig, mode: str, max_lent_nodes: int | None, why: str, window_s: float
) -> FleetSwitch:
    try:
        check(mode, max_lent_nodes)
    except FleetError as exc:
        raise fail(str(exc)) from None
    if max_lent_nodes is not None and max_lent_nodes > cfg.policy.max_lent_nodes:
        raise fail(
            f"--max-lent-nodes {max_lent_nodes} is above [policy] max_lent_nodes "
            f"{cfg.policy.max_lent_nodes}: a step never lends more than the configuration"
        )
    store = _store(cfg)
    now = datetime.now(UTC)
    baseline = _measure(cfg, now, window_s)
    return switch_fleet(
        store,
        mode,
        max_lent_nodes=max_lent_nodes,
        why=why,
        baseline=baseline,
        trail=open_trail(cfg),
        now=now,
        who=getpass.getuser(),
    )


def _said(row: FleetSwitch, cfg: BridgeConfig) -> str:
    what = {
        "separate": "the bridge lends nothing and returns every lease (each drained within "
        f"[leases] drain_timeout_s = {cfg.leases.drain_timeout_s:g} s)",
        "advisory": "the bridge lends nothing, returns every lease, and says at each pass "
        "what it would lend or return if shared",
        "shared": "the bridge lends"
        + (
            f" at most {row.max_lent_nodes} nodes"
            if row.max_lent_nodes is not None
            else f" up to [policy] max_lent_nodes = {cfg.policy.max_lent_nodes}"
        ),
    }[row.mode]
    errors = [row.baseline[k] for k in ("training_error", "inference_error") if k in row.baseline]
    taken = "; figures taken" + (f" (without: {'; '.join(errors)})" if errors else "")
    return f"fleet mode {row.mode} from the daemon's next pass: {what}{taken}"


@fleet_app.command("mode")
def mode(
    new: Annotated[str, typer.Argument(help=f"One of {', '.join(MODES)}.")],
    max_lent_nodes: Annotated[
        int | None,
        typer.Option(
            "--max-lent-nodes", help="A gradual shared step: lend at most this many nodes."
        ),
    ] = None,
    why: WhyOpt = "",
    window: WindowOpt = DEFAULT_WINDOW_S,
    config: ConfigOpt = None,
) -> None:
    """Switch the fleet's mode: separate (lend nothing, return every lease), advisory (as
    separate, saying what shared would do) or shared (lend; a step may cap the nodes)."""
    cfg = load_or_exit(config)
    say(console, _said(_switch(cfg, new, max_lent_nodes, why, window), cfg))


@fleet_app.command("fallback")
def fallback(
    why: WhyOpt = "", window: WindowOpt = DEFAULT_WINDOW_S, config: ConfigOpt = None
) -> None:
    """Back to a separate fleet at once: every lease returned at the daemon's next pass,
    each drained within the drain timeout."""
    cfg = load_or_exit(config)
    say(console, _said(_switch(cfg, "separate", None, why or "fallback", window), cfg))


def _row(row: FleetSwitch) -> dict[str, Any]:
    return {
        "at": row.at.isoformat(),
        "mode": row.mode,
        "max_lent_nodes": row.max_lent_nodes,
        "who": row.who,
        "why": row.why,
        "baseline": row.baseline,
    }


@fleet_app.command("status")
def status(as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """The mode in force, since when and by whom."""
    current = _store(load_or_exit(config)).current()
    doc = _row(current) if current is not None else {"mode": "shared", "at": None}
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    if current is None:
        say(console, "fleet mode shared (never switched: the configuration's caps)")
        return
    cap = "" if current.max_lent_nodes is None else f", at most {current.max_lent_nodes} nodes"
    by = f" by {current.who}" if current.who else ""
    said = f"fleet mode {current.mode}{cap} since {current.at:%Y-%m-%d %H:%M:%S}{by}"
    say(console, said + (f": {current.why}" if current.why else ""))


@fleet_app.command("report")
def report(as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Each switch's figures (the window before it, stored at the switch) beside those of
    the period it began, measured now over exactly that period (to the next switch, or
    to now for the mode in force)."""
    cfg = load_or_exit(config)
    rows = _store(cfg).history()
    if not rows:
        raise fail("the fleet was never switched: nothing to compare (stb fleet mode ...)")
    now = datetime.now(UTC)
    periods = []
    for i, row in enumerate(rows):
        end = rows[i + 1].at if i + 1 < len(rows) else now
        span = max(1.0, (end - row.at).total_seconds())
        after = _measure(cfg, end, span)
        periods.append({**_row(row), "until": end.isoformat(), "after": after,
                        "rows": compare(row.baseline, after)})  # fmt: skip
    if as_json:
        print(json.dumps(periods, indent=2, default=str))
        return
    for p in periods:
        title = f"{p['mode']} from {p['at']} to {p['until']} ({p['who'] or '-'}: {p['why'] or '-'})"
        table = Table(title=escape(title))
        for col in ("part", "of", "figure", "before", "in the period", "ratio"):
            table.add_column(col)
        for r in p["rows"]:
            table.add_row(
                *(escape(str(r[k])) for k in ("part", "of", "figure")),
                *(str(r[k]) if r[k] is not None else "-" for k in ("before", "after", "ratio")),
            )
        console.print(table)
