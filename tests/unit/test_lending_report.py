"""The lending view (bridge.ledger.lending): the pure core's GPU-ms per pool and phase on
hand-built timelines, and the section built from a real lease store and ledger (SQLite
files): phases clipped at the window, lent time and borrowers from the ledger, the cost
with rates, the note for nodes with no inventory."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert

from accounting.attribution import Entry
from accounting.buckets import MS_PER_HOUR
from accounting.db import open_ledger
from accounting.rates import RateBook, RateSpec, money
from accounting.report import Window
from accounting.schema import NodeSpan
from bridge.db import make_engine, write_transaction
from bridge.leases.store import LeaseStore, create_schema
from bridge.ledger.lending import (
    TOTAL,
    LeaseTimeline,
    NodeGpus,
    lending_section,
    phase_gpu_ms,
)
from bridge.lifecycle import LeaseState
from bridge.slurm.slices import SliceRules
from tests.unit.helpers import insert_entries

S = LeaseState
DAY = Window(datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC), "2026-11-02")
AFTER = datetime(2026, 11, 4, tzinfo=UTC)  # "now" for the reports: the window is over


def t(day: int, hh: int, mm: int = 0, ss: int = 0) -> datetime:
    return datetime(2026, 11, day, hh, mm, ss, tzinfo=UTC)


# ---- the pure core ---------------------------------------------------------------------


def test_core_phases_on_hand_built_timelines() -> None:
    h100 = NodeGpus(4, "h100")
    leases = [
        # served, then returned: 30 s wait, 120 s startup, 90 s drain (draining + releasing)
        LeaseTimeline(1, "n3", "elastic", (
            (t(2, 1), S.REQUESTED), (t(2, 1, 0, 5), S.SUBMITTED), (t(2, 1, 0, 30), S.STARTING),
            (t(2, 1, 2, 30), S.SERVING), (t(2, 3), S.DRAINING), (t(2, 3, 1), S.RELEASING),
            (t(2, 3, 1, 30), S.RETURNED),
        )),
        # failed while starting: 10 s wait, startup up to the failure (300 s), then the
        # cleanup in failed (30 s) as drain
        LeaseTimeline(2, "n3", "elastic", (
            (t(2, 10), S.REQUESTED), (t(2, 10, 0, 2), S.SUBMITTED), (t(2, 10, 0, 10), S.STARTING),
            (t(2, 10, 5, 10), S.FAILED), (t(2, 10, 5, 40), S.RETURNED),
        )),
        # given back while its job was pending, and one refused at submission: no job
        # ever ran, so all of it (releasing and failed too) is wait
        LeaseTimeline(3, "n1", "training", (
            (t(2, 5), S.REQUESTED), (t(2, 5, 0, 1), S.SUBMITTED), (t(2, 5, 10), S.RELEASING),
            (t(2, 5, 10, 5), S.RETURNED),
        )),
        LeaseTimeline(4, "n1", "training", (
            (t(2, 6), S.REQUESTED), (t(2, 6, 0, 3), S.FAILED), (t(2, 6, 0, 4), S.RETURNED),
        )),
        # open across midnight, still starting at the end of the window (2026-11-04)
        LeaseTimeline(5, "n3", "elastic", (
            (t(2, 23, 59), S.REQUESTED), (t(2, 23, 59, 50), S.STARTING),
        )),
        # a node with no GPU count: counted as a lease, 0 GPU-ms, named
        LeaseTimeline(6, "n9", "elastic", (
            (t(2, 12), S.REQUESTED), (t(2, 12, 0, 30), S.STARTING), (t(2, 12, 1), S.SERVING),
        )),
        # returned before the window, and created after it: not counted
        LeaseTimeline(7, "n3", "elastic", ((t(1, 1), S.REQUESTED), (t(1, 2), S.RETURNED))),
        LeaseTimeline(8, "n3", "elastic", ((t(4, 0), S.REQUESTED),)),
    ]  # fmt: skip
    nodes = {"n3": h100, "n1": NodeGpus(8, "a100")}
    out = phase_gpu_ms(leases, nodes, t(2, 0), t(4, 0))

    elastic, training = out["elastic"], out["training"]
    assert set(out) == {"elastic", "training"}
    assert elastic.leases == 4 and training.leases == 2
    day2_startup = (120 + 300 + 10) * 4_000  # lease 5 starts at 23:59:50
    day3_startup = 24 * 3600 * 4_000  # ... and is still starting at the window's end
    assert elastic.wait_ms == (30 + 10 + 50) * 4_000
    assert elastic.startup_ms == day2_startup + day3_startup
    assert elastic.drain_ms == (90 + 30) * 4_000
    assert elastic.transition_ms == elastic.startup_ms + elastic.drain_ms
    assert elastic.transition_by_day == {
        ("h100", date(2026, 11, 2)): day2_startup + (90 + 30) * 4_000,
        ("h100", date(2026, 11, 3)): day3_startup,
    }
    assert elastic.unknown_nodes == {"n9"}
    assert training.wait_ms == (605 + 4) * 8_000
    assert training.startup_ms == training.drain_ms == 0
    assert training.transition_by_day == {} and training.unknown_nodes == set()


def test_core_clips_at_both_edges() -> None:
    lease = LeaseTimeline(1, "n3", "elastic", (
        (t(1, 23), S.REQUESTED), (t(1, 23, 50), S.STARTING), (t(2, 0, 5), S.SERVING),
        (t(2, 23, 58), S.DRAINING), (t(3, 0, 2), S.RETURNED),
    ))  # fmt: skip
    out = phase_gpu_ms([lease], {"n3": NodeGpus(2, "h100")}, t(2, 0), t(3, 0))["elastic"]
    assert (out.leases, out.wait_ms) == (1, 0)
    assert out.startup_ms == 5 * 60 * 2_000  # 00:00 - 00:05, not the 10 min before
    assert out.drain_ms == 2 * 60 * 2_000  # 23:58 - 24:00, not the 2 min after


def test_core_books_a_partial_lease_its_gpus_and_a_slice_its_share() -> None:
    """Issue 32: on a node of 8 GPUs a lease of 2 books 2 GPUs' phases, not the node's 8;
    a lease of two 1g.10gb slices books 2/7 of a GPU by compute (2/8 by memory, 10 GB of
    80); a lease that says more GPUs than its node has books the node's."""
    moves = ((t(2, 1), S.REQUESTED), (t(2, 1, 0, 7), S.STARTING), (t(2, 1, 0, 21), S.SERVING))
    node = {"n3": NodeGpus(8, "h100")}

    def startup_ms(lease: LeaseTimeline, **kw: Any) -> int:
        return phase_gpu_ms([lease], node, t(2, 0), t(3, 0), **kw)["elastic"].startup_ms

    whole = LeaseTimeline(1, "n3", "elastic", moves)
    assert startup_ms(whole) == 14_000 * 8
    assert startup_ms(LeaseTimeline(2, "n3", "elastic", moves, gpus=2)) == 14_000 * 2
    assert startup_ms(LeaseTimeline(3, "n3", "elastic", moves, gpus=12)) == 14_000 * 8
    sliced = LeaseTimeline(4, "n3", "elastic", moves, gpus=2, gpu_type="h100_1g.10gb")
    assert startup_ms(sliced) == 14_000 * 2 // 7
    by_memory = SliceRules(share="memory", gpu_memory_gb={"h100": 80})
    assert startup_ms(sliced, rules=by_memory) == 14_000 * 2 // 8


