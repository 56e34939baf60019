"""`stb audit`: read the audit trail. `stb audit [--since] [--who] [--action] [--json]`
lists entries; `stb audit export --format jsonl|syslog` prints them for shipping off the
host; `stb audit verify` walks the hash chain and names the first entry that does not
hold (exit 1); `stb audit check` holds the trail against the leases, requests, holds and
fleet switches it records and names each one missing or recorded twice (exit 1,
`bridge.audit.check`). Reads only; the database is `database_url` of the configuration."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from bridge.audit.check import reconcile
from bridge.audit.export import FORMATS, line, to_json
from bridge.cli_text import fail, say
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.leases.audit import AuditStore
from bridge.leases.store import create_schema, make_engine

console = Console()
audit_app = typer.Typer(
    help="The audit trail of privileged actions: list, export, verify.",
    invoke_without_command=True,
)

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: an ISO 8601 date or time (UTC unless it says), or an age such as `30m`,
    `12h`, `7d`; ValueError naming the text otherwise."""
    m = _RELATIVE.match(text.strip())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(
            f"--since {text!r}: not an ISO 8601 time (2026-12-04, 2026-12-04T10:00) nor an "
            "age (30m, 12h, 7d)"
        ) from exc
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _engine(config: ConfigOpt) -> Engine:
    cfg = load_or_exit(config)
    try:
        engine = make_engine(cfg.database_url)
        create_schema(engine)
    except SQLAlchemyError as exc:
        raise fail(f"the bridge's database: {exc}") from exc
    return engine


def _store(config: ConfigOpt) -> AuditStore:
    return AuditStore(_engine(config))


@audit_app.callback()
def audit(
    ctx: typer.Context,
    since: Annotated[
        str | None, typer.Option(help="From this time (ISO 8601, UTC) or age (30m, 12h, 7d).")
    ] = None,
    who: Annotated[
        str | None, typer.Option(help="Only this actor: a Unix user, token name, daemon@host.")
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(help="Only this action, or a family of them (`model`: model.publish, ...)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, the newest (0: all).")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    config: ConfigOpt = None,
) -> None:
    """List the audit trail's entries, oldest first: when, who, what, on what, outcome."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        start = parse_since(since, datetime.now(UTC)) if since else None
    except ValueError as exc:
        raise fail(exc) from exc
    if limit < 0:
        raise fail(f"--limit {limit}: a count, 0 for all")
    store = _store(config)
    entries = store.find(since=start, who=who, action=action, limit=limit or None)
    if as_json:
        print(json.dumps([to_json(e) for e in entries], indent=2, ensure_ascii=False))
        return
    table = Table(title="audit trail")
    for col in ("#", "at", "who", "action", "target", "outcome", "detail"):
        table.add_column(col)
    for e in entries:
        who_text = e.actor + (f" (job {e.slurm_job})" if e.slurm_job else "")
        outcome = e.outcome if e.outcome == "ok" else f"[red]{e.outcome}[/red]"
        table.add_row(
            str(e.seq),
            e.at.strftime("%Y-%m-%d %H:%M:%S"),
            escape(who_text),
            escape(e.action),
            escape(e.target),
            outcome,
            escape(e.detail),
        )
    console.print(table)


@audit_app.command("export")
def export(
    fmt: Annotated[str, typer.Option("--format", help="jsonl or syslog (RFC 5424).")] = "jsonl",
    after: Annotated[
        int, typer.Option(help="Only the entries after this one (its number): what is new.")
    ] = 0,
    config: ConfigOpt = None,
) -> None:
    """Print every entry (after --after) as JSON lines or RFC 5424 syslog lines, on
    stdout, oldest first: pipe them to the site's log shipper."""
    if fmt not in FORMATS:
        raise fail(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    for entry in _store(config).walk(after):
        print(line(entry, fmt))


@audit_app.command("verify")
def verify(config: ConfigOpt = None) -> None:
    """Walk the hash chain from the first entry: exit 1 naming the first entry whose
    number, link or hash does not hold (changed, removed or moved since written)."""
    verdict = _store(config).verify()
    if verdict.broken is not None:
        held = f"up to entry {verdict.head_seq}" if verdict.head_seq else "before it: none"
        raise fail(f"the audit trail is broken at {verdict.broken.line()}; it holds {held}")
    say(
        console,
        f"the audit trail holds: {verdict.checked} entries, head {verdict.head_seq} "
        f"{verdict.head_hash}",
    )


@audit_app.command("check")
def check(config: ConfigOpt = None) -> None:
    """Hold the trail against what it records in the same database: each lease lent
    (and returned), each operator request and its outcome, each pool hold and lift, each
    fleet switch, in the trail once; the chain unbroken. Exit 1 naming each finding."""
    engine = _engine(config)
    try:
        found = reconcile(engine)
    except SQLAlchemyError as exc:
        raise fail(f"the bridge's database: {exc}") from exc
    checked = ", ".join(f"{n} {what}" for what, n in sorted(found.checked.items()) if n)
    if not found.ok:
        for finding in found.findings:
            console.print(escape(finding), highlight=False)
        raise fail(f"the audit trail does not agree: {len(found.findings)} finding(s)")
    say(
        console,
        f"the audit trail agrees: {found.entries} entries, {checked or 'nothing to hold'} "
        "each recorded once",
    )
