"""The daily roll-up and the ingest's worker processes, on both backends.

- `ledger_day` always equals `ledger_row` summed per day over every key but the user and
  the source, and a report read from it equals the same report read from the hourly rows
  (keys, steps, filters, idle shared, windows of whole days), after a first ingest, a
  re-ingest that changes records (rows replaced) and more serving samples, one after the
  inventory changed (idle recomputed), and a restatement of a closed month.
- `ingest_documents` (read and prepared in worker processes, or in this one) writes exactly
  the ledger `ingest_records` writes, row for row, ids included; a bad record or an
  unreadable document raises the same error and writes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from accounting.errors import IngestError
from accounting.ingest import ingest_documents, ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.periods import close_period
from accounting.rates import RateBook, RateSpec, add_rates, list_rates
from accounting.report import Window, build_report
from accounting.rollup import DAYS, LEDGER
from accounting.samples import record_serving
from accounting.schema import DAY_KEYS
from bridge.slurm import UnparseableOutput
from bridge.slurm.model import AccountingRecord
from tests.db.helpers import fresh_ledger, rec, snapshot
from tests.db.ledger_scenario import CTX, NODES, NOW, T0, points, records

WINDOWS = ("2026-10", "2026-11", "2026-10-31..2026-11-02", "2026-11-01")
KEYS: list[tuple[str, ...]] = [
    ("team",), ("team", "workload"), ("pool", "gpu_type"), ("model",), ("account", "qos"),
    ("lease", "partition", "cluster"), ("user",), ("source",), ("pool", "lent"), (),
]  # fmt: skip


def read_document(document: Sequence[AccountingRecord]) -> list[AccountingRecord]:
    """A `read` for `ingest_documents` (module level: it runs in worker processes)."""
    return list(document)


def read_unparseable(document: Any) -> list[AccountingRecord]:
    """Records, or for anything but a list of them the parser's error."""
    if isinstance(document, list):
        return document
    raise UnparseableOutput("sacct --json", f"not JSON: {document}")