# ---- the section from the two databases ------------------------------------------------


def _lease(store: LeaseStore, node: str, pool: str, mode: str, key: str,
           moves: list[tuple[LeaseState, datetime]]) -> int:  # fmt: skip
    """A lease created at the first move's time, then moved through the others."""
    (_, created), *rest = moves
    lease = store.create(node, pool, mode, ["busy"], key, created)
    assert lease.id is not None
    for state, at in rest:
        store.set_status(lease.id, state, at, "test")
    return lease.id


def _leases(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'leases.db'}")
    create_schema(engine)
    store = LeaseStore(engine)
    # before the window: not counted
    _lease(store, "n1", "training", "drain", "g", [
        (S.REQUESTED, t(1, 8)), (S.RETURNED, t(1, 10)),
    ])  # fmt: skip
    # straddles the window's start (drain mode): startup 00:00 - 00:05 (300 s), drain 60 s
    _lease(store, "n1", "training", "drain", "e", [
        (S.REQUESTED, t(1, 23)), (S.SUBMITTED, t(1, 23, 0, 1)), (S.STARTING, t(1, 23, 50)),
        (S.SERVING, t(2, 0, 5)), (S.DRAINING, t(2, 2)), (S.RELEASING, t(2, 2, 0, 30)),
        (S.RETURNED, t(2, 2, 1)),
    ])  # fmt: skip
    # preempt mode, served and returned: wait 30 s, startup 120 s, drain 90 s
    _lease(store, "n3", "elastic", "preempt", "a", [
        (S.REQUESTED, t(2, 1)), (S.SUBMITTED, t(2, 1, 0, 5)), (S.STARTING, t(2, 1, 0, 30)),
        (S.SERVING, t(2, 1, 2, 30)), (S.DRAINING, t(2, 3)), (S.RELEASING, t(2, 3, 1)),
        (S.RETURNED, t(2, 3, 1, 30)),
    ])  # fmt: skip
    # drain mode: wait 600 s for the node, startup 60 s, drain 40 s
    _lease(store, "n1", "training", "drain", "b", [
        (S.REQUESTED, t(2, 5)), (S.SUBMITTED, t(2, 5, 0, 1)), (S.STARTING, t(2, 5, 10)),
        (S.SERVING, t(2, 5, 11)), (S.DRAINING, t(2, 6)), (S.RELEASING, t(2, 6, 0, 20)),
        (S.RETURNED, t(2, 6, 0, 40)),
    ])  # fmt: skip
    # fails while starting: wait 10 s, startup 300 s up to the failure, drain 30 s
    _lease(store, "n3", "elastic", "preempt", "c", [
        (S.REQUESTED, t(2, 10)), (S.SUBMITTED, t(2, 10, 0, 2)), (S.STARTING, t(2, 10, 0, 10)),
        (S.FAILED, t(2, 10, 5, 10)), (S.RETURNED, t(2, 10, 5, 40)),
    ])  # fmt: skip
    # a node the inventory does not know
    _lease(store, "n9", "elastic", "preempt", "f", [
        (S.REQUESTED, t(2, 12)), (S.SUBMITTED, t(2, 12, 0, 1)), (S.STARTING, t(2, 12, 0, 30)),
        (S.SERVING, t(2, 12, 1)), (S.DRAINING, t(2, 13)), (S.RELEASING, t(2, 13, 0, 10)),
        (S.RETURNED, t(2, 13, 0, 30)),
    ])  # fmt: skip
    # straddles the window's end, still open: wait 20 s, startup 40 s of 80 in the window
    _lease(store, "n3", "elastic", "preempt", "d", [
        (S.REQUESTED, t(2, 23, 59)), (S.SUBMITTED, t(2, 23, 59, 10)),
        (S.STARTING, t(2, 23, 59, 20)), (S.SERVING, t(3, 0, 0, 40)),
    ])  # fmt: skip
    return engine


