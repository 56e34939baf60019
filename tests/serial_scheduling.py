"""The test run's xdist scheduler (not a test module): `--dist loadgroup` whose serial group
(the lab's tests: every test under the folders it is given) runs whole, in order, on one
worker, from the start, while the other workers run everything else.

The group is told by the tests' node ids: xdist 3.8 names an `xdist_group` in the node id
by setting `item._nodeid`, which pytest 9.2 no longer reads. The first worker to ask for
work becomes the group's host and is sent the whole group; it takes nothing else until
the group is done (then it helps with what is left). Every other test (the unit and
database tiers) is spread over the other workers, one test at a time, as `loadgroup` does
with tests of no group. The group keeps its collection order (tests/conftest.py sorts it
after every other test, the `last` test at its end), so the lab comes up once and goes
down last.

Why at once and not last: the lab's tests are most of a run and mostly wait (on Slurm,
Triton, the load generator), so the unit and database tiers fit in beside them. Those run
at a lower CPU priority (tests/conftest.py renices a worker the first time it runs a test
outside the lab's folders), so the lab's servers and load generator, whose latencies some
lab tests measure, come first on the CPUs. With one worker (`-n 1`) the group simply runs
first.

Chosen by tests/conftest.py's `pytest_xdist_make_scheduler` for `--dist loadgroup`; only
imported when pytest-xdist runs the session.
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController


class SerialFirstScheduling(LoadGroupScheduling):
    """`loadgroup`, with the xdist_group `serial` sent whole to the first worker that asks,
    which takes nothing else until it is done."""

    def __init__(
        self, config: pytest.Config, log: Producer | None, serial: str, folders: tuple[str, ...]
    ) -> None:
        super().__init__(config, log)
        self.serial = serial
        self.folders = folders  # node id prefixes, e.g. "tests/lab/"
        self.serial_host: WorkerController | None = None

    def _split_scope(self, nodeid: str) -> str:
        return self.serial if nodeid.startswith(self.folders) else super()._split_scope(nodeid)

    def _hosting(self, node: WorkerController) -> bool:
        """Whether `node` hosts the serial group and has some of it still to run."""
        unit = self.assigned_work.get(node, {}).get(self.serial, {})
        return node == self.serial_host and not all(unit.values())

    def _assign_work_unit(self, node: WorkerController) -> None:
        """Give `node` the serial group if nobody hosts it yet, else (unless it is busy with
        the group) the next other scope in collection order."""
        for scope in [s for s, unit in self.workqueue.items() if all(unit.values())]:
            del self.workqueue[scope]  # a crashed worker's finished scopes, given back too
        if not self.workqueue:
            node.shutdown()
            return
        if self.serial in self.workqueue and self.serial_host is None:
            self.serial_host = node
            self._send(node, self.serial)
            return
        if self._hosting(node):
            return
        scope = next((s for s in self.workqueue if s != self.serial), None)
        if scope is not None:
            self._send(node, scope)

    def _send(self, node: WorkerController, scope: str) -> None:
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )

    def remove_node(self, node: WorkerController) -> str | None:
        crashed = super().remove_node(node)
        if node == self.serial_host:
            # its unfinished work went back to the queue: the next worker to ask hosts it
            self.serial_host = None
        return crashed
