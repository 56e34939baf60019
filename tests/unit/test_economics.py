"""Unit economics per model and version: a serving job booked through the real ingest (its
split among models from stored Triton samples), the counters read back as increases, the
model's GPU time split among its versions by compute time, cost per million requests with
a rate, None where there are no requests, filters, and the unattributed note."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from accounting.attribution import Context, ServingPoint
from accounting.db import open_ledger
from accounting.economics import COLUMNS, unit_economics
from accounting.errors import WindowError
from accounting.ingest import ingest_records
from accounting.rates import RateBook, RateSpec, add_rates, list_rates
from accounting.report import Window
from accounting.samples import record_serving
from bridge.slurm.model import AccountingRecord

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
M = timedelta(minutes=1)
DAY = Window.parse("2026-11-03")
CTX = Context(
    pool_of_node={"n4": "inference"},
    gpu_type_of_node={"n4": "h100"},
    workload_of_partition={"infer": "inference"},
    team_of_account={"bridge": "platform"},
    team_of_model={"bert": "team-nlp", "resnet": "team-vision"},
    known_gpu_types=frozenset({"h100"}),
)


def serving_job(job: str, start: datetime, hours: int = 1) -> AccountingRecord:
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="triton",
        partition="infer", account="bridge", user="stb", qos="normal", state="COMPLETED",
        submit=start, start=start, end=start + timedelta(hours=hours), elapsed_s=3600 * hours,
        nodes=("n4",), gpus=1, gpu_type="h100", comment="stb:triton", restarts=0,
    )  # fmt: skip


def pt(
    model: str, version: str, minute: int, seconds: float, requests: float | None, job: str = "7"
) -> ServingPoint:
    return ServingPoint(job, "n4:8000", model, T0 + minute * M, seconds * 1e6, version, requests)


@pytest.fixture
def ledger(tmp_path: Path) -> Engine:
    """One 1-GPU serving job, 10:00-11:00: bert version 1 computes 600 s for 1000
    requests, version 2 900 s for 3000; resnet 360 s with its request counter at zero.
    The ledger books bert 1500 s, resnet 360 s and the rest (1740 s) unattributed."""
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    record_serving(
        engine,
        "lab",
        [
            pt("bert", "1", 0, 0, 0),
            pt("bert", "1", 30, 600, 1000),
            pt("bert", "2", 0, 0, 0),
            pt("bert", "2", 30, 450, 2000),
            pt("bert", "2", 50, 900, 3000),
            pt("resnet", "1", 0, 0, 0),
            pt("resnet", "1", 30, 360, 0),
        ],
    )
    ingest_records(engine, [serving_job("7", T0)], CTX)
    return engine


def rates(engine: Engine) -> RateBook:
    add_rates(engine, [RateSpec("h100", Decimal("3.00"), date(2026, 1, 1))])
    return RateBook(list_rates(engine))


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["model"], r["version"]): r for r in rows}


def test_versions_split_the_models_gpu_time_and_cost_per_million_requests(
    ledger: Engine,
) -> None:
    section = unit_economics(ledger, DAY, rates(ledger))
    assert section.key == "unit_economics"
    assert section.columns == COLUMNS
    # each model's whole row first, then its versions
    assert [(r["model"], r["version"]) for r in section.rows] == [
        ("bert", "*"), ("bert", "1"), ("bert", "2"), ("resnet", "*"), ("resnet", "1"),
    ]  # fmt: skip
    rows = by_key(section.rows)
    bert, v1, v2 = rows[("bert", "*")], rows[("bert", "1")], rows[("bert", "2")]
    assert (bert["requests"], v1["requests"], v2["requests"]) == (4000, 1000, 3000)
    assert (bert["team"], v1["team"]) == ("team-nlp", "team-nlp")
    assert (v1["compute_gpu_seconds"], v2["compute_gpu_seconds"]) == (600.0, 900.0)
    # 1500 GPU-seconds booked to bert, split 600:900 by the versions' compute time
    assert bert["gpu_hours"] == round(1500 / 3600, 6)
    assert (v1["gpu_hours"], v2["gpu_hours"]) == (round(600 / 3600, 6), round(900 / 3600, 6))
    assert (v1["gpu_seconds_per_request"], v2["gpu_seconds_per_request"]) == (0.6, 0.3)
    assert bert["gpu_seconds_per_request"] == 0.375
    # fully loaded: the job's 1740 unattributed seconds shared 1500:360 by bert and resnet,
    # so the two carry the whole GPU-hour of the job between them
    loaded_bert = 1500 + 1740 * 1500 / 1860
    assert bert["loaded_gpu_hours"] == pytest.approx(loaded_bert / 3600, abs=1e-6)
    assert bert["loaded_gpu_hours"] + rows[("resnet", "*")]["loaded_gpu_hours"] == (
        pytest.approx(1.0, abs=1e-5)
    )
    assert v1["loaded_gpu_hours"] == pytest.approx(loaded_bert * 600 / 1500 / 3600, abs=1e-6)
    assert bert["loaded_cost_per_million_requests"] == Decimal("604.84")  # 3.00 x h / 4000
    # 3.00 per GPU-hour: bert 1.25, version 1 0.50 (1000 requests), version 2 0.75 (3000)
    assert (bert["cost"], v1["cost"], v2["cost"]) == (
        Decimal("1.25"), Decimal("0.50"), Decimal("0.75"),
    )  # fmt: skip
    assert v1["cost_per_million_requests"] == Decimal("500.00")
    assert v2["cost_per_million_requests"] == Decimal("250.00")
    assert bert["cost_per_million_requests"] == Decimal("312.50")
    assert all(isinstance(r["cost"], Decimal) for r in section.rows)
    # resnet: GPU time and cost, but zero requests: nothing per request
    resnet = rows[("resnet", "*")]
    assert (resnet["team"], resnet["requests"], resnet["cost"]) == (
        "team-vision", 0, Decimal("0.30"),
    )  # fmt: skip
    assert resnet["gpu_seconds_per_request"] is None
    assert resnet["cost_per_million_requests"] is None
    # the unattributed rest: 3600 - 1500 - 360 = 1740 GPU-seconds, 1.45 at 3.00
    unattributed = [n for n in section.notes if "(unattributed)" in n]
    assert len(unattributed) == 1
    assert "0.483 GPU-hours (1.45 USD)" in unattributed[0]
    assert "in no model's cost" in unattributed[0]
    assert section.as_dict()["rows"][1]["cost_per_million_requests"] == "500.00"


def test_without_rates_there_is_no_cost(ledger: Engine) -> None:
    section = unit_economics(ledger, DAY, None)
    assert all(r["cost"] is None for r in section.rows)
    assert all(r["cost_per_million_requests"] is None for r in section.rows)
    assert by_key(section.rows)[("bert", "2")]["gpu_hours"] == 0.25
    assert "no rates defined: GPU-hours only" in section.notes
    assert any("0.483 GPU-hours;" in n for n in section.notes)


def test_filters_select_rows_after_the_figures_are_computed(ledger: Engine) -> None:
    book = rates(ledger)
    whole = by_key(unit_economics(ledger, DAY, book).rows)
    vision = unit_economics(ledger, DAY, book, filters={"team": "team-vision"})
    assert [(r["model"], r["version"]) for r in vision.rows] == [("resnet", "*"), ("resnet", "1")]
    # the unattributed rest is the platform team's (the serving job's account)
    assert not any("(unattributed)" in n for n in vision.notes)
    platform = unit_economics(ledger, DAY, book, filters={"team": "platform"})
    assert platform.rows == []
    assert any("team platform's serving jobs' (unattributed)" in n for n in platform.notes)
    one = unit_economics(ledger, DAY, book, filters={"model": "bert", "version": "2"})
    assert one.rows == [whole[("bert", "2")]]
    assert unit_economics(ledger, DAY, book, filters={"cluster": "lab"}).rows == list(
        whole.values()
    )
    with pytest.raises(WindowError, match="cannot filter by pool"):
        unit_economics(ledger, DAY, book, filters={"pool": "inference"})


def test_an_hour_window_reads_the_hourly_rows_the_same(ledger: Engine) -> None:
    hour = Window.parse("2026-11-03T10:00..2026-11-03T11:00")
    book = rates(ledger)
    assert unit_economics(ledger, hour, book).rows == unit_economics(ledger, DAY, book).rows


def test_another_cluster_or_window_has_nothing(ledger: Engine) -> None:
    other = unit_economics(ledger, DAY, None, cluster="elsewhere")
    assert other.rows == []
    assert "the ledger has no serving rows in this window" in other.notes
    assert unit_economics(ledger, Window.parse("2026-11-04"), None).rows == []


def test_missing_request_counters_and_models_without_counters(tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    record_serving(
        engine,
        "lab",
        [
            # an old server: no request counter at all
            pt("bert", "1", 0, 0, None, job="8"),
            pt("bert", "1", 30, 720, None, job="8"),
            # one sample only: the ledger books it from the job's start, but there is no
            # interval to count in the window
            pt("llama", "3", 20, 180, 50, job="8"),
        ],
    )
    ingest_records(engine, [serving_job("8", T0)], CTX)
    section = unit_economics(engine, DAY, rates(engine))
    rows = by_key(section.rows)
    assert set(rows) == {("bert", "*"), ("bert", "1"), ("llama", "*")}
    bert = rows[("bert", "1")]
    assert bert["requests"] is None
    assert bert["gpu_seconds_per_request"] is None
    assert bert["cost_per_million_requests"] is None
    assert bert["cost"] == Decimal("0.60")  # 720 GPU-seconds at 3.00
    llama = rows[("llama", "*")]
    assert (llama["requests"], llama["compute_gpu_seconds"]) == (None, None)
    assert llama["loaded_cost_per_million_requests"] is None
    assert llama["gpu_hours"] == 0.05  # 180 GPU-seconds
    assert any(
        n.startswith("GPU time but no Triton counters") and "llama" in n for n in section.notes
    )
