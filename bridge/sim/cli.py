"""`stb simulate`: compare the set-ups of `bridge.sim.policies` on a simulated fleet, fed
by a site's own data (`bridge.sim.inputs`), by generators (the defaults: they need
nothing outside the repository) or by the public traces, and print or write the
comparison. Registered in `bridge.cli`. Thin: checks the options (here), reads the site's
data (`bridge.sim.inputs.site.resolve`), builds the `Scenario` (`bridge.sim.build`, with
`bridge.sim.workload` for the generators and traces), runs `compare` and the selection's
trade-off runs with progress bars on stderr (`bridge.sim.progress`), and prints or writes
the result (`bridge.sim.output`, rendered by `bridge.sim.render` and
`bridge.sim.selection_render`).

Generated models are named m0, m1, ...; model i gets `--mean-rps` / (i + 1) requests per
second on average (a Zipf-like popularity: m0 the full rate, m1 half, m2 a third, ...),
every one with the same SLO and service time. A site's arrivals (`--arrivals prometheus`
or `csv`) bring their own models, each with its SLO from --config's [models] (else
--slo-ms) and its service time from Triton's counters (`--service-from`) or
--service-ms. Generated jobs are a share of the GPUs left outside a peak-sized inference
pool, so every set-up faces the same offered work; a site's jobs (`--jobs sacct`, or
`--jobs ledger`: those the GPU-hour ledger booked) are replayed as they came.

An option that another option's value would leave unread is never ignored
(`bridge.sim.options`' table): a file only one kind reads chooses that kind when the
kind was not given (`--arrivals-trace F`: `--arrivals azure`, said in the report's
inputs line and its scenario's `implied`); else the run is refused naming both options.

Bad input (an option out of range, an unknown policy, a missing or unreadable trace or
site file, a Prometheus that does not answer, a fleet too small for the inference load,
an option that would go unread) ends with one line on stderr and exit code 2, and writes
nothing; an output file is written whole or not at all (temp file + rename).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from bridge.cli_text import fail
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.sim.build import (
    ALIBABA_TRACE,
    AZURE_TRACE,
    STEP_S,
    BadInput,
    build_scenario,
    model_rates,
)
from bridge.sim.criteria import Criteria, parse_criteria
from bridge.sim.inputs.site import (
    DEFAULT_DAYS,
    SERVICE_FROM,
    SITE_ARRIVALS,
    SITE_JOBS,
    TIMING_FROM,
    SiteOptions,
    per_model,
    resolve,
)
from bridge.sim.lending import GRANULARITIES, parse_replica_gpus
from bridge.sim.options import GENERATED_ARRIVALS, GENERATED_JOBS, settle
from bridge.sim.output import emit
from bridge.sim.policies import POLICIES, known, size, tradeoff_sizes, with_separate
from bridge.sim.progress import run, run_selection
from bridge.sim.weights import DEFAULT_MODEL_BYTES, DEFAULT_STAGE_BYTES_S

FORMATS = ("table", "json", "html", "markdown")
ARRIVALS = (*GENERATED_ARRIVALS, *SITE_ARRIVALS)
JOBS = (*GENERATED_JOBS, *SITE_JOBS)
ALL = ",".join(POLICIES)


def _bad(exc: Exception) -> typer.Exit:
    """Print `exc` as the command's one-line error (`fail`) and return exit code 2."""
    return fail(exc, code=2)


def parse_policies(text: str) -> list[str]:
    """A comma list of policy names, in the order given, each once."""
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise BadInput(f"--policies is empty; choose from {', '.join(POLICIES)}")
    unknown = [p for p in names if not known(p)]
    if unknown:
        raise BadInput(
            f"--policies: unknown policy {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(POLICIES)} or separate-N (N inference nodes)"
        )
    return names


