"""`stb lab demo`, the README's main command: the bridge at work on the lab.

Brings the lab up, wires the daemon's parts from `deploy/lab/bridge.toml` (lab paths
filled in), runs the showcase scenario (`bridge.lab.showcase`) with its timeline printed
as it happens, then prints what happened: the lease's states, what the load generator
measured before and after the lend, the requeued elastic job running again, the GPU
booking Slurm's accounting made for the lent Triton server, and the ledger of the demo's
hours (who used the GPUs, for what; the served models split by compute time).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accounting.buckets import floor_hour
from accounting.render import to_table
from accounting.report import Window, build_report
from bridge.cli_text import say
from bridge.config import BridgeConfig, load_config
from bridge.daemon.service import build, single_instance
from bridge.lab import triton
from bridge.lab.showcase import OnPass, Scenario, ScenarioResult
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lab.stepfigures import describe
from bridge.lab.tokens import tokens_file
from bridge.leases.store import LeaseStore
from bridge.ledger.feed import LedgerFeed, ingest_window
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TRITON_TAG
from bridge.slurm.sacct import parse_sacct_json


def lab_config(spec: LabSpec, pools_from: Path | None = None) -> BridgeConfig:
    """deploy/lab/bridge.toml with every path under this lab's directory. `pools_from`:
    a configuration (`stb init`'s, say) whose pools, Triton partition and account, and
    models where it names any, replace the lab file's; the lab's tick and policy stay
    (tuned to the demo's short load step)."""
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    if pools_from is not None:
        given = load_config(pools_from)
        base = base.model_copy(
            update={
                "pools": given.pools,
                "models": given.models or base.models,
                "triton": base.triton.model_copy(
                    update={"partition": given.triton.partition, "account": given.triton.account}
                ),
            }
        )
    lab = spec.lab_dir
    return base.model_copy(
        update={
            "database_url": f"sqlite:///{lab / 'bridge.db'}",
            "triton": triton.job_config(spec).model_copy(
                update={"partition": base.triton.partition, "account": base.triton.account}
            ),
            "routing": base.routing.model_copy(
                update={
                    "nginx_conf": lab / "routing" / "stb-upstreams.conf",
                    "http_sd_file": lab / "routing" / "http_sd.json",
                    "managed_nginx_prefix": lab / "nginx",
                }
            ),
            "daemon": base.daemon.model_copy(update={"lock_file": lab / "run" / "bridge.lock"}),
            "api": base.api.model_copy(update={"tokens_file": tokens_file(spec.api_dir)}),
            "accounting": base.accounting.model_copy(
                update={"ledger_url": f"sqlite:///{lab / 'ledger.db'}", "cluster": spec.cluster}
            ),
        }
    )


def daemon_toml(
    spec: LabSpec,
    work: Path,
    *,
    listen: str,
    exporter: str,
    tick_s: float = 1,
    ingest_interval_s: float = 2,
    database_url: str = "",
    instance: str = "",
) -> str:
    """A bridge TOML for a `stb daemon` on this lab with everything of its own (database,
    nginx, routing, exporter, lock, ledger) under `work`: for tests and benches that run
    the real daemon beside the lab's. `database_url` (default: SQLite under `work`) and
    `instance` serve tests that run several daemons on one database."""
    cfg = triton.job_config(spec)
    database_url = database_url or f"sqlite:///{work / 'bridge.db'}"
    return f"""
tick_s = {tick_s}
database_url = "{database_url}"
[policy]
max_lent_nodes = 1
[triton]
sbatch_script = "{cfg.sbatch_script}"
model_repository = "{cfg.model_repository}"
key_file = "{cfg.key_file}"
backend_directory = "{cfg.backend_directory}"
log_dir = "{cfg.log_dir}"
[routing]
nginx_conf = "{work / "routing" / "upstreams.conf"}"
http_sd_file = "{work / "routing" / "http_sd.json"}"
listen = "{listen}"
managed_nginx_prefix = "{work / "nginx"}"
[daemon]
exporter_listen = "{exporter}"
lock_file = "{work / "bridge.lock"}"
instance = "{instance}"
[api]
tokens_file = "{tokens_file(spec.api_dir)}"
[accounting]
ledger_url = "sqlite:///{work / "ledger.db"}"
cluster = "{spec.cluster}"
ingest_interval_s = {ingest_interval_s}
"""


def _report_row(name: str, rep: object) -> list[str]:
    from bridge.load.report import Report

    assert isinstance(rep, Report)
    t = rep.total
    lat = t.latency
    return [
        name,
        f"{t.sent_rate:.1f}",
        str(t.ok),
        str(sum(t.errors.values())),
        str(t.dropped),
        f"{lat.p50_ms:.0f}" if lat.p50_ms is not None else "-",
        f"{lat.p99_ms:.0f}" if lat.p99_ms is not None else "-",
    ]


def run(
    spec: LabSpec,
    console: Console,
    *,
    wait_requeued: bool = True,
    pools_from: Path | None = None,
    on_pass: OnPass | None = None,
) -> ScenarioResult:
    """The demo (the module's docstring); `on_pass` sees each of the scenario's passes
    (`bridge.lab.showcase.Scenario`)."""
    config = lab_config(spec, pools_from)
    started = datetime.now(UTC)
    with single_instance(config.daemon.lock_file):
        bridge = build(config, slurm_env=spec.env())
        # busy's SLO as the daemon scales it: the repository's, or the TOML's override
        slo_ms = bridge.reconciler.observer.models().scaled["busy"].slo_p99_ms
        try:
            console.print(
                f"[bold]bridge at work[/bold]: tick {config.tick_s:g}s, traffic "
                f"through nginx at {escape(config.routing.listen)}, SLO busy {slo_ms:g} ms"
            )
            res = Scenario(
                spec,
                bridge.reconciler,
                config.routing.listen,
                say=lambda line: say(console, line),
                on_pass=on_pass,
            ).run(wait_requeued=wait_requeued)
            lease_job = bridge.reconciler.store.get(res.lease_id or 0).slurm_job_id
        finally:
            # its connections closed and nginx stopped first: a server with an open
            # keep-alive connection would wait out its exit timeout (20 s) before it exits
            bridge.close()
            for job in bridge.reconciler.slurm.jobs(tag=TRITON_TAG):
                bridge.reconciler.slurm.cancel(job.job_id)
    table = Table(title="load generator (through nginx)")
    for col in ("phase", "sent/s", "ok", "errors", "dropped", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")
    if res.heavy:
        table.add_row(*_report_row("load step, 70/s", res.heavy))
    if res.light:
        table.add_row(*_report_row("trickle during return, 4/s", res.light))
    console.print(table)
    figures = res.step_figures(slo_ms)
    if figures is not None:
        for line in describe(figures, slo_ms):
            say(console, line)
    say(console, f"lease {res.lease_id} on {res.lease_node}: {' -> '.join(res.lease_states)}")
    say(
        console,
        f"elastic job {res.victim}: requeued {res.victim_restarts}x by Slurm"
        + (
            ""
            if res.victim_ran_again is None
            else (", ran again" if res.victim_ran_again else ", not running again yet")
        ),
    )
    console.print(
        "training jobs "
        + escape(" ".join(res.training_jobs))
        + ": "
        + ("never touched" if res.training_untouched else "[red]disturbed[/red]")
    )
    if lease_job:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs = parse_sacct_json(slurm(spec, "sacct", "-j", lease_job, "--json"))
            if runs and runs[-1].end is not None and runs[-1].partition:
                run = runs[-1]
                say(
                    console,
                    f"sacct books the lent Triton job {lease_job} (account {run.account}, "
                    f"partition {run.partition}): {run.gpus} GPUs x {run.elapsed_s}s = "
                    f"{run.gpu_seconds / 3600:.3f} GPU-hours of serving",
                )
                break
            time.sleep(1)
    if bridge.ledger is not None:
        _ledger(spec, config, bridge.ledger, bridge.reconciler.store, started, console)
    say(console, f"logs: {spec.log_dir}; lab stays up (`stb lab down` stops it)")
    return res


def _ledger(
    spec: LabSpec,
    config: BridgeConfig,
    feed: LedgerFeed,
    store: LeaseStore,
    started: datetime,
    console: Console,
) -> None:
    """Book the demo's hour(s) in the ledger and show who used the GPUs, for what."""
    now = datetime.now(UTC)
    summary = ingest_window(
        config, SlurmCLI(env=spec.env()), feed.ledger, started, now,
        leases=store.touched_since(started), now=now,
    )  # fmt: skip
    say(console, f"ledger ({config.accounting.ledger_url}): {summary.line()}")
    window = Window(floor_hour(started), floor_hour(now) + timedelta(hours=1), "this demo")
    report = build_report(feed.ledger, window, ("team", "workload", "model"))
    console.print(to_table(report))
    # deploy/lab/bridge.toml names the default lab's files relative to the repository
    default = spec.lab_dir.resolve() == (project_root() / ".lab").resolve()
    cfg = "deploy/lab/bridge.toml" if default else "<config>"
    say(
        console,
        f"the same ledger as a finance report (unit economics, lending, capacity plan): "
        f"stb report -c {cfg} --window {now:%Y-%m-%d} --format html -o report.html",
    )


def run_llm(spec: LabSpec, console: Console, pace_ms: int = 60, step: float = 1.5) -> None:
    """`stb lab demo --llm`: the LLM's load step (`bridge.lab.llm_showcase`), its
    timeline and its figures in TTFT/TPOT terms."""
    import shutil

    from bridge.lab import llm_showcase as llm

    def out(line: str) -> None:
        say(console, line)

    prepared = llm.prepare(spec, pace_ms, out)
    rate = step * prepared.one_replica_rate
    out(llm.describe(prepared, pace_ms))
    try:
        got = llm.one_round(spec, prepared.config, rate, out)
    finally:
        shutil.rmtree(prepared.repo, ignore_errors=True)
    table = Table(title=f"streams on smol through nginx, {rate:.2f}/s for {llm.STEP_S:.0f} s")
    for col in ("lend after", "replica serving after", "TTFT p99", "under SLO from",
                "TPOT p99", "streams", "broken"):  # fmt: skip
        table.add_column(col, justify="right")

    def s_(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    table.add_row(
        s_(got.get("lend_s")),
        s_(got.get("serving_s")),
        ms(got.get("ttft_p99_ms")) + f" (SLO {prepared.slo_ttft_s * 1000:.0f})",
        s_(got.get("ttft_under_s")),
        ms(got.get("tpot_p99_ms")) + f" (SLO {prepared.slo_tpot_s * 1000:.0f})",
        f"{got.get('streams') or 0:.0f}",
        f"{got.get('broken') or 0:.0f}",
    )
    console.print(table)
