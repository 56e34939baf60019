"""`stb daemon` and `stb status`: run the bridge, and show what it holds.

`status` reads the lease store, asks Slurm for the pools, and reads the running daemon's
own view (each model's p99, each lease's retries, its last pass's outcome) from its
exporter; each open lease says whether it is stuck past its state's deadline, and the
leases that failed in the last day are listed with the reason. `--json` prints the same as
one document.
"""

from __future__ import annotations

import getpass
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bridge.config import BridgeConfig
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.daemon.actuator import record_of
from bridge.daemon.observation import pool_of
from bridge.daemon.planner import Settings, is_stuck
from bridge.daemon.service import DaemonError, run_daemon
from bridge.leases.errors import LeaseError
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend

console = Console()


def daemon(config: ConfigOpt = None) -> None:
    """Run the bridge: observe, decide, act every tick, until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        run_daemon(load_or_exit(config))
    except DaemonError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=1) from exc


@dataclass
class DaemonView:
    """What the running daemon's exporter says (None fields: not reachable)."""

    p99_ms: dict[str, float] = field(default_factory=dict)
    retries: dict[int, int] = field(default_factory=dict)
    health: dict[str, Any] | None = None


def _daemon_view(exporter: str) -> DaemonView | None:
    try:
        text = httpx.get(f"http://{exporter}/metrics", timeout=2).text
        health = httpx.get(f"http://{exporter}/healthz", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    view = DaemonView(health=health)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "stb_model_p99_ms" and s.value == s.value:  # not NaN
                view.p99_ms[s.labels["model"]] = float(s.value)
            elif s.name == "stb_lease_retries" and s.labels.get("lease", "").isdigit():
                view.retries[int(s.labels["lease"])] = int(s.value)
    return view


def collect(cfg: BridgeConfig, now: datetime) -> dict[str, Any]:
    """The status document."""
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = LeaseStore(engine)
    daemon = _daemon_view(cfg.daemon.exporter_listen)
    settings = Settings.of(cfg)
    leases = [
        {
            "id": lease.id,
            "node": lease.node,
            "pool": lease.pool,
            "mode": lease.lend_mode.value,
            "state": lease.state.value,
            "models": lease.models,
            "job": lease.slurm_job_id,
            "age_s": round((now - lease.created_at).total_seconds()),
            "in_state_s": round((now - lease.updated_at).total_seconds()),
            "reason": lease.reason,
            "stuck": is_stuck(record_of(lease), settings, now.timestamp()),
            "retries": (daemon.retries if daemon else {}).get(lease.id or 0, 0),
        }
        for lease in store.open_leases()
    ]
    failed = [
        {
            "id": lease.id,
            "node": lease.node,
            "pool": lease.pool,
            "at": event.at.isoformat(),
            "from": event.from_state.value if event.from_state else None,
            "reason": event.reason,
            "state": lease.state.value,
        }
        for lease, event in store.failures_since(now - timedelta(days=1))
    ]
    pools: dict[str, dict[str, Any]] = {
        name: {"partition": p.partition, "mode": p.lend_mode, "nodes": [], "lent": []}
        for name, p in cfg.pools.items()
    }
    error = None
    try:
        lent = {lease["node"] for lease in leases}
        for node in open_backend().nodes():
            pool = pool_of(node, cfg)
            if pool:
                pools[pool]["nodes"].append(f"{node.name}:{node.state}")
                if node.name in lent:
                    pools[pool]["lent"].append(node.name)
    except SlurmError as exc:
        error = str(exc)
    models = {
        name: {
            "slo_p99_ms": m.slo_p99_ms,
            "p99_ms": daemon.p99_ms.get(name) if daemon else None,
            "replicas": [m.min_replicas, m.max_replicas],
        }
        for name, m in cfg.models.items()
    }
    return {
        "at": now.isoformat(),
        "pools": pools,
        "leases": leases,
        "failed": failed,
        "models": models,
        "daemon_reachable": daemon is not None,
        "daemon_health": daemon.health if daemon else None,
        "slurm_error": error,
    }


def status(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> None:
    """Pools, lent nodes, leases with state and age, per-model p99 against SLO."""
    doc = collect(load_or_exit(config), datetime.now(UTC))
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    pools = Table(title="pools")
    for col in ("pool", "partition", "mode", "nodes", "lent"):
        pools.add_column(col)
    for name, p in doc["pools"].items():
        pools.add_row(
            name, p["partition"], p["mode"], " ".join(p["nodes"]), " ".join(p["lent"]) or "-"
        )
    console.print(pools)
    leases = Table(title="open leases")
    for col in ("id", "node", "pool", "state", "models", "job", "age", "in state", "reason"):
        leases.add_column(col)
    for lease in doc["leases"]:
        state = lease["state"]
        if lease["stuck"]:
            state = f"[red]{state} (stuck)[/red]"
        if lease["retries"]:
            state += f" ({lease['retries']} retries)"
        leases.add_row(
            str(lease["id"]),
            lease["node"],
            lease["pool"],
            state,
            ",".join(lease["models"]),
            lease["job"] or "-",
            f"{lease['age_s']}s",
            f"{lease['in_state_s']}s",
            lease["reason"],
        )
    console.print(leases)
    if doc["failed"]:
        failures = Table(title="leases failed in the last 24 h")
        for col in ("id", "node", "pool", "at", "from", "now", "reason"):
            failures.add_column(col)
        for f in doc["failed"]:
            failures.add_row(
                str(f["id"]),
                f["node"],
                f["pool"],
                f["at"],
                f["from"] or "-",
                f["state"],
                f["reason"],
            )
        console.print(failures)
    health = doc["daemon_health"]
    if health is not None and health.get("last_outcome") not in (None, "ok"):
        console.print(f"[yellow]daemon's last pass: {health['last_outcome']}[/yellow]")
        for line in health.get("last_errors", []):
            console.print(f"  {line}")
    models = Table(
        title="models" + ("" if doc["daemon_reachable"] else " (daemon not reachable: no p99)")
    )
    for col in ("model", "p99 ms", "SLO ms", "replicas min-max"):
        models.add_column(col)
    for name, m in doc["models"].items():
        p99 = m["p99_ms"]
        shown = (
            "-"
            if p99 is None
            else (f"[red]{p99:.0f}[/red]" if p99 > m["slo_p99_ms"] else f"{p99:.0f}")
        )
        models.add_row(
            name, shown, f"{m['slo_p99_ms']:g}", f"{m['replicas'][0]}-{m['replicas'][1]}"
        )
    console.print(models)
    if doc["slurm_error"]:
        console.print(f"[yellow]Slurm: {doc['slurm_error']}[/yellow]")


def _queue(cfg: BridgeConfig) -> tuple[RequestQueue, LeaseStore]:
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    return RequestQueue(engine), LeaseStore(engine)


def _wait(queue: RequestQueue, request_id: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        req = queue.get(request_id)
        if req is not None and req.done_at is not None:
            bad = req.outcome.startswith(("refused", "failed"))
            console.print(
                ("[red]" if bad else "[green]") + req.outcome + ("[/red]" if bad else "[/green]")
            )
            if bad:
                raise typer.Exit(code=1)
            return
        time.sleep(0.5)
    console.print(
        f"[yellow]request {request_id} not taken within {timeout_s:g}s: is the "
        "daemon running?[/yellow]"
    )
    raise typer.Exit(code=2)


WaitOpt = Annotated[float, typer.Option(help="Seconds to wait for the daemon (0: don't).")]


def lend(
    node: Annotated[str, typer.Argument(help="Slurm node to lend to Triton.")],
    models: Annotated[
        str,
        typer.Option(help="Models to place, comma-separated (default: every configured model)."),
    ] = "",
    config: ConfigOpt = None,
    wait: WaitOpt = 30,
) -> None:
    """Ask the running daemon to lend NODE (through the lease state machine)."""
    cfg = load_or_exit(config)
    names = [m for m in models.split(",") if m]
    unknown = sorted(set(names) - set(cfg.models))
    if unknown:
        console.print(
            f"[red]error:[/red] unknown models {', '.join(unknown)}; configured: "
            f"{', '.join(cfg.models)}"
        )
        raise typer.Exit(code=1)
    queue, _ = _queue(cfg)
    req = queue.request_lend(node, names, datetime.now(UTC), requested_by=getpass.getuser())
    console.print(f"request {req.id}: lend {node}")
    if wait > 0 and req.id is not None:
        _wait(queue, req.id, wait)


def return_(
    lease: Annotated[int, typer.Argument(help="Lease id (see `stb status`).")],
    config: ConfigOpt = None,
    wait: WaitOpt = 30,
) -> None:
    """Ask the running daemon to return LEASE: out of routing, drained, given back."""
    cfg = load_or_exit(config)
    queue, store = _queue(cfg)
    try:
        state = store.get(lease).state.value
    except LeaseError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=1) from exc
    if state == "returned":
        console.print(f"[red]error:[/red] lease {lease} is already returned")
        raise typer.Exit(code=1)
    req = queue.request_return(lease, datetime.now(UTC), requested_by=getpass.getuser())
    console.print(f"request {req.id}: return lease {lease} (now {state})")
    if wait > 0 and req.id is not None:
        _wait(queue, req.id, wait)
