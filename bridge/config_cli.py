"""`stb config check FILE [--live]`: validate a configuration and say what is wrong, by
field, show each model's effective SLO, bounds and replica size and where each came from
(the model repository or the TOML's override; exit 1 when a model's metadata is refused),
and with `--live` what would stop it working on this cluster; `stb init`: a
starting configuration from the cluster (`bridge.init`). Also what every command that
reads the configuration shares: the `--config` option and `load_or_exit` (`fail`, the
error line, is `bridge.cli_text`'s, also importable from here). Everything from the file
or the cluster prints as it is (escaped: `[triton]` in a message stays)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from bridge.cli_text import error, say
from bridge.cli_text import fail as fail  # the commands' error line, re-exported
from bridge.config import BridgeConfig, ConfigError, load_config, unknown_env
from bridge.init import InitError, live_problems, propose, render
from bridge.paths import write_whole
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import Node, Partition

if TYPE_CHECKING:
    from bridge.modelfacts import ModelFact

config_app = typer.Typer(help="The bridge's configuration file.", no_args_is_help=True)
console = Console()
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="Bridge TOML file.")]


def load_or_exit(path: Path | None) -> BridgeConfig:
    """The configuration, or exit 1 naming each bad field (`error: FILE: N problem(s)`,
    then a line per field)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        error(exc)
        raise typer.Exit(code=1) from exc


@config_app.command()
def check(
    path: Annotated[Path, typer.Argument(help="TOML configuration file.")],
    live: Annotated[
        bool,
        typer.Option(
            help="Also check it against the cluster Slurm describes now: partitions, the "
            "bridge's account on the Triton partition, preemption as the pools need."
        ),
    ] = False,
) -> None:
    """Validate FILE (with STB_ environment overrides); exit 1 naming each bad field."""
    for name in unknown_env(dict(os.environ)):
        console.print(
            f"[yellow]warning:[/yellow] environment variable {escape(name)} names no setting"
        )
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        console.print(f"[red]{escape(exc.source)}: invalid[/red]", soft_wrap=True)
        for field, msg in exc.problems:
            console.print(f"  [bold]{escape(field)}[/bold]: {escape(msg)}", soft_wrap=True)
        raise typer.Exit(code=1) from exc
    console.print(
        f"[green]{escape(str(path))}: valid[/green] ({len(cfg.pools)} pools, "
        f"{len(cfg.models)} model overrides, tick {cfg.tick_s:g}s, database "
        f"{escape(cfg.database_url)})"
    )
    if show_models(cfg):
        raise typer.Exit(code=1)
    if not live:
        return
    partitions, nodes = _cluster(None, None)
    problems = live_problems(cfg, partitions, nodes)
    for problem in problems:
        console.print(f"  [red]cluster[/red]: {escape(problem)}", soft_wrap=True)
    if problems:
        raise typer.Exit(code=1)
    console.print(
        f"[green]the cluster agrees[/green] ({len(partitions)} partitions, {len(nodes)} nodes)"
    )


def show_models(cfg: BridgeConfig) -> bool:
    """Each model's effective SLO, bounds, instances and GPUs per replica, where each
    value came from (the repository's config.pbtxt, the TOML's override, a default) or
    why it is not scaled, then every override, warning and problem; True when a model's
    facts are refused."""
    from bridge.triton.catalog import site_models

    facts = site_models(cfg)
    where = facts.repository or "no model repository"
    say(console, f"models ({where}, with the TOML's [models] overrides):")
    for name, fact in facts.facts.items():
        m = fact.model
        if m is None:
            console.print(f"  {escape(name)}: [yellow]{escape(fact.why)}[/yellow]", soft_wrap=True)
            continue
        src = fact.source_of
        instances = f", instances {m.instances} ({src('instances')})" if m.instances else ""
        request = (
            f"SLO p99 {m.slo_p99_ms:g} ms ({src('slo_p99_ms')})"
            if m.has_request_slo
            else "no request SLO (scaled by its tokens)"
        )
        say(
            console,
            f"  {name}: {request}{token_slos(fact)}, replicas "
            f"{m.min_replicas} ({src('min_replicas')}) to {m.max_replicas} "
            f"({src('max_replicas')}){instances}{replica_gpus(fact)}",
        )
    if facts.repository_note:
        console.print(f"  [yellow]{escape(facts.repository_note)}[/yellow]", soft_wrap=True)
    for fact in facts.facts.values():
        for line in fact.problems:
            console.print(f"  [red]error[/red]: {escape(line)}", soft_wrap=True)
        for line in fact.warnings:
            console.print(f"  [yellow]warning[/yellow]: {escape(line)}", soft_wrap=True)
        for line in fact.overrides:
            say(console, f"  override: {line}")
    return bool(facts.problems)


def _sourced(
    fact: ModelFact, rows: tuple[tuple[str, str], ...], show: Callable[[Any], str]
) -> list[str]:
    """Each (label, field) the model has a value for as "label shown-value (its source)"."""
    return [
        f"{label} {show(value)} ({fact.source_of(field)})"
        for label, field in rows
        if (value := getattr(fact.model, field)) is not None
    ]


