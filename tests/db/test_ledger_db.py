"""The ledger on SQLite and PostgreSQL: migrations, bad input, closed periods, rates,
the serving split from stored samples, a running job that later ends.

Every bad input must leave the ledger exactly as it was: the tests compare the whole
ledger before and after.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, func, inspect, select
from sqlmodel import SQLModel

from accounting.attribution import Context, ServingPoint
from accounting.db import current_revision, downgrade, head_revision, open_ledger
from accounting.errors import ClosedPeriodError, IngestError, LedgerError, RateError
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.periods import close_period
from accounting.rates import RateBook, RateSpec, add_rates, list_rates
from accounting.report import Window, build_report
from accounting.samples import record_serving
from accounting.schema import IDLE_TEAM, LEDGER_TABLES, UNATTRIBUTED, Restatement
from accounting.tables import LEDGER, SOURCES
from bridge.config import BridgeConfig
from bridge.ledger.feed import ingest_window
from bridge.slurm import UnparseableOutput
from bridge.slurm.model import AccountingRecord, Node, SlurmEvent
from bridge.slurm.sacct import parse_sacct_json
from bridge.slurm.scontrol import parse_nodes
from tests.db.helpers import rec, snapshot, table_of

DATA = Path(__file__).parent.parent / "data" / "slurm"
T0 = datetime(2026, 10, 31, 22, 0, tzinfo=UTC)  # two hours before a month boundary
CTX = Context(
    pool_of_node={"n1": "training", "n2": "training", "n3": "elastic", "n4": "inference"},
    gpu_type_of_node={"n1": "h100", "n2": "h100", "n3": "h100", "n4": "h100"},
    workload_of_partition={"train": "training", "elastic": "elastic", "infer": "inference"},
    team_of_account={"bridge": "platform"},
    team_of_model={"busy": "team-vision"},
    known_gpu_types=frozenset({"h100"}),
    horizon=T0 + timedelta(hours=4),
)


@pytest.fixture
def ledger(database_url: str) -> Engine:
    engine = open_ledger(database_url)
    record_inventory(
        engine, "lab",
        [NodeCapacity(n, CTX.pool_of_node[n], "h100", 4) for n in ("n1", "n2", "n3", "n4")],
        T0 + timedelta(hours=4), backfill_from=T0,
    )  # fmt: skip
    return engine


def test_migrations_build_exactly_the_models(database_url: str) -> None:
    engine = open_ledger(database_url)
    assert current_revision(engine) == head_revision() == "0008"
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = [
            d for d in compare_metadata(ctx, SQLModel.metadata)
            if table_of(d) in LEDGER_TABLES
        ]  # fmt: skip
    assert diff == []
    downgrade(engine, "base")
    assert not LEDGER_TABLES & set(inspect(engine).get_table_names())
    open_ledger(database_url)  # and up again
    assert set(inspect(engine).get_table_names()) >= LEDGER_TABLES


def test_a_job_across_the_month_boundary_is_split_by_hour_and_month(ledger: Engine) -> None:
    job = rec("1", T0 + timedelta(minutes=30), T0 + timedelta(hours=2, minutes=15))
    summary = ingest_records(ledger, [job], CTX)
    assert (summary.new, summary.rows_written > 0) == (1, True)
    with ledger.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.month, LEDGER.c.bucket, LEDGER.c.gpu_ms).where(
                LEDGER.c.source == job.key
            )
        ).all()
    assert [(m, ms) for m, _, ms in sorted(rows, key=lambda r: r[1])] == [
        ("2026-10", 2 * 30 * 60_000),
        ("2026-10", 2 * 60 * 60_000),
        ("2026-11", 2 * 15 * 60_000),
    ]
    assert sum(ms for *_, ms in rows) == job.gpu_seconds * 1000


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (rec("9", T0, T0 + timedelta(hours=1), gpu_type="a100"), "unknown GPU type 'a100'"),
        (rec("9", T0 + timedelta(hours=1), T0), "ends .* before it starts"),
        (rec("9", T0, T0 + timedelta(hours=1), gpus=-1), "negative GPU count"),
        (rec("9", T0, T0 + timedelta(hours=1), comment="stb:workload=gaming"), "unknown workload"),
        (rec("9", T0, T0 + timedelta(hours=1), nodes=("n9",), gpu_type=None), "no GPU type"),
    ],
)
def test_a_bad_record_is_named_and_nothing_is_written(
    ledger: Engine, bad: AccountingRecord, message: str
) -> None:
    before = snapshot(ledger)
    good = [rec(str(i), T0, T0 + timedelta(minutes=10 * i)) for i in range(1, 4)]
    with pytest.raises(IngestError, match=message) as info:
        ingest_records(ledger, [*good, bad, *good], CTX, chunk_size=2)
    assert info.value.key == bad.key
    assert f"record {bad.key}" in str(info.value)
    assert snapshot(ledger) == before


def test_closed_periods_refuse_changes_unless_restated_with_a_reason(ledger: Engine) -> None:
    job = rec("1", T0, T0 + timedelta(hours=3))
    ingest_records(ledger, [job], CTX)
    close_period(ledger, "2026-10")
    with pytest.raises(LedgerError, match="already closed"):
        close_period(ledger, "2026-10")
    longer = rec("1", T0, T0 + timedelta(hours=3), gpus=4)
    before = snapshot(ledger)
    with pytest.raises(ClosedPeriodError, match="closed period 2026-10"):
        ingest_records(ledger, [longer], CTX)
    assert snapshot(ledger) == before
    with pytest.raises(LedgerError, match="needs a reason"):
        ingest_records(ledger, [longer], CTX, restate=True)
    summary = ingest_records(ledger, [longer], CTX, restate=True, reason="gres was misreported")
    assert summary.restated == ["2026-10"]
    with ledger.connect() as conn:
        logged = conn.execute(select(Restatement.__table__)).all()  # type: ignore[attr-defined]
        total = conn.scalar(select(func.sum(LEDGER.c.gpu_ms)).where(LEDGER.c.source == job.key))
    assert [(r.month, r.old_gpu_ms, r.new_gpu_ms, r.reason) for r in logged] == [
        ("2026-10", 2 * 2 * 3_600_000, 4 * 2 * 3_600_000, "gres was misreported")
    ]
    assert total == 4 * 3 * 3_600_000
    # A change that touches only the open month needs no restatement.
    ingest_records(
        ledger, [rec("2", T0 + timedelta(hours=2, minutes=5), T0 + timedelta(hours=3))], CTX
    )


def test_a_running_job_grows_until_it_ends_without_double_counting(ledger: Engine) -> None:
    start = T0 + timedelta(minutes=10)
    running = rec("5", start, None, state="RUNNING")
    ctx1 = Context(**{**CTX.__dict__, "horizon": T0 + timedelta(hours=1)})
    ingest_records(ledger, [running], ctx1)
    done = rec("5", start, T0 + timedelta(hours=2))
    summary = ingest_records(ledger, [done], CTX)
    assert (summary.new, summary.changed) == (0, 1)
    with ledger.connect() as conn:
        total = conn.scalar(select(func.sum(LEDGER.c.gpu_ms)).where(LEDGER.c.source == done.key))
        sources = conn.scalar(select(func.count()).select_from(SOURCES))
    assert total == done.gpu_seconds * 1000
    assert sources == 1


def test_a_record_slurmdbd_has_not_finished_is_deferred_not_booked(ledger: Engine) -> None:
    partial = rec("6", T0, T0 + timedelta(seconds=5), nodes=(), partition="")
    summary = ingest_records(ledger, [partial], CTX)
    assert [k for k, _ in summary.deferred] == [partial.key]
    assert summary.new == 0
    with ledger.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(SOURCES)) == 0
        assert (
            conn.scalar(
                select(func.count()).select_from(LEDGER).where(LEDGER.c.source == partial.key)
            )
            == 0
        )
    # Once slurmdbd has merged the record, the next ingest books it.
    whole = rec("6", T0, T0 + timedelta(seconds=5))
    assert ingest_records(ledger, [whole], CTX).new == 1


def test_the_serving_job_is_split_by_stored_compute_samples(ledger: Engine) -> None:
    start, end = T0, T0 + timedelta(hours=1)
    job = rec("7", start, end, nodes=("n4",), gpus=1, partition="infer", account="bridge",
              comment="stb:triton,stb:baseline")  # fmt: skip
    points = [
        ServingPoint("7", "127.0.1.4:8000", "busy", start + timedelta(minutes=30), 600e6),
        ServingPoint("7", "127.0.1.4:8000", "busy", start + timedelta(minutes=40), 100e6),  # reset
        ServingPoint("7", "127.0.1.4:8000", "echo", start + timedelta(minutes=50), 300e6),
    ]
    record_serving(ledger, "lab", points)
    record_serving(ledger, "lab", points)  # stored once
    ingest_records(ledger, [job], CTX)
    with ledger.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.model, LEDGER.c.team, LEDGER.c.gpu_ms).where(LEDGER.c.source == job.key)
        ).all()
    got = {m: (t, ms) for m, t, ms in rows}
    assert got == {
        "busy": ("team-vision", 700_000),  # 600 s, then 100 s after the counter reset
        "echo": ("platform", 300_000),
        UNATTRIBUTED: ("platform", 3_600_000 - 1_000_000),
    }
    # A later sample changes the split on re-ingest (the record's digest includes them).
    record_serving(ledger, "lab", [ServingPoint("7", "127.0.1.4:8000", "echo", end, 400e6)])
    assert ingest_records(ledger, [job], CTX).changed == 1


def test_rates_refuse_overlaps_and_price_the_report(ledger: Engine) -> None:
    h100 = RateSpec("h100", Decimal("2.50"), date(2026, 1, 1), date(2026, 11, 1))
    add_rates(ledger, [h100, RateSpec("h100", Decimal("3.00"), date(2026, 11, 1))])
    add_rates(ledger, [RateSpec("h100", Decimal("1.25"), date(2026, 1, 1), pool="elastic")])
    before = snapshot(ledger)
    with pytest.raises(RateError, match="overlaps"):
        add_rates(ledger, [RateSpec("h100", Decimal("9"), date(2026, 10, 15), date(2026, 10, 20))])
    with pytest.raises(RateError, match="valid_to must be after"):
        add_rates(ledger, [RateSpec("a100", Decimal("1"), date(2026, 2, 1), date(2026, 1, 1))])
    with pytest.raises(RateError, match="prices in USD"):
        add_rates(ledger, [RateSpec("a100", Decimal("1"), date(2026, 1, 1), currency="EUR")])
    assert snapshot(ledger) == before

    ingest_records(ledger, [
        rec("1", T0, T0 + timedelta(hours=3)),  # 2 h in October, 1 h in November, 2 GPUs
        rec("2", T0, T0 + timedelta(hours=1), nodes=("n3",), partition="elastic", gpus=4),
    ], CTX, since=T0, until=T0 + timedelta(hours=3))  # fmt: skip
    book = RateBook(list_rates(ledger))
    window = Window.parse("2026-10-31..2026-11-02")
    rep = build_report(ledger, window, ["team", "workload"], rates=book)
    cost = {(li.keys["team"], li.keys["workload"]): li.cost for li in rep.lines}
    assert cost[("team-nlp", "training")] == Decimal("2.50") * 4 + Decimal("3.00") * 2
    assert cost[("team-nlp", "elastic")] == Decimal("1.25") * 4
    # Idle: 16 GPUs x 3 h = 48 GPU-h capacity, 6 + 4 used.
    idle_hours = sum(li.gpu_ms for li in rep.lines if li.keys["workload"] == "idle") / 3.6e6
    assert idle_hours == 48 - 10
    shared = build_report(ledger, window, ["team"], rates=book, idle="shared")
    assert shared.total_cost == rep.total_cost  # shared out, not lost
    # Each pool's idle goes to its users; the inference pool had none, so its idle stays.
    assert [li.cost for li in shared.lines if li.keys["team"] == IDLE_TEAM] == [
        4 * 2 * Decimal("2.50") + 4 * Decimal("3.00")
    ]
    assert any("inference stays on the idle line" in n for n in shared.notes), shared.notes
    # No rate for a GPU type in use: a clear error, not a silent zero.
    with pytest.raises(RateError, match="no rate for GPU type 'h100' on 2025-12-31"):
        RateBook([RateSpec("h100", Decimal(1), date(2026, 1, 1))]).price(
            "h100", "training", "normal", date(2025, 12, 31)
        )


class _RecordedSlurm:
    """Answers `nodes()` and `accounting()` from recorded 22.05 output (the two calls an
    ingest makes); the sacct text may be corrupted by the test."""

    def __init__(self, sacct_text: str) -> None:
        self.sacct_text = sacct_text

    def nodes(self) -> list[Node]:
        return parse_nodes((DATA / "scontrol-nodes-22.05.txt").read_text())

    def cluster_name(self) -> str:
        return "cluster"

    def accounting(self, since: datetime, until: datetime) -> list[AccountingRecord]:
        return parse_sacct_json(self.sacct_text)

    def events(self, since: datetime, until: datetime) -> list[SlurmEvent]:
        return []


def _corrupt_job_id(jobs: list[dict[str, Any]]) -> None:
    jobs[-1]["job_id"] = "not-a-number"


def _unknown_gpu_type(jobs: list[dict[str, Any]]) -> None:
    """The first job that holds GPUs asks for a type the cluster does not have."""
    for tres in jobs[0]["tres"]["allocated"]:
        if tres["type"] == "gres" and tres["name"] == "gpu:h100":
            tres["name"] = "gpu:a100"


@pytest.mark.parametrize(
    ("corrupt", "error", "message"),
    [
        (_corrupt_job_id, UnparseableOutput, "not-a-number"),
        (_unknown_gpu_type, IngestError, "unknown GPU type 'a100'"),
    ],
)
def test_a_bad_sacct_record_is_named_and_nothing_is_written(
    database_url: str, corrupt: Any, error: type[Exception], message: str
) -> None:
    text = (DATA / "sacct-requeue-22.05.json").read_text()
    doc = json.loads(text)
    corrupt(doc["jobs"])
    ledger = open_ledger(database_url)
    before = snapshot(ledger)
    slurm = _RecordedSlurm(json.dumps(doc))
    start = min(r.start for r in parse_sacct_json(text) if r.start)
    since = start.replace(minute=0, second=0)
    with pytest.raises(error, match=message):
        ingest_window(
            BridgeConfig(),
            slurm,
            ledger,
            since,
            since + timedelta(hours=2),  # type: ignore[arg-type]
            now=since + timedelta(hours=2),
            events=False,
        )
    assert snapshot(ledger) == before  # not even the inventory
