"""The observe step: one immutable `Observation` per tick of what Slurm and Triton say now.

Called by the reconciler once per tick (and by lab tools that want the same view). It reads
the Slurm adapter (nodes, active jobs, reservations: one batched query each), asks every
running Triton job's server whether it is ready and which models it holds
(`[observe] concurrency` at once, on a pool of threads), and folds the latency signal into
each model's history (the last N samples the policy's consecutive counts need). The
signal comes from each server's metrics page (`[observe] source = "direct"`), or from the
site's Prometheus server (`"prometheus"`, `bridge.triton.prometheus`: one query a tick
whatever the fleet's size; a leased replica's page is still read, for its drain). The
planner, the policy and routing all read this one value; nothing reads the adapters'
answers any other way. Each tick also reads the model repository (`ModelCatalog`: a
config.pbtxt is parsed again only when it changed) merged with the TOML's overrides: the
observation's `models`, and a history for each of them, so a model published since the
last tick is scaled from this one.

Failures to reach one Triton server make that replica "not ready" and its models' sample
"no data"; they never raise. A metrics page refused by the client (over its size limit) or
by the parser (a bad line) gives no data from that replica for the tick, never a calm
reading: a model's sample holds only what its other replicas gave ("no data" when that
replica is its only one). The replica stays as ready as it said. A Slurm error does raise:
without a fresh view of Slurm the tick must not act (the reconciler reports it as a failed
tick).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from bridge.config import BridgeConfig
from bridge.daemon.observation import RESERVATION_PREFIX, Observation, TritonServer
from bridge.modelfacts import ModelFacts
from bridge.models.profile import Profiles
from bridge.policy import history_depth
from bridge.policy.snapshot import ModelSample
from bridge.policy.tokens import TokenProfile
from bridge.slurm.model import TRITON_TAG, Job, Node, lease_of
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.catalog import ModelCatalog
from bridge.triton.errors import TritonError
from bridge.triton.metrics import MetricsPage, parse_page
from bridge.triton.metrics import ModelSample as PageSample
from bridge.triton.ports import server_address
from bridge.triton.prometheus import PrometheusError, PrometheusSignal
from bridge.triton.protocol import RepositoryModel, TritonInstance
from bridge.triton.signal import ModelSignal, Scrape, instance_signal, model_signals

log = logging.getLogger(__name__)

#: Slurm job states the bridge reads each tick (finished jobs are gone from its view)
ACTIVE_STATES = ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING")


def unloading_only(index: Sequence[RepositoryModel]) -> bool:
    """Whether a live server that says it is not ready is only loading or unloading model
    versions while it holds at least one READY (a placement's load, a rollout's old
    version going): it serves what it holds READY meanwhile. A server loading with nothing
    READY (its start) is not ready. Versions in other states (UNAVAILABLE: unloaded, or
    failed to load) do not count either way: Triton lists an unloaded version so."""
    states = {m.state for m in index}
    return "READY" in states and bool(states & {"UNLOADING", "LOADING"})


def in_flight(sample: PageSample) -> float:
    """Requests in flight of one (model, version) on a page: Triton's queued requests
    (`nv_inference_pending_request_count`: only until an instance takes one) and the
    streams an LLM is generating (`LlmSample.open_streams`: a decoupled model's request
    being streamed is in no Triton gauge). A drain, a placement's unload wait on both."""
    streams = sample.llm.open_streams if sample.llm is not None else None
    return (sample.pending_requests or 0.0) + (streams or 0.0)


