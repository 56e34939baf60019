"""The ledger's capacity and down time from slurmdbd's own events, on the lab.

- A first ingest whose window begins before the lab's cluster registered with slurmdbd books
  nothing before that registration (the bug this replaced: every node seen for the first
  time was taken to have existed since the window's start, so the whole look-back window
  was booked idle); nor does the same ingest with capacity from the inventory, which books
  a node from its first job run or its first observation.
- The same through `stb accounting ingest` with the lab's TOML as a site writes it
  (`[accounting] cluster` empty, no job yet in the window): the cluster's name is Slurm's
  ClusterName, so slurmdbd's registration is found; a cluster name slurmdbd does not know is
  an error naming the ones it does, and nothing is written.
- A node the bridge fences (drain reason "stb: ...") and one an administrator drains show
  as their own lines, `fenced` and `drained`, each of the node's GPUs x the event's seconds
  as `sacctmgr show event` records them, with who set them.
- Per hour, capacity (allocated + down lines + idle) is the registered nodes' GPUs x the
  registered seconds.
- sreport over hours slurmdbd has rolled up since the lab started: the ledger agrees with
  `sreport -T gres/gpu cluster Utilization` and `AccountUtilizationByUser`; an hour whose
  rollup predates a job record (pending) agrees once slurmdbd has rolled it up again. A lab younger
  than a whole hour has none; the test then says so and skips that part
  (bench/sreport_agreement.py on a lab that has run for hours is the proof).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from accounting.buckets import HOUR, floor_hour
from accounting.capacity import down_class
from accounting.db import open_ledger
from accounting.tables import LEDGER
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import MIG_POOL, LabSpec
from bridge.ledger.feed import gpu_equivalents, ingest_window
from bridge.ledger.sreport import sreport_agreement
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import SlurmEvent
from bridge.slurm.slices import SliceRules
from tests.faults.tools import stb_ingest
from tests.lab.helpers import sbatch, wait_sacct_final

pytestmark = pytest.mark.lab


def _idle_node(cli: SlurmCLI) -> str | None:
    for node in cli.nodes():
        if node.partitions == (MIG_POOL,):  # the node of MIG slices: no whole GPUs
            continue
        if node.state == "idle" and not node.flags & {"DRAIN", "DRAINED", "DRAINING"}:
            return node.name
    return None


def _drain_briefly(lab: LabSpec, cli: SlurmCLI, reason: str) -> SlurmEvent:
    """Drain an idle node for about two seconds; the event slurmdbd recorded. slurmctld
    books no event for a node drained under a running job (it is draining, not down: seen
    on 22.05.8), so a node that took a job between the idle check and the drain (a job
    another test left pending) is resumed and another idle one tried."""
    for _ in range(10):
        node = _idle_node(cli)
        if node is None:
            pytest.skip("no idle lab node to drain")
        started = datetime.now(UTC) - timedelta(seconds=1)
        slurm(lab, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        drained = next((n for n in cli.nodes() if n.name == node), None)
        if drained is None or drained.state != "idle":  # a job started there first
            slurm(lab, "scontrol", "update", f"nodename={node}", "state=resume")
            time.sleep(1)
            continue
        time.sleep(2.5)
        slurm(lab, "scontrol", "update", f"nodename={node}", "state=resume")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [
                e
                for e in cli.events(started, datetime.now(UTC) + timedelta(seconds=1))
                if e.node == node and e.reason == reason and e.end is not None
            ]
            if found:
                return found[-1]
            time.sleep(0.5)
        raise AssertionError(f"slurmdbd recorded no closed drain event of {node} ({reason!r})")
    raise AssertionError(f"no lab node stayed idle long enough to drain ({reason!r})")


def _rows(url: str) -> list[tuple[datetime, str, str, str, int]]:
    engine = open_ledger(url)
    with engine.connect() as conn:
        return [
            (b if b.tzinfo else b.replace(tzinfo=UTC), p, w, u, int(ms))
            for b, p, w, u, ms in conn.execute(
                select(
                    LEDGER.c.bucket,
                    LEDGER.c.pool,
                    LEDGER.c.workload,
                    LEDGER.c.user_name,
                    LEDGER.c.gpu_ms,
                )
            )
        ]


def test_capacity_and_down_time_from_slurm_events(lab: LabSpec, tmp_path: Path) -> None:
    cli = SlurmCLI(env=lab.env())
    config = lab_config(lab)
    # a job of a second in the window: the inventory's capacity below books a node from its
    # first job run (a lab that has run none, as when this test runs alone, books nothing)
    wait_sacct_final(lab, sbatch(lab, "-p", "elastic", "-A", lab.accounts[0], "--wrap", "true"))
    fence = _drain_briefly(lab, cli, "stb: ledger test fence")
    admin = _drain_briefly(lab, cli, "ledger test maintenance")
    now = datetime.now(UTC)
    registered = [
        e
        for e in cli.events(now - timedelta(days=7), now)
        if e.is_registration and e.cluster == lab.cluster
    ]
    assert registered, "slurmdbd holds no registration of the lab's cluster"
    first = min(e.start for e in registered)
    since = floor_hour(first) - HOUR  # the window begins an hour before the cluster existed
    # the ledger's GPUs of each node: a MIG slice its fraction of a GPU
    gpus = {n.name: float(gpu_equivalents(n, SliceRules())) for n in cli.nodes()}
    counts = {n.name: n.gpus for n in cli.nodes()}  # Slurm's: a slice is one gres/gpu

    url = f"sqlite:///{tmp_path / 'events.db'}"
    ingest_window(config, cli, open_ledger(url), since, now, now=now)
    rows = _rows(url)
    assert rows and not [r for r in rows if r[0] < floor_hour(first)], (
        "capacity before Slurm had it"
    )

    # the fence and the drain as their own lines, with who set them: at least the test's
    # own event (the node's GPUs x its seconds), at most every event of that line in the
    # window (other tests fence nodes too; a line never takes more than the capacity left)
    by_line: dict[tuple[str, str], int] = defaultdict(int)
    for _b, _p, workload, user, ms in rows:
        by_line[(workload, user)] += ms
    raw: dict[tuple[str, str], int] = defaultdict(int)
    for ev in cli.events(since, now):
        line = down_class(ev) if not ev.is_cluster else None
        if line is not None:
            lo, hi = max(ev.start, first), min(ev.end or now, now)
            raw[(line, ev.user)] += ev.gpus * max(0, int((hi - lo).total_seconds() * 1000))
    for line, ev in (("fenced", fence), ("drained", admin)):
        assert ev.end is not None and down_class(ev) == line
        own = gpus[ev.node] * int((ev.end - ev.start).total_seconds()) * 1000
        assert own <= by_line[(line, ev.user)] <= raw[(line, ev.user)] + 1000, (
            line, ev, dict(by_line), dict(raw),
        )  # fmt: skip

    # per hour: every line together is the registered GPUs x registered seconds
    per_hour: dict[datetime, int] = defaultdict(int)
    for bucket, _p, _w, _u, ms in rows:
        per_hour[bucket] += ms
    for bucket, total in per_hour.items():
        expected = 0
        for e in registered:
            lo = max(e.start, bucket)
            hi = min(e.end or now, bucket + HOUR, now)
            if hi > lo:
                # a node Slurm no longer has (a lab brought up in another shape earlier)
                # has no inventory record: the registration's GPUs less the known nodes'
                known = [n for n in e.nodes if n in gpus]
                gone = (
                    max(0, e.gpus - sum(counts[n] for n in known))
                    if len(known) < len(e.nodes)
                    else 0
                )
                expected += (sum(gpus[n] for n in known) + gone) * int(
                    (hi - lo).total_seconds() * 1000
                )
        assert abs(total - expected) <= 1000 * len(gpus) * 4, (bucket, total, expected)

    # the inventory's capacity books each node from its first job run in the window (or
    # from now): never from the window's start, so nothing before the cluster existed either
    inventory = f"sqlite:///{tmp_path / 'inventory.db'}"
    ingest_window(config, cli, open_ledger(inventory), since, now, now=now, events=False)
    booked = _rows(inventory)
    assert booked and not [r for r in booked if r[0] < floor_hour(first)], "inventory backfill"


def test_agrees_with_sreport_over_rolled_up_hours(lab: LabSpec, tmp_path: Path) -> None:
    cli = SlurmCLI(env=lab.env())
    now = datetime.now(UTC)
    registered = [e for e in cli.events(now - timedelta(days=7), now) if e.is_cluster]
    first = min(e.start for e in registered)
    start, end = floor_hour(first), floor_hour(now)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = open_ledger(url)
    ingest_window(lab_config(lab), cli, engine, start, now, now=now)
    agreement = sreport_agreement(cli, engine, lab.cluster, start, end)
    if not agreement.hours:
        pytest.skip(
            "slurmdbd has rolled up no whole hour of this lab yet (it started at "
            f"{first:%H:%M}); bench/sreport_agreement.py is the proof"
        )
    assert agreement.ok, [
        (d.hour, d.what, d.ledger, d.sreport, d.cause) for d in agreement.differences
    ]
    # an hour slurmdbd had not re-rolled (the demo or earlier tests changed a job record
    # of it after its rollup) is pending, not a difference; rolled up again, it must agree
    for pending in agreement.pending:
        print(f"pending {pending.hour:%H:00}: {pending.differences} runs {pending.runs}")
        again = sreport_agreement(
            cli, engine, lab.cluster, pending.hour, pending.hour + HOUR, reroll=True
        )
        assert again.rerolled == [pending.hour] and again.ok, again.differences


def _arrival(registered: list[SlurmEvent]) -> SlurmEvent:
    """The latest registration that no earlier one covers: when the cluster (re)appeared
    (on a new lab, its first)."""
    ordered = sorted(registered, key=lambda e: e.start)
    fresh = [
        e
        for e in ordered
        if not any(o.start < e.start and (o.end is None or o.end >= e.start) for o in ordered)
    ]
    return fresh[-1]


def _site_toml(tmp_path: Path, name: str, accounting: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'database_url = "sqlite:///{tmp_path / name}-bridge.db"\n'
        "[accounting]\n"
        f'ledger_url = "sqlite:///{tmp_path / name}-ledger.db"\n' + accounting
    )
    return path


def test_a_new_clusters_first_ingest_books_nothing_before_it_registered(
    lab: LabSpec, tmp_path: Path
) -> None:
    cli = SlurmCLI(env=lab.env())
    now = datetime.now(UTC)
    registered = [
        e
        for e in cli.events(now - timedelta(days=7), now)
        if e.is_registration and e.cluster == lab.cluster
    ]
    assert registered, "slurmdbd holds no registration of the lab's cluster"
    arrived = _arrival(registered)
    # ingested at once: the window ends seconds after the registration, three hours back
    since = floor_hour(arrived.start) - 3 * HOUR
    until = arrived.start + timedelta(seconds=20)

    toml = _site_toml(tmp_path, "site", "")  # [accounting] cluster left empty, as shipped
    code, out = stb_ingest(lab, toml, since, until)
    print(f"stb accounting ingest, cluster unset: exit {code}: {out.strip()}")
    assert code == 0, out
    assert "capacity from the inventory" not in out, out
    rows = _rows(f"sqlite:///{tmp_path / 'site'}-ledger.db")
    early = [r for r in rows if r[0] < floor_hour(arrived.start)]
    assert not early, f"GPU-hours booked before the cluster registered: {early[:5]}"
    assert sum(ms for *_k, ms in rows) > 0, "the registration's own seconds are booked"

    # a cluster slurmdbd has never heard of: the error names the ones it has; nothing written
    wrong = _site_toml(tmp_path, "wrong", 'cluster = "no-such-cluster"\n')
    code, out = stb_ingest(lab, wrong, since, until)
    print(f"stb accounting ingest, unknown cluster: exit {code}: {out.strip()}")
    assert code == 1, out
    assert "no-such-cluster" in out and lab.cluster in out and "Traceback" not in out, out
    assert not _rows(f"sqlite:///{tmp_path / 'wrong'}-ledger.db")
