"""The agreement check's `rollup_view`: the ledger's hour counted by slurmdbd's rollup rules
(the cluster clamped as a whole; node events over the hour's registrations and the gaps
between them), from the ledger's own stored events and allocation. Each case is one the
ledger books differently on purpose, with the figures sreport's rollup would give
(as_mysql_rollup.c at slurm-22-05-8-1, `_setup_cluster_usage`, `_setup_cluster_tres_usage`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from accounting.agreement import compare, ledger_hour, rollup_view
from accounting.db import open_ledger
from bridge.ledger.feed import ingest_window
from bridge.slurm.model import AccountingRecord, SlurmEvent
from tests.unit.fakes import N3, N5, EventSlurm, make_config

T0 = datetime(2026, 11, 29, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
REG = "Cluster Registered TRES"
NODES = [replace(N5, gpu_type="h100"), replace(N3, gpu_type="h100")]  # 4 GPUs each


def _job(start: datetime, end: datetime) -> AccountingRecord:
    return AccountingRecord(
        cluster="stblab", job_id="7", array_job_id=None, array_task_id=None, name="x",
        partition="train", account="a", user="u", qos="normal", state="COMPLETED",
        submit=start, start=start, end=end, elapsed_s=int((end - start).total_seconds()),
        nodes=("n5",), gpus=4, gpu_type="h100", comment="", restarts=0,
    )  # fmt: skip


def _down(node: str, start: datetime, end: datetime) -> SlurmEvent:
    return SlurmEvent("stblab", node, (node,), start, end, 1, "DOWN", "root(0)", "test", 4)


def _ledger(tmp_path: Path, jobs: list[AccountingRecord], events: list[SlurmEvent]):  # type: ignore[no-untyped-def]
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    now = T0 + 2 * H
    slurm = EventSlurm(NODES, jobs, events)
    ingest_window(make_config(tmp_path), slurm, engine, T0 - H, now, now=now)  # type: ignore[arg-type]
    return engine, now


def test_down_time_under_a_job_is_clamped_for_the_cluster_not_the_pool(tmp_path: Path) -> None:
    # n5's 4 GPUs run a job all hour; n5 is down for 10 minutes of it (a job slurmctld
    # ended only later); n3 idles
    events = [
        SlurmEvent("stblab", "", ("n3", "n5"), T0 - 2 * H, None, 0, "", "", REG, 8),
        _down("n5", T0 + 10 * M, T0 + 20 * M),
    ]
    engine, now = _ledger(tmp_path, [_job(T0 - H, T0 + 2 * H)], events)
    led = ledger_hour(engine, "stblab", T0)
    # the ledger books n5's GPUs once, to the job: no down time in the training pool
    assert (led.allocated, led.down, led.idle, led.reported) == (14_400, 0, 14_400, 28_800)
    view = rollup_view(engine, "stblab", T0, now)
    # sreport: the cluster has room, so the 4 x 600 s stay down, out of n3's idle time
    assert (view.allocated, view.down, view.idle, view.reported) == (14_400, 2_400, 12_000, 28_800)
    assert view.accounts == led.accounts == {"a": 14_400}
    assert compare(T0, view, led) != []


def test_node_events_count_across_a_registration_gap(tmp_path: Path) -> None:
    # the cluster registered again with other TRES: a 10-minute gap; n3 down across it
    events = [
        SlurmEvent("stblab", "", ("n3", "n5"), T0 - 2 * H, T0 + 20 * M, 0, "", "", REG, 8),
        SlurmEvent("stblab", "", ("n3", "n5"), T0 + 30 * M, None, 0, "", "", REG, 8),
        _down("n3", T0 + 15 * M, T0 + 35 * M),
    ]
    engine, now = _ledger(tmp_path, [], events)
    led = ledger_hour(engine, "stblab", T0)
    # capacity 8 GPUs x 50 min; down only while registered: 4 x 10 min
    assert (led.down, led.idle, led.reported) == (2_400, 21_600, 24_000)
    view = rollup_view(engine, "stblab", T0, now)
    # sreport counts n3's down time over the gap too: 4 x 20 min, out of idle
    assert (view.down, view.idle, view.reported) == (4_800, 19_200, 24_000)


def test_an_hour_without_either_case_is_the_ledgers_own(tmp_path: Path) -> None:
    events = [
        SlurmEvent("stblab", "", ("n3", "n5"), T0 - 2 * H, None, 0, "", "", REG, 8),
        _down("n3", T0 + 10 * M, T0 + 20 * M),
    ]
    engine, now = _ledger(tmp_path, [_job(T0 - H, T0 + 2 * H)], events)
    led = ledger_hour(engine, "stblab", T0)
    assert led.down == 2_400
    view = rollup_view(engine, "stblab", T0, now)
    assert compare(T0, view, led) == []
