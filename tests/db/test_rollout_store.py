"""The rollouts' store (bridge.leases.rollouts) on SQLite and the real PostgreSQL: one open
rollout per model held by the partial unique index against a writer that skips the check,
a finished rollout frees the model, times in UTC both ways, events in order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bridge.leases.rollouts import Rollout, RolloutError, RolloutStore
from bridge.leases.store import create_schema, make_engine

T0 = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)


def test_one_open_rollout_per_model_on_both_backends(database_url: str) -> None:
    engine = make_engine(database_url)
    create_schema(engine)
    create_schema(engine)  # idempotent
    store = RolloutStore(engine)
    row = store.start("busy", 1, 2, "10%,50%", 60, T0, who="alice")
    assert row.id is not None
    with pytest.raises(RolloutError, match="has a rollout open"):
        store.start("busy", 1, 3, "10%", 60, T0)
    with pytest.raises(IntegrityError), Session(engine) as session:
        session.add(
            Rollout(model="busy", old_version=1, new_version=3, plan="10%", hold_s=60,
                    state="pending", created_at=T0, updated_at=T0)
        )  # fmt: skip
        session.commit()
    later = T0 + timedelta(seconds=30)
    store.move(row.id, "running", later, "loaded", step=0)
    store.move(row.id, "rolling_back", later, "p99", figures={"new": {"p99_ms": 211.4}})
    store.move(row.id, "rolled_back", later, "p99")
    (back,) = store.of_model("busy")
    assert (back.state, back.step_started_at, back.created_at) == ("rolled_back", later, T0)
    assert [e.to_state for e in store.events(row.id)] == [
        "pending", "running", "rolling_back", "rolled_back"
    ]  # fmt: skip
    assert store.events(row.id)[2].figures == {"new": {"p99_ms": 211.4}}
    again = store.start("busy", 1, 3, "10%", 60, later)  # the model is free again
    assert [r.id for r in store.open_rollouts()] == [again.id]
