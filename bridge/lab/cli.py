"""`stb lab ...`: bring the one-host lab cluster up, down, show it, and run the demo."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.cli_text import fail, say
from bridge.lab import lab as lab_mod
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import MIG_PROFILES, LabSpec, LabSpecError
from bridge.paths import default_lab_dir

lab_app = typer.Typer(
    help="The one-host lab cluster: real Slurm, real Triton.", no_args_is_help=True
)
console = Console()

DirOpt = Annotated[
    Path | None,
    typer.Option("--dir", help="Lab directory [default: .lab in the checkout, or $STB_LAB_DIR]."),
]


def _say(msg: str) -> None:
    console.print(f"[dim]lab:[/dim] {escape(msg)}", soft_wrap=True)


def _spec(lab_dir: Path | None) -> LabSpec:
    lab_dir = (lab_dir or default_lab_dir()).resolve()
    spec = LabSpec.load(lab_dir)
    return spec if spec is not None else LabSpec(lab_dir=lab_dir)


@lab_app.command()
def up(
    lab_dir: DirOpt = None,
    train: Annotated[int, typer.Option(help="Nodes in the training pool.")] = 2,
    elastic: Annotated[int, typer.Option(help="Nodes in the elastic pool.")] = 1,
    infer: Annotated[int, typer.Option(help="Nodes reserved for inference.")] = 1,
    gpus: Annotated[int, typer.Option(help="Fake GPUs per node.")] = 4,
    gpu_type: Annotated[str, typer.Option(help="GPU type in gres.")] = "h100",
    no_install: Annotated[bool, typer.Option(help="Do not apt-get missing packages.")] = False,
    mig: Annotated[
        bool,
        typer.Option(
            help="One more node of fake MIG slices (4g.40gb, 2g.20gb, 1g.10gb) in a hidden "
            "partition 'mig' (tests/lab/test_ledger_mig_lab.py)."
        ),
    ] = False,
) -> None:
    """Install what is missing and start the lab cluster (idempotent)."""
    try:
        spec = LabSpec(
            lab_dir=(lab_dir or default_lab_dir()).resolve(),
            train_nodes=train,
            elastic_nodes=elastic,
            infer_nodes=infer,
            gpus_per_node=gpus,
            gpu_type=gpu_type,
            mig_profiles=MIG_PROFILES if mig else (),
        )
        start = time.monotonic()
        lab_mod.up(spec, say=_say, install=not no_install)
    except (LabSpecError, RuntimeError) as exc:
        raise fail(exc) from exc
    console.print(
        f"[green]lab up[/green] in {time.monotonic() - start:.1f}s: "
        f"{spec.node_count} nodes, {spec.gpus_per_node}x{escape(spec.gpu_type)} each"
    )
    _print_status(spec)


@lab_app.command()
def down(lab_dir: DirOpt = None) -> None:
    """Cancel the lab's jobs and stop every process the lab started."""
    try:
        lab_mod.down(_spec(lab_dir), say=_say)
    except RuntimeError as exc:
        raise fail(exc) from exc
    console.print("[green]lab down[/green]")


@lab_app.command()
def status(lab_dir: DirOpt = None) -> None:
    """Say which lab daemons run, where their logs are, and the Slurm view."""
    spec = _spec(lab_dir)
    if not (spec.lab_dir / "lab.json").exists():
        say(console, f"no lab at {spec.lab_dir}; `stb lab up` makes one")
        raise typer.Exit(code=1)
    _print_status(spec)
    if not all(d.pid for d in lab_mod.status(spec)):
        raise typer.Exit(code=3)


def _print_status(spec: LabSpec) -> None:
    table = Table(title=escape(f"lab at {spec.lab_dir}"))
    for col in ("daemon", "state", "pid", "log"):
        table.add_column(col)
    for d in lab_mod.status(spec):
        table.add_row(
            d.name,
            "[green]running[/green]" if d.pid else "[red]stopped[/red]",
            str(d.pid or "-"),
            escape(str(d.log)),
        )
    console.print(table)
    nodes = Table(title="nodes")
    for col in ("node", "address", "slurmd port", "pool", "gres"):
        nodes.add_column(col)
    for n in spec.nodes:
        nodes.add_row(
            *map(escape, (n.name, n.addr, str(n.port), n.pool)),
            escape(f"gpu:{spec.gpu_type}:{spec.gpus_per_node}"),
        )
    console.print(nodes)
    if any(d.name == "slurmctld" and d.pid for d in lab_mod.status(spec)):
        say(console, slurm(spec, "sinfo", "-N", "-o", "%N %9P %6t %G", check=False).rstrip())
        say(
            console,
            slurm(spec, "squeue", "-o", "%.6i %.8P %.14j %.12a %.8T %N", check=False).rstrip(),
        )
    say(console, f"Slurm clients: export SLURM_CONF={spec.slurm_conf}")


@lab_app.command()
def demo(
    lab_dir: DirOpt = None,
    no_wait: Annotated[
        bool, typer.Option(help="Do not wait for the requeued elastic job to run again.")
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Take the pools (and models, if it names any) from this configuration, "
            "e.g. `stb init`'s; the rest is deploy/lab/bridge.toml's.",
        ),
    ] = None,
    llm: Annotated[
        bool,
        typer.Option(
            "--llm",
            help="The step on the lab's LLM (smol, token streams) instead of busy: the "
            "bridge sizes it by its measured token profile; shown in TTFT/TPOT terms.",
        ),
    ] = False,
) -> None:
    """The bridge at work: a load step lends a node, load falls, the node returns."""
    from bridge.config import ConfigError, load_config
    from bridge.lab import demo as demo_mod

    try:
        if config is not None:
            load_config(config)  # a bad file is said before the lab starts
        spec = _spec(lab_dir)
        lab_mod.up(spec, say=_say)
        if llm:
            demo_mod.run_llm(spec, console)
            return
        demo_mod.run(spec, console, wait_requeued=not no_wait, pools_from=config)
    except (RuntimeError, ConfigError) as exc:
        raise fail(exc) from exc