class Observer:
    """Builds observations; keeps per-instance previous scrapes and per-model history."""

    def __init__(
        self,
        slurm: SlurmProtocol,
        config: BridgeConfig,
        triton_for: Callable[[str], TritonInstance],
        clock: Callable[[], float] = time.monotonic,
        on_page: Callable[[str, str, float, MetricsPage], None] | None = None,
        prometheus: PrometheusSignal | None = None,
        catalog: ModelCatalog | None = None,
    ) -> None:
        self._slurm = slurm
        #: called with (job id, address, wall time, page) for each scraped instance: the
        #: ledger keeps the per-model compute counters
        self._on_page = on_page
        self._config = config
        self._triton_for = triton_for
        self._clock = clock
        #: the signal's source at scale (`[observe] source = "prometheus"`); None: direct
        self._prometheus = prometheus
        #: each model's facts: the repository's metadata with the TOML's overrides
        self.catalog = catalog or ModelCatalog.of(config)
        #: the LLMs' measured token profiles, kept in the model repository
        self.profiles = Profiles(config.triton.model_repository)
        self._said_profiles: dict[str, str] = {}
        self._depth = history_depth(config)
        self._history: dict[str, deque[ModelSample]] = {}
        self._previous: dict[str, Scrape] = {}
        #: per Triton job, when its server last answered as ready (or first did not)
        self._answered: dict[str, float] = {}
        #: the servers' addresses asked in the last pass (`_let_go`)
        self._asked: set[str] = set()
        #: more than one: servers are asked on a pool of threads (each keeps its own
        #: clients, `bridge.daemon.clients`); one: on the caller's thread, as before
        self._workers = config.observe.concurrency
        self._pool = (
            ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="stb-observe")
            if self._workers > 1
            else None
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._prometheus is not None:
            self._prometheus.close()

    def models(self) -> ModelFacts:
        """The models' effective facts now (the repository as it is, with the TOML's
        overrides)."""
        return self.catalog.facts()

    def latest(self, model: str) -> ModelSample | None:
        """The model's most recent sample (None before the first tick)."""
        history = self._history.get(model)
        return history[-1] if history else None

    def _server(
        self, job: Job, node: Node, read_page: bool
    ) -> tuple[TritonServer, MetricsPage | None, float]:
        """Ask one Triton job's server (on a pool thread); its page when it was read."""
        address = server_address(node.addr, job.tags)
        ready = False
        models: tuple[str, ...] = ()
        unavailable: dict[str, str] = {}
        pending: dict[str, float] = {}
        versions: dict[str, list[str]] = {}
        page = None
        try:
            client = self._triton_for(address)
            ready = client.is_ready()
            index = None
            if not ready and client.is_live():
                # Triton's strict readiness says "not ready" while any model version is
                # loading or unloading; one that only loads a model (a placement) or
                # unloads a version (the old one, after a publish or a rollout's move)
                # goes on serving what it holds READY.
                index = client.repository_index()
                ready = unloading_only(index)
            if ready:
                index = index if index is not None else client.repository_index()
                models = tuple(sorted(m.name for m in index if m.state == "READY"))
                for m in index:
                    if m.state == "READY" and m.version:
                        versions.setdefault(m.name, []).append(m.version)
                unavailable = {m.name: m.reason for m in index if m.state == "UNAVAILABLE"}
                if read_page:
                    page = parse_page(client.metrics_text())
                    for sample in page.models.values():
                        pending[sample.model] = pending.get(sample.model, 0.0) + in_flight(sample)
        except TritonError as exc:
            log.info("Triton of job %s at %s: %s", job.job_id, address, exc)
        server = TritonServer(
            job, node.name, address, ready, models, pending, unavailable,
            {m: tuple(sorted(vs, key=int)) for m, vs in versions.items()},
        )  # fmt: skip
        return server, page, self._clock()

    def _silence(self, server: TritonServer, now: float) -> TritonServer:
        """The server with how long it has gone unanswered (a busy server misses a tick's
        ask; the planner fails a serving replica only past `[leases] unanswered_grace_s`)."""
        job_id = server.job.job_id
        if server.ready:
            self._answered[job_id] = now
            return server
        since = self._answered.setdefault(job_id, now)
        return dataclasses.replace(server, unanswered_s=max(0.0, now - since))

    def observe(self, now: float) -> Observation:
        """Read Slurm and every running Triton server; raises the Slurm adapter's errors."""
        nodes = {n.name: n for n in self._slurm.nodes()}
        jobs = tuple(self._slurm.jobs(states=ACTIVE_STATES))
        all_reservations = self._slurm.reservations()
        reservations = frozenset(r.name for r in all_reservations)
        site = tuple(r for r in all_reservations if not r.name.startswith(RESERVATION_PREFIX))
        asked = [
            (job, nodes[job.nodes[0]])
            for job in jobs
            if TRITON_TAG in job.tags
            and job.state == "RUNNING"
            and job.nodes  # a gang's server runs on its first node, the batch host
            and job.nodes[0] in nodes
        ]
        direct = self._prometheus is None

        # Leased replicas' pages are read on both paths: their drain waits on the pending
        # requests of now, not of Prometheus' last scrape.
        def ask(jn: tuple[Job, Node]) -> tuple[TritonServer, MetricsPage | None, float]:
            return self._server(jn[0], jn[1], direct or lease_of(jn[0].tags) is not None)

        self._let_go({server_address(node.addr, job.tags) for job, node in asked})
        if self._pool is None:
            answers = [ask(jn) for jn in asked]
        else:
            self._purge_pool()
            answers = list(self._pool.map(ask, asked))
        servers = [self._silence(server, now) for server, _, _ in answers]
        for job_id in set(self._answered) - {s.job.job_id for s in servers}:
            del self._answered[job_id]
        for server, page, _ in answers:
            if page is not None and self._on_page is not None:
                self._on_page(server.job.job_id, server.address, now, page)
        if direct:
            signals = []
            for server, page, at in answers:
                if page is None:
                    continue
                scrape = Scrape(server.address, at, page, incarnation=server.job.job_id)
                signals.append(instance_signal(self._previous.get(server.address), scrape))
                self._previous[server.address] = scrape
            live = {s.address for s in servers}
            for gone in set(self._previous) - live:
                del self._previous[gone]
            per_model = model_signals(signals)
        else:
            per_model = self._from_prometheus()
        facts = self.catalog.facts()
        for gone in set(self._history) - set(facts.names):
            del self._history[gone]  # retired: its history goes (a new one if it is back)
        for model in facts.names:
            if model not in self._history:
                self._history[model] = deque(maxlen=self._depth)
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
                    ttft_p99_ms=sig.ttft_p99_ms if sig else None,
                    tpot_p99_ms=sig.tpot_p99_ms if sig else None,
                    prompt_tps=sig.prompt_tps if sig else None,
                    output_tps=sig.output_tps if sig else None,
                    running=sig.running if sig else None,
                    prompt_lengths=sig.prompt_lengths if sig else None,
                    output_lengths=sig.output_lengths if sig else None,
                    ttft_mean_ms=sig.ttft_mean_ms if sig else None,
                    tpot_mean_ms=sig.tpot_mean_ms if sig else None,
                    timed=sig.timed if sig else None,
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
            facts,
            self._token_profiles(facts),
        )

    def _token_profiles(self, facts: ModelFacts) -> dict[str, TokenProfile]:
        """The newest measured profile of each scaled LLM; a refused file said once."""
        llms = tuple(n for n, m in facts.scaled.items() if m.has_token_slo)
        if not llms:
            return {}
        profiles = self.profiles.read(llms)
        for name, problem in self.profiles.problems.items():
            if self._said_profiles.get(name) != problem:
                log.warning("token profile of %s refused (sized without it): %s", name, problem)
        self._said_profiles = dict(self.profiles.problems)
        return profiles

    def _let_go(self, addresses: set[str]) -> None:
        """Forget the clients of servers asked last pass and not this one (their job
        cancelled, ended or gone): an open keep-alive connection makes tritonserver wait
        out its whole exit timeout (20 s in the lab) before it exits. The bridge that
        cancels a lease's job forgets its client itself; this covers every other bridge
        that was asking the server too (a standby) and jobs that ended on their own."""
        forget = getattr(self._triton_for, "forget", None)
        if forget is not None:
            for address in sorted(self._asked - addresses):
                forget(address)
        self._asked = addresses

    def _purge_pool(self) -> None:
        """Have each pool thread close its clients of servers the bridge stopped."""
        purge = getattr(self._triton_for, "purge", None)
        if purge is None or self._pool is None:
            return
        barrier = threading.Barrier(self._workers, timeout=1.0)

        def once() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()  # every worker takes exactly one of these
            purge()

        for f in [self._pool.submit(once) for _ in range(self._workers)]:
            f.result()

    def _from_prometheus(self) -> Mapping[str, ModelSignal]:
        """Each model's signal over its fresh replicas, from Prometheus (none when it does
        not answer: no data, never calm)."""
        assert self._prometheus is not None
        try:
            reading = self._prometheus.read()
        except PrometheusError as exc:
            log.warning("Prometheus: %s: no signal this tick", exc)
            return {}
        for model, n in reading.stale.items():
            if n:
                log.info("Prometheus: %d replica(s) of %s stale: no data from them", n, model)
        return reading.models
