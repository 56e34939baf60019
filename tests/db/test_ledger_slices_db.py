"""MIG slices through the ledger's database (SQLite and PostgreSQL): a node of three slice
types has one inventory span per type, opened and closed together; a job on a slice books
its fraction under the slice's type, in bulk and by the reference writer alike; per cell
allocated + idle = the slice's capacity, a slice busy the whole hour leaves no idle; the
sreport agreement counts the slice back to one gres/gpu; a change of the rules re-books
the slice's record and nothing else; re-ingesting changes nothing."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from accounting.agreement import ledger_hour
from accounting.attribution import Context
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.tables import LEDGER, SPANS
from bridge.slurm.slices import SliceRules
from tests.db.helpers import fresh_ledger, rec, snapshot

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
H = 3_600_000
SLICES = (("h100_4g.40gb", 1), ("h100_2g.20gb", 1), ("h100_1g.10gb", 1))
CTX = Context(
    pool_of_node={"m1": "mig", "n1": "training"},
    gpu_type_of_node={"m1": "h100_4g.40gb", "n1": "h100"},
    known_gpu_types=frozenset({"h100", *(t for t, _ in SLICES)}),
    horizon=T0 + timedelta(hours=3),
    cluster="lab",
)


def _records() -> list:  # type: ignore[type-arg]
    one = dataclasses.replace(
        rec("1", T0, T0 + timedelta(hours=2), nodes=("m1",), gpus=1, partition="mig",
            gpu_type="h100_1g.10gb"),
        gpu_tres="gres/gpu=1,gres/gpu:h100_1g.10gb=1",
    )  # fmt: skip
    two = dataclasses.replace(
        rec("2", T0 + timedelta(minutes=30), T0 + timedelta(minutes=90), nodes=("m1",),
            gpus=1, partition="mig", gpu_type="h100_2g.20gb", account="team-vision"),
        gpu_tres="gres/gpu=1,gres/gpu:h100_2g.20gb=1",
    )  # fmt: skip
    plain = rec("3", T0, T0 + timedelta(hours=1), nodes=("n1",), gpus=2)
    return [one, two, plain]


def _ingest(engine, ctx: Context = CTX, bulk: bool = True):  # type: ignore[no-untyped-def]
    return ingest_records(
        engine, _records(), ctx, since=T0, until=T0 + timedelta(hours=3),
        now=T0 + timedelta(hours=3), bulk=bulk,
    )  # fmt: skip


def test_slices_book_their_fraction_and_their_capacity(database_url: str, tmp_path: Path) -> None:
    engine = fresh_ledger(database_url, tmp_path, "slices")
    inventory = [NodeCapacity("m1", "mig", t, n) for t, n in SLICES]
    inventory.append(NodeCapacity("n1", "training", "h100", 4))
    record_inventory(engine, "lab", inventory, T0 + timedelta(hours=3), backfill_from=T0)
    # the same inventory again opens or closes nothing
    assert record_inventory(engine, "lab", inventory, T0 + timedelta(hours=3)) == 0
    _ingest(engine)

    with engine.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.source, LEDGER.c.gpu_type, LEDGER.c.bucket, LEDGER.c.workload,
                   LEDGER.c.gpu_ms).where(LEDGER.c.pool == "mig")
        ).all()  # fmt: skip
    by_job: dict[tuple[str, str], int] = defaultdict(int)
    cells: dict[tuple[str, datetime], int] = defaultdict(int)
    idle: dict[tuple[str, datetime], int] = defaultdict(int)
    for source, gpu_type, bucket, workload, ms in rows:
        bucket = bucket if bucket.tzinfo else bucket.replace(tzinfo=UTC)
        by_job[(source.split(":")[1] if source != "capacity" else source, gpu_type)] += ms
        cells[(gpu_type, bucket)] += ms
        if workload == "idle":
            idle[(gpu_type, bucket)] += ms
    # job 1: two hours of a 1g slice (1/7); job 2: an hour of a 2g slice (2/7)
    assert abs(by_job[("1", "h100_1g.10gb")] - 2 * H / 7) < 2
    assert abs(by_job[("2", "h100_2g.20gb")] - 2 * H / 7) < 2
    # per slice type and hour: allocated + idle = its capacity; the 1g slice, busy both
    # hours, has no idle
    for (gpu_type, bucket), ms in cells.items():
        units = dict(SLICES)[gpu_type] * int(gpu_type.split("_")[1][0])
        assert abs(ms - units * H / 7) < 2, (gpu_type, bucket, ms)
    assert not [k for k in idle if k[0] == "h100_1g.10gb" and k[1] < T0 + timedelta(hours=2)]
    # sreport's count: the slices as three gres/gpu, four whole GPUs, each second of the hour
    hour = ledger_hour(engine, "lab", T0)
    assert hour.reported == (3 + 4) * 3600
    # job 1's slice the whole hour, job 2's from 10:30, the plain job's two GPUs
    assert hour.allocated == 3600 + 1800 + 2 * 3600

    # re-ingesting changes nothing; the reference writer books the same rows
    before = snapshot(engine)
    again = _ingest(engine)
    assert (again.new, again.changed, again.rows_written) == (0, 0, 0)
    after = snapshot(engine)
    del after["ingest_run"], before["ingest_run"]  # a line per ingest
    assert after == before
    ref = fresh_ledger(database_url, tmp_path, "reference")
    record_inventory(ref, "lab", inventory, T0 + timedelta(hours=3), backfill_from=T0)
    _ingest(ref, bulk=False)
    assert snapshot(ref)["ledger_row"] == after["ledger_row"]  # same ids on a fresh ledger
    ref.dispose()

    # a change of the rules re-books the slice runs, never the whole-GPU one
    memory = dataclasses.replace(CTX, slices=SliceRules(share="memory", gpu_memory_gb={"h100": 80}))
    changed = _ingest(engine, memory)
    assert changed.changed == 2
    with engine.connect() as conn:
        spans = conn.execute(select(SPANS.c.node, SPANS.c.gpu_type).where(SPANS.c.node == "m1"))
        assert sorted(spans) == sorted(("m1", t) for t, _ in SLICES)
    engine.dispose()