def _ledger(tmp_path: Path) -> Engine:
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    spans = [
        {"cluster": "c", "node": "n3", "pool": "elastic", "gpu_type": "h100", "gpus": 4,
         "start": t(1, 0) - timedelta(days=31), "end": None},
        # n1 changed during the window: its latest span (4 GPUs) counts
        {"cluster": "c", "node": "n1", "pool": "training", "gpu_type": "h100", "gpus": 2,
         "start": t(1, 0) - timedelta(days=31), "end": t(2, 3)},
        {"cluster": "c", "node": "n1", "pool": "training", "gpu_type": "h100", "gpus": 4,
         "start": t(2, 3), "end": None},
        # ended before the window: not used for n9
        {"cluster": "c", "node": "n9", "pool": "elastic", "gpu_type": "h100", "gpus": 8,
         "start": t(1, 0) - timedelta(days=31), "end": t(1, 0)},
    ]  # fmt: skip
    entries = [
        # lent time in elastic (two borrowing teams) and training
        Entry(t(2, 1), "c", "elastic", "infer", "inference", "bridge", "team-vision", "stb",
              "busy", "h100", "", "3.1762045200", 14_400_000),
        Entry(t(2, 2), "c", "elastic", "infer", "inference", "bridge", "team-vision", "stb",
              "busy", "h100", "", "3.1762045200", 14_400_000),
        Entry(t(2, 2), "c", "elastic", "infer", "inference", "bridge", "team-nlp", "stb",
              "echo", "h100", "", "3.1762045200", 3_600_000),
        Entry(t(2, 5), "c", "training", "infer", "inference", "bridge", "team-nlp", "stb",
              "echo", "h100", "", "4.1762059600", 14_400_000),
        # not lent (no lease), another cluster, another day: none of it counts
        Entry(t(2, 5), "c", "training", "train", "training", "a", "team-research", "u",
              "", "h100", "normal", "", 50_000_000),
        Entry(t(2, 5), "other", "elastic", "infer", "inference", "bridge", "team-x", "stb",
              "busy", "h100", "", "9.1762059600", 7_000_000),
        Entry(t(3, 5), "c", "elastic", "infer", "inference", "bridge", "team-y", "stb",
              "busy", "h100", "", "5.1762127140", 9_000_000),
    ]  # fmt: skip
    with write_transaction(engine) as conn:
        conn.execute(insert(NodeSpan.__table__), spans)  # type: ignore[attr-defined]
    insert_entries(engine, entries)
    return engine


