"""The daemon's metrics, health and http_sd over real HTTP on loopback (`bridge.http`), with
an injected clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.report import StepError, TickReport
from bridge.http.app import create_app
from bridge.http.auth import TokenTable
from bridge.http.server import HttpServer
from bridge.policy import Lend
from tests.unit.helpers import write_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


METRICS_TOKEN = "m" * 24


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Clock, BridgeMetrics, str]]:
    clock = Clock()
    metrics = BridgeMetrics(clock=clock)
    tokens = write_tokens(tmp_path / "tokens", {"prometheus": ("metrics", METRICS_TOKEN)})
    app = create_app(
        metrics,
        tick_s=5,
        sd_document=lambda: b'[{"targets": ["127.0.1.4:8002"]}]',
        tokens=TokenTable(tokens),
    )
    server = HttpServer(app, ("127.0.0.1", 0)).start()
    host, port = server.address
    try:
        yield clock, metrics, f"http://{host}:{port}"
    finally:
        server.stop()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _report(**kw: object) -> TickReport:
    report = TickReport(datetime(2027, 1, 1, tzinfo=UTC), seconds=0.2)
    for name, value in kw.items():
        setattr(report, name, value)
    return report


def test_health_follows_the_last_good_tick(served: tuple[Clock, BridgeMetrics, str]) -> None:
    clock, metrics, url = served
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 503 and "no tick" in r.json()["reason"]
    metrics.record(_report(lease_states={"serving": 1, "starting": 1}))
    assert httpx.get(f"{url}/healthz").status_code == 200
    clock.now += 16  # more than three 5 s ticks without a good one
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 503 and "16s ago" in r.json()["reason"]


def test_a_tick_with_errors_is_not_a_good_tick(served: tuple[Clock, BridgeMetrics, str]) -> None:
    clock, metrics, url = served
    metrics.record(_report())
    good_at = clock.now
    clock.now += 10
    metrics.record(_report(errors=[StepError("submit", "permanent", "sbatch: no", 3)]))
    clock.now += 1
    metrics.record(_report(errors=[StepError("observe", "transient", "down")], failed=True))
    body = httpx.get(f"{url}/healthz").json()
    assert body["last_outcome"] == "failed" and "observe (transient): down" in body["last_errors"]
    samples = _samples(httpx.get(f"{url}/metrics").text)
    assert samples[("stb_last_good_tick_timestamp_seconds", ())] == good_at
    assert samples[("stb_ticks_total", (("outcome", "ok"),))] == 1
    assert samples[("stb_ticks_total", (("outcome", "errors"),))] == 1
    assert samples[("stb_ticks_total", (("outcome", "failed"),))] == 1
    assert samples[("stb_step_errors_total", (("kind", "permanent"), ("step", "submit")))] == 1
    assert samples[("stb_step_errors_total", (("kind", "transient"), ("step", "observe")))] == 1
    metrics.record_exception(RuntimeError("bug"))
    samples = _samples(httpx.get(f"{url}/metrics").text)
    assert samples[("stb_ticks_total", (("outcome", "failed"),))] == 2
    assert samples[("stb_tick_exceptions_total", (("kind", "RuntimeError"),))] == 1


def test_metrics_page(served: tuple[Clock, BridgeMetrics, str]) -> None:
    clock, metrics, url = served
    metrics.record(
        _report(
            lease_states={"serving": 2, "draining": 1},
            actions=[Lend("n3", "elastic", "preempt", ("busy",), "breach: busy")],
            lent=["elastic"],
            p99_ms={"busy": 152.0, "echo": None},
            retries={7: 3},
            stuck={8: "releasing: cancelling"},
        ),
        {"busy": 100.0, "echo": 50.0},
    )
    samples = _samples(httpx.get(f"{url}/metrics").text)
    assert samples[("stb_leases", (("state", "serving"),))] == 2
    assert samples[("stb_leases", (("state", "draining"),))] == 1
    assert samples[("stb_leases", (("state", "returned"),))] == 0
    assert samples[("stb_lends_total", (("pool", "elastic"),))] == 1
    assert samples[("stb_decisions_total", (("action", "lend"), ("reason", "breach")))] == 1
    assert samples[("stb_model_p99_ms", (("model", "busy"),))] == 152.0
    assert samples[("stb_model_slo_p99_ms", (("model", "busy"),))] == 100.0
    assert samples[("stb_lease_retries", (("lease", "7"),))] == 3
    assert samples[("stb_leases_stuck", ())] == 1
    assert samples[("stb_last_good_tick_timestamp_seconds", ())] == clock.now
    metrics.record(_report(lease_states={}))  # lease 7 retried fine: its series goes
    samples = _samples(httpx.get(f"{url}/metrics").text)
    assert ("stb_lease_retries", (("lease", "7"),)) not in samples


def test_sd_and_unknown_paths(served: tuple[Clock, BridgeMetrics, str]) -> None:
    _, _, url = served
    auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    assert httpx.get(f"{url}/sd", headers=auth).json() == [{"targets": ["127.0.1.4:8002"]}]
    assert httpx.get(f"{url}/sd").status_code == 401  # the targets are not for everyone
    assert httpx.get(f"{url}/nope").status_code == 404


def test_metrics_in_the_format_asked_for(served: tuple[Clock, BridgeMetrics, str]) -> None:
    _, metrics, url = served
    metrics.lends.labels("elastic").inc()
    plain = httpx.get(f"{url}/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain; version=")
    assert _samples(plain.text)[("stb_lends_total", (("pool", "elastic"),))] == 1
    om = "application/openmetrics-text; version=1.0.0"
    open_metrics = httpx.get(f"{url}/metrics", headers={"Accept": om})
    assert open_metrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert open_metrics.text.endswith("# EOF\n") and "stb_lends_total" in open_metrics.text
    only = httpx.get(f"{url}/metrics", params={"name[]": "stb_leases"}).text
    assert {name for name, _ in _samples(only)} == {"stb_leases"}


class SlowCollector(Collector):
    """A collector that waits to be released, like the ledger's on a stalled database."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.release.wait(10)
        yield GaugeMetricFamily("stb_slow", "A slow family.", value=1)


def test_a_slow_scrape_does_not_stall_healthz(served: tuple[Clock, BridgeMetrics, str]) -> None:
    _, metrics, url = served
    slow = SlowCollector()
    metrics.registry.register(slow)
    scrape: list[httpx.Response] = []
    scraping = threading.Thread(target=lambda: scrape.append(httpx.get(f"{url}/metrics")))
    scraping.start()
    try:
        assert slow.entered.wait(5), "the scrape never reached the collector"
        started = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 503  # no tick yet
        assert time.monotonic() - started < 1
    finally:
        slow.release.set()
        scraping.join(10)
    (done,) = scrape
    assert done.status_code == 200 and _samples(done.text)[("stb_slow", ())] == 1


def test_two_exporters_do_not_share_a_registry() -> None:
    a, b = BridgeMetrics(), BridgeMetrics()
    a.lends.labels("elastic").inc()
    assert b.registry is not a.registry