def token_slos(fact: ModelFact) -> str:
    """An LLM's token objectives as `stb config check` shows them, each with its source
    (", TTFT p99 2000 ms (repository), TPOT p99 150 ms (toml)"); "" when it has none."""
    if fact.model is None:
        return ""
    rows = (("TTFT", "slo_ttft_p99_ms"), ("TPOT", "slo_tpot_p99_ms"), ("e2e", "slo_e2e_p99_ms"))
    return "".join(f", {p}" for p in _sourced(fact, rows, lambda v: f"p99 {v:g} ms"))


def replica_gpus(fact: ModelFact) -> str:
    """The GPUs one replica of a model needs, as `stb config check` shows them: the
    policy's rule (`bridge.policy.gang.replica_gpus`) on its instance GPUs and
    parallel sizes, each with its source (", 8 GPUs per replica: instance GPUs 2
    (repository), tensor parallel 4 (repository), pipeline parallel 2 (toml)"), and a
    GPU type where it says one (", 1 GPU per replica: type h100_1g.10gb (toml)"); "" when
    none is said (a replica takes whole nodes)."""
    from bridge.policy.gang import replica_gpus as of_model

    gpus = of_model(fact.model) if fact.model is not None else None
    if gpus is None:
        return ""
    rows = (
        ("instance GPUs", "instance_gpus"),
        ("tensor parallel", "tensor_parallel"),
        ("pipeline parallel", "pipeline_parallel"),
        ("type", "gpu_type"),
    )
    return f", {gpus} GPU{'' if gpus == 1 else 's'} per replica: " + ", ".join(
        _sourced(fact, rows, str)
    )


def _cluster(
    partitions_file: Path | None, nodes_file: Path | None
) -> tuple[list[Partition], list[Node]]:
    """Partitions and nodes from recorded `scontrol show partition/node -o` output, else
    from Slurm now (`open_backend`); exit 1 naming what failed."""
    from bridge.slurm.scontrol import parse_nodes, parse_partitions
    from bridge.slurm.select import open_backend

    try:
        if partitions_file is not None and nodes_file is not None:
            return (
                parse_partitions(partitions_file.read_text()),
                parse_nodes(nodes_file.read_text()),
            )
        slurm = open_backend()
        return slurm.partitions(), slurm.nodes()
    except (OSError, SlurmError) as exc:
        raise fail(exc) from exc


def _repository_models(repository: Path) -> dict[str, str]:
    """Model -> where its SLO comes from, for the TOML's comment (the repository read as
    the daemon reads it: `PublishedModels`)."""
    from bridge.modelfacts import FILE
    from bridge.triton.repository import SLO_PARAMETER, PublishedModels

    out: dict[str, str] = {}
    for name, pub in (PublishedModels(repository).read() or {}).items():
        if FILE in pub.errors:
            out[name] = f"unreadable config.pbtxt ({pub.errors[FILE]})"
        elif "slo_p99_ms" in pub.errors:
            out[name] = f"refused: {pub.errors['slo_p99_ms']}"
        elif pub.slo_p99_ms is not None:
            out[name] = f"{SLO_PARAMETER} = {pub.slo_p99_ms:g} ms"
        elif pub.slo_ttft_p99_ms is not None or pub.slo_tpot_p99_ms is not None:
            out[name] = "token SLOs (stb.slo_ttft_p99_ms / stb.slo_tpot_p99_ms)"
        else:
            out[name] = f"no {SLO_PARAMETER}: served, not scaled"
    return out


def init(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Write the configuration here.")
    ] = Path("bridge.toml"),
    account: Annotated[str, typer.Option(help="The bridge's Slurm account.")] = "bridge",
    model_repository: Annotated[
        Path | None,
        typer.Option(help="The Triton model repository (default: the project's triton_repo)."),
    ] = None,
    partitions_file: Annotated[
        Path | None,
        typer.Option("--partitions", help="`scontrol show partition -o` output (else Slurm)."),
    ] = None,
    nodes_file: Annotated[
        Path | None,
        typer.Option("--nodes", help="`scontrol show node -o` output (with --partitions)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """Write a starting configuration from Slurm's partitions and nodes and the model
    repository, each choice explained in a comment; then `stb config check FILE --live`."""
    from bridge.config import TritonJobConfig

    if (partitions_file is None) != (nodes_file is None):
        raise fail(ValueError("--partitions and --nodes go together"))
    if output.exists() and not force:
        raise fail(ValueError(f"{output} exists: give --force to replace it"))
    if output.is_dir() or not output.parent.is_dir():
        raise fail(ValueError(f"--output {output}: not a file in an existing directory"))
    partitions, nodes = _cluster(partitions_file, nodes_file)
    repository = model_repository or TritonJobConfig().model_repository
    try:
        proposal = propose(
            partitions, nodes, account=account, models=_repository_models(repository)
        )
    except InitError as exc:
        raise fail(exc) from exc
    source = (
        f"{partitions_file.name} and {nodes_file.name}"
        if partitions_file is not None and nodes_file is not None
        else "the cluster's partitions and nodes"
    )
    text = render(proposal, source=source)
    write_whole(output, text, mode=0o644)
    for pool in proposal.pools:
        say(
            console,
            f"pool {pool.name}: partition {pool.partition}, {pool.lend_mode} "
            f"({len(pool.nodes)} nodes, {pool.gpus} GPUs): {pool.why}",
        )
    for note in proposal.notes:
        say(console, f"left out: {note}")
    say(console, f"wrote {output}; next: stb config check {output} --live")
