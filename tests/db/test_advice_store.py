"""The advisory's record (bridge.leases.advice) on SQLite and the real PostgreSQL: one
tick's rows in one transaction, shadow leases upserted and read back for a restart, the
window's advice and samples oldest first, times in UTC both ways."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from bridge.leases.advice import Advice, AdviceSample, AdviceStore, ShadowLeaseRow
from bridge.leases.store import create_schema, make_engine

T0 = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def shadow(lease_id: int, state: str, created: float, **fields: object) -> ShadowLeaseRow:
    return ShadowLeaseRow(
        id=lease_id, node=f"n{lease_id}", pool="elastic", lend_mode="preempt", models=["busy"],
        state=state, created_at=at(created), updated_at=at(created), **fields,
    )  # fmt: skip


def test_a_tick_is_written_and_read_back(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    create_schema(engine)  # idempotent
    store = AdviceStore(engine)
    assert store.next_shadow_id() == 1
    figures = {"models": {"busy": {"p99_ms": 400.0, "rate": 60.0}}, "pools": {"elastic": {}}}
    lend = Advice(at=at(10), kind="lend", node="n3", pool="elastic", lend_mode="preempt",
                  models=["busy"], reason="capacity", shadow_lease=1, figures=figures)  # fmt: skip
    samples = [AdviceSample(at=at(10), model=m, request_rate=r, p99_ms=None, replicas=1)
               for m, r in (("busy", 60.0), ("echo", None))]  # fmt: skip
    store.write_tick([lend], samples, [shadow(1, "submitted", 10, running_at=1.5, victims=["7"])])
    # the next tick: the shadow moves on (an upsert), an earlier advice comes later
    store.write_tick(
        [Advice(at=at(5), kind="baseline", node="n1", pool="inference")],
        [],
        [shadow(1, "starting", 10, running_at=1.5, victims=["7"]), shadow(2, "returned", -7200)],
    )
    (first, second) = store.advice_between(at(0), at(60))
    assert (first.kind, first.at, second.kind) == ("baseline", at(5), "lend")
    assert second.at.tzinfo is not None and second.figures == figures
    assert second.models == ["busy"] and second.shadow_lease == 1
    assert [(s.model, s.request_rate) for s in store.samples_between(at(0), at(60))] == [
        ("busy", 60.0),
        ("echo", None),
    ]
    assert store.advice_between(at(11), at(60)) == []
    # open shadows, and the ones made since `since` (their victims still count)
    assert [(r.id, r.state, r.victims) for r in store.shadows(at(0))] == [
        (1, "starting", ["7"]),
    ]
    assert [r.id for r in store.shadows(at(-7200))] == [1, 2]
    assert store.next_shadow_id() == 3
    # the caller's rows are copied: the same objects may be written again after a failure
    assert lend.id is None


def test_a_refused_tick_writes_none_of_its_rows(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    store = AdviceStore(engine)
    good = AdviceSample(at=at(1), model="busy", request_rate=1.0)
    bad = Advice(at=at(1), kind="lend", node=None, pool="elastic")  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        store.write_tick([bad], [good], [])
    assert store.samples_between(at(0), at(10)) == []
