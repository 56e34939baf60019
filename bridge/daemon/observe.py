"""The observe step: one immutable `Observation` per tick of what Slurm and Triton say now.

Called by the reconciler once per tick (and by lab tools that want the same view). It reads
the Slurm adapter (nodes, active jobs, reservations: one batched query each), asks every
running Triton job's server whether it is ready and which models it holds, scrapes its
metrics and folds them into each model's latency history (the last N samples the policy's
consecutive counts need). The planner, the policy and routing all read this one value;
nothing reads the adapters' answers any other way.

Failures to reach one Triton server make that replica "not ready" and its models' sample
"no data"; they never raise. A metrics page refused by the client (over its size limit) or
by the parser (a bad line) gives no data from that replica for the tick, never a calm
reading: a model's sample holds only what its other replicas gave ("no data" when that
replica is its only one). The replica stays as ready as it said. A Slurm error does raise:
without a fresh view of Slurm the tick must not act (the reconciler reports it as a failed
tick).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from bridge.config import BridgeConfig
from bridge.daemon.observation import RESERVATION_PREFIX, Observation, TritonServer
from bridge.policy import history_depth
from bridge.policy.snapshot import ModelSample
from bridge.slurm.model import TRITON_TAG, Job, Node
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.client import HTTP_PORT
from bridge.triton.errors import TritonError
from bridge.triton.metrics import MetricsPage, parse_page
from bridge.triton.protocol import TritonInstance
from bridge.triton.signal import Observation as Scrape
from bridge.triton.signal import instance_signal, model_signals

log = logging.getLogger(__name__)

#: Slurm job states the bridge reads each tick (finished jobs are gone from its view)
ACTIVE_STATES = ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING")


class Observer:
    """Builds observations; keeps per-instance previous scrapes and per-model history."""

    def __init__(
        self,
        slurm: SlurmProtocol,
        config: BridgeConfig,
        triton_for: Callable[[str], TritonInstance],
        clock: Callable[[], float] = time.monotonic,
        on_page: Callable[[str, str, float, MetricsPage], None] | None = None,
    ) -> None:
        self._slurm = slurm
        #: called with (job id, address, wall time, page) for each scraped instance: the
        #: ledger keeps the per-model compute counters
        self._on_page = on_page
        self._config = config
        self._triton_for = triton_for
        self._clock = clock
        depth = history_depth(config)
        self._history: dict[str, deque[ModelSample]] = {
            m: deque(maxlen=depth) for m in config.models
        }
        self._previous: dict[str, Scrape] = {}

    def latest(self, model: str) -> ModelSample | None:
        """The model's most recent sample (None before the first tick)."""
        history = self._history.get(model)
        return history[-1] if history else None

    def _server(self, job: Job, node: Node, now: float) -> tuple[TritonServer, Scrape | None]:
        """Ask one Triton job's server; its scrape when it is ready and answered."""
        address = f"{node.addr}:{HTTP_PORT}"
        ready = False
        models: tuple[str, ...] = ()
        unavailable: dict[str, str] = {}
        pending: dict[str, float] = {}
        scrape = None
        try:
            client = self._triton_for(address)
            ready = client.is_ready()
            if ready:
                index = client.repository_index()
                models = tuple(sorted(m.name for m in index if m.state == "READY"))
                unavailable = {m.name: m.reason for m in index if m.state == "UNAVAILABLE"}
                page = parse_page(client.metrics_text())
                for sample in page.models.values():
                    pending[sample.model] = pending.get(sample.model, 0.0) + (
                        sample.pending_requests or 0.0
                    )
                if self._on_page is not None:
                    self._on_page(job.job_id, address, now, page)
                scrape = Scrape(address, self._clock(), page, incarnation=job.job_id)
        except TritonError as exc:
            log.info("Triton of job %s at %s: %s", job.job_id, address, exc)
        return TritonServer(job, node.name, address, ready, models, pending, unavailable), scrape

    def observe(self, now: float) -> Observation:
        """Read Slurm and every running Triton server; raises the Slurm adapter's errors."""
        nodes = {n.name: n for n in self._slurm.nodes()}
        jobs = tuple(self._slurm.jobs(states=ACTIVE_STATES))
        all_reservations = self._slurm.reservations()
        reservations = frozenset(r.name for r in all_reservations)
        site = tuple(r for r in all_reservations if not r.name.startswith(RESERVATION_PREFIX))
        servers = []
        signals = []
        for job in jobs:
            if TRITON_TAG not in job.tags or job.state != "RUNNING" or len(job.nodes) != 1:
                continue
            node = nodes.get(job.nodes[0])
            if node is None:
                continue
            server, scrape = self._server(job, node, now)
            servers.append(server)
            if scrape is not None:
                signals.append(instance_signal(self._previous.get(server.address), scrape))
                self._previous[server.address] = scrape
        live = {s.address for s in servers}
        for gone in set(self._previous) - live:
            del self._previous[gone]
        per_model = model_signals(signals)
        for model, history in self._history.items():
            sig = per_model.get(model)
            history.append(
                ModelSample(
                    now,
                    sig.p99_ms if sig else None,
                    sig.request_rate if sig else None,
                    sig.pending if sig else None,
                    sig.mean_latency_ms if sig else None,
                    sig.mean_compute_ms if sig else None,
                )
            )
        return Observation(
            now,
            nodes,
            jobs,
            reservations,
            tuple(servers),
            {m: tuple(h) for m, h in self._history.items()},
            site,
        )