def _check(
    *,
    days: float,
    nodes: int,
    gpus_per_node: int,
    models: int,
    mean_rps: float,
    slo_ms: float,
    service_ms: float | None,
    load: float,
    arrivals: str,
    jobs: str,
    fmt: str,
    output: Path | None,
    granularity: str = "node",
) -> None:
    """Every option that can be checked before reading a trace; BadInput naming it.
    `service_ms`: --service-ms' value for every model (None: it names models only)."""
    positive = {
        "--days": days,
        "--mean-rps": mean_rps,
        "--slo-ms": slo_ms,
        "--load": load,
    }
    if service_ms is not None:
        positive["--service-ms"] = service_ms
    for option, value in positive.items():
        if not (math.isfinite(value) and value > 0):
            raise BadInput(f"{option} must be a number > 0, got {value:g}")
    for option, count in {"--nodes": nodes, "--gpus-per-node": gpus_per_node}.items():
        if count < 1:
            raise BadInput(f"{option} must be at least 1, got {count}")
    if models < 1:
        raise BadInput(f"--models must be at least 1, got {models}")
    if service_ms is not None and service_ms >= slo_ms:
        raise BadInput(
            f"--service-ms {service_ms:g} is not below --slo-ms {slo_ms:g}: no replica "
            "could meet the SLO"
        )
    choices = {
        "--arrivals": (arrivals, ARRIVALS),
        "--jobs": (jobs, JOBS),
        "--format": (fmt, FORMATS),
        "--granularity": (granularity, GRANULARITIES),
    }
    for option, (choice, allowed) in choices.items():
        if choice not in allowed:
            raise BadInput(f"{option} {choice!r}: choose from {', '.join(allowed)}")
    if fmt == "html" and output is None:
        raise BadInput("--format html needs --output FILE")
    if output is not None:
        if output.is_dir():
            raise BadInput(f"--output {output} is a directory")
        if not output.parent.is_dir():
            raise BadInput(f"--output: no directory {output.parent}")


#: where an option's value came from when the user gave it (typer's vendored click's
#: ParameterSource names; the rest are defaults)
GIVEN_FROM = ("COMMANDLINE", "ENVIRONMENT")


def _options(ctx: typer.Context) -> tuple[dict[str, object], set[str]]:
    """The command's options by flag (`--arrivals-trace`), at their values, and the flags
    the command line gave (`bridge.sim.options.settle` reads both)."""
    values: dict[str, object] = {}
    given: set[str] = set()
    for param in ctx.command.params:
        if param.name is None or param.name not in ctx.params:
            continue
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        values[flag] = ctx.params[param.name]
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name in GIVEN_FROM:
            given.add(flag)
    return values, given