def _rows(section: Any) -> dict[str, dict[str, Any]]:
    return {row["pool"]: row for row in section.rows}


def h(gpu_ms: int) -> float:
    return gpu_ms / MS_PER_HOUR


# expected GPU-ms in the window 2026-11-02 (4 GPUs on n3 and n1, 0 on n9)
ELASTIC = {"wait": (30 + 10 + 20) * 4_000, "startup": (120 + 300 + 40) * 4_000,
           "drain": (90 + 30) * 4_000, "lent": 32_400_000}  # fmt: skip
TRAINING = {"wait": 600 * 4_000, "startup": (300 + 60) * 4_000, "drain": (60 + 40) * 4_000,
            "lent": 14_400_000}  # fmt: skip


def test_section_phases_lent_time_and_notes(tmp_path: Path) -> None:
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, None, "c", now=AFTER)
    assert section.key == "lending"
    assert "transition_cost" not in section.columns
    rows = _rows(section)
    assert list(rows) == ["elastic", "training", TOTAL]
    for pool, want, leases, borrowers in [
        ("elastic", ELASTIC, 4, "team-nlp, team-vision"),
        ("training", TRAINING, 2, "team-nlp"),
    ]:
        row = rows[pool]
        transition = want["startup"] + want["drain"]
        assert row == {
            "pool": pool,
            "leases": leases,
            "lent_gpu_hours": h(want["lent"]),
            "borrowers": borrowers,
            "wait_gpu_hours": h(want["wait"]),
            "startup_gpu_hours": h(want["startup"]),
            "drain_gpu_hours": h(want["drain"]),
            "transition_gpu_hours": h(transition),
            "transition_share": transition / want["lent"],
        }, pool
    total = rows[TOTAL]
    assert total["leases"] == 6
    assert total["borrowers"] == "team-nlp, team-vision"
    assert total["lent_gpu_hours"] == h(ELASTIC["lent"] + TRAINING["lent"])
    assert total["wait_gpu_hours"] == h(ELASTIC["wait"] + TRAINING["wait"])
    assert total["transition_gpu_hours"] == h(
        ELASTIC["startup"] + ELASTIC["drain"] + TRAINING["startup"] + TRAINING["drain"]
    )
    assert any("node(s) n9" in note and "0 GPUs" in note for note in section.notes)
    assert any(note.startswith("wait:") and "fenced" in note for note in section.notes)
    assert "no rates defined: GPU-hours only" in section.notes
    assert section.as_dict()["rows"][0]["pool"] == "elastic"


