"""`stb models publish | list | rollback | retire | history | status | profile`: the model
repository on the command line. Thin: finds the running Triton servers through Slurm (jobs tagged
`stb:triton`), calls `bridge.models.publish`, prints; `history` reads the journal;
`status` is one model's own view (`bridge.models.status`); `profile` measures an LLM's
token profile (`bridge.models.profile_run`) and keeps it with the model. The
repository is `[triton] model_repository` of the configuration unless `--repository`
names one. A bad model name (or, for publish, a model folder holding a symbolic link or
other non-regular file) is refused before Slurm or Triton is asked anything; every
refusal is one `error:` line and exit status 1."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from bridge.audit.trail import AuditError, Trail, open_trail
from bridge.cli_text import fail, say
from bridge.config import BridgeConfig
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.leases.rollouts import RolloutError, RolloutStore
from bridge.leases.store import create_schema, make_engine
from bridge.modelfacts import ModelFact
from bridge.models import history, profile_cmd, rollout
from bridge.models.publish import PublishError, Server, publish, retire, rollback
from bridge.models.repo import ModelRepository, RepositoryError, check_source
from bridge.models.servers import running_servers
from bridge.models.status import UnknownModel, check_known, gather
from bridge.models.status_render import render
from bridge.models.status_views import ModelStatus
from bridge.policy.rollout import parse_plan
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend
from bridge.triton.catalog import ModelCatalog
from bridge.triton.errors import TritonError
from bridge.triton.repository import ModelConfigError, check_name
from bridge.weights.view import read_jobs

console = Console(stderr=True)
models_app = typer.Typer(
    help="The Triton model repository: publish, list, roll back, retire, history, status, profile.",
    no_args_is_help=True,
)
RepoOpt = Annotated[
    Path | None, typer.Option("--repository", help="Model repository (default: the config's).")
]
WhyOpt = Annotated[str, typer.Option(help="Why (kept in the history).")]


def _repo(cfg: BridgeConfig, repository: Path | None) -> ModelRepository:
    return ModelRepository(repository or cfg.triton.model_repository)


def _model(
    config: Path | None, repository: Path | None, name: str
) -> tuple[BridgeConfig, ModelRepository]:
    """The configuration and the model repository, for a command on model `name` (which
    the repository must hold: else the command's error line)."""
    cfg = load_or_exit(config)
    repo = _repo(cfg, repository)
    try:
        repo.model_dir(name)
    except RepositoryError as exc:
        raise fail(exc) from exc
    return cfg, repo


#: a change of the repository refused before it was made, as the audit trail says it
_REFUSED = (RolloutError, RepositoryError, ModelConfigError)


def _trail(cfg: BridgeConfig) -> Trail:
    """The audit trail, written as this command's user (and Slurm job)."""
    try:
        return open_trail(cfg)
    except SQLAlchemyError as exc:
        raise fail(f"the audit trail cannot be reached: {exc}") from exc


def _rollouts(cfg: BridgeConfig) -> RolloutStore:
    """The bridge database's rollouts (its tables made if missing, as `stb lend` does)."""
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    return RolloutStore(engine)


def _no_open_rollout(store: RolloutStore, name: str) -> None:
    if (row := store.open_of(name)) is not None:
        raise PublishError(
            f"{name} has a rollout open (version {row.new_version} beside "
            f"{row.old_version}, {row.state}): wait for it to end, or stop it with "
            f"stb models rollback {name}"
        )


@models_app.command("publish")
def publish_cmd(
    src: Annotated[
        Path, typer.Argument(help="Model folder: config.pbtxt and the version's files.")
    ],
    name: Annotated[str, typer.Option(help="Model name in the repository.")],
    version: Annotated[int | None, typer.Option(help="Version (default: latest + 1).")] = None,
    reason: Annotated[str, typer.Option(help="Why (kept in the model's history).")] = "",
    canary: Annotated[
        str | None,
        typer.Option(
            help="Roll out gradually: the share of the model's unversioned requests the new "
            "version gets, or a step plan such as 10%:5m,50%:10m (a step without a hold "
            "holds \\[rollout] hold_s); the daemon promotes it or rolls it back by itself."
        ),
    ] = None,
    checks: Annotated[
        Path | None,
        typer.Option(
            help="With --canary: recorded requests (JSON, bridge/models/checks.py) the new "
            "version must answer as expected, or as the old version does, before any split."
        ),
    ] = None,
    repository: RepoOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Validate, write the version atomically, load it where the model is served, check
    that it answers; roll back if it does not. Either way it goes into the history. With
    --canary, the version is written beside the served one and the daemon rolls it out."""
    cfg = load_or_exit(config)
    try:
        check_name(name)
        check_source(src)
        trail = _trail(cfg)
        store = _rollouts(cfg)
        if canary is not None:
            if version is not None:
                raise PublishError("--canary takes the next version: leave out --version")
            with trail.audited("model.canary", f"model {name}", _REFUSED) as note:
                row = rollout.start(
                    _repo(cfg, repository), store, src, name, canary, cfg.rollout.hold_s,
                    why=reason, checks_file=checks,
                )  # fmt: skip
                note.detail = (
                    f"rollout {row.id}: version {row.new_version} beside {row.old_version}, "
                    f"plan {row.plan}" + (f": {reason}" if reason else "")
                )
            steps = ", ".join(
                f"{s.percent:g}% for {s.hold_s:g} s" for s in parse_plan(row.plan, row.hold_s)
            )
            say(
                console,
                f"{name} version {row.new_version} written beside version {row.old_version}; "
                f"the daemon rolls it out ({steps}) and promotes it or rolls it back: "
                f"stb models status {name}",
            )
            return
        if checks is not None:
            raise PublishError("--checks goes with --canary")
        with trail.audited("model.publish", f"model {name}", _REFUSED) as note:
            _no_open_rollout(store, name)
            with running_servers(cfg) as servers:
                out = publish(
                    _repo(cfg, repository), src, name, servers, version=version,
                    say=lambda m: say(console, m), why=reason,
                )  # fmt: skip
            note.detail = f"version {out.version} on {', '.join(out.loaded_on) or 'no server'}"
            note.detail += f": {reason}" if reason else ""
    except (PublishError, ModelConfigError, RepositoryError, RolloutError, SQLAlchemyError,
            SlurmError, TritonError, AuditError) as exc:  # fmt: skip
        raise fail(exc) from exc
    where = ", ".join(out.loaded_on) or "no running server (loaded when one starts)"
    say(console, f"published {out.name} version {out.version}; serving on {where}")


@models_app.command("list")
def list_cmd(repository: RepoOpt = None, config: ConfigOpt = None) -> None:
    """Models in the repository: versions, team, the SLO and replica bounds the bridge
    scales them by (the config.pbtxt's, a value the TOML overrides marked `(toml)`),
    where served."""
    cfg = load_or_exit(config)
    repo = _repo(cfg, repository)
    facts = ModelCatalog(repo.root, cfg.models, say=False).facts()
    table = Table("model", "versions", "team", "SLO p99 ms", "replicas", "served on")
    try:
        with running_servers(cfg) as servers:
            served: dict[str, list[str]] = {}
            for s in servers:
                try:
                    for m in s.client.repository_index():
                        if m.state == "READY":
                            served.setdefault(m.name, []).append(f"{s.address} v{m.version}")
                except TritonError:
                    continue
            for name in repo.models():
                fact = facts.facts.get(name)
                if fact is None or fact.problems:
                    why = "; ".join(fact.problems) if fact else "unreadable"
                    info = (f"[red]{escape(why)}[/red]", "", "")
                elif fact.model is None:
                    info = (escape(fact.team or "-"), f"[yellow]{escape(fact.why)}[/yellow]", "")
                else:
                    info = (escape(fact.team or "-"), _marked(fact, "slo_p99_ms"), _bounds(fact))
                versions = ",".join(map(str, repo.versions(name))) or "-"
                where = escape("; ".join(served.get(name, []))) or "-"
                table.add_row(escape(name), versions, *info, where)
    except SlurmError as exc:
        raise fail(exc) from exc
    Console().print(table)


def _marked(fact: ModelFact, field: str) -> str:
    """A scaled model's value of `field`, marked `(toml)` where the TOML overrides it."""
    assert fact.model is not None
    value = getattr(fact.model, field)
    return f"{value:g}" + (" (toml)" if fact.source_of(field) == "toml" else "")


def _bounds(fact: ModelFact) -> str:
    return f"{_marked(fact, 'min_replicas')}-{_marked(fact, 'max_replicas')}"


@models_app.command("rollback")
def rollback_cmd(
    name: str, reason: WhyOpt = "rollback", repository: RepoOpt = None, config: ConfigOpt = None
) -> None:
    """Set the latest version aside; the previous one serves again."""
    cfg, repo = _model(config, repository, name)
    trail = _trail(cfg)
    try:
        store = _rollouts(cfg)
        running = store.open_of(name)
        if running is not None and running.state in ("pending", "running"):
            assert running.id is not None
            why = f"stopped by {history.actor()}: {reason}"
            target = f"model {name} version {running.new_version}"
            trail.check()  # an unreachable trail stops nothing it cannot record
            try:
                store.move(
                    running.id,
                    "rolling_back",
                    datetime.now(UTC),
                    why,
                    audit=trail.within("rollout.stop", target, why),
                )
            except RolloutError as exc:
                trail.record("rollout.stop", target, "refused", str(exc))
                raise
            say(
                console,
                f"{name}: the rollout of version {running.new_version} is stopped; the "
                f"daemon sends every request to version {running.old_version} and sets "
                f"version {running.new_version} aside",
            )
            return
        with trail.audited("model.rollback", f"model {name}", _REFUSED) as note:
            _no_open_rollout(store, name)
            with running_servers(cfg) as servers:
                gone, now, where = rollback(repo, name, servers, reason)
            note.detail = f"version {gone} set aside, version {now} serves: {reason}"
    except (PublishError, ModelConfigError, RepositoryError, RolloutError, SQLAlchemyError,
            SlurmError, TritonError, AuditError) as exc:  # fmt: skip
        raise fail(exc) from exc
    say(
        console,
        f"{name}: version {gone} set aside; version {now} serves on {', '.join(where) or '-'}",
    )


@models_app.command("retire")
def retire_cmd(
    name: str, reason: WhyOpt = "retired", repository: RepoOpt = None, config: ConfigOpt = None
) -> None:
    """Unload the model everywhere and move it out of the repository (kept in the archive)."""
    cfg, repo = _model(config, repository, name)
    try:
        with _trail(cfg).audited("model.retire", f"model {name}", _REFUSED) as note:
            with running_servers(cfg) as servers:
                where = retire(repo, name, servers, reason)
            note.detail = f"unloaded from {', '.join(where) or 'no server'}: {reason}"
    except (PublishError, RepositoryError, SlurmError, TritonError, AuditError) as exc:
        raise fail(exc) from exc
    say(console, f"{name} retired (unloaded from {', '.join(where) or 'no server'})")


@models_app.command("history")
def history_cmd(
    name: Annotated[str | None, typer.Argument(help="The model (default: every model).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    repository: RepoOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Every publish, failed publish, rollback and retire: when, who, which version, why,
    on which servers. Reads the repository's journal only (no Slurm, no Triton)."""
    cfg = load_or_exit(config)
    repo = _repo(cfg, repository)
    try:
        if name is not None:
            repo.model_dir(name)
        journal = history.read(repo.archive, name)
    except (RepositoryError, OSError) as exc:
        raise fail(exc) from exc
    if journal.skipped:
        console.print(
            f"[yellow]{journal.skipped} line(s) of {escape(str(repo.archive / history.FILE))} "
            "are no entry (cut by a crash?) and are left out[/yellow]",
            soft_wrap=True,
        )
    if as_json:
        doc = {"entries": [e.to_json() for e in journal.entries], "skipped": journal.skipped}
        typer.echo(json.dumps(doc, indent=2))
        return
    if not journal.entries:
        say(console, f"no history for {name or 'any model'} in {repo.archive / history.FILE}")
        return
    table = Table("when (UTC)", "model", "action", "version", "serving", "who", "why", "servers")
    for e in journal.entries:
        table.add_row(
            f"{e.at:%Y-%m-%d %H:%M:%S}", escape(e.model), escape(e.action), _v(e.version),
            _v(e.serving), escape(e.who), escape(e.why) or "-",
            escape(", ".join(e.servers)) or "-",
        )  # fmt: skip
    Console().print(table)


def _v(version: int | None) -> str:
    return "-" if version is None else str(version)


@models_app.command("status")
def status_cmd(
    name: Annotated[str, typer.Argument(help="The model.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    repository: RepoOpt = None,
    config: ConfigOpt = None,
) -> None:
    """One model as its team sees it: team, SLO and replica bounds; each version's state
    (serving, canary, rolled back and why, ...), where it serves and its live figures
    (Triton's counters since load, its 60 s p99) beside the SLO; the open and the last
    rollout; replicas now and lends today; this month's and today's GPU-hours and cost
    from the ledger. Reads only: no database is created; Slurm not answering leaves the
    servers unknown. A model neither the repository nor its history knows: exit 2."""
    cfg = load_or_exit(config)
    repo = _repo(cfg, repository)
    try:
        check_known(name, repo)
    except (UnknownModel, RepositoryError) as exc:
        raise typer.BadParameter(str(exc), param_hint="'NAME'") from exc
    status = model_status(cfg, repo, name, datetime.now(UTC))
    if as_json:
        typer.echo(json.dumps(status.to_json(), indent=2))
        return
    render(status, Console())


def model_status(cfg: BridgeConfig, repo: ModelRepository, name: str, now: datetime) -> ModelStatus:
    """`gather` with the running servers Slurm knows (unknown when Slurm does not answer)."""
    facts = ModelCatalog(repo.root, cfg.models, say=False).facts()

    jobs, jobs_note = read_jobs(open_backend())

    def at(servers: list[Server] | None, note: str = "") -> ModelStatus:
        return gather(
            name, repo, facts, database_url=cfg.database_url,
            ledger_url=cfg.accounting.ledger_url, servers=servers, now=now, servers_note=note,
            observe=cfg.observe, staging_jobs=jobs, staging_note=jobs_note,
        )  # fmt: skip

    try:
        with running_servers(cfg) as servers:
            return at(servers)
    except SlurmError as exc:
        return at(None, f"Slurm does not answer: {exc}")


models_app.command("profile")(profile_cmd.profile)
