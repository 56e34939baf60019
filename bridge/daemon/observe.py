"""The observe step: one immutable `Snapshot` from what Slurm and Triton say now.

Called by the reconciler once per tick. It reads the Slurm adapter (nodes and jobs, one
batched query each), asks every running Triton job's server whether it is ready and which
models it holds, scrapes their metrics and folds them into each model's latency history
(the last N samples the policy's consecutive counts need). Failures to reach one Triton
server make that replica absent and its models' sample "no data"; they never raise.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bridge.config import BridgeConfig
from bridge.policy.snapshot import (
    JobView,
    LeaseView,
    ModelSample,
    NodeView,
    ReplicaView,
    Snapshot,
)
from bridge.slurm.model import Job, Node
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.errors import TritonError
from bridge.triton.metrics import MetricsPage, parse_page
from bridge.triton.protocol import TritonInstance
from bridge.triton.signal import Observation, instance_signal, model_signals

log = logging.getLogger(__name__)

TRITON_TAG = "stb:triton"
TRITON_HTTP_PORT = 8000
_UNUSABLE = ("down", "fail", "unknown", "future", "inval")


@dataclass(frozen=True)
class TritonServer:
    """A Triton job Slurm runs, and what its server said this tick."""

    job: Job
    node: str
    address: str
    ready: bool
    models: tuple[str, ...]


def pool_of(node: Node, config: BridgeConfig) -> str | None:
    """The configured pool of a node: the one whose partition holds it; a lendable pool
    wins over the reserved one (the elastic nodes are also in the inference partition)."""
    matches = [
        (pool.lend_mode == "reserved", name)
        for name, pool in config.pools.items()
        if pool.partition in node.partitions
    ]
    return min(matches)[1] if matches else None


def _ts(job: Job, field: str) -> float | None:
    value = getattr(job, field)
    return value.timestamp() if value is not None else None


class Observer:
    """Builds snapshots; keeps per-instance previous scrapes and per-model history."""

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
        depth = max(config.policy.breach_evaluations, config.policy.calm_evaluations)
        self._history: dict[str, deque[ModelSample]] = {
            m: deque(maxlen=depth) for m in config.models
        }
        self._previous: dict[str, Observation] = {}
        #: what the last observe() read from Slurm, for the reconciler's passive sync
        self.last_nodes: dict[str, Node] = {}
        self.last_jobs: list[Job] = []

    def latest(self, model: str) -> ModelSample | None:
        """The model's most recent sample (None before the first tick)."""
        history = self._history.get(model)
        return history[-1] if history else None

    def triton_servers(self, nodes: Mapping[str, Node], jobs: Sequence[Job]) -> list[TritonServer]:
        servers = []
        for job in jobs:
            if TRITON_TAG not in job.tags or job.state != "RUNNING" or len(job.nodes) != 1:
                continue
            node = nodes.get(job.nodes[0])
            if node is None:
                continue
            address = f"{node.addr}:{TRITON_HTTP_PORT}"
            ready = False
            models: tuple[str, ...] = ()
            try:
                client = self._triton_for(address)
                ready = client.is_ready()
                if ready:
                    models = tuple(
                        sorted(m.name for m in client.repository_index() if m.state == "READY")
                    )
            except TritonError as exc:
                log.info("Triton of job %s at %s: %s", job.job_id, address, exc)
            servers.append(TritonServer(job, node.name, address, ready, models))
        return servers

    def _sample(self, servers: Sequence[TritonServer], now: float) -> None:
        signals = []
        for server in servers:
            if not server.ready:
                continue
            try:
                text = self._triton_for(server.address).metrics_text()
            except TritonError:
                continue
            page = parse_page(text)
            if self._on_page is not None:
                self._on_page(server.job.job_id, server.address, now, page)
            obs = Observation(server.address, self._clock(), page, incarnation=server.job.job_id)
            signals.append(instance_signal(self._previous.get(server.address), obs))
            self._previous[server.address] = obs
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
                )
            )

    def observe(
        self,
        leases: Sequence[LeaseView],
        now: float,
        last_lend_at: Mapping[str, float] | None = None,
    ) -> tuple[Snapshot, list[TritonServer]]:
        """The snapshot, and the Triton servers seen (the reconciler's passive sync uses
        them to move leases forward)."""
        nodes = {n.name: n for n in self._slurm.nodes()}
        jobs = self._slurm.jobs(states=["RUNNING", "PENDING", "CONFIGURING", "COMPLETING"])
        self.last_nodes, self.last_jobs = nodes, list(jobs)
        servers = self.triton_servers(nodes, jobs)
        self._sample(servers, now)
        lease_of = {lease.node: lease.lease_id for lease in leases}
        views = []
        for node in nodes.values():
            pool = pool_of(node, self._config)
            if pool is None:
                continue
            on_node = [j for j in jobs if node.name in j.nodes]
            # A pending Triton job asked for this node: it is on its way there.
            triton_here = any(
                TRITON_TAG in j.tags and node.name in (j.nodes or j.requested_nodes) for j in jobs
            )
            work = tuple(
                JobView(j.job_id, j.gpus, _ts(j, "start_time"), j.restarts, _ts(j, "submit_time"))
                for j in on_node
                if TRITON_TAG not in j.tags and j.state == "RUNNING"
            )
            usable = not node.state.startswith(_UNUSABLE) and (
                not node.drained or node.fenced_by_bridge
            )
            views.append(
                NodeView(
                    node.name,
                    pool,
                    usable,
                    node.gpus,
                    work,
                    has_triton=triton_here,
                )
            )
        replicas = tuple(
            ReplicaView(s.node, s.models, lease_of.get(s.node))
            for s in servers
            if s.ready and s.models
        )
        snapshot = Snapshot(
            tuple(views),
            replicas,
            {m: tuple(h) for m, h in self._history.items()},
            tuple(leases),
            dict(last_lend_at or {}),
        )
        return snapshot, servers
