"""The Prometheus path's pure part: the one query a tick (`query`) and its answer folded
into the direct path's `ModelSignal`s (`fold`): sums of rates, ratios of sums, the largest
p99, counts of replicas; a model none of whose replicas is fresh has no sample, never a
calm one. The query itself runs against a real Prometheus in tests/lab/test_prometheus.py."""

from __future__ import annotations

import pytest

from bridge.triton.prometheus import fold, query

NOW = 1_800_000_000.0


def stat(model: str, name: str, value: str) -> dict[str, object]:
    return {"metric": {"model": model, "stb_stat": name}, "value": [NOW, value]}


def model(name: str, **values: float) -> list[dict[str, object]]:
    return [stat(name, k, str(v)) for k, v in values.items()]


def test_a_models_sums_become_its_signal() -> None:
    reading = fold(
        model(
            "busy", success=40.0, failure=1.0, request_us=800_000.0, queue_us=200_000.0,
            compute_us=600_000.0, pending=4, p99_us=90_000, with_data=2, fresh=2, replicas=3,
        )
    )  # fmt: skip
    sig = reading.models["busy"]
    assert sig.request_rate == pytest.approx(41.0) and sig.failure_rate == 1.0
    assert sig.mean_latency_ms == pytest.approx(20.0)  # request time per success
    assert sig.mean_queue_ms == pytest.approx(5.0)
    assert sig.mean_compute_ms == pytest.approx(15.0)
    assert sig.queue_compute_ratio == pytest.approx(1 / 3)
    assert sig.pending == 4 and sig.p99_ms == 90.0
    assert (sig.instances, sig.with_data) == (2, 2)
    assert reading.stale == {"busy": 1} and reading.at == NOW


def test_a_model_with_no_fresh_replica_has_no_sample() -> None:
    reading = fold(model("busy", replicas=2) + model("echo", success=1.0, failure=0.0, fresh=1))
    assert "busy" not in reading.models and reading.stale["busy"] == 2
    assert reading.models["echo"].request_rate == 1.0


def test_garbage_is_no_data_not_zero() -> None:
    result = model("busy", fresh=1, replicas=1, pending=3)
    result += [
        stat("busy", "success", "NaN"),
        stat("busy", "failure", "0"),
        stat("busy", "p99_us", "-5"),
        stat("busy", "colour", "7"),  # not one of the statistics
        {"metric": {"stb_stat": "success"}, "value": [NOW, "3"]},  # no model
        {"metric": "garbage", "value": None},
    ]
    sig = fold(result).models["busy"]
    assert sig.request_rate is None and sig.mean_latency_ms is None and sig.p99_ms is None
    assert sig.pending == 3


def test_an_idle_model_is_a_measured_zero() -> None:
    sig = fold(model("busy", success=0.0, failure=0.0, request_us=0.0, fresh=1)).models["busy"]
    assert sig.request_rate == 0.0 and sig.mean_latency_ms is None


def test_the_query_names_every_statistic_and_the_staleness_bound() -> None:
    q = query(15)
    for name in ("success", "failure", "request_us", "queue_us", "compute_us", "pending",
                 "p99_us", "with_data", "fresh", "replicas"):  # fmt: skip
        assert f'"stb_stat", "{name}"' in q
    assert '(time() - timestamp(up{job="triton"})) <= 15)' in q
    assert q.count(" or ") == 9
