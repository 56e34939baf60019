"""The Prometheus path's pure part (`bridge.triton.prometheus.fold`): the recording rules'
series and the replicas' last good scrapes become the direct path's per-replica windows,
aggregated the same way; a stale or missing replica gives no data, never a calm reading."""

from __future__ import annotations

import pytest

from bridge.triton.prometheus import fold
from bridge.triton.signal import Window, model_signals

NOW = 1_800_000_000.0


def scraped(job: str, at: float) -> dict[str, object]:
    return {"metric": {"instance": f"h{job}:8002", "slurm_job_id": job}, "value": [NOW, str(at)]}


def rule(name: str, job: str, model: str, value: str) -> dict[str, object]:
    labels = {"__name__": name, "instance": f"h{job}:8002", "slurm_job_id": job, "model": model}
    return {"metric": labels, "value": [NOW, value]}


def replica(job: str, model: str, success: float, p99_us: float) -> list[dict[str, object]]:
    return [
        rule("stb:triton_success:rate20s", job, model, str(success)),
        rule("stb:triton_failure:rate20s", job, model, "0.5"),
        rule("stb:triton_request_us:rate20s", job, model, str(success * 20_000)),
        rule("stb:triton_queue_us:rate20s", job, model, str(success * 5_000)),
        rule("stb:triton_compute_us:rate20s", job, model, str(success * 15_000)),
        rule("stb:triton_pending:sum", job, model, "2"),
        rule("stb:triton_p99_us:max", job, model, str(p99_us)),
    ]


def test_two_fresh_replicas_aggregate_like_the_direct_path() -> None:
    series = replica("1", "busy", 30.0, 40_000) + replica("2", "busy", 10.0, 90_000)
    reading = fold([scraped("1", NOW - 3), scraped("2", NOW - 4)], series, 15)
    assert set(reading.instances) == {"1", "2"} and reading.stale == frozenset()
    sig = model_signals(reading.instances.values())["busy"]
    assert sig.request_rate == pytest.approx(41.0)  # (30 + 0.5) + (10 + 0.5)
    assert sig.failure_rate == pytest.approx(1.0)
    assert sig.mean_latency_ms == pytest.approx(20.0)  # request time per success
    assert sig.mean_compute_ms == pytest.approx(15.0)
    assert sig.mean_queue_ms == pytest.approx(5.0)
    assert sig.pending == 4 and sig.p99_ms == 90.0  # the worst replica's p99
    assert sig.instances == sig.with_data == 2


def test_a_stale_replica_gives_no_data() -> None:
    series = replica("1", "busy", 30.0, 40_000) + replica("2", "busy", 10.0, 90_000)
    # replica 2 last scraped 40 s ago (down, or Prometheus lost it); replica 3 never
    # scraped successfully but its rule series linger
    series += replica("3", "busy", 99.0, 1_000)
    reading = fold([scraped("1", NOW - 3), scraped("2", NOW - 40)], series, 15)
    assert set(reading.instances) == {"1"} and reading.stale == {"2", "3"}
    sig = model_signals(reading.instances.values())["busy"]
    assert sig.request_rate == pytest.approx(30.5) and sig.p99_ms == 40.0
    only_stale = fold([scraped("2", NOW - 40)], replica("2", "busy", 10.0, 90_000), 15)
    assert only_stale.instances == {}  # its only replica stale: the model has no sample
    assert model_signals(only_stale.instances.values()) == {}


def test_garbage_values_are_no_data_and_a_first_scrape_has_no_rate() -> None:
    series = [
        rule("stb:triton_success:rate20s", "1", "busy", "NaN"),
        rule("stb:triton_pending:sum", "1", "busy", "3"),
        rule("stb:triton_p99_us:max", "1", "busy", "-5"),
        rule("stb:triton_success:rate20s", "1", "echo", "+Inf"),
        rule("stb:other:rate", "1", "busy", "7"),  # not one of the bridge's rules
    ]
    reading = fold([scraped("1", NOW)], series, 15)
    (busy, echo) = reading.instances["1"].models
    assert busy.window == Window.NO_DATA and busy.request_rate is None
    assert busy.pending == 3 and busy.p99_ms is None
    assert echo.window == Window.NO_DATA
    sig = model_signals(reading.instances.values())["busy"]
    assert sig.request_rate is None and sig.with_data == 0  # no data, not a zero


def test_an_idle_replica_is_a_measured_zero() -> None:
    series = replica("1", "busy", 0.0, 0)
    series = [s for s in series if "p99" not in str(s["metric"])]
    sig = model_signals(fold([scraped("1", NOW - 1)], series, 15).instances.values())["busy"]
    assert sig.request_rate == pytest.approx(0.5) and sig.mean_latency_ms is None
