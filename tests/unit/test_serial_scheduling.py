"""The suite's xdist scheduler (`tests/serial_scheduling.py`) with fake workers: the lab's
tests go whole, in their order, to the first worker that asks, which takes nothing else
until they are done, while the other worker runs every other test; without lab tests it
spreads the work like `loadgroup`; a crashed host's lab tests go to the next worker that
asks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("xdist")

from tests.serial_scheduling import SerialFirstScheduling

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
    sched = SerialFirstScheduling(
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


def test_the_lab_group_goes_whole_to_one_worker_at_once_and_the_other_runs_the_rest() -> None:
    collection = UNIT + LAB
    sched, (a, b) = _scheduler(collection)
    done: set[int] = set()
    host, other = (a, b) if set(_ids(a, collection)) & set(LAB) else (b, a)
    assert _ids(host, collection) == LAB  # whole, in collection order, and nothing else
    assert not set(_ids(other, collection)) & set(LAB)
    # the host runs its first lab test: it is given no unit test while the group lasts
    first = host.sent[0]
    done.add(first)
    sched.mark_test_complete(host, first)
    assert _ids(host, collection) == LAB
    # the other worker runs every unit test while the host is busy with the lab
    while not other.shutting_down and sched.workqueue:
        _finish(sched, other, collection, done)
    _finish(sched, other, collection, done)
    assert sorted(set(_ids(other, collection))) == sorted(UNIT)
    assert _ids(host, collection) == LAB
    _finish(sched, host, collection, done)
    assert sorted(done) == list(range(len(collection)))
    assert sched.tests_finished and not sched.has_pending


def test_a_host_done_with_the_lab_helps_with_what_is_left() -> None:
    collection = UNIT + LAB
    sched, (a, b) = _scheduler(collection)
    done: set[int] = set()
    host, other = (a, b) if set(_ids(a, collection)) & set(LAB) else (b, a)
    _finish(sched, host, collection, done)  # the lab's tests, while other is still on its first
    unit_on_host = [i for i in _ids(host, collection) if i in UNIT]
    assert unit_on_host, "a host done with the lab takes unit tests"
    while sched.has_pending:
        _finish(sched, host, collection, done)
        _finish(sched, other, collection, done)
    assert sorted(done) == list(range(len(collection)))
    host_ids = _ids(host, collection)
    assert host_ids[: len(LAB)] == LAB  # the lab first on the host, then the rest


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
