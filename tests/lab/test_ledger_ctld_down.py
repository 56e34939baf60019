"""slurmctld stopped for 40 s (TrackSlurmctldDown=yes in the lab's slurmdbd.conf):
the ledger books the gap as sreport does, on the lab.

slurmdbd 22.05 inserts a cluster event when slurmctld's connection closes (node name "",
state DOWN, reason "slurmctld disconnect", the cluster's TRES; as_mysql_cluster.c
`as_mysql_fini_ctld`) and ends it when slurmctld registers again. Its rollup books the
registered GPUs x the gap's seconds as Down, less the GPUs x seconds of the jobs running
in it and the cluster's GPUs x the overlap of each node event in it (as_mysql_rollup.c;
`accounting/capacity.py` has the line references). A 1-GPU job runs across the gap.

Checked, on a fresh ledger of the hours around the gap:

- `sacctmgr show event` lists the disconnect (the test prints what it saw): a cluster
  event, state 1, ended, its TRES the registered GPUs, about the time slurmctld stopped;
- the ledger's `down` of the disconnect (user "": slurmdbd records none) per hour is the
  registered GPUs x the gap's seconds less the job runs' GPUs x seconds in it (and less
  the cluster's GPUs x any node event's overlap), within rounding;
- no `idle` in the gap: per hour, idle fits in the registered time outside the gap once the
  allocation outside it is taken;
- per hour, allocated + down lines + idle = the registered GPUs x the registered seconds;
- the job across the gap is booked as sacct says: its GPUs x its elapsed seconds.

The lab must run with TrackSlurmctldDown=yes (deploy/lab/templates/slurmdbd.conf.in); a lab
started before it was there skips, saying so (`stb lab down && stb lab up`).
"""

from __future__ import annotations

import re
import shutil
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from accounting.buckets import HOUR, floor_hour
from accounting.capacity import DISCONNECT_USER
from accounting.db import open_ledger
from accounting.schema import CAPACITY_SOURCE
from accounting.tables import LEDGER
from bridge.lab import lab as lab_mod
from bridge.lab import procs
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import gpu_equivalents, ingest_window
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import SlurmEvent
from bridge.slurm.slices import SliceRules

from .helpers import gpu_count, sacct_records, sbatch, until, wait_sacct_final, wait_state

pytestmark = pytest.mark.lab

#: how long slurmctld stays down: the booking is exact to the second, so 40 s (16 GPUs x 40 s
#: of down, against a tolerance of a GPU-second per job run and GPU) checks it as well as
#: three minutes did
GAP_S = 40
MS = 1000


def _tracked(lab: LabSpec) -> bool:
    """slurmdbd runs with TrackSlurmctldDown=yes (`sacctmgr show configuration` lists the
    running slurmdbd's settings)."""
    out = slurm(lab, "sacctmgr", "show", "configuration")
    found = re.search(r"TrackSlurmctldDown\s*=\s*(\S+)", out)
    return bool(found) and found.group(1).lower() in ("yes", "1")


def _slurmctld_bin() -> str:
    for d in ("/usr/sbin", "/usr/bin", "/sbin"):
        if Path(d, "slurmctld").exists():
            return str(Path(d, "slurmctld"))
    found = shutil.which("slurmctld")
    assert found, "slurmctld is not installed"
    return found


