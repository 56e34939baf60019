"""The capacity plan: per model and hour, replicas held, peak rate, service time and the
replicas the policy's capacity model says the load needs; the summary's long-term count and
burst hours; the reader end to end on a SQLite ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import insert

from accounting.attribution import ServingPoint
from accounting.db import open_ledger
from accounting.report import Window
from accounting.samples import record_serving
from accounting.serving import Increase
from bridge.config import ModelConfig
from bridge.ledger.replica_plan import (
    SPANS,
    needed_replicas,
    plan,
    plan_section,
    typical_gpus,
)
from bridge.policy import capacity

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
M = timedelta(minutes=1)
H = timedelta(hours=1)
SERVICE = 0.02  # s per request
BERT = ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=64, instances=2)
SLO = 0.1


def _load(
    rate: float,
    start: datetime,
    minutes: int,
    inst: str = "a",
    version: str = "1",
    model: str = "bert",
    service: float = SERVICE,
) -> list[Increase]:
    """Increases of one minute each carrying `rate` req/s."""
    return [
        Increase(
            "7", inst, model, version, start + k * M, start + (k + 1) * M,
            rate * 60 * service * 1e6, rate * 60,
        )
        for k in range(minutes)
    ]  # fmt: skip


def _p99(n: int, rate: float, cfg: ModelConfig = BERT, gpus: int = 1) -> float:
    demand = {"bert": capacity.Demand(rate, SERVICE, cfg.slo_p99_ms / 1000, cfg.instances)}
    return capacity.predict([capacity.Group(("bert",), n, gpus)], demand)["bert"]


def test_model_config_validation() -> None:
    with pytest.raises(ValidationError):
        ModelConfig(slo_p99_ms=0)
    with pytest.raises(ValidationError):
        ModelConfig(slo_p99_ms=50, min_replicas=5, max_replicas=2)
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({"slo_p99_ms": 50, "bogus": 1})


def test_steady_load_needs_the_fewest_replicas_within_the_slo() -> None:
    rate = 300.0  # 6 busy servers' worth at 20 ms
    got = plan(_load(rate, T0, 60), T0, T0 + H, {"bert": BERT}, gpus=1)
    (hour,) = got.hours
    assert hour.held == pytest.approx(1.0)
    assert hour.rate_peak == pytest.approx(rate)
    assert hour.rate_mean == pytest.approx(rate)
    assert hour.service_s == pytest.approx(SERVICE)
    n = hour.needed
    assert n is not None and n * 2 > 6  # more servers than busy ones
    assert _p99(n - 1, rate) > BERT.slo_p99_ms / 1000
    assert _p99(n, rate) <= BERT.slo_p99_ms / 1000
    (summary,) = got.models
    assert (summary.hours, summary.long_term, summary.burst_hours) == (1, n, 0)
    assert summary.needed_p10 == summary.needed_median == summary.needed_max == n
    assert summary.verdict == f"needs {n} long-term replica{'s' if n != 1 else ''}"


def test_the_search_agrees_with_predict_on_shared_gpus() -> None:
    shared = ModelConfig(slo_p99_ms=50)  # no instances: shares the node's 4 GPUs
    n = needed_replicas(500.0, SERVICE, 0.05, None, 4)
    assert n is not None and n > 1
    assert _p99(n - 1, 500.0, shared, gpus=4) > 0.05 >= _p99(n, 500.0, shared, gpus=4)
    assert needed_replicas(0.0, SERVICE, 0.05, None, 4) == 0
    assert needed_replicas(10.0, 0.05, 0.05, None, 4) is None  # a request alone is too slow


def test_a_burst_hour_raises_needed_that_hour_only() -> None:
    incs = [
        *_load(50.0, T0, 60),
        *_load(50.0, T0 + H, 60),
        *_load(500.0, T0 + H + 20 * M, 5, inst="b"),  # a 5-minute burst on a lent node
        *_load(50.0, T0 + 2 * H, 60),
    ]
    got = plan(incs, T0, T0 + 3 * H, {"bert": BERT}, gpus=1)
    calm, burst, after = (h.needed for h in got.hours)
    assert calm is not None and burst is not None
    assert calm == after and burst > calm
    assert got.hours[1].rate_peak == pytest.approx(550.0)
    assert got.hours[1].rate_mean == pytest.approx((50 * 3600 + 500 * 300) / 3600)
    assert got.hours[1].held == pytest.approx(1 + 5 / 60)
    (s,) = got.models
    assert (s.long_term, s.needed_max, s.burst_hours) == (calm, burst, 1)
    assert s.verdict.startswith(f"bursty: {calm} long-term replica")
    assert s.verdict.endswith("more for 1 hour")


def test_two_instances_held_half_an_hour_each_hold_one_replica() -> None:
    incs = [*_load(10.0, T0, 30, inst="a"), *_load(10.0, T0 + 30 * M, 30, inst="b")]
    (hour,) = plan(incs, T0, T0 + H, {"bert": BERT}, gpus=1).hours
    assert hour.held == pytest.approx(1.0)
    assert hour.rate_peak == pytest.approx(10.0)


def test_version_series_are_summed_and_held_once() -> None:
    incs = [*_load(40.0, T0, 60, version="1"), *_load(60.0, T0, 60, version="2")]
    (hour,) = plan(incs, T0, T0 + H, {"bert": BERT}, gpus=1).hours
    assert hour.rate_peak == pytest.approx(100.0)
    assert hour.requests == pytest.approx(100.0 * 3600)
    assert hour.held == pytest.approx(1.0)  # one instance, two versions
    assert hour.needed == needed_replicas(100.0, SERVICE, SLO, 2, 1)


def test_a_quiet_hour_takes_the_window_mean_service_time_and_idle_is_over_provisioned() -> None:
    cfg = ModelConfig(slo_p99_ms=50, min_replicas=0, max_replicas=8, instances=1)
    incs = [
        *_load(10.0, T0, 60, service=0.01),
        # 10 requests in the second hour, on three instances, with a slow service time
        *_load(10.0 / 3600, T0 + H, 60, service=0.04),
        *_load(0.0, T0 + H, 60, inst="b"),
        *_load(0.0, T0 + H, 60, inst="c"),
    ]
    got = plan(incs, T0, T0 + 2 * H, {"bert": cfg}, gpus=1)
    first, second = got.hours
    assert second.requests == pytest.approx(10.0)
    total_s = 10 * 3600 * 0.01 + 10 * 0.04
    assert second.service_s == pytest.approx(total_s / (10 * 3600 + 10))
    assert first.service_s == pytest.approx(0.01)
    (s,) = got.models
    assert s.held_mean == pytest.approx(2.0)
    assert s.long_term == 1
    assert s.verdict == "over-provisioned: holds 2.0, needs 1"


def test_a_model_without_an_slo_gets_no_figure() -> None:
    got = plan(_load(10.0, T0, 60, model="gpt"), T0, T0 + H, {"bert": BERT}, gpus=1)
    bert, gpt = got.models
    assert (bert.model, bert.hours, bert.long_term) == ("bert", 0, 1)
    assert bert.verdict == "no samples in the window"
    assert gpt.model == "gpt" and gpt.slo_s is None and gpt.long_term is None
    assert gpt.needed_max is None and gpt.verdict.startswith("no SLO configured")
    (hour,) = got.hours
    assert (hour.needed, hour.status) == (None, "no SLO")


def test_an_infeasible_model_says_so() -> None:
    got = plan(_load(10.0, T0, 60, service=0.12), T0, T0 + H, {"bert": BERT}, gpus=1)
    assert got.hours[0].status == "infeasible"
    assert got.models[0].long_term is None
    assert got.models[0].verdict.startswith("infeasible")


def test_the_reader_end_to_end(tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    # 300 req/s on one instance, scraped every 30 s from 09:59:30 to 12:00:30 (the
    # intervals straddling the window's edges count their part inside), plus an
    # unconfigured model; another cluster's samples are left out
    pts = []
    for k in range(243):
        at = T0 - 30 * timedelta(seconds=1) + k * timedelta(seconds=30)
        n = 300.0 * 30 * k
        pts.append(ServingPoint("7", "h1:8000", "bert", at, n * SERVICE * 1e6, "1", n))
        pts.append(ServingPoint("7", "h1:8000", "gpt", at, n * 1e3, "1", n / 100))
    record_serving(engine, "c", pts)
    record_serving(engine, "other", [ServingPoint("9", "x", "bert", T0, 0.0, "1", 0.0)])
    with engine.begin() as conn:
        for node, gpus in (("n1", 8), ("n2", 8), ("n3", 4)):
            conn.execute(
                insert(SPANS).values(
                    cluster="c", node=node, pool="p", gpu_type="h100", gpus=gpus, start=T0
                )
            )
    assert typical_gpus(engine, "c") == 8
    assert typical_gpus(engine, "none") == 1

    window = Window(T0, T0 + 2 * H, "2026-11-03T10..12")
    sec = plan_section(engine, window, {"bert": BERT}, gpus=8, cluster="c")
    assert sec.key == "capacity_plan"
    bert, gpt = sec.rows
    n = needed_replicas(300.0, SERVICE, SLO, 2, 8)
    assert bert["model"] == "bert" and bert["hours"] == 2
    assert bert["held_mean"] == pytest.approx(1.0)
    assert bert["rate_peak"] == pytest.approx(300.0)
    assert bert["service_s"] == pytest.approx(SERVICE)
    assert bert["long_term"] == bert["needed_max"] == n
    assert bert["verdict"] == f"needs {n} long-term replica{'s' if n != 1 else ''}"
    assert gpt["model"] == "gpt" and gpt.get("long_term") is None
    assert "no SLO" in gpt["verdict"]
    assert sec.as_dict()["columns"][0] == "model"

    hourly = plan_section(engine, window, {"bert": BERT}, gpus=8, cluster="c", hourly=True)
    assert [(r["model"], r["hour"], r["needed"]) for r in hourly.rows] == [
        ("bert", "2026-11-03T10:00Z", n),
        ("bert", "2026-11-03T11:00Z", n),
        ("gpt", "2026-11-03T10:00Z", None),
        ("gpt", "2026-11-03T11:00Z", None),
    ]
    assert all(r["held"] == pytest.approx(1.0) for r in hourly.rows)


def test_held_counts_the_part_of_the_hour_that_was_observed() -> None:
    """Samples over ten minutes of an hour (the daemon ran only then): two replicas held
    all that time read as 2, not as a sixth of 2."""
    incs = [*_load(50.0, T0, 10), *_load(50.0, T0, 10, inst="b")]
    got = plan(incs, T0, T0 + H, {"bert": BERT}, gpus=1)
    (hour,) = got.hours
    assert hour.held == pytest.approx(2.0)
