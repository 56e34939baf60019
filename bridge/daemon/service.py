"""Wiring and running the daemon: builds the adapters, the lease store, routing and the
exporter with its API from a `BridgeConfig`, decides which instance acts, and runs
`Reconciler.run_once` every `tick_s` with APScheduler (one pass at a time; a late pass is
coalesced, never stacked).

Which instance acts: on PostgreSQL, the leader row (`bridge.leases.leader`), beaten on a
thread of its own every third of its TTL; a standby that takes the lease runs its first
active pass at once. On SQLite, an exclusive file lock: one daemon on one host.

At start the bridge's database and the ledger are opened by `open_database`'s rule: a new
database is created at head under the schema lock (so two daemons started together make
it once and both run), an older or newer schema stops the daemon with one line naming
the revisions and `stb db upgrade`.

`stb daemon --advise` runs the advisory pass on the same scheduler, tick thread and
exporter (`bridge.advise.service`): `Daemon` is what both kinds of daemon give them.

The passes run on an executor of their own with one thread, so
they never wait behind a slow ledger ingest and always use the same thread (the Triton
clients are per thread: see `bridge.daemon.clients`). Called by `stb daemon`; `build()`
also serves the operator commands and tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import IO, Protocol

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from fastapi import APIRouter
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from accounting.db import LEDGER
from accounting.db import ensure as ensure_ledger
from accounting.errors import LedgerError
from bridge.audit.trail import AuditError, Trail, daemon
from bridge.config import BridgeConfig
from bridge.daemon.clients import TritonClients
from bridge.daemon.keyshim import KeyShimError, ensure_key_shim
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.daemon.report import Outcome, TickReport
from bridge.daemon.rollouts import RolloutDriver
from bridge.db import SchemaError, redacted
from bridge.http.activator import Activator
from bridge.http.app import create_app
from bridge.http.auth import Principal, TokensError, TokenTable
from bridge.http.routes import finance_routes, operator_routes
from bridge.http.server import HttpServer, tls_context
from bridge.leases import leader
from bridge.leases.audit import AuditStore
from bridge.leases.leader import LeaderLease
from bridge.leases.requests import RequestQueue
from bridge.leases.rollouts import RolloutStore
from bridge.leases.schema import BRIDGE, open_schema
from bridge.leases.store import LeaseStore, make_engine
from bridge.ledger.feed import LedgerFeed
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxControl, NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.slurm.select import open_backend
from bridge.triton.metrics import MetricsPage
from bridge.triton.prometheus import PrometheusSignal

log = logging.getLogger(__name__)

#: a token as the tokens file's re-read tells of it: its digest and who holds it
Tentry = tuple[bytes, Principal]


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why."""


@dataclass
class Bridge:
    config: BridgeConfig
    reconciler: Reconciler
    metrics: BridgeMetrics
    publisher: RoutingPublisher | None
    nginx: NginxProcess | None
    clients: TritonClients
    #: the ledger feed (None when `accounting.ingest_interval_s` is 0)
    ledger: LedgerFeed | None = None
    #: this instance's side of the leader election (None: SQLite, the file lock)
    leader: LeaderLease | None = None
    requests: RequestQueue | None = None
    #: holds the requests of models at zero while their first replica starts (None: no
    #: routing, or an advisory daemon)
    activator: Activator | None = None
    #: not an advisory daemon (`AdvisoryBridge`): it acts while it leads
    advisory = False

    @property
    def loop(self) -> Reconciler:
        """The pass each tick runs."""
        return self.reconciler

    @property
    def active(self) -> bool:
        return self.leader is None or self.leader.active

    @property
    def instance(self) -> str:
        return instance_name(self.config)

    def close(self) -> None:
        self.reconciler.observer.close()
        self.clients.close()
        if self.nginx is not None:
            self.nginx.stop()