def simulate(
    ctx: typer.Context,
    days: Annotated[
        float | None,
        typer.Option(
            help=f"Simulated days (default {DEFAULT_DAYS:g}; with site data, its own span "
            "unless --since/--until say otherwise)."
        ),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(help="Nodes in the fleet (every set-up; default 256).")
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="GPUs per node (default 8, or the --fleet-nodes').")
    ] = None,
    models: Annotated[int, typer.Option(help="Models m0, m1, ... served.")] = 4,
    mean_rps: Annotated[
        float,
        typer.Option(
            help="Mean requests/s of m0; model i gets MEAN_RPS / (i + 1). The default puts "
            "inference at about 6% of 256 nodes on average and 12% at its peak minute."
        ),
    ] = 3000.0,
    slo_ms: Annotated[
        float,
        typer.Option(help="p99 latency SLO (ms) of every model --config gives none."),
    ] = 100.0,
    service_ms: Annotated[
        str,
        typer.Option(
            help="Service time of one request (ms; the lab's `busy` model): 20 for every "
            "model, busy=20,echo=1 per model, or both (20,busy=35)."
        ),
    ] = "20",
    arrivals: Annotated[
        str,
        typer.Option(
            help=f"{'|'.join(ARRIVALS)}: generated (synthetic, ramps, bursty, daily), the "
            "public Azure trace, or the site's own (a Prometheus range query, a CSV)."
        ),
    ] = "synthetic",
    arrivals_trace: Annotated[
        Path | None,
        typer.Option(
            help=f"Azure LLM trace (default: $STB_TRACES_DIR/{AZURE_TRACE}); given alone, "
            "it means --arrivals azure."
        ),
    ] = None,
    jobs: Annotated[
        str,
        typer.Option(
            help=f"{'|'.join(JOBS)}: the public Alibaba trace, generated, or the site's own "
            "sacct records (--sacct-json) or GPU-hour ledger (jobs arrive as they started)."
        ),
    ] = "synthetic",
    jobs_trace: Annotated[
        Path | None,
        typer.Option(
            help=f"Alibaba GPU trace (default: $STB_TRACES_DIR/{ALIBABA_TRACE}); given "
            "alone, it means --jobs alibaba."
        ),
    ] = None,
    load: Annotated[
        float,
        typer.Option(
            help="Offered job GPU-load, a share of the GPUs outside peak inference (not "
            "for --jobs sacct or ledger: those come as they came)."
        ),
    ] = 0.85,
    since: Annotated[
        str | None,
        typer.Option(help="Start of the site's window: ISO 8601 with a zone, or epoch seconds."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="End of the site's window (as --since).")
    ] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option(help="The site's Prometheus (http://host:9090): arrivals, service times."),
    ] = None,
    prometheus_json: Annotated[
        Path | None,
        typer.Option(help="A saved answer of Prometheus' /api/v1/query_range (the arrivals)."),
    ] = None,
    prometheus_save: Annotated[
        Path | None,
        typer.Option(help="Save the --prometheus-url query's answer here (replay it later)."),
    ] = None,
    query: Annotated[
        str,
        typer.Option(
            help="The arrivals' range query, a series per model (default: sum by (model) "
            "(rate(nv_inference_request_success[1m])))."
        ),
    ] = "",
    arrivals_file: Annotated[
        Path | None,
        typer.Option(help="--arrivals csv: a CSV of time,model,rate (requests/s at time)."),
    ] = None,
    scale: Annotated[
        float, typer.Option(help="The site's arrivals times this (1.5: half as much again).")
    ] = 1.0,
    max_gap_s: Annotated[
        float,
        typer.Option(
            help="A missing stretch of the site's arrivals up to this long holds the sample "
            "before it; a longer one is a gap (rate 0, listed in the report)."
        ),
    ] = 60.0,
    sacct_json: Annotated[
        list[Path] | None,
        typer.Option(help="--jobs sacct: `sacct --json --duplicates -a` output (repeatable)."),
    ] = None,
    partition_kind: Annotated[
        str,
        typer.Option(
            help="Partitions no pool or \\[accounting] workloads names: PART=training|elastic|"
            "inference,... (inference: not batch work)."
        ),
    ] = "",
    ledger_url: Annotated[
        str | None,
        typer.Option(
            help="--jobs ledger, --service-from ledger: the GPU-hour ledger's database URL "
            "(default: --config's \\[accounting] ledger_url). Read only."
        ),
    ] = None,
    fleet_nodes: Annotated[
        Path | None,
        typer.Option(help="The fleet: `scontrol show node -o` output; pools from --config."),
    ] = None,
    fleet_partitions: Annotated[
        Path | None,
        typer.Option(help="With --fleet-nodes: `scontrol show partition -o` output."),
    ] = None,
    service_from: Annotated[
        str,
        typer.Option(
            help=f"{'|'.join(SERVICE_FROM)}: service times from --service-ms, from Triton's "
            "counters through Prometheus, or from those the daemon stored in --config's ledger."
        ),
    ] = "options",
    service_json: Annotated[
        Path | None,
        typer.Option(help="--service-from prometheus: a saved answer of its service query."),
    ] = None,
    load_s: Annotated[
        str,
        typer.Option(
            help="Seconds loading a model adds to a lent replica's start past Triton's own: "
            "30, or llm=90,small=5 (default 0: the lab's models). With --timing leases, "
            "the models it does not give take the loads the daemon stored, less the "
            "history's Triton start; what it gives overrides them."
        ),
    ] = "",
    cache: Annotated[
        str,
        typer.Option(
            help="Node-local weight caches: off; N:S (each node keeps the N models it "
            "served last and loads them in S seconds); stage:N:S (the same, staged ahead "
            f"of need, {DEFAULT_MODEL_BYTES / 1e9:g} GB a model at "
            f"{DEFAULT_STAGE_BYTES_S / 1e6:g} MB/s a node); N or stage:N (with --timing "
            "leases: each model's S the daemon stored for loads from a node's cache). A "
            "given S overrides the history's."
        ),
    ] = "off",
    timing: Annotated[
        str,
        typer.Option(
            help=f"{'|'.join(TIMING_FROM)}: actuation times measured on the lab, or the "
            "medians of the bridge's own lease history (--config's database_url), with "
            "the model load times its daemon stored there."
        ),
    ] = "default",
    policies: Annotated[str, typer.Option(help="Set-ups to compare, comma-separated.")] = ALL,
    config: ConfigOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 0,
    checkpoint_s: Annotated[
        float,
        typer.Option(
            help="Elastic jobs checkpoint every this many seconds of run time and report it "
            "(stb:ckpt=): a requeue loses only the work since. 0: never."
        ),
    ] = 0.0,
    reserve: Annotated[
        str,
        typer.Option(
            help="The bridge's reserved inference nodes: mean, peak, pNN (a percentile of the "
            "per-minute load) or a number of nodes."
        ),
    ] = "mean",
    lend_cap: Annotated[
        str,
        typer.Option(
            help="The bridge's lend cap: peak (the peak's nodes above what it reserves: no "
            "more than a separate fleet owns; the default), share:F (F of each lendable "
            "pool's nodes, max_lent_share: bursts past the separate fleet's size, at the "
            "cost of requeued elastic work and longer job waits) or a node count N "
            "(max_lent_nodes)."
        ),
    ] = "peak",
    granularity: Annotated[
        str,
        typer.Option(
            help="What a lend takes: node (whole nodes, as the bridge lends today) or gpu "
            "(the GPUs of its replica, --replica-gpus: the jobs requeued are the fewest GPUs "
            "of elastic work, the node's other GPUs run on). The same where no model states "
            "its replica's GPUs."
        ),
    ] = "node",
    replica_gpus: Annotated[
        str,
        typer.Option(
            help="GPUs one replica of each model takes: 1,2,4,8,16 (the models in order, "
            "cycled), m0=4,m1=16 per model, or both. More than a node's: a gang of whole "
            "nodes, lent and returned together, all or nothing. Default: whole nodes."
        ),
    ] = "",
    separate_nodes: Annotated[
        int,
        typer.Option(
            help="Also compare separate pools with this many inference nodes (separate-N: "
            "the site's inference partition as it is, say). 0: none."
        ),
    ] = 0,
    tradeoff_at: Annotated[
        str,
        typer.Option(
            "--tradeoff",
            help="Reserved sizes the selection report runs the bridge at: auto (4 from 1 "
            "node to the peak's, and the bridge's own), none, or node counts 4,8,16 (each "
            "a full run; at most 12).",
        ),
    ] = "auto",
    slo_target: Annotated[
        float,
        typer.Option(
            help="The selection report's SLO attainment target: the share of requests "
            "within SLO a set-up must reach."
        ),
    ] = 0.99,
    criteria: Annotated[
        str,
        typer.Option(
            help="The selection report's other thresholds, name=value,...: budget_slack, "
            "max_lends_per_day, max_lost_share, max_exposure, min_wait_cut, min_nodes_saved."
        ),
    ] = "",
    fmt: Annotated[str, typer.Option("--format", help="|".join(FORMATS))] = "table",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write to FILE (html: required; json: else stdout)."),
    ] = None,
) -> None:
    """Compare separate pools, Lyra-like idle loans and the bridge on a simulated fleet:
    inference SLOs, job queueing and completion, GPU use. Uses the bridge's own policy;
    --config takes the policy section and tick_s of a bridge TOML."""
    try:
        service_default, _ = per_model(service_ms, "--service-ms")
        _check(
            days=DEFAULT_DAYS if days is None else days,
            nodes=256 if nodes is None else nodes,
            gpus_per_node=8 if gpus_per_node is None else gpus_per_node, models=models,
            mean_rps=mean_rps, slo_ms=slo_ms, service_ms=service_default, load=load,
            arrivals=arrivals, jobs=jobs, fmt=fmt, output=output, granularity=granularity,
        )  # fmt: skip
        settled = settle(*_options(ctx))  # an option that would go unread: refused
        arrivals, jobs = str(settled.values["--arrivals"]), str(settled.values["--jobs"])
        service_from = str(settled.values["--service-from"])
        chosen = with_separate(parse_policies(policies), separate_nodes)
        if not checkpoint_s >= 0:
            raise BadInput(f"--checkpoint-s must be >= 0 seconds, got {checkpoint_s}")
    except ValueError as exc:
        raise _bad(exc) from exc
    try:
        cfg = load_or_exit(config) if config is not None else None
    except typer.Exit:  # it named each bad field; a bad file is bad input here too
        raise typer.Exit(code=2) from None
    site_options = SiteOptions(
        arrivals=arrivals, jobs=jobs, days=days, since=since, until=until,
        prometheus_url=prometheus_url, prometheus_json=prometheus_json,
        prometheus_save=prometheus_save, query=query, arrivals_file=arrivals_file,
        scale=scale, max_gap_s=max_gap_s, sacct_json=tuple(sacct_json or ()),
        partition_kind=partition_kind, ledger_url=ledger_url, fleet_nodes=fleet_nodes,
        fleet_partitions=fleet_partitions, nodes=nodes, gpus_per_node=gpus_per_node,
        slo_ms=slo_ms, service_ms=service_ms, service_from=service_from,
        service_json=service_json, load_s=load_s, cache=cache, timing=timing, step_s=STEP_S,
    )  # fmt: skip
    try:
        rates = model_rates(models, mean_rps)
        site = resolve(site_options, cfg, list(rates), now=datetime.now(UTC))
        sizes_of = parse_replica_gpus(replica_gpus, list(site.models or rates))
        scenario = build_scenario(
            days=site.days, nodes=site.nodes, gpus_per_node=site.gpus_per_node,
            rates=rates, slo_ms=slo_ms, service_ms=service_default or 20.0,
            arrivals=arrivals, arrivals_trace=arrivals_trace, jobs=jobs, jobs_trace=jobs_trace,
            load=load, policies=chosen, seed=seed, reserve=reserve, lend_cap=lend_cap,
            checkpoint_s=checkpoint_s or None,
            policy=cfg.policy if cfg else None, tick_s=cfg.tick_s if cfg else STEP_S,
            about={
                "config": config.name if config else "none (policy defaults, 5 s ticks)",
                **site.about,
                **({"implied": settled.implied} if settled.implied else {}),
            },
            series=site.series, site_jobs=site.jobs, models=site.models, timing=site.timing,
            granularity=granularity, replica_gpus=sizes_of,
        )  # fmt: skip
        thresholds = parse_criteria(criteria, Criteria(target=slo_target))
        sizes = tradeoff_sizes(tradeoff_at, size(scenario), scenario.nodes)
    except (ValueError, OSError) as exc:
        raise _bad(exc) from exc
    report, selection = run_selection(scenario, run(scenario, chosen), sizes, thresholds)

    emit(report, selection, fmt, output)