def test_section_without_cluster_counts_every_cluster(tmp_path: Path) -> None:
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, None, now=AFTER)
    elastic = _rows(section)["elastic"]
    assert elastic["lent_gpu_hours"] == h(ELASTIC["lent"] + 7_000_000)
    assert elastic["borrowers"] == "team-nlp, team-vision, team-x"


def test_section_prices_the_transitions(tmp_path: Path) -> None:
    rates = RateBook([
        RateSpec("h100", Decimal("2.50"), date(2026, 1, 1)),
        RateSpec("h100", Decimal("4.00"), date(2026, 1, 1), pool="training"),
    ])  # fmt: skip
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, rates, "c", now=AFTER)
    assert section.columns[-1] == "transition_cost"
    rows = _rows(section)
    elastic = Decimal(ELASTIC["startup"] + ELASTIC["drain"]) * Decimal("2.50") / MS_PER_HOUR
    training = Decimal(TRAINING["startup"] + TRAINING["drain"]) * Decimal("4.00") / MS_PER_HOUR
    assert rows["elastic"]["transition_cost"] == money(elastic) == Decimal("1.61")
    assert rows["training"]["transition_cost"] == money(training) == Decimal("2.04")
    assert rows[TOTAL]["transition_cost"] == money(elastic + training)
    assert section.as_dict()["rows"][0]["transition_cost"] == "1.61"


def test_section_notes_a_missing_rate(tmp_path: Path) -> None:
    rates = RateBook([RateSpec("h100", Decimal("4.00"), date(2026, 1, 1), pool="training")])
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, rates, "c", now=AFTER)
    rows = _rows(section)
    assert "transition_cost" not in rows["elastic"] and "transition_cost" not in rows[TOTAL]
    assert rows["training"]["transition_cost"] == Decimal("2.04")
    assert any(note.startswith("pool elastic: no transition_cost") for note in section.notes)


def test_open_leases_count_up_to_now(tmp_path: Path) -> None:
    """At 10:03:10 the failing lease has been starting for 180 s; later leases not yet."""
    now = t(2, 10, 3, 10)
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, None, "c", now=now)
    elastic = _rows(section)["elastic"]
    assert elastic["leases"] == 2
    assert elastic["wait_gpu_hours"] == h((30 + 10) * 4_000)
    assert elastic["startup_gpu_hours"] == h((120 + 180) * 4_000)
    assert elastic["drain_gpu_hours"] == h(90 * 4_000)


def test_empty_window(tmp_path: Path) -> None:
    window = Window(t(20, 0), t(21, 0), "2026-11-20")
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), window, None, now=AFTER)
    assert section.rows == []


@pytest.mark.parametrize("now", [t(1, 0), t(2, 0)])
def test_now_before_the_window_counts_nothing(tmp_path: Path, now: datetime) -> None:
    section = lending_section(_ledger(tmp_path), _leases(tmp_path), DAY, None, "c", now=now)
    assert all(row["leases"] == 0 for row in section.rows)
