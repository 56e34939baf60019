"""The suite's xdist scheduler (`tests/serial_scheduling.py`) with fake workers: the lab's
tests wait until every other test has finished on every worker, then go whole, in their
order, to one worker while the others are shut down; without lab tests it spreads the work
like `loadgroup`; a crashed host's lab tests go to the next worker that asks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("xdist")

from tests.serial_scheduling import SerialLastScheduling

UNIT = [f"tests/unit/test_u.py::test_{k}" for k in range(8)]
LAB = ["tests/faults/test_f.py::test_f", "tests/lab/test_a.py::test_a", "tests/lab/test_zz.py::t"]


class FakeWorker:
    """What the scheduler calls on a worker; it runs nothing by itself."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[int] = []
        self.shutting_down = False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


def _scheduler(collection: list[str], workers: int = 2) -> tuple[Any, list[FakeWorker]]:
    config = SimpleNamespace(
        getvalue=lambda name: {"tx": [f"{workers}*popen"]}[name],
        option=SimpleNamespace(loadscopereorder=True),
    )
    sched = SerialLastScheduling(
        config,  # type: ignore[arg-type]
        None,
        serial="lab",
        folders=("tests/lab/", "tests/faults/"),
    )
    nodes = [FakeWorker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def _finish(sched: Any, node: FakeWorker, collection: list[str], done: set[int]) -> None:
    """The worker runs what it was sent and has not reported yet, one test at a time."""
    for index in list(node.sent):
        if index not in done:
            done.add(index)
            sched.mark_test_complete(node, index)


def _ids(node: FakeWorker, collection: list[str]) -> list[str]:
    return [collection[i] for i in node.sent]


def test_the_lab_group_waits_for_every_other_test_then_runs_whole_on_one_worker() -> None:
    collection = UNIT + LAB
    sched, (a, b) = _scheduler(collection)
    done: set[int] = set()
    assert not set(_ids(a, collection) + _ids(b, collection)) & set(LAB)
    # a runs out of unit tests first; b still has some: a hosts the lab group, b is
    # shut down, and nothing of the lab goes out while b has a test left
    _finish(sched, a, collection, done)
    while not b.shutting_down:
        _finish(sched, a, collection, done)
        assert not set(_ids(a, collection)) & set(LAB)
    assert [i for i in b.sent if i not in done], "b still holds tests when the lab is next"
    assert not set(_ids(a, collection)) & set(LAB)
    _finish(sched, b, collection, done)
    lab_sent = [collection[i] for i in a.sent if collection[i] in LAB]
    assert lab_sent == LAB  # whole, in collection order, on the host only
    assert not set(_ids(b, collection)) & set(LAB)
    _finish(sched, a, collection, done)
    assert sorted(done) == list(range(len(collection)))
    assert sched.tests_finished and not sched.has_pending


def test_without_lab_tests_the_work_is_spread_over_both_workers() -> None:
    sched, (a, b) = _scheduler(UNIT)
    done: set[int] = set()
    while sched.has_pending:
        _finish(sched, a, UNIT, done)
        _finish(sched, b, UNIT, done)
    assert a.sent and b.sent and sorted(a.sent + b.sent) == list(range(len(UNIT)))


def test_only_lab_tests_run_on_one_worker() -> None:
    _, nodes = _scheduler(LAB)
    live = [n for n in nodes if n.sent]
    assert len(live) == 1 and _ids(live[0], LAB) == LAB


def test_a_crashed_hosts_lab_tests_go_to_the_next_worker_that_asks() -> None:
    collection = UNIT[:2] + LAB
    sched, (a, b) = _scheduler(collection)
    done: set[int] = set()
    _finish(sched, a, collection, done)
    _finish(sched, b, collection, done)
    host = a if any(collection[i] in LAB for i in a.sent) else b
    assert [collection[i] for i in host.sent if collection[i] in LAB] == LAB
    first_lab = host.sent[[collection[i] for i in host.sent].index(LAB[0])]
    sched.mark_test_complete(host, first_lab)
    assert sched.remove_node(host) == LAB[1]  # crashed in the second lab test
    fresh = FakeWorker("gw2")
    sched.add_node(fresh)
    sched.add_node_collection(fresh, collection)
    sched.schedule()
    assert _ids(fresh, collection) == LAB[1:]
