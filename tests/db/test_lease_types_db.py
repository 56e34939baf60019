"""A lease of GPUs of one type (issue 32: a lend of MIG slices, `--gres=gpu:<type>:k`) in
the lease store on SQLite and PostgreSQL: its type is stored and read back (the planner's
copy included), and a type without GPUs or not a GRES type name is refused with nothing
written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine

from bridge.daemon.actuator import record_of
from bridge.leases.store import LeaseStore, create_schema, make_engine

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ONE = "h100_1g.10gb"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    create_schema(eng)
    yield eng
    eng.dispose()


def test_a_lease_keeps_its_gpu_type_and_a_bad_one_is_refused(engine: Engine) -> None:
    store = LeaseStore(engine)
    made = store.create("m1", "mig", "preempt", ["small"], "k1", T0, gpus=1, gpu_type=ONE)
    assert made.id is not None
    view = record_of(store.get(made.id))
    assert (view.lent_gpus, view.gpu_type) == (1, ONE)
    (event,) = store.history(made.id)
    assert f"gpus=1 gpu_type={ONE}" in (event.detail or "")
    with pytest.raises(ValueError, match="GRES type"):
        store.create("m2", "mig", "preempt", ["small"], "k2", T0, gpus=1, gpu_type="a:b")
    with pytest.raises(ValueError, match="GRES type"):
        store.create("m2", "mig", "preempt", ["small"], "k3", T0, gpu_type=ONE)
    assert [lease.node for lease in store.open_leases()] == ["m1"]
    # a lease of any GPU, or of the whole node, has none, as before
    plain = store.create("n3", "elastic", "preempt", ["busy"], "k4", T0, gpus=2)
    assert plain.id is not None and record_of(store.get(plain.id)).gpu_type is None