def _day_sums(engine: Engine) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(ledger_row summed per roll-up cell, ledger_day), both sorted."""
    keys = [LEDGER.c.day, *(LEDGER.c[k] for k in DAY_KEYS)]
    with engine.connect() as conn:
        base = conn.execute(
            select(*keys, LEDGER.c.month, func.sum(LEDGER.c.gpu_ms)).group_by(*keys, LEDGER.c.month)
        ).all()
        day_keys = [DAYS.c.day, *(DAYS.c[k] for k in DAY_KEYS)]
        rolled = conn.execute(select(*day_keys, DAYS.c.month, DAYS.c.gpu_ms)).all()
    return sorted((*r[:-1], int(r[-1])) for r in base), sorted(tuple(r) for r in rolled)


def _assert_reports_agree(engine: Engine) -> int:
    """Every report read both ways; returns how many read the roll-up."""
    base, rolled = _day_sums(engine)
    assert rolled == base and base
    rates = RateBook(list_rates(engine))
    used = 0
    for window, by, step, idle in itertools.product(
        WINDOWS, KEYS, (None, "day", "month"), ("line", "shared")
    ):
        w = Window.parse(window)
        for filters in ({}, {"workload": "training"}, {"pool": "inference"}):
            kw: dict[str, Any] = dict(by=by, step=step, idle=idle, rates=rates, filters=filters)
            got = build_report(engine, w, **kw).as_dict()
            want = build_report(engine, w, rollup=False, **kw).as_dict()
            assert got == want, (window, by, step, idle, filters)
            used += "user" not in by and "source" not in by
    return used


def test_the_roll_up_equals_the_hourly_rows_through_changes_idle_and_restatements(
    database_url: str, tmp_path: Path
) -> None:
    engine = fresh_ledger(database_url, tmp_path, "rollup")
    add_rates(
        engine,
        [
            RateSpec("h100", Decimal("2.5"), date(2026, 1, 1), pool="training", currency="EUR"),
            RateSpec("h100", Decimal("1.75"), date(2026, 1, 1), currency="EUR"),
        ],
        now=NOW,
    )
    nodes = [NodeCapacity(n, CTX.pool_of_node[n], "h100", 8) for n in NODES]
    record_inventory(
        engine, "lab", nodes, T0 + timedelta(hours=1), backfill_from=T0 - timedelta(hours=1)
    )
    record_serving(engine, "", points(False))
    ingest_records(engine, records(False), CTX, chunk_size=4, now=NOW)
    assert _assert_reports_agree(engine) > 100
    # the running job ended, more samples: rows replaced
    record_serving(engine, "", points(True))
    s = ingest_records(engine, records(True), CTX, chunk_size=4, now=NOW + timedelta(hours=1))
    assert s.changed > 0
    _assert_reports_agree(engine)
    # a node left the pool: idle recomputed for the window
    record_inventory(engine, "lab", nodes[1:], T0 + timedelta(hours=2))
    later = NOW + timedelta(hours=2)
    s = ingest_records(
        engine, records(True), CTX, since=T0, until=T0 + timedelta(hours=5), now=later
    )
    assert s.idle_hours and s.unchanged
    _assert_reports_agree(engine)
    # October closed, then restated with a record that changes it
    close_period(engine, "2026-10", now=later)
    moved = [rec("1", T0, T0 + timedelta(hours=3), nodes=("n1", "n2"), gpus=4)]
    s = ingest_records(engine, moved, CTX, restate=True, reason="sacct corrected", now=later)
    assert s.restated == ["2026-10"]
    _assert_reports_agree(engine)
    engine.dispose()


def test_a_report_of_part_of_a_day_or_by_hour_reads_the_hourly_rows(
    database_url: str, tmp_path: Path
) -> None:
    engine = fresh_ledger(database_url, tmp_path, "partial")
    ingest_records(engine, records(True), CTX, now=NOW)
    with engine.begin() as conn:  # a roll-up that disagrees would show
        conn.execute(DAYS.update().values(gpu_ms=DAYS.c.gpu_ms + 1))
    for window, step in (("2026-10-31T22:00..2026-11-01T03:00", None), ("2026-11", "hour")):
        w = Window.parse(window)
        got = build_report(engine, w, step=step).as_dict()
        assert got == build_report(engine, w, step=step, rollup=False).as_dict()
    w = Window.parse("2026-11")
    assert build_report(engine, w).as_dict() != build_report(engine, w, rollup=False).as_dict()
    engine.dispose()


@pytest.mark.parametrize("workers", [1, 0])
def test_ingest_documents_writes_what_ingest_records_writes(
    database_url: str, tmp_path: Path, workers: int
) -> None:
    def run(engine: Engine, documents: bool) -> dict[str, list[Any]]:
        record_inventory(
            engine, "lab", [NodeCapacity(n, CTX.pool_of_node[n], "h100", 8) for n in NODES],
            T0 + timedelta(hours=1), backfill_from=T0 - timedelta(hours=1),
        )  # fmt: skip
        for k, (ended, later) in enumerate([(False, False), (True, True), (True, True)]):
            record_serving(engine, "", points(later))
            recs = records(ended)
            now = NOW + k * timedelta(hours=1)
            if documents:  # three documents, the middle one empty
                docs = [recs[:5], [], recs[5:]]
                ingest_documents(
                    engine, docs, read_document, CTX, workers=workers, chunk_size=3, now=now
                )
            else:
                ingest_records(engine, recs, CTX, chunk_size=3, now=now, bulk=False)
        snap = snapshot(engine)
        snap["ingest_run"] = [r[:2] + r[3:] for r in snap["ingest_run"]]  # not finished_at
        return snap

    engine = fresh_ledger(database_url, tmp_path, "records")
    want = run(engine, documents=False)
    engine.dispose()
    engine = fresh_ledger(database_url, tmp_path, "documents")
    got = run(engine, documents=True)
    assert len(want["ledger_row"]) > 40 and want["ledger_day"]
    for table in want:
        assert got[table] == want[table], table

    before = snapshot(engine)
    bad = rec("99", T0, T0 + timedelta(hours=1), gpu_type="a100")
    with pytest.raises(IngestError, match=r"record lab:99:.*unknown GPU type 'a100'"):
        ingest_documents(
            engine, [records(True), [bad]], read_document, CTX, workers=workers, now=NOW
        )
    with pytest.raises(UnparseableOutput, match="cannot parse sacct --json: 'not JSON: 7'") as e:
        ingest_documents(engine, [records(True), 7], read_unparseable, CTX, workers=workers)
    assert e.value.raw == "not JSON: 7"
    assert snapshot(engine) == before
    engine.dispose()


def test_lent_time_shows_in_the_lending_pool_as_lent(database_url: str, tmp_path: Path) -> None:
    """The derived key `lent`: a lent node's serving time (rows under a lease) is `lent` in
    the pool it was lent from, the rest `own`; from the roll-up and the hourly rows alike."""
    engine = fresh_ledger(database_url, tmp_path, "lent")
    ctx = replace(CTX, pool_of_lease={"L1": "elastic"})
    lent = rec(
        "40", T0, T0 + timedelta(minutes=90), nodes=("n3",), gpus=8, partition="infer",
        comment="stb:triton,stb:lease=L1",
    )  # fmt: skip
    ingest_records(engine, [*records(True), lent], ctx, now=NOW)
    for rollup in (True, False):
        w = Window.parse("2026-10-31..2026-11-02")
        rep = build_report(engine, w, ("pool", "lent"), rollup=rollup)
        lines = {tuple(li.keys.values()): li.gpu_ms for li in rep.lines}
        assert lines[("elastic", "lent")] == 8 * 90 * 60_000
        assert not any(k[1] == "lent" for k in lines if k != ("elastic", "lent"))
        assert ("elastic", "own") in lines and ("training", "own") in lines
    engine.dispose()
