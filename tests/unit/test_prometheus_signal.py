"""The Prometheus path's pure part: the one query a tick (`QUERY`) and its answer folded
into the direct path's `ModelSignal`s (`fold`): sums of rates, ratios of sums, the largest
p99, counts of replicas; a model none of whose replicas is fresh has no sample, never a
calm one. The query itself runs against a real Prometheus in tests/lab/test_prometheus.py."""

from __future__ import annotations

import re

import pytest

from bridge.paths import project_root
from bridge.triton.prometheus import _STATS, QUERY, fold

NOW = 1_800_000_000.0


def stat(model: str, name: str, value: str) -> dict[str, object]:
    return {"metric": {"model": model, "stb_stat": name}, "value": [NOW, value]}


def model(name: str, age: float = 2.0, **values: float) -> list[dict[str, object]]:
    """A model's statistics, its rules last evaluated `age` seconds ago."""
    return [stat(name, k, str(v)) for k, v in (values | {"age": age}).items()]


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


def test_rules_not_evaluated_lately_give_no_data() -> None:
    fresh = model("busy", success=1.0, failure=0.0, fresh=1, replicas=1)
    assert "busy" in fold(fresh, 15).models
    old = model("busy", age=40.0, success=1.0, failure=0.0, fresh=1, replicas=1)
    reading = fold(old, 15)
    assert reading.models == {} and reading.stale == {"busy": 1}
    no_age = [x for x in fresh if "age" not in str(x["metric"])]
    assert fold(no_age, 15).models == {}


def test_the_query_reads_every_model_rule_and_their_age() -> None:
    rules = (project_root() / "deploy" / "prometheus" / "rules.yml").read_text()
    names = set(re.findall(r"record: stb:model_([a-z0-9_]+):", rules))
    assert names == set(_STATS)  # every statistic has its rule, and no rule is unread
    assert '{__name__=~"stb:model_.+"}' in QUERY and "timestamp(stb:model_replicas" in QUERY
