"""The bridge's own metrics and health, over HTTP: `/metrics` (Prometheus text),
`/healthz` (200 while the last good tick is recent, 503 otherwise, with a JSON body
saying why) and `/sd` (the http_sd document of Triton targets, when routing provides
one), plus the routes the daemon adds (the ledger's `/api/report`). Called by the
reconciler (it records each tick and decision) and by `stb daemon`
(it starts the server). One registry per exporter, so tests and several daemons in one
process never collide.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bridge.leases.states import LeaseState

#: an extra GET route: query parameters -> (HTTP status, JSON body)
Route = Callable[[Mapping[str, Sequence[str]]], tuple[int, bytes]]


class BridgeMetrics:
    """The metrics the daemon keeps about itself."""

    def __init__(
        self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        r = self.registry
        self.leases = Gauge("stb_leases", "Leases by state.", ["state"], registry=r)
        self.lends = Counter("stb_lends", "Nodes lent, by pool.", ["pool"], registry=r)
        self.returns = Counter(
            "stb_returns", "Leases returned, by outcome.", ["outcome"], registry=r
        )
        self.lend_seconds = Histogram(
            "stb_lend_duration_seconds",
            "From lend decision to serving.",
            ["pool"],
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.return_seconds = Histogram(
            "stb_lease_lifetime_seconds",
            "From lend request to returned (whole lease).",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        self.decisions = Counter(
            "stb_decisions", "Policy actions, by kind and reason.", ["action", "reason"], registry=r
        )
        self.model_p99 = Gauge(
            "stb_model_p99_ms", "Per-model p99 the bridge saw (ms).", ["model"], registry=r
        )
        self.model_slo = Gauge(
            "stb_model_slo_p99_ms", "Per-model p99 objective (ms).", ["model"], registry=r
        )
        self.last_good_tick = Gauge(
            "stb_last_good_tick_timestamp_seconds",
            "Unix time of the last tick that completed.",
            registry=r,
        )
        self.tick_seconds = Histogram(
            "stb_tick_duration_seconds",
            "One control pass.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.tick_errors = Counter(
            "stb_tick_errors", "Ticks that failed, by error class.", ["kind"], registry=r
        )
        self.ledger_ingests = Counter(
            "stb_ledger_ingests", "Scheduled ledger ingests, by outcome.", ["outcome"], registry=r
        )
        for state in LeaseState:
            self.leases.labels(state.value).set(0)
        self._last_good: float | None = None

    def record_tick(self, seconds: float, lease_states: Iterable[str]) -> None:
        counts: dict[str, int] = {s.value: 0 for s in LeaseState}
        for state in lease_states:
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            self.leases.labels(state).set(n)
        self.tick_seconds.observe(seconds)
        self._last_good = self._clock()
        self.last_good_tick.set(self._last_good)

    def record_model(self, model: str, p99_ms: float | None, slo_ms: float) -> None:
        self.model_slo.labels(model).set(slo_ms)
        self.model_p99.labels(model).set(float("nan") if p99_ms is None else p99_ms)

    def health(self, tick_s: float) -> tuple[bool, dict[str, object]]:
        """Healthy while the last good tick is younger than three tick intervals."""
        now = self._clock()
        if self._last_good is None:
            return False, {"healthy": False, "reason": "no tick has completed yet"}
        age = now - self._last_good
        ok = age <= 3 * tick_s
        body: dict[str, object] = {"healthy": ok, "last_good_tick_age_s": round(age, 3)}
        if not ok:
            body["reason"] = f"last good tick {age:.0f}s ago (limit {3 * tick_s:g}s)"
        return ok, body


class ExporterServer:
    """`/metrics`, `/healthz`, `/sd` on a loopback address, in a background thread."""

    def __init__(
        self,
        metrics: BridgeMetrics,
        address: tuple[str, int],
        tick_s: float,
        sd_document: Callable[[], bytes] | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        exporter = self
        #: more GET paths: path -> handler(query parameters) -> (status, JSON body)
        self.routes = dict(routes or {})

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter._serve(self)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.metrics = metrics
        self.tick_s = tick_s
        self.sd_document = sd_document
        self._server = ThreadingHTTPServer(address, Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="stb-exporter"
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> ExporterServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(req, 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry))
        elif path == "/healthz":
            ok, body = self.metrics.health(self.tick_s)
            self._reply(req, 200 if ok else 503, "application/json", json.dumps(body).encode())
        elif path == "/sd" and self.sd_document is not None:
            self._reply(req, 200, "application/json", self.sd_document())
        elif path in self.routes:
            query = parse_qs(urlsplit(req.path).query, keep_blank_values=True)
            code, payload = self.routes[path](query)
            self._reply(req, code, "application/json", payload)
        else:
            self._reply(req, 404, "text/plain", b"not found\n")

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, ctype: str, body: bytes) -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
