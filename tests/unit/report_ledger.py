"""The finance reports' test ledger (not a test module): a small SQLite file of two pools
of one 8-GPU node each, three teams over two days (training, elastic and inference work), a
team name that needs escaping in HTML, and rates; `render_page` renders its HTML report."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import Engine

from accounting.attribution import Context
from accounting.db import open_ledger
from accounting.html import render_html
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.rates import RateBook, RateSpec, add_rates, list_rates
from accounting.report import Window, build_report
from bridge.slurm.model import AccountingRecord

T0 = datetime(2026, 3, 2, tzinfo=UTC)
END = datetime(2026, 3, 4, tzinfo=UTC)
WINDOW = Window.parse("2026-03-02..2026-03-04")
#: a team name that needs escaping in HTML
VISION = "vision & <3d>"
TEAMS = ("alpha", "beta", VISION)


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


def _record(
    job: str, account: str, partition: str, node: str, gpus: int, start: datetime, end: datetime
) -> AccountingRecord:
    return AccountingRecord(
        cluster="c1",
        job_id=job,
        array_job_id=None,
        array_task_id=None,
        name=f"job{job}",
        partition=partition,
        account=account,
        user="u",
        qos="normal",
        state="COMPLETED",
        submit=start,
        start=start,
        end=end,
        elapsed_s=int((end - start).total_seconds()),
        nodes=(node,),
        gpus=gpus,
        gpu_type="H100",
        # the bridge tags its Triton jobs; their time is inference
        comment="stb:triton" if partition == "serve" else "",
        restarts=0,
    )


def build_ledger(directory: Path, *, rates: bool = True) -> Engine:
    """The test ledger in `directory`/l.db."""
    engine = open_ledger(f"sqlite:///{directory}/l.db")
    nodes = [NodeCapacity("n1", "train", "H100", 8), NodeCapacity("n2", "serve", "H100", 8)]
    record_inventory(engine, "c1", nodes, at=T0, backfill_from=T0)
    ctx = Context(
        pool_of_node={"n1": "train", "n2": "serve"},
        gpu_type_of_node={"n1": "H100", "n2": "H100"},
        workload_of_partition={"train": "training", "elastic": "elastic", "serve": "inference"},
        team_of_account={"vis": VISION},
        horizon=END,
        cluster="c1",
    )
    records = [
        _record("1", "alpha", "train", "n1", 4, _at(2, 1), _at(2, 11)),  # 40 GPU-h
        _record("2", "beta", "elastic", "n1", 2, _at(3, 5), _at(3, 15, 30)),  # 21 GPU-h
        _record("3", "vis", "serve", "n2", 8, _at(2, 12), _at(3, 12)),  # 192 GPU-h
        _record("4", "alpha", "train", "n1", 2, _at(3, 2), _at(3, 9)),  # 14 GPU-h
    ]
    ingest_records(engine, records, ctx, since=T0, until=END, now=END)
    if rates:
        add_rates(
            engine,
            [
                RateSpec("H100", Decimal("2.50"), date(2026, 1, 1)),
                RateSpec("H100", Decimal("3.10"), date(2026, 1, 1), pool="serve"),
            ],
        )
    return engine


def render_page(directory: Path, *, rates: bool = True, window: Window = WINDOW) -> str:
    """The HTML report of the test ledger over `window`, by team and workload."""
    engine = build_ledger(directory, rates=rates)
    book = RateBook(list_rates(engine))
    report = build_report(engine, window, ("team", "workload"), rates=book)
    return render_html(engine, report, book, generated_at=END)
