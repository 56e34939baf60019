"""The catalogue of node-local weight copies (bridge.leases.weights) on SQLite and the
real PostgreSQL: one row per node and model version (held by the unique constraint
against a writer that skips the store), the transition table refusing illegal moves,
sizes past 2**31, times in UTC both ways."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bridge.leases.store import create_schema, make_engine
from bridge.leases.weights import WeightCopy, WeightStore, WeightStoreError

T0 = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)
BIG = 140 * 10**9  # a 70B model in bf16: beyond a 32-bit column


def test_a_copy_is_staged_completed_verified_evicted_and_staged_again(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    store = WeightStore(engine)
    row = store.begin("n3", "weighty", 1, "/cache/weighty/1", T0, job_id="41")
    assert (row.state, row.job_id, row.size_bytes) == ("staging", "41", 0)
    with pytest.raises(WeightStoreError, match="is staging: it cannot become staging"):
        store.begin("n3", "weighty", 1, "/cache/weighty/1", T0)
    with pytest.raises(WeightStoreError, match="is staging, not complete"):
        store.verified("n3", "weighty", 1, T0)
    done = store.finish("n3", "weighty", 1, BIG, "ab" * 32, T0 + timedelta(seconds=700))
    assert (done.state, done.size_bytes, done.staged_at) == (
        "complete",
        BIG,
        T0 + timedelta(seconds=700),
    )
    later = T0 + timedelta(hours=1)
    assert store.verified("n3", "weighty", 1, later).verified_at == later
    store.begin("n4", "weighty", 1, "/cache/weighty/1", T0, job_id="42")
    store.fail("n4", "weighty", 1, "sha256 differs", T0)
    (read,) = store.copies("n3")
    assert read.verified_at == later and read.verified_at.tzinfo is not None
    assert store.where("weighty", 1) == ["n3"]
    assert store.used_bytes("n3") == BIG and store.used_bytes("n4") == 0
    assert [c.state for c in store.copies()] == ["complete", "failed"]
    store.evict("n3", "weighty", 1, "room for smol", later)
    with pytest.raises(WeightStoreError, match="is evicted: it cannot become complete"):
        store.finish("n3", "weighty", 1, BIG, "ab" * 32, later)
    again = store.begin("n3", "weighty", 1, "/cache/weighty/1", later, job_id="43")
    assert (again.state, again.job_id, again.reason, again.id) == ("staging", "43", "", row.id)
    with pytest.raises(WeightStoreError, match="no copy of weighty version 2 on n3"):
        store.fail("n3", "weighty", 2, "x", later)


def test_one_row_per_node_and_version_even_past_the_store(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    WeightStore(engine).begin("n3", "weighty", 1, "/c", T0)
    with pytest.raises(IntegrityError), Session(engine) as session:
        session.add(
            WeightCopy(
                node="n3", model="weighty", version=1, path="/c", state="staging", updated_at=T0
            )
        )
        session.commit()
