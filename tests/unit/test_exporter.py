"""The bridge's exporter over real HTTP on loopback, with an injected clock."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.daemon.exporter import BridgeMetrics, ExporterServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[Clock, BridgeMetrics, str]]:
    clock = Clock()
    metrics = BridgeMetrics(clock=clock)
    server = ExporterServer(
        metrics,
        ("127.0.0.1", 0),
        tick_s=5,
        sd_document=lambda: b'[{"targets": ["127.0.1.4:8002"]}]',
    ).start()
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


def test_health_follows_the_last_good_tick(served: tuple[Clock, BridgeMetrics, str]) -> None:
    clock, metrics, url = served
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 503 and "no tick" in r.json()["reason"]
    metrics.record_tick(0.2, ["serving", "starting"])
    assert httpx.get(f"{url}/healthz").status_code == 200
    clock.now += 16  # more than three 5 s ticks without a good one
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 503 and "16s ago" in r.json()["reason"]


def test_metrics_page(served: tuple[Clock, BridgeMetrics, str]) -> None:
    clock, metrics, url = served
    metrics.record_tick(0.2, ["serving", "serving", "draining"])
    metrics.lends.labels("elastic").inc()
    metrics.decisions.labels("lend", "breach").inc()
    metrics.record_model("busy", 152.0, 100.0)
    metrics.record_model("echo", None, 50.0)
    samples = _samples(httpx.get(f"{url}/metrics").text)
    assert samples[("stb_leases", (("state", "serving"),))] == 2
    assert samples[("stb_leases", (("state", "draining"),))] == 1
    assert samples[("stb_leases", (("state", "returned"),))] == 0
    assert samples[("stb_lends_total", (("pool", "elastic"),))] == 1
    assert samples[("stb_model_p99_ms", (("model", "busy"),))] == 152.0
    assert samples[("stb_model_slo_p99_ms", (("model", "busy"),))] == 100.0
    assert samples[("stb_last_good_tick_timestamp_seconds", ())] == clock.now


def test_sd_and_unknown_paths(served: tuple[Clock, BridgeMetrics, str]) -> None:
    _, _, url = served
    assert httpx.get(f"{url}/sd").json() == [{"targets": ["127.0.1.4:8002"]}]
    assert httpx.get(f"{url}/nope").status_code == 404


def test_two_exporters_do_not_share_a_registry() -> None:
    a, b = BridgeMetrics(), BridgeMetrics()
    a.lends.labels("elastic").inc()
    assert b.registry is not a.registry