class Daemon(Protocol):
    """What the scheduler, the exporter and the API need of a daemon: the acting one
    (`Bridge`) or the advisory one (`bridge.advise.service.AdvisoryBridge`)."""

    config: BridgeConfig
    metrics: BridgeMetrics
    advisory: bool

    @property
    def loop(self) -> Pass: ...

    @property
    def publisher(self) -> RoutingPublisher | None: ...

    @property
    def instance(self) -> str: ...

    def close(self) -> None: ...


class Pass(Protocol):
    """One tick's pass: the reconciler's, or the advisory's."""

    def run_once(self, now: datetime) -> TickReport: ...


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise DaemonError(f"not a host:port: {text!r}")
    return host, int(port)


def instance_name(config: BridgeConfig) -> str:
    return config.daemon.instance or f"{socket.gethostname()}:{os.getpid()}"


def build(
    config: BridgeConfig,
    *,
    with_routing: bool = True,
    slurm_env: Mapping[str, str] | None = None,
    elect: bool = False,
) -> Bridge:
    """Every part of the daemon, wired; `slurm_env` is added to Slurm commands' env. With
    `elect` on PostgreSQL, the instance acts only while it holds the leader row, and its
    writes are fenced by it."""
    key_file = config.triton.key_file
    if not key_file.exists():
        raise DaemonError(f"triton.key_file {key_file} does not exist")
    clients = TritonClients(key_file.read_text().strip())
    try:
        ensure_key_shim(config.triton)
    except KeyShimError as exc:
        raise DaemonError(str(exc)) from exc

    engine = open_database(config.database_url)
    lease = None
    if elect and leader.supported(engine):
        ttl = config.daemon.leader_ttl_s or config.tick_s
        lease = LeaderLease(engine, instance_name(config), ttl)
    fence = lease.fence if lease is not None else None
    store = LeaseStore(engine, fence)
    requests = RequestQueue(engine, fence)
    slurm = open_backend(env=slurm_env)
    metrics = BridgeMetrics(instance=instance_name(config))
    if lease is not None:
        metrics.is_active = lambda: lease.active
    feed = None
    if config.accounting.ingest_interval_s > 0:
        feed = LedgerFeed(config, _open_ledger(config.accounting.ledger_url))
        metrics.registry.register(feed.collector)
    publisher = proc = activator = None
    if with_routing:
        r = config.routing
        if r.managed_nginx_prefix is not None:
            proc = NginxProcess(r.managed_nginx_prefix, routing_conf=r.nginx_conf)
            proc.start()
            control = proc.control
        else:
            control = NginxControl(main_conf=r.nginx_main_conf, pid_file=r.nginx_pid_file)
        settings = nginx.NginxSettings(
            listen=r.listen,
            activator=activator_address(config.daemon.exporter_listen),
            activator_scheme="https" if config.api.tls_cert is not None else "http",
            cold_start_s=r.cold_start_timeout_s,
            batch_log=str(config.batch.access_log.resolve()) if config.batch.enabled else None,
        )
        publisher = RoutingPublisher(
            proc.routing_conf if proc else r.nginx_conf,
            r.http_sd_file,
            control,
            settings=settings,
            bridge_metrics=config.daemon.exporter_listen,
        )
        published = publisher
        activator = Activator(
            lambda: published.table,
            timeout_s=r.cold_start_timeout_s,
            queue=r.activator_queue,
            read_timeout_s=settings.read_timeout_s,
            max_body_bytes=settings.max_body_mb * 1024 * 1024,
        )
    reconciler = Reconciler(
        config,
        slurm,
        store,
        Observer(
            slurm,
            config,
            clients,
            on_page=_leader_only(feed.record_page, lease) if feed else None,
            prometheus=prometheus_source(config),
        ),
        clients,
        publisher,
        metrics,
        requests,
        clients.forget,
        is_active=(lambda: lease.active) if lease is not None else None,
        rollouts=RolloutDriver(config, RolloutStore(engine, fence), clients),
        waiting=activator.demand if activator is not None else None,
    )
    if feed is not None and reconciler.batch is not None:  # batch work's share of serving
        reconciler.batch.attach_ledger(feed.ledger, feed.cluster)
    return Bridge(
        config, reconciler, metrics, publisher, proc, clients, feed, lease, requests, activator
    )


