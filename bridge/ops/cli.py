"""`stb daemon` and `stb status`: run the bridge (`--advise`: the advisory mode, which
acts on nothing), and show what it holds.

`status` reads the lease store, asks Slurm for the pools, and reads the running daemon's
own view (each model's p99, each lease's retries, its last pass's outcome) from its
exporter; each open lease says whether it is stuck past its state's deadline, and the
leases that failed in the last day are listed with the reason; each model shows its
effective SLO and bounds and where each came from (its config.pbtxt in the repository,
the TOML's override, a default), or why it is not scaled; the weight cache shows per
model version the nodes holding a complete copy and the staging jobs in flight
(`bridge.weights.view`). `--json` prints the same as one document.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from bridge.audit.asks import ask_lend, ask_place, ask_return, hold_pool, release_pool
from bridge.audit.trail import AuditError, Trail, fingerprint, open_trail, operator
from bridge.cli_text import fail, say
from bridge.config import BridgeConfig, pool_of
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.daemon.actuator import record_of
from bridge.daemon.planner import Settings, is_stuck
from bridge.http.auth import TokensError, add_token
from bridge.leases import leader
from bridge.leases.audit import AuditStore
from bridge.leases.errors import LeaseError
from bridge.leases.fleet import FleetStore
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.leases.weights import WeightStore
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import Job
from bridge.slurm.select import open_backend
from bridge.triton.catalog import site_models
from bridge.weights.view import cache_view, print_table, read_jobs

console = Console()


AdviseOpt = Annotated[
    bool,
    typer.Option(
        "--advise",
        help="Advisory mode: observe and decide as the daemon would, record each decision "
        "it would take (`stb advise report`), and act on nothing (no Slurm or Triton "
        "write, no lease, no routing).",
    ),
]


def daemon(config: ConfigOpt = None, advise: AdviseOpt = False) -> None:
    """Run the bridge: observe, decide, act every tick, until SIGTERM (with --advise:
    observe, decide and record, never act)."""
    # imported here: the daemon's modules (the web server, the scheduler, the ledger's
    # feed) are most of what `stb` would import, and the other commands need none of them
    from bridge.advise.service import run_advisory
    from bridge.daemon.service import DaemonError, run_daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        cfg = load_or_exit(config)
        if advise:
            run_advisory(cfg)
        else:
            run_daemon(cfg)
    except DaemonError as exc:
        raise fail(exc) from exc


@dataclass
class DaemonView:
    """What the running daemon's exporter says (None fields: not reachable)."""

    p99_ms: dict[str, float] = field(default_factory=dict)
    retries: dict[int, int] = field(default_factory=dict)
    health: dict[str, Any] | None = None