def _restart_slurmctld(lab: LabSpec, table: procs.ProcTable) -> None:
    """Start slurmctld as `stb lab up` does (same argv, environment and pid file, so `stb
    lab down` stops it), then wait until it answers and every node is up again."""
    table.start("slurmctld", [_slurmctld_bin(), "-D", "-f", str(lab.slurm_conf)], lab.env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if lab_mod.is_up(lab):
            return
        time.sleep(0.3)
    raise AssertionError(f"the lab is not up 120 s after slurmctld restarted; see {lab.log_dir}")


def _disconnect(cli: SlurmCLI, lab: LabSpec, stopped: datetime) -> SlurmEvent:
    """The ended disconnect event slurmdbd recorded when slurmctld stopped."""
    deadline = time.monotonic() + 60
    seen: list[SlurmEvent] = []
    while time.monotonic() < deadline:
        seen = [
            e
            for e in cli.events(stopped - timedelta(minutes=1), datetime.now(UTC))
            if e.cluster == lab.cluster and e.is_cluster
        ]
        found = [
            e
            for e in seen
            if e.is_disconnect
            and e.end is not None
            and abs((e.start - stopped).total_seconds()) <= 60
        ]
        if found:
            return found[-1]
        time.sleep(0.3)
    raise AssertionError(f"slurmdbd recorded no ended slurmctld disconnect; cluster events: {seen}")


def _started_at(lab: LabSpec, job: str) -> float | None:
    """The job's start (epoch s) as slurmdbd has it; None before slurmdbd has it."""
    recs = sacct_records(lab, job)
    if not recs:
        return None
    state = recs[-1]["state"]["current"]  # a string on 22.05, a list on later releases
    start = int(recs[-1]["time"]["start"] or 0)
    return (
        float(start)
        if start and "RUNNING" in ([state] if isinstance(state, str) else state)
        else None
    )


def _gap_across(lab: LabSpec, cli: SlurmCLI, table: procs.ProcTable, job: str) -> SlurmEvent:
    """Stop slurmctld for GAP_S while `job` runs, start it again; the disconnect event,
    once it ended and a whole second more passed (sacct's times are whole seconds, so the
    job, cancelled next, starts before the gap and ends after it)."""
    wait_state(lab, job, {"RUNNING"}, 60)
    # slurmdbd has the job's start (the ledger sees it run in the gap)
    until("slurmdbd has the job's start", lambda: _started_at(lab, job) is not None, 30, 0.5)
    started_at = _started_at(lab, job) or 0.0
    until("a second after the job's start", lambda: time.time() >= started_at + 1.5, 5)
    stopped = datetime.now(UTC)
    try:
        assert table.stop("slurmctld", timeout_s=30)
        time.sleep(GAP_S)
    finally:
        _restart_slurmctld(lab, table)
    ev = _disconnect(cli, lab, stopped)
    gap_end = ev.end.timestamp() if ev.end else 0.0
    until("a second after the gap's end", lambda: time.time() >= gap_end + 1.5, 10)
    return ev


def _overlap_ms(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> int:
    return max(0, int((min(a1, b1) - max(a0, b0)).total_seconds() * MS))


@pytest.mark.timeout(900)
def test_slurmctld_down_is_booked_as_sreport_books_it(lab: LabSpec, tmp_path: Path) -> None:
    if not _tracked(lab):
        pytest.skip(
            "the lab's slurmdbd runs without TrackSlurmctldDown=yes (started before it was "
            "in deploy/lab/templates/slurmdbd.conf.in): `stb lab down && stb lab up`"
        )
    cli = SlurmCLI(env=lab.env())
    table = procs.ProcTable(lab.run_dir, lab.log_dir, str(lab.lab_dir))
    assert table.get("slurmctld"), "the lab's slurmctld is not running"

    # the job runs until it is cancelled once the gap is over (a job that ends on its own
    # would keep the test waiting for its sleep)
    job = sbatch(lab, "--partition=train", "--account=team-vision", "--gres=gpu:1",
                 "--time=15", "--wrap", "sleep 600")  # fmt: skip
    try:
        ev = _gap_across(lab, cli, table, job)
    finally:
        slurm(lab, "scancel", job, check=False)
    print(f"slurmdbd recorded: {ev}")  # what the test saw
    assert ev.end is not None and ev.reason == "slurmctld disconnect" and ev.state_raw == 1
    assert not ev.is_registration and ev.nodes == ()
    gap = (ev.start, ev.end)
    assert (gap[1] - gap[0]).total_seconds() >= GAP_S - 5, gap

    rec = wait_sacct_final(lab, job, timeout_s=60)
    gpus_of_job = gpu_count(rec)
    assert gpus_of_job == 1
    job_start = datetime.fromtimestamp(int(rec["time"]["start"]), UTC)
    job_end = datetime.fromtimestamp(int(rec["time"]["end"]), UTC)
    assert job_start < gap[0] and job_end > gap[1], (job_start, job_end, gap)

    now = datetime.now(UTC)
    since = floor_hour(min(job_start, gap[0]))  # the whole job in the window
    events = cli.events(since, now)
    registered = [e for e in events if e.is_registration and e.cluster == lab.cluster]
    reg_at_gap = [e for e in registered if e.start <= gap[0] and (e.end is None or e.end >= gap[1])]
    assert reg_at_gap, f"no registration of {lab.cluster} spans the gap: {registered}"
    slurm_gpus = {n.name: n.gpus for n in cli.nodes()}
    assert ev.gpus == sum(slurm_gpus.get(n, 0) for n in reg_at_gap[0].nodes), ev.gpus
    # the ledger's GPUs: a MIG slice its fraction of a GPU, not one gres/gpu
    node_gpus = {n.name: float(gpu_equivalents(n, SliceRules())) for n in cli.nodes()}
    cluster_gpus = sum(node_gpus.get(n, 0) for n in reg_at_gap[0].nodes)

    url = f"sqlite:///{tmp_path / 'ctld.db'}"
    engine = open_ledger(url)
    ingest_window(lab_config(lab), cli, engine, since, now, now=now)
    with engine.connect() as conn:
        rows = [
            (b if b.tzinfo else b.replace(tzinfo=UTC), w, u, src, int(ms))
            for b, w, u, src, ms in conn.execute(
                select(LEDGER.c.bucket, LEDGER.c.workload, LEDGER.c.user_name, LEDGER.c.source,
                       LEDGER.c.gpu_ms)
            )
        ]  # fmt: skip

    # the job across the gap as sacct books it
    key = f"{lab.cluster}:{job}:{int(job_start.timestamp())}"
    booked = sum(ms for _b, _w, _u, src, ms in rows if src == key)
    assert booked == gpus_of_job * int(rec["time"]["elapsed"]) * MS, (key, booked, rec["time"])

    # every run in the gap (other tests' jobs too), from sacct
    runs = [r for r in cli.accounting(since, now) if r.start and r.gpus]
    node_events = [e for e in events if not e.is_cluster and not e.state_raw & 0x8000]
    # every disconnect of the hours (an earlier test may have stopped slurmctld too)
    gaps = [(e.start, e.end or now) for e in events if e.is_disconnect and e.cluster == lab.cluster]
    hours = sorted({floor_hour(gap[0]), floor_hour(gap[1] - timedelta(microseconds=1))})
    for h in hours:
        h_end = min(h + HOUR, now)
        want = g_all = jobs_all = nodes_all = 0
        for g0, g1 in gaps:
            g = _overlap_ms(g0, g1, h, h_end)
            if not g:
                continue
            lo, hi = max(g0, h), min(g1, h_end)
            jobs = sum(r.gpus * _overlap_ms(r.start, r.end or now, lo, hi) for r in runs if r.start)
            nodes_in = sum(_overlap_ms(e.start, e.end or now, lo, hi) for e in node_events)
            want += max(0, cluster_gpus * g - jobs - cluster_gpus * nodes_in)
            g_all, jobs_all, nodes_all = g_all + g, jobs_all + jobs, nodes_all + nodes_in
        got = sum(ms for b, w, u, _s, ms in rows if b == h and w == "down" and u == DISCONNECT_USER)
        print(f"{h:%H:%M}: gaps {g_all} ms, jobs {jobs_all} GPU-ms, node events {nodes_all} ms "
              f"in them: down {got} GPU-ms, sreport's rule {want}")  # fmt: skip
        assert abs(got - want) <= MS * (len(runs) + cluster_gpus), (h, got, want)
        # no idle in the gaps: idle fits in the registered time outside them, less the
        # allocation outside them (and the room node events in them leave, as in sreport)
        reg_ms = sum(
            sum(node_gpus.get(n, 0) for n in e.nodes) * _overlap_ms(e.start, e.end or now, h, h_end)
            for e in registered
        )
        alloc = sum(ms for b, _w, _u, src, ms in rows if b == h and src != CAPACITY_SOURCE)
        idle = sum(ms for b, w, _u, _s, ms in rows if b == h and w == "idle")
        room = reg_ms - cluster_gpus * g_all - (alloc - jobs_all) + cluster_gpus * nodes_all
        assert idle <= room + MS * (len(runs) + cluster_gpus), (h, idle, room)

    # per hour: allocated + down lines + idle = registered GPUs x registered seconds
    per_hour: dict[datetime, int] = defaultdict(int)
    for b, _w, _u, _s, ms in rows:
        per_hour[b] += ms
    for h, total in per_hour.items():
        expected = sum(
            sum(node_gpus.get(n, 0) for n in e.nodes)
            * _overlap_ms(e.start, e.end or now, h, min(h + HOUR, now))
            for e in registered
        )
        assert abs(total - expected) <= MS * len(node_gpus) * 4, (h, total, expected)