def activator_address(exporter_listen: str) -> str:
    """Where nginx reaches the daemon's HTTP server (the activator): its listen address,
    a wildcard one (every interface) reached on loopback."""
    host, port = _host_port(exporter_listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "[::1]"
    return f"{host}:{port}"


def open_database(url: str) -> Engine:
    """The bridge's database, its schema created if new (under the schema lock: of many
    daemons starting at once one creates it); an older or newer schema is a `DaemonError`
    naming what to run. A daemon never upgrades a schema other hosts may be running on."""
    engine = make_engine(url)
    try:
        change = open_schema(engine)
    except SchemaError as exc:
        engine.dispose()
        raise DaemonError(str(exc)) from exc
    log.info("%s at %s: %s", BRIDGE.what, redacted(url), change.line())
    return engine


def _open_ledger(url: str) -> Engine:
    """The ledger the daemon feeds, by the same rule as `open_database`."""
    engine = make_engine(url)
    try:
        change = ensure_ledger(engine, upgrade=False)
    except SchemaError as exc:
        engine.dispose()
        raise DaemonError(str(exc)) from exc
    log.info("%s at %s: %s", LEDGER.what, redacted(url), change.line())
    return engine


def _leader_only(
    record: Callable[[str, str, float, MetricsPage], None], lease: LeaderLease | None
) -> Callable[[str, str, float, MetricsPage], None]:
    """The ledger's page hook, on the active instance only: a standby writes nothing."""
    if lease is None:
        return record

    def on_page(job_id: str, address: str, at: float, page: MetricsPage) -> None:
        if lease.active:
            record(job_id, address, at, page)

    return on_page


def prometheus_source(config: BridgeConfig) -> PrometheusSignal | None:
    """The Prometheus signal source when `[observe] source = "prometheus"`."""
    o = config.observe
    if o.source != "prometheus":
        return None
    return PrometheusSignal(o.prometheus_url, o.max_staleness_s, o.timeout_s)


def api_routes(bridge: Daemon) -> list[APIRouter]:
    """The operator routes, and finance's report when the daemon feeds a ledger; none
    on an advisory daemon (it takes no request)."""
    if not isinstance(bridge, Bridge):
        return []
    assert bridge.requests is not None
    routes = [
        operator_routes(
            bridge.config,
            bridge.requests,
            bridge.reconciler.store,
            models=bridge.reconciler.observer.models,
        )
    ]
    if bridge.ledger is not None:
        routes.append(finance_routes(bridge.ledger.ledger, bridge.config.accounting.idle_cost))
    if bridge.activator is not None:
        routes.append(bridge.activator.routes())
    return routes


def exporter_for(bridge: Daemon) -> HttpServer:
    """The exporter and API as configured (`[daemon] exporter_listen`, `[api]`)."""
    config = bridge.config
    host, port = _host_port(config.daemon.exporter_listen)
    on_change = None
    if isinstance(bridge, Bridge):
        on_change = token_changes(own_trail(bridge))
    try:
        tokens = TokenTable(config.api.tokens_file, on_change)
    except TokensError as exc:
        raise DaemonError(str(exc)) from exc
    tls = None
    if config.api.tls_cert is not None and config.api.tls_key is not None:
        try:
            tls = tls_context(config.api.tls_cert, config.api.tls_key)
        except (OSError, ValueError) as exc:
            raise DaemonError(f"api.tls_cert/tls_key: {exc}") from exc
    sd = bridge.publisher.document if bridge.publisher else None
    app = create_app(
        bridge.metrics, config.tick_s, tokens=tokens, sd_document=sd, routers=api_routes(bridge)
    )
    try:
        return HttpServer(app, (host, port), tls=tls)
    except OSError as exc:
        raise DaemonError(f"daemon.exporter_listen {host}:{port}: {exc.strerror}") from exc


def own_trail(bridge: Bridge) -> Trail:
    """The audit trail as this instance records its own facts (unfenced: a standby's
    configuration is its own)."""
    return Trail(AuditStore.beside(bridge.reconciler.store, fenced=False), daemon())


def record_config(trail: Trail, config: BridgeConfig) -> None:
    """Record the configuration this daemon loaded: the SHA-256 of its effective values
    (the file with the environment's overrides), and whether it changed since the last
    load recorded; `DaemonError` if the trail cannot be written (the daemon does not
    start unrecorded)."""
    digest = hashlib.sha256(config.model_dump_json().encode()).hexdigest()
    try:
        last = trail.store.find(action="config.load", limit=1)
        since = (
            "first load recorded"
            if not last
            else f"unchanged since entry {last[0].seq}"
            if digest in last[0].detail
            else f"changed since entry {last[0].seq}"
        )
        trail.record("config.load", "configuration", "ok", f"sha256 {digest}: {since}")
    except (AuditError, SQLAlchemyError) as exc:
        raise DaemonError(f"the audit trail cannot be written: {exc}") from exc


def token_changes(trail: Trail) -> Callable[[list[Tentry], list[Tentry]], None]:
    """What the daemon records when the tokens file changes: each token gone as revoked,
    each new one as issued unless `stb token` recorded its issue (by its fingerprint).
    Every instance notices the change; each fingerprint is recorded once. A failure is
    logged as an error (the API goes on with the file's tokens)."""

    def changed(added: list[Tentry], removed: list[Tentry]) -> None:
        try:
            done = {
                (e.action, e.detail.rsplit("fingerprint ", 1)[-1][:12])
                for e in trail.store.find(action="token")
            }
            for action, entries in (("token.issue", added), ("token.revoke", removed)):
                for digest, who in entries:
                    fp = digest.hex()[:12]
                    if (action, fp) not in done:
                        why = "found in" if action == "token.issue" else "gone from"
                        roles = ",".join(sorted(who.roles))
                        detail = f"{why} the tokens file, roles {roles}, fingerprint {fp}"
                        trail.record(action, f"token {who.name}", "ok", detail)
        except (AuditError, SQLAlchemyError) as exc:
            log.error("the tokens file changed and the audit trail could not record it: %s", exc)

    return changed


def tick_once(bridge: Daemon) -> TickReport | None:
    """One pass as the scheduler runs it: the report's lines logged; an exception (a bug,
    since adapter errors come back as data) counted as a failed tick with its traceback."""
    try:
        report = bridge.loop.run_once(datetime.now(UTC))
    except Exception as exc:  # the loop never dies; the failure is counted and logged
        bridge.metrics.record_exception(exc)
        log.exception("tick failed")
        return None
    for line in report.events:
        log.info("%s", line)
    if report.outcome != Outcome.OK:
        log.warning("tick %s: %d error(s)", report.outcome.value, len(report.errors))
    return report


def scheduler_for(
    bridge: Daemon, scheduler_cls: type[BaseScheduler] = BlockingScheduler
) -> BaseScheduler:
    """The daemon's scheduler with its tick job: one pass at a time on the `tick`
    executor's single thread, late passes coalesced; other jobs go to `ledger`."""
    scheduler = scheduler_cls(
        timezone=UTC,
        executors={
            "default": ThreadPoolExecutor(1),
            "tick": ThreadPoolExecutor(1),
            "ledger": ThreadPoolExecutor(1),
            "leader": ThreadPoolExecutor(1),
        },
    )
    scheduler.add_job(
        tick_once,
        "interval",
        args=(bridge,),
        seconds=bridge.config.tick_s,
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
        id="tick",
        executor="tick",
    )
    return scheduler


@contextmanager
def single_instance(path: os.PathLike[str]) -> Iterator[IO[str]]:
    """Hold an exclusive flock on `path` for the daemon's life (kopf's peering, simply)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise DaemonError(f"another bridge daemon holds {path}") from exc
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield handle
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def run_daemon(config: BridgeConfig) -> None:
    """Run until SIGTERM or SIGINT: on PostgreSQL as one of several instances (the
    leader acts), on SQLite as the only one (`stb daemon --advise` runs
    `bridge.advise.service.run_advisory` instead)."""
    elect = leader.supported(make_engine(config.database_url))
    with nullcontext() if elect else single_instance(config.daemon.lock_file):
        bridge = build(config, elect=elect)
        record_config(own_trail(bridge), config)
        exporter = exporter_for(bridge).start()
        scheduler = scheduler_for(bridge)
        election = bridge.leader
        if election is not None:
            _beat(bridge, scheduler)
            if not election.active:
                held = leader.current(election.engine)
                log.info(
                    "%s is standing by: %s leads",
                    bridge.instance,
                    f"{held.holder} (epoch {held.epoch})" if held else "nobody yet",
                )
            scheduler.add_job(
                _beat,
                "interval",
                args=(bridge, scheduler),
                seconds=election.beat_s,
                max_instances=1,
                coalesce=True,
                id="leader",
                executor="leader",
            )

        feed = bridge.ledger
        if feed is not None:

            def ingest() -> None:
                if not bridge.active:  # the ledger is written by the leader only
                    return
                rec = bridge.reconciler
                try:
                    summary = feed.ingest(rec.slurm, rec.store, datetime.now(UTC))
                except LedgerError as exc:  # refused as it stands (its words say why)
                    bridge.metrics.ledger_ingests.labels("error").inc()
                    log.error("ledger ingest failed: %s", exc)
                    return
                except Exception as exc:  # a failed ingest is retried at the next interval
                    bridge.metrics.ledger_ingests.labels("error").inc()
                    log.exception("ledger ingest failed: %s", exc)
                    return
                bridge.metrics.ledger_ingests.labels("ok").inc()
                log.info("ledger ingest: %s", summary.line())

            scheduler.add_job(
                ingest,
                "interval",
                executor="ledger",
                seconds=config.accounting.ingest_interval_s,
                max_instances=1,
                coalesce=True,
                next_run_time=datetime.now(UTC),
                id="ledger-ingest",
            )

        log.info(
            "bridge daemon %s: tick %ss, %s on %s",
            bridge.instance,
            config.tick_s,
            "API and metrics",
            exporter.url,
        )

        def closing() -> None:
            if election is not None:
                election.release()
            bridge.close()

        serve(scheduler, exporter, closing)


def serve(scheduler: BaseScheduler, exporter: HttpServer, closing: Callable[[], None]) -> None:
    """Run the scheduler until SIGTERM or SIGINT, then stop the exporter and close."""

    def stop(signum: int, frame: FrameType | None) -> None:
        if scheduler.running:  # a second signal while shutting down changes nothing
            scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        scheduler.start()
    finally:
        exporter.stop()
        closing()


def _beat(bridge: Bridge, scheduler: BaseScheduler) -> None:
    """One beat of the election; a standby that just took over ticks at once."""
    election = bridge.leader
    assert election is not None
    was = election.epoch is not None
    now_active = election.beat()
    bridge.metrics.record_epoch(election.epoch)
    if now_active and not was:
        log.info("%s is now the active bridge (epoch %s)", bridge.instance, election.epoch)
        if scheduler.running:
            scheduler.modify_job("tick", next_run_time=datetime.now(UTC))
    elif was and not now_active:
        log.warning("%s is standing by (%s)", bridge.instance, election.last_error or "deposed")
    elif not now_active and election.last_error:
        log.warning("leader election: %s", election.last_error)
