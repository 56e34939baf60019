"""Wiring and running advisory mode (`stb daemon --advise`): the advisory pass
(`bridge.advise.advisory.Advisor`) on the daemon's own scheduler, tick thread and exporter
(`bridge.daemon.service`), never acting: it takes no part in the election and holds its
own lock file (`<lock_file>.advise`), so an active daemon may run beside it; it starts no
nginx, publishes no routing, feeds no ledger, serves no operator API, starts no Triton
server (its Triton key reads each server's model list, nothing else), and `/healthz` says
`"role": "advisory"`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bridge.advise.advisory import Advisor
from bridge.config import BridgeConfig
from bridge.daemon.clients import TritonClients
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observe import Observer
from bridge.daemon.service import (
    DaemonError,
    exporter_for,
    instance_name,
    open_database,
    prometheus_source,
    scheduler_for,
    serve,
    single_instance,
)
from bridge.db import redacted
from bridge.leases.advice import AdviceStore
from bridge.leases.requests import RequestQueue
from bridge.slurm.select import open_backend

log = logging.getLogger(__name__)


@dataclass
class AdvisoryBridge:
    """The parts of an advisory daemon (`build_advisory`): its pass, metrics and Triton
    clients; none that acts (no routing, nginx, ledger, election or request queue)."""

    config: BridgeConfig
    advisor: Advisor
    metrics: BridgeMetrics
    clients: TritonClients
    publisher: None = None
    ledger: None = None
    leader: None = None
    advisory = True
    active = False

    @property
    def loop(self) -> Advisor:
        """The pass each tick runs."""
        return self.advisor

    @property
    def instance(self) -> str:
        return instance_name(self.config)

    def close(self) -> None:
        self.advisor.observer.close()
        self.clients.close()


def build_advisory(
    config: BridgeConfig, *, slurm_env: Mapping[str, str] | None = None
) -> AdvisoryBridge:
    """The advisory daemon's parts: the same Slurm adapter and observer as `build`'s, the
    advisory pass over them, the exporter's metrics; no routing, no ledger, no election,
    no operator requests (their pool holds are read). It holds the Triton key as the
    daemon does, since Triton lists a server's models only behind it (the repository
    index), and calls no other keyed API; it needs no key shim (it starts no server)."""
    key_file = config.triton.key_file
    if not key_file.exists():
        raise DaemonError(f"triton.key_file {key_file} does not exist")
    clients = TritonClients(key_file.read_text().strip())
    engine = open_database(config.database_url)
    requests = RequestQueue(engine)
    slurm = open_backend(env=slurm_env)
    metrics = BridgeMetrics(instance=instance_name(config), advisory=True)
    observer = Observer(slurm, config, clients, prometheus=prometheus_source(config))
    advisor = Advisor(config, observer, AdviceStore(engine), metrics, holds=requests.holds)
    return AdvisoryBridge(config, advisor, metrics, clients)


def advisory_lock(config: BridgeConfig) -> Path:
    """The advisory daemon's own lock file: one advisory per host and lock, beside (never
    instead of) the active daemon's."""
    lock = config.daemon.lock_file
    return lock.with_name(lock.name + ".advise")


def run_advisory(config: BridgeConfig) -> None:
    """`stb daemon --advise` until SIGTERM or SIGINT: the advisory pass on the daemon's
    scheduler and exporter, under its own lock file (`advisory_lock`)."""
    with single_instance(advisory_lock(config)):
        bridge = build_advisory(config)
        exporter = exporter_for(bridge).start()
        scheduler = scheduler_for(bridge)
        log.warning(
            "bridge daemon %s: ADVISORY mode, acts on nothing: it observes and decides every "
            "%ss and records what it would do in the advice tables of %s (no Slurm or Triton "
            "write, no lease, no routing, no operator request); metrics and /healthz (role "
            "advisory) on %s",
            bridge.instance,
            config.tick_s,
            redacted(config.database_url),
            exporter.url,
        )
        serve(scheduler, exporter, bridge.close)
