"""Failover on the lab: how soon a standby bridge carries on after the active one dies.

Each HA round runs two real `stb daemon` processes on one scratch PostgreSQL database
(tick 2 s, leader TTL = tick), has the active one lend the elastic node, kills it with
SIGKILL while the lend is in flight, and times from the kill:
  active  the standby holds the leader row (its acquired_at)
  move    the standby's first lease move (the lease's history)
  serving the lend it inherited is serving
Baseline, in the same run: today's single daemon (SQLite, file lock) killed the same way
and restarted at once on the same host, the best case of a host that survives (systemd's
RestartSec adds its 5 s; a host that is gone never comes back by itself).

Usage (lab up, root, a local PostgreSQL):  .venv/bin/python bench/failover.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bridge.lab import lab as lab_mod
from bridge.lab.pair import Instance, NoPostgres, cancel_triton_jobs, scratch_database
from bridge.lab.spec import LabSpec
from bridge.leases import leader
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState as S
from bridge.paths import default_lab_dir

TICK_S = 2.0
IN_FLIGHT = (S.REQUESTED, S.SUBMITTED, S.STARTING)


def _until(check: object, timeout_s: float, every: float = 0.02) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return time.time()
        time.sleep(every)
    raise TimeoutError(f"not within {timeout_s:g}s")


def _lend_and_kill(
    lab: LabSpec, store: LeaseStore, queue: RequestQueue, victim: Instance
) -> tuple[int, float, str]:
    """Lend the elastic node through `victim`, kill it mid-lend: (lease, kill time, state)."""
    queue.request_lend(lab.pool_nodes("elastic")[0].name, ["busy"], datetime.now(UTC))
    _until(lambda: any(x.state in IN_FLIGHT for x in store.open_leases()), 30)
    (lease,) = store.open_leases()
    assert lease.id is not None
    killed = time.time()
    victim.kill()
    return lease.id, killed, lease.state.value


def _after_kill(store: LeaseStore, lease_id: int, killed: float) -> tuple[float, float]:
    """(first move after the kill, serving) in seconds from the kill."""
    served = _until(lambda: store.get(lease_id).state == S.SERVING, 120)
    first = min(e.at.timestamp() for e in store.history(lease_id) if e.at.timestamp() >= killed)
    return first - killed, served - killed


def _give_back(store: LeaseStore, queue: RequestQueue, lease_id: int) -> None:
    queue.request_return(lease_id, datetime.now(UTC))
    _until(lambda: store.get(lease_id).state == S.RETURNED, 120, 0.2)


def ha_round(lab: LabSpec, work: Path) -> dict[str, float | str]:
    with scratch_database() as url:
        engine = make_engine(url)
        create_schema(engine)
        store, queue = LeaseStore(engine), RequestQueue(engine)
        a = Instance("bench-a", lab, work / "a", url, TICK_S)
        b = Instance("bench-b", lab, work / "b", url, TICK_S)
        try:
            a.start().wait_role("active")
            b.start().wait_role("standby")
            lease_id, killed, state = _lend_and_kill(lab, store, queue, a)
            _until(lambda: (h := leader.current(engine)) is not None and h.holder == b.name, 30)
            held = leader.current(engine)
            assert held is not None
            move, serving = _after_kill(store, lease_id, killed)
            _give_back(store, queue, lease_id)
            return {
                "killed_in": state,
                "active": held.acquired_at.timestamp() - killed,
                "move": move,
                "serving": serving,
            }
        finally:
            a.stop()
            b.stop()
            engine.dispose()


def restart_round(lab: LabSpec, work: Path) -> dict[str, float | str]:
    url = f"sqlite:///{work / 'solo' / 'bridge.db'}"
    engine = make_engine(url)
    create_schema(engine)
    store, queue = LeaseStore(engine), RequestQueue(engine)
    solo = Instance("solo", lab, work / "solo", url, TICK_S)
    try:
        solo.start().wait_role("active")
        lease_id, killed, state = _lend_and_kill(lab, store, queue, solo)
        solo.start()  # at once, on the same host
        move, serving = _after_kill(store, lease_id, killed)
        _give_back(store, queue, lease_id)
        return {"killed_in": state, "move": move, "serving": serving}
    finally:
        solo.stop()
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lab = LabSpec.load(default_lab_dir())
    if lab is None or not lab_mod.is_up(lab):
        print("the lab is not up: run `stb lab up` first", file=sys.stderr)
        return 2
    ha: list[dict[str, float | str]] = []
    solo: list[dict[str, float | str]] = []
    try:
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="stb-failover-") as tmp:
                ha.append(ha_round(lab, Path(tmp)))
                print(f"round {i + 1} HA:      {ha[-1]}", flush=True)
            with tempfile.TemporaryDirectory(prefix="stb-failover-") as tmp:
                solo.append(restart_round(lab, Path(tmp)))
                print(f"round {i + 1} restart: {solo[-1]}", flush=True)
    except NoPostgres as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        cancel_triton_jobs(lab)  # the baselines the daemons started

    def med(rows: list[dict[str, float | str]], key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    print(f"\nmedian over {args.rounds} rounds, seconds from SIGKILL (tick {TICK_S:g} s):")
    print(f"{'':28}{'standby (HA)':>14}{'restart':>10}")
    print(f"{'leader row taken':28}{med(ha, 'active'):>14.2f}{'-':>10}")
    print(f"{'first lease move':28}{med(ha, 'move'):>14.2f}{med(solo, 'move'):>10.2f}")
    print(f"{'inherited lend serving':28}{med(ha, 'serving'):>14.2f}{med(solo, 'serving'):>10.2f}")
    print(
        f"RESULT rounds={args.rounds} tick_s={TICK_S:g} "
        f"takeover_s={med(ha, 'active'):.2f} first_move_s={med(ha, 'move'):.2f} "
        f"first_move_ticks={med(ha, 'move') / TICK_S:.2f} "
        f"restart_first_move_s={med(solo, 'move'):.2f} "
        f"serving_s={med(ha, 'serving'):.2f} restart_serving_s={med(solo, 'serving'):.2f} "
        f"ratio_first_move={med(ha, 'move') / med(solo, 'move'):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