def _daemon_view(exporter: str, tls: bool = False) -> DaemonView | None:
    # /metrics and /healthz are the open paths: no token is sent, so an HTTPS exporter's
    # certificate (often issued for a name, not the listen address) is not checked here
    base = f"{'https' if tls else 'http'}://{exporter}"
    try:
        text = httpx.get(f"{base}/metrics", timeout=2, verify=not tls).text
        health = httpx.get(f"{base}/healthz", timeout=2, verify=not tls).json()
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
    daemon = _daemon_view(cfg.daemon.exporter_listen, cfg.api.tls_cert is not None)
    settings = Settings.of(cfg)
    open_rows = store.open_leases()
    leases = [
        {
            "id": lease.id,
            "node": lease.node,
            **({"members": lease.members} if lease.members else {}),
            # a lease of some of its node's GPUs (of a type: MIG slices); absent: whole
            **({"gpus": lease.gpus} if lease.gpus is not None else {}),
            **({"gpu_type": lease.gpu_type} if lease.gpu_type else {}),
            # a node several leases share: this one's port slot (`bridge.triton.ports`)
            **({"slot": lease.slot} if lease.slot else {}),
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
        for lease in open_rows
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
    jobs: list[Job] | None = None
    jobs_note = ""
    try:
        lent = {n for lease in open_rows for n in (lease.node, *(lease.members or ()))}
        slurm = open_backend()
        for node in slurm.nodes():
            pool = pool_of(node, cfg)
            if pool:
                pools[pool]["nodes"].append(f"{node.name}:{node.state}")
                if node.name in lent:
                    pools[pool]["lent"].append(node.name)
        jobs, jobs_note = read_jobs(slurm)
    except SlurmError as exc:
        error = str(exc)
        jobs_note = "Slurm does not answer: staging jobs unknown"
    weights = cache_view(WeightStore(engine).copies(), jobs, jobs_note)
    facts = site_models(cfg)
    models = {
        name: {
            "scaled": f.model is not None,
            # None: no request SLO (a model scaled by its token SLOs alone)
            "slo_p99_ms": f.model.slo_p99_ms if f.model and f.model.has_request_slo else None,
            "slo_ttft_p99_ms": f.model.slo_ttft_p99_ms if f.model else None,
            "slo_tpot_p99_ms": f.model.slo_tpot_p99_ms if f.model else None,
            "p99_ms": daemon.p99_ms.get(name) if daemon else None,
            "replicas": [f.model.min_replicas, f.model.max_replicas] if f.model else None,
            "instances": f.model.instances if f.model else None,
            # where each value came from: "repository" (config.pbtxt), "toml", "default"
            "sources": dict(f.sources),
            "why": f.why,
            "notes": [*f.problems, *f.warnings, *f.overrides],
        }
        for name, f in facts.facts.items()
    }
    holder = leader.current(engine)
    holds = RequestQueue(engine).holds()
    switch = FleetStore(engine).current()
    return {
        "at": now.isoformat(),
        "fleet": {"mode": "shared", "since": None, "max_lent_nodes": None, "who": ""}
        if switch is None
        else {
            "mode": switch.mode,
            "since": switch.at.isoformat(),
            "max_lent_nodes": switch.max_lent_nodes,
            "who": switch.who,
        },
        "leader": None
        if holder is None
        else {
            "instance": holder.holder,
            "epoch": holder.epoch,
            "expires_in_s": round(holder.expires_in_s, 1),
            "since": holder.acquired_at.isoformat(),
        },
        "holds": {
            pool: {"by": h.held_by, "since": h.held_at.isoformat(), "reason": h.reason}
            for pool, h in holds.items()
        },
        "pools": pools,
        "leases": leases,
        "failed": failed,
        "models": models,
        "weights": weights.to_json(),
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
            *map(escape, (name, p["partition"], p["mode"], " ".join(p["nodes"]))),
            escape(" ".join(p["lent"])) or "-",
        )
    console.print(pools)
    fleet = doc["fleet"]
    if fleet["since"] is not None:  # (a bridge never switched says nothing: shared)
        cap = fleet["max_lent_nodes"]
        step = "" if cap is None else f", at most {cap} nodes lent"
        say(console, f"fleet mode {fleet['mode']}{step} since {fleet['since']} (stb fleet)")
    lead = doc["leader"]
    if lead is not None:
        alive = lead["expires_in_s"] > 0
        who = escape(str(lead["instance"]))
        console.print(
            f"active bridge: {who} (epoch {lead['epoch']}, since {lead['since']})"
            if alive
            else f"[red]no active bridge: {who}'s lease ran out "
            f"{-lead['expires_in_s']:.0f}s ago[/red]"
        )
    health = doc["daemon_health"]
    if health is not None and "role" in health:
        say(console, f"this host's daemon ({health['instance']}): {health['role']}")
    for pool, hold in doc["holds"].items():
        console.print(
            escape(
                f"pool {pool} held by {hold['by']} since {hold['since']}"
                + (f": {hold['reason']}" if hold["reason"] else "")
            ),
            style="yellow",
            soft_wrap=True,
        )
    leases = Table(title="open leases")
    for col in ("id", "node", "pool", "state", "models", "job", "age", "in state", "reason"):
        leases.add_column(col)
    for lease in doc["leases"]:
        state = escape(lease["state"])
        if lease["stuck"]:
            state = f"[red]{state} (stuck)[/red]"
        if lease["retries"]:
            state += f" ({lease['retries']} retries)"
        held = ""  # a lease of some of its node's GPUs says how many, of which type
        if "gpus" in lease:
            held = f" ({lease['gpus']} x {lease.get('gpu_type', 'GPU')})"
        if lease.get("slot"):
            held += f" slot {lease['slot']}"
        leases.add_row(
            str(lease["id"]),
            escape(",".join((lease["node"], *lease.get("members", ()))) + held),
            escape(lease["pool"]),
            state,
            escape(",".join(lease["models"])),
            escape(lease["job"] or "-"),
            f"{lease['age_s']}s",
            f"{lease['in_state_s']}s",
            escape(lease["reason"]),
        )
    console.print(leases)
    if doc["failed"]:
        failures = Table(title="leases failed in the last 24 h")
        for col in ("id", "node", "pool", "at", "from", "now", "reason"):
            failures.add_column(col)
        for f in doc["failed"]:
            failures.add_row(
                str(f["id"]),
                *map(escape, (f["node"], f["pool"], f["at"], f["from"] or "-", f["state"])),
                escape(f["reason"]),
            )
        console.print(failures)
    if health is not None and health.get("last_outcome") not in (None, "ok"):
        console.print(
            f"[yellow]daemon's last pass: {escape(str(health['last_outcome']))}[/yellow]",
            soft_wrap=True,
        )
        for line in health.get("last_errors", []):
            say(console, f"  {line}")
    models = Table(
        title="models" + ("" if doc["daemon_reachable"] else " (daemon not reachable: no p99)")
    )
    for col in ("model", "p99 ms", "SLO ms", "replicas min-max", "from"):
        models.add_column(col)
    notes: list[str] = []
    for name, m in doc["models"].items():
        p99 = m["p99_ms"]
        notes += m["notes"]
        if not m["scaled"]:
            shown = "-" if p99 is None else f"{p99:.0f}"
            models.add_row(escape(name), shown, "-", "-", f"[yellow]{escape(m['why'])}[/yellow]")
            continue
        shown = (
            "-"
            if p99 is None
            else (
                f"[red]{p99:.0f}[/red]"
                if m["slo_p99_ms"] is not None and p99 > m["slo_p99_ms"]
                else f"{p99:.0f}"
            )
        )
        models.add_row(
            escape(name),
            shown,
            _slos(m),
            f"{m['replicas'][0]}-{m['replicas'][1]}",
            escape(_sources(m["sources"])),
        )
    console.print(models)
    for note in notes:
        say(console, f"  {note}")
    print_table(doc["weights"], console)
    if doc["slurm_error"]:
        console.print(f"[yellow]Slurm: {escape(doc['slurm_error'])}[/yellow]", soft_wrap=True)


def _slos(m: dict[str, Any]) -> str:
    """A model's objectives in the table: its request p99, then an LLM's TTFT and TPOT."""
    parts = [] if m["slo_p99_ms"] is None else [f"{m['slo_p99_ms']:g}"]
    for label, key in (("TTFT", "slo_ttft_p99_ms"), ("TPOT", "slo_tpot_p99_ms")):
        if m.get(key) is not None:
            parts.append(f"{label} {m[key]:g}")
    return ", ".join(parts) or "-"


def _sources(sources: dict[str, str]) -> str:
    """Where a model's values came from, shortest first: `repository`, or each field
    that came from elsewhere (`slo_p99_ms: toml`)."""
    other = {k: v for k, v in sources.items() if v != "repository"}
    if not other:
        return "repository"
    return ", ".join(f"{k}: {v}" for k, v in other.items())


def _queue(cfg: BridgeConfig) -> tuple[RequestQueue, LeaseStore]:
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    return RequestQueue(engine), LeaseStore(engine)


WaitOpt = Annotated[float, typer.Option(help="Seconds to wait for the daemon (0: don't).")]
ApiOpt = Annotated[
    str,
    typer.Option(
        "--api",
        envvar="STB_API",
        help="The daemon's API (https://host:9108): send the request there, with a token, "
        "instead of writing the bridge's database.",
    ),
]
TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file", envvar="STB_TOKEN_FILE", help="File holding your API token (--api)."
    ),
]
CaOpt = Annotated[
    Path | None,
    typer.Option("--ca", envvar="STB_CA", help="CA bundle that signed the API's certificate."),
]


