"""Fault 9 (stress): the daemon under sustained external load, with operator lend/return
cycles.

The real `stb daemon` (its APScheduler, exporter and worker threads, 1 s ticks) runs
while `stb load` sends an open-loop Poisson stream to the `busy` model through the
bridge's nginx, without a break until the last cycle is over; meanwhile the elastic node
is lent (`stb lend`'s request), serves for a while and is returned (`stb return`'s
request), CYCLES times. The load is a chain of overlapping `stb load` runs of SEGMENT_S
seconds each, started until the cycles are done: `stb load` has no graceful early stop
(a killed one prints no report), and one run long enough for the slowest cycles would
make every run wait out that length.
Expected: not one tick with outcome "failed" and none with "errors" (stb_ticks_total from
the daemon's /metrics), every cycle's lease goes the whole way to `returned`, and the load
generator saw no failed or dropped request.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.lab.spec import LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState

from .tools import DaemonProc, delta, infer_through, lab_env, stb, until

pytestmark = pytest.mark.lab
CYCLES = 3  # lend/return cycles, about 15 s each (5 s to serving, HOLD_S, 4 s to returned)
#: the bound on all of them: a cycle may take 80 s and still pass
CYCLES_TIMEOUT_S = 240.0
RATE = 10.0  # requests/s on busy (20 ms each): the baseline alone stays within its SLO
#: seconds each lent replica serves before its return: at RATE, split over two replicas,
#: some 25 requests reach it
HOLD_S = 5.0
#: each `stb load` run's length; the next starts OVERLAP_S before its end (a run takes
#: 1-2 s to start sending), so the stream never pauses and at most doubles for a moment
SEGMENT_S = 15.0
OVERLAP_S = 2.0
ORDER = ["requested", "submitted", "starting", "serving", "draining", "releasing", "returned"]


def _answered(queue: RequestQueue, request_id: int, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while (req := queue.get(request_id)) is None or req.done_at is None:
        assert time.monotonic() < deadline, f"request {request_id} not taken in {timeout_s}s"
        time.sleep(0.2)
    return req.outcome


def _wait_state(store: LeaseStore, lease_id: int, state: LeaseState, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := store.get(lease_id).state) != state:
        assert time.monotonic() < deadline, f"lease {lease_id} still {now}, not {state}"
        time.sleep(0.2)


class _Load:
    """`stb load` runs of SEGMENT_S seconds on busy, one started every SEGMENT_S -
    OVERLAP_S seconds (each with the next seed) from start() until stop(); finish() waits
    for the last and returns (exit status, stderr, JSON report) of each."""

    def __init__(self, lab: LabSpec, listen: str, folder: Path) -> None:
        self.lab, self.listen, self.folder = lab, listen, folder
        self.runs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._stopping = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)

    def _start_run(self) -> None:
        k = len(self.runs)
        out = self.folder / f"load-{k}.json"
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                [stb(), "load", "-e", self.listen, "--model", "busy", "--rate", str(RATE),
                 "--duration", str(SEGMENT_S), "--max-requests", str(int(RATE * SEGMENT_S * 2)),
                 "--seed", str(9 + k), "--json", "--quiet"],
                env=lab_env(self.lab), stdout=sink, stderr=subprocess.PIPE,
            )  # fmt: skip
        self.runs.append((proc, out))

    def _feed(self) -> None:
        while True:
            self._start_run()
            if self._stopping.wait(SEGMENT_S - OVERLAP_S):
                return

    def start(self) -> None:
        self._feeder.start()

    def stop(self) -> None:
        self._stopping.set()
        self._feeder.join()

    def finish(self) -> list[tuple[int, str, dict[str, Any]]]:
        self.stop()
        done = []
        for proc, out in self.runs:
            _, err = proc.communicate(timeout=SEGMENT_S + 60)
            report = json.loads(out.read_text()) if proc.returncode == 0 else {}
            done.append((proc.returncode, err.decode(errors="replace"), report))
        return done

    def kill(self) -> None:
        self.stop()
        for proc, _ in self.runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_daemon_under_sustained_load_with_lend_return_cycles(
    lab: LabSpec,
    daemon_config: Path,
    daemons: Callable[..., DaemonProc],
    tmp_path: Path,
) -> None:
    daemon = daemons(daemon_config)
    engine = make_engine(daemon.database_url)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    lent = lab.pool_nodes("elastic")[0]
    until(
        "busy answering through nginx",
        lambda: infer_through(daemon.listen, n=1)[0][0] == 200,
        120,
        step=0.5,
    )
    before = daemon.must_metrics()
    started = time.monotonic()
    load = _Load(lab, daemon.listen, tmp_path)
    load.start()
    cycles: list[tuple[int, float, float]] = []  # (lease, s to serving, s to returned)
    try:
        while len(cycles) < CYCLES:
            assert time.monotonic() - started < CYCLES_TIMEOUT_S, cycles
            t0 = time.monotonic()
            req = ask_lend(queue, lent.name, ["busy"])
            outcome = _answered(queue, req.id or 0)
            open_leases = store.by_node(lent.name, open_only=True)
            assert len(open_leases) == 1 and open_leases[0].id is not None, outcome
            lease_id = open_leases[0].id
            _wait_state(store, lease_id, LeaseState.SERVING, 60)
            serving = time.monotonic() - t0
            time.sleep(HOLD_S)
            ask_return(queue, lease_id)
            _wait_state(store, lease_id, LeaseState.RETURNED, 60)
            cycles.append((lease_id, round(serving, 1), round(time.monotonic() - t0, 1)))
        runs = load.finish()
    finally:
        load.kill()
    after = daemon.must_metrics()
    window_s = time.monotonic() - started
    load_s = SEGMENT_S * len(runs)
    reports = [report["total"] for _, _, report in runs if report]
    total = {
        "sent": sum(t["sent"] for t in reports),
        "ok": sum(t["ok"] for t in reports),
        "dropped": sum(t["dropped"] for t in reports),
        "errors": {},
        "p99_ms": max((t["latency"]["p99_ms"] or 0 for t in reports), default=None),
    }
    for t in reports:
        for kind, n in t["errors"].items():
            total["errors"][kind] = total["errors"].get(kind, 0) + n
    ticks = delta(after.ticks(), before.ticks())
    errors = delta(after.step_errors(), before.step_errors())
    print(
        f"{len(cycles)} lend/return cycles (lease, s to serving, s to returned): {cycles}\n"
        f"ticks {ticks} in {window_s:.0f} s; step errors {errors}\n"
        f"load ({len(runs)} runs of {SEGMENT_S:g} s): sent {total['sent']} ok {total['ok']} "
        f"errors {total['errors']} dropped {total['dropped']} worst p99 {total['p99_ms']} ms"
    )
    for returncode, err, _ in runs:
        assert returncode == 0, err
    assert len(cycles) >= 3, cycles
    for lease_id, _, _ in cycles:
        assert [e.to_state.value for e in store.history(lease_id)] == ORDER
    # The loop: never a failed tick, ideally never an error either.
    assert ticks.get("failed", 0) == 0, (ticks, errors, daemon.log_tail())
    assert ticks.get("errors", 0) == 0, (ticks, errors)
    assert ticks.get("ok", 0) >= window_s / 2, ticks  # it kept ticking (1 s interval)
    # The load: nothing failed, nothing dropped.
    assert total["sent"] >= RATE * load_s * 0.8, total["sent"]
    assert total["errors"] == {} and total["dropped"] == 0, total
    assert total["ok"] == total["sent"]
