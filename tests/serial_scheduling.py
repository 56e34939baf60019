"""The test run's xdist scheduler (not a test module): `--dist loadgroup` whose serial group
(the lab's tests: every test under the folders it is given) runs last, whole, on one
worker, alone on the machine.

The group is told by the tests' node ids: xdist 3.8 names an `xdist_group` in the node id
by setting `item._nodeid`, which pytest 9.2 no longer reads. Every other test (the unit and
database tiers) is spread over all workers first, one test at a time, as `loadgroup` does
with tests of no group. When nothing but the serial group is left in the queue, the first
worker to ask for work becomes its host and every other worker is shut down (each finishes
what it holds, then exits); the group is sent to the host only once no other worker has a
test left, so no lab test shares the CPUs with a unit test (the lab's load tests are
sensitive to a busy machine). The group keeps its collection order (tests/conftest.py
sorts it after every other test, the `last` test at its end), so the lab comes up once
and goes down last.

Chosen by tests/conftest.py's `pytest_xdist_make_scheduler` for `--dist loadgroup`; only
imported when pytest-xdist runs the session.
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController


class SerialLastScheduling(LoadGroupScheduling):
    """`loadgroup`, with the xdist_group `serial` held back until every other test has
    finished."""

    def __init__(
        self, config: pytest.Config, log: Producer | None, serial: str, folders: tuple[str, ...]
    ) -> None:
        super().__init__(config, log)
        self.serial = serial
        self.folders = folders  # node id prefixes, e.g. "tests/lab/"
        self.serial_host: WorkerController | None = None

    def _split_scope(self, nodeid: str) -> str:
        return self.serial if nodeid.startswith(self.folders) else super()._split_scope(nodeid)

    def _only_serial_left(self) -> bool:
        return list(self.workqueue) == [self.serial]

    def _others_pending(self, host: WorkerController) -> bool:
        return any(self._pending_of(work) for n, work in self.assigned_work.items() if n != host)

    def _assign_work_unit(self, node: WorkerController) -> None:
        """Give `node` the next scope in collection order, the serial group only when it
        is all that is left: then `node` hosts it and the other workers are shut down."""
        for scope in [s for s, unit in self.workqueue.items() if all(unit.values())]:
            del self.workqueue[scope]  # a crashed worker's finished scopes, given back too
        if not self.workqueue:
            node.shutdown()
            return
        if not self._only_serial_left():
            scope = next(s for s in self.workqueue if s != self.serial)
            self._send(node, scope)
            return
        if self.serial_host is None:
            self.serial_host = node
            for other in self.assigned_work:
                if other != node and not other.shutting_down:
                    other.shutdown()
        self._start_serial()

    def _start_serial(self) -> None:
        """Send the serial group to its host once no other worker has a test pending."""
        host = self.serial_host
        if host is None or not self._only_serial_left() or self._others_pending(host):
            return
        self._send(host, self.serial)

    def _send(self, node: WorkerController, scope: str) -> None:
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )

    def mark_test_complete(
        self, node: WorkerController, item_index: int, duration: float = 0
    ) -> None:
        super().mark_test_complete(node, item_index, duration)
        self._start_serial()

    def remove_node(self, node: WorkerController) -> str | None:
        crashed = super().remove_node(node)
        if node == self.serial_host:
            # its unfinished work went back to the queue: the next worker to ask hosts it
            self.serial_host = None
        self._start_serial()
        return crashed
