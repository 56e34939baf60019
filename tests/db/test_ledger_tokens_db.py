"""An LLM's tokens in the ledger, on SQLite and PostgreSQL: serving samples with the token
counters (as the daemon stores each scrape) next to a model without them, one serving job
booked through the real ingest, and the unit economics read back.

The reconciliation: the section's cost per million output tokens equals the ledger's
GPU-hours for the model (its booked rows, read by a plain report) x the rate / the
generated-token counter's increase over the same window, computed here from the recorded
counters by hand (a reload's reset included); the loaded figure the same with the model's
loaded GPU-hours. Also: versions keep their own counts, tokens beside requests in every
rendering, and a ledger at 0006 upgrades with its samples kept (tokens unknown: None).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from accounting.attribution import Context, ServingPoint
from accounting.db import current_revision, open_ledger, upgrade
from accounting.economics import COLUMNS, TOKEN_COLUMNS, unit_economics
from accounting.ingest import ingest_records
from accounting.rates import RateBook, RateSpec, add_rates, list_rates, money
from accounting.render import to_json
from accounting.report import Window, build_report
from accounting.samples import record_serving
from accounting.section import to_html, to_rich
from accounting.tables import SAMPLES
from bridge.db import make_engine
from bridge.slurm.model import AccountingRecord

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
M = timedelta(minutes=1)
DAY = Window.parse("2026-11-03")
RATE = Decimal("3.00")
CTX = Context(
    pool_of_node={"n4": "inference"},
    gpu_type_of_node={"n4": "h100"},
    workload_of_partition={"infer": "inference"},
    team_of_account={"bridge": "platform"},
    team_of_model={"smol": "team-chat", "busy": "team-vision"},
    known_gpu_types=frozenset({"h100"}),
)

# (minute, compute seconds, requests, prompt tokens, generated tokens): cumulative, as
# Triton's page says them at each scrape. Version 2 is reloaded between minutes 20 and 40
# (its counters start again from zero).
SMOL_1 = [(0, 0, 0, 0, 0), (20, 400, 100, 30_000, 12_000), (40, 800, 210, 61_000, 25_000),
          (59, 1200, 300, 90_000, 36_000)]  # fmt: skip
SMOL_2 = [(0, 0, 0, 0, 0), (20, 200, 40, 9_000, 8_000), (40, 100, 20, 4_000, 3_000),
          (59, 400, 90, 20_000, 12_000)]  # fmt: skip
# the counters' increases over the window, by hand (version 2: 8000, then 3000 after the
# reset, then 9000)
OUT_1, OUT_2 = 36_000, 8_000 + 3_000 + 9_000
IN_1, IN_2 = 90_000, 9_000 + 4_000 + 16_000
BUSY = [(0, 0, 0), (30, 450, 900), (59, 900, 1800)]


def serving_job(job: str = "7") -> AccountingRecord:
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="triton",
        partition="infer", account="bridge", user="stb", qos="normal", state="COMPLETED",
        submit=T0, start=T0, end=T0 + timedelta(hours=1), elapsed_s=3600, nodes=("n4",),
        gpus=1, gpu_type="h100", comment="stb:triton", restarts=0,
    )  # fmt: skip


def points() -> list[ServingPoint]:
    out = [
        ServingPoint("7", "n4:8000", "smol", T0 + m * M, s * 1e6, version, r, p, g)
        for version, series in (("1", SMOL_1), ("2", SMOL_2))
        for m, s, r, p, g in series
    ]
    out += [ServingPoint("7", "n4:8000", "busy", T0 + m * M, s * 1e6, "1", r) for m, s, r in BUSY]
    return out


def rates(engine: Engine) -> RateBook:
    add_rates(engine, [RateSpec("h100", RATE, date(2026, 1, 1))])
    return RateBook(list_rates(engine))


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["model"], r["version"]): r for r in rows}


@pytest.fixture
def ledger(database_url: str) -> Engine:
    """One 1-GPU serving job, 10:00-11:00: smol computes 1200 + 600 s, busy 900 s, the
    rest (900 s) unattributed."""
    engine = open_ledger(database_url)
    record_serving(engine, "lab", points())
    ingest_records(engine, [serving_job()], CTX)
    return engine


def test_cost_per_million_output_tokens_is_gpu_hours_x_rate_over_the_counter(
    ledger: Engine,
) -> None:
    book = rates(ledger)
    section = unit_economics(ledger, DAY, book)
    assert section.columns == COLUMNS + TOKEN_COLUMNS
    rows = by_key(section.rows)
    smol, v1, v2 = rows[("smol", "*")], rows[("smol", "1")], rows[("smol", "2")]
    assert (v1["output_tokens"], v2["output_tokens"]) == (OUT_1, OUT_2)
    assert (v1["input_tokens"], v2["input_tokens"]) == (IN_1, IN_2)
    assert (smol["output_tokens"], smol["input_tokens"]) == (OUT_1 + OUT_2, IN_1 + IN_2)

    # the ledger's own GPU time for smol, read as a plain report reads it
    booked = build_report(ledger, DAY, ("model",), filters={"workload": "inference"})
    smol_ms = sum(li.gpu_ms for li in booked.lines if li.keys["model"] == "smol")
    assert smol_ms == 1_800_000  # 1200 + 600 compute-seconds of the job's hour
    gpu_hours = Decimal(smol_ms) / Decimal(3_600_000)
    expected = money(gpu_hours * RATE / Decimal(OUT_1 + OUT_2) * Decimal(1_000_000))
    assert smol["cost_per_million_output_tokens"] == expected == Decimal("26.79")
    assert smol["cost_per_million_input_tokens"] == money(
        gpu_hours * RATE / Decimal(IN_1 + IN_2) * Decimal(1_000_000)
    )
    # per version: its share of the model's time (by compute) over its own counter
    v1_hours = Decimal(1_200_000) / Decimal(3_600_000)
    assert v1["cost_per_million_output_tokens"] == money(
        v1_hours * RATE / Decimal(OUT_1) * Decimal(1_000_000)
    )
    # the same money per request and per token: cost = per-request x requests
    assert smol["requests"] == 300 + 40 + 20 + 70
    assert smol["cost"] == Decimal("1.50")

    # loaded: smol's share of the job's 900 unattributed seconds (1800 : 900 with busy)
    loaded_hours = Decimal(1_800_000 + 600_000) / Decimal(3_600_000)
    assert smol["loaded_gpu_hours"] == pytest.approx(float(loaded_hours), abs=1e-6)
    assert smol["loaded_cost_per_million_output_tokens"] == money(
        loaded_hours * RATE / Decimal(OUT_1 + OUT_2) * Decimal(1_000_000)
    )
    assert smol["loaded_cost_per_million_input_tokens"] == money(
        loaded_hours * RATE / Decimal(IN_1 + IN_2) * Decimal(1_000_000)
    )

    # busy counts no tokens: its token cells are empty, its per-request figures as before
    busy = rows[("busy", "*")]
    assert busy["output_tokens"] is None and busy["cost_per_million_output_tokens"] is None
    assert busy["cost_per_million_requests"] == Decimal("416.67")  # 0.75 / 1800 requests
    assert any(n.startswith("input_tokens, output_tokens") for n in section.notes)


def test_without_rates_the_tokens_are_counted_and_nothing_is_priced(ledger: Engine) -> None:
    smol = by_key(unit_economics(ledger, DAY, None).rows)[("smol", "*")]
    assert smol["output_tokens"] == OUT_1 + OUT_2
    assert smol["cost_per_million_output_tokens"] is None
    assert smol["loaded_cost_per_million_input_tokens"] is None


def test_tokens_stand_beside_requests_in_every_rendering(ledger: Engine) -> None:
    book = rates(ledger)
    section = unit_economics(ledger, DAY, book)
    report = build_report(ledger, DAY, ("model",), rates=book)
    data = json.loads(to_json(report, [section]))["sections"]["unit_economics"]
    smol = next(r for r in data["rows"] if r["model"] == "smol" and r["version"] == "*")
    assert smol["cost_per_million_output_tokens"] == "26.79"
    assert smol["output_tokens"] == OUT_1 + OUT_2
    html = str(to_html(section))
    assert "cost_per_million_output_tokens" in html and "cost_per_million_requests" in html
    assert "26.79" in html
    header = [c.header for c in to_rich(section).columns]
    assert "loaded_cost_per_million_input_tokens" in header


def test_a_site_without_llms_keeps_its_columns(database_url: str) -> None:
    engine = open_ledger(database_url)
    record_serving(engine, "lab", [p for p in points() if p.model == "busy"])
    ingest_records(engine, [serving_job()], CTX)
    section = unit_economics(engine, DAY, rates(engine))
    assert section.columns == COLUMNS
    assert not any("tokens" in n for n in section.notes)


def test_a_ledger_at_0006_upgrades_and_keeps_its_samples(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0006")
    old = {
        "cluster": "lab", "job_id": "7", "instance": "n4:8000", "model": "busy", "version": "1",
        "at": T0, "compute_us": 1e6, "requests": 5.0,
    }  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(SAMPLES).values(**old))
    engine.dispose()
    engine = open_ledger(database_url)  # `stb db upgrade`'s way
    assert current_revision(engine) == "0008"
    with engine.connect() as conn:
        row = conn.execute(select(SAMPLES)).one()
    assert (row.requests, row.prompt_tokens, row.generation_tokens) == (5.0, None, None)
    record_serving(engine, "lab", [ServingPoint("7", "n4:8000", "smol", T0, 0.0, "1", 0, 0, 0)])
    with engine.connect() as conn:
        stored = conn.execute(select(SAMPLES).where(SAMPLES.c.model == "smol")).one()
    assert (stored.prompt_tokens, stored.generation_tokens) == (0.0, 0.0)


def test_scrapes_without_the_token_counters_are_said_not_guessed(database_url: str) -> None:
    engine = open_ledger(database_url)
    series = [
        ServingPoint("7", "n4:8000", "smol", T0, 0.0, "1", 0, 0, 0),
        ServingPoint("7", "n4:8000", "smol", T0 + 20 * M, 300e6, "1", 50, 4_000, 1_000),
        ServingPoint("7", "n4:8000", "smol", T0 + 40 * M, 600e6, "1", 90),  # no token counters
        ServingPoint("7", "n4:8000", "smol", T0 + 59 * M, 900e6, "1", 120, 9_000, 3_000),
    ]
    record_serving(engine, "lab", series)
    ingest_records(engine, [serving_job()], CTX)
    section = unit_economics(engine, DAY, rates(engine))
    smol = by_key(section.rows)[("smol", "1")]
    # only the interval with the counters at both ends: 0 -> 20 minutes
    assert (smol["input_tokens"], smol["output_tokens"]) == (4_000, 1_000)
    assert "tokens undercounted, some scrapes lacked the token counters: smol 1" in section.notes