@dataclass
class Channel:
    """Where an operator's request goes: the bridge's database (each request or hold
    written with its audit trail entry, as this command's user), or its HTTP API (which
    records it under the token's name)."""

    cfg: BridgeConfig
    api: str = ""
    token_file: Path | None = None
    ca: Path | None = None

    @cached_property
    def _db(self) -> tuple[RequestQueue, LeaseStore]:
        """The bridge's database, opened once (`stb lend` polls it while it waits)."""
        return _queue(self.cfg)

    @cached_property
    def _trail(self) -> Trail:
        """The audit trail in the bridge's database, written as this command's user: each
        request or hold and its entry commit together (`bridge.audit.trail`)."""
        queue, _ = self._db
        return Trail(AuditStore.beside(queue), operator())

    @cached_property
    def _client(self) -> httpx.Client:
        """The API client, made once: `stb lend` polls the request while it waits."""
        if self.token_file is None:
            _fail("--api needs --token-file (or STB_TOKEN_FILE)")
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            _fail(f"cannot read the token file {self.token_file}: {exc.strerror}")
        verify: str | bool = str(self.ca) if self.ca is not None else True
        return httpx.Client(
            base_url=self.api.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            verify=verify,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            reply = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            _fail(f"the API at {self.api} did not answer: {exc}")
        try:
            doc = reply.json()
        except ValueError:
            doc = {"error": reply.text[:200]}
        if reply.status_code >= 400:
            _fail(f"{reply.status_code}: {doc.get('error', doc)}")
        return dict(doc)

    def lend(self, node: str, models: list[str]) -> int:
        if self.api:
            doc = self.call("POST", "/api/lend", json={"node": node, "models": models})
            return int(doc["request"])
        queue, _ = self._db
        with _recorded("lend"):
            req = ask_lend(queue, node, models, trail=self._trail)
        assert req.id is not None
        return req.id

    def return_(self, lease: int) -> int:
        if self.api:
            return int(self.call("POST", "/api/return", json={"lease": lease})["request"])
        queue, _ = self._db
        if self._state_of(lease) == "returned":
            _fail(f"lease {lease} is already returned")
        with _recorded("return"):
            req = ask_return(queue, lease, trail=self._trail)
        assert req.id is not None
        return req.id

    def place(self, lease: int, models: list[str]) -> int:
        """Queue a placement of serving lease `lease` (`stb place`)."""
        if self.api:
            _fail("stb place writes the bridge's database: it has no --api path yet")
        queue, _ = self._db
        state = self._state_of(lease)
        if state != "serving":
            _fail(f"lease {lease} is {state}, not serving: only a serving lease is placed")
        with _recorded("placement"):
            req = ask_place(queue, lease, models, trail=self._trail)
        assert req.id is not None
        return req.id

    def _state_of(self, lease: int) -> str:
        """The stored lease's state; exit naming the store's error (no such lease)."""
        _, store = self._db
        try:
            return store.get(lease).state.value
        except LeaseError as exc:
            _fail(str(exc))

    def outcome(self, request_id: int) -> str | None:
        if self.api:
            doc = self.call("GET", "/api/request", params={"id": request_id})
            return str(doc["outcome"]) if doc["done"] else None
        queue, _ = self._db
        req = queue.get(request_id)
        return req.outcome if req is not None and req.done_at is not None else None

    def hold(self, pool: str, reason: str, on: bool) -> str:
        if self.api:
            path = "/api/drain" if on else "/api/resume"
            body = {"pool": pool, "reason": reason} if on else {"pool": pool}
            doc = self.call("POST", path, json=body)
            return f"pool {doc['pool']} " + ("held" if on else "resumed")
        if pool not in self.cfg.pools:
            _fail(f"no pool {pool!r}; configured: {', '.join(self.cfg.pools)}")
        queue, _ = self._db
        with _recorded("hold" if on else "resume"):
            if on:
                hold = hold_pool(queue, pool, reason, trail=self._trail)
                return f"pool {pool} held by {hold.held_by} since {hold.held_at:%Y-%m-%d %H:%M:%S}"
            if release_pool(queue, pool, trail=self._trail) is None:
                _fail(f"pool {pool} is not held")
        return f"pool {pool} resumed"


def _fail(message: str) -> NoReturn:
    raise fail(message)


@contextmanager
def _recorded(what: str) -> Iterator[None]:
    """An operator's write and its audit entry, as one: if either cannot be written,
    neither is, and the command says so."""
    try:
        yield
    except (AuditError, SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(f"the {what} was not asked: the bridge's database (and audit trail): {first}")


def _wait(channel: Channel, request_id: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = channel.outcome(request_id)
        if outcome is not None:
            bad = outcome.startswith(("refused", "failed"))
            console.print(escape(outcome), style="red" if bad else "green", soft_wrap=True)
            if bad:
                raise typer.Exit(code=1)
            return
        time.sleep(0.5)
    console.print(
        f"[yellow]request {request_id} not taken within {timeout_s:g}s: is the "
        "daemon running?[/yellow]"
    )
    raise typer.Exit(code=2)


def lend(
    node: Annotated[str, typer.Argument(help="Slurm node to lend to Triton.")],
    models: Annotated[
        str,
        typer.Option(
            help="Models to place, comma-separated (default: every model the repository has)."
        ),
    ] = "",
    config: ConfigOpt = None,
    wait: WaitOpt = 30,
    api: ApiOpt = "",
    token_file: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Ask the running daemon to lend NODE (through the lease state machine)."""
    cfg = load_or_exit(config)
    names = [m for m in models.split(",") if m]
    known = site_models(cfg).names
    unknown = sorted(set(names) - set(known))
    if unknown:
        _fail(f"unknown models {', '.join(unknown)}; known: {', '.join(known)}")
    channel = Channel(cfg, api, token_file, ca)
    request_id = channel.lend(node, names)
    say(console, f"request {request_id}: lend {node}")
    if wait > 0:
        _wait(channel, request_id, wait)


def return_(
    lease: Annotated[int, typer.Argument(help="Lease id (see `stb status`).")],
    config: ConfigOpt = None,
    wait: WaitOpt = 30,
    api: ApiOpt = "",
    token_file: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Ask the running daemon to return LEASE: out of routing, drained, given back."""
    channel = Channel(load_or_exit(config), api, token_file, ca)
    request_id = channel.return_(lease)
    console.print(f"request {request_id}: return lease {lease}")
    if wait > 0:
        _wait(channel, request_id, wait)


def drain(
    pool: Annotated[str, typer.Argument(help="Pool to hold (see `stb status`).")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    config: ConfigOpt = None,
    api: ApiOpt = "",
    token_file: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Hold POOL: the daemon lends none of its nodes and returns its leases, until
    `stb resume POOL`."""
    say(console, Channel(load_or_exit(config), api, token_file, ca).hold(pool, reason, True))


def resume(
    pool: Annotated[str, typer.Argument(help="Held pool to open again.")],
    config: ConfigOpt = None,
    api: ApiOpt = "",
    token_file: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Lift the hold `stb drain POOL` put on POOL."""
    say(console, Channel(load_or_exit(config), api, token_file, ca).hold(pool, "", False))


def token(
    name: Annotated[str, typer.Argument(help="Who the token is for (recorded with requests).")],
    roles: Annotated[str, typer.Option(help="Comma-separated roles: finance, operator, metrics.")],
    tokens_file: Annotated[
        Path | None, typer.Option("--file", help="Tokens file (default: \\[api] tokens_file).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Add a new API token for NAME to the tokens file and print it (once: the file keeps
    it, nothing else does; the audit trail records its issue by fingerprint)."""
    cfg = load_or_exit(config)
    path = tokens_file or cfg.api.tokens_file
    if path is None:
        _fail("no tokens file: pass --file or set [api] tokens_file")
    wanted = {r for r in roles.split(",") if r}
    try:
        with open_trail(cfg).audited("token.issue", f"token {name}", (TokensError,)) as note:
            issued = add_token(path, name, wanted)
            note.detail = f"roles {','.join(sorted(wanted))}, fingerprint {fingerprint(issued)}"
    except (TokensError, OSError, AuditError, SQLAlchemyError) as exc:
        _fail(str(exc))
    print(issued)
