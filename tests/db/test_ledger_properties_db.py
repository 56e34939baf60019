"""Property tests (hypothesis) of the ledger in a real database: inventory, ingest, report.

Hypothesis generates GPU jobs on a small inventory (4 nodes x 4 GPUs in 3 pools, two GPU
types), placed so that no node ever holds more than its 4 GPUs: single- and two-node jobs,
jobs still running at the horizon, training, elastic and serving jobs, four accounts of
three teams, over a 6-hour window that crosses a month boundary. Each example gets a fresh
SQLite ledger in a temporary folder; then:

- per pool, GPU type and hour, allocated + idle = capacity, where allocation and capacity
  are computed here from the generated jobs and inventory (not read back from the code
  under test), and each record's rows sum to gpus x duration;
- re-ingesting the same records is a no-op: every ledger and source row identical, ids
  included, and the summary says 0 new / 0 changed;
- a report filtered to one team (`filters={"team": t}`) has exactly that team's lines of
  the report of all teams, with and without rates, idle as a line or shared;
- a changed record replaces its rows (no double counting): ingesting the changed records
  over the old ones leaves the same ledger as ingesting them into an empty one.

Deterministic tests run a fixed scenario (with a serving job whose counter resets) through
the same checks on SQLite and on PostgreSQL (the `database_url` fixture).
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from accounting.attribution import Context, ServingPoint
from accounting.book import IngestSummary
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.rates import RateBook, RateSpec, add_rates, list_rates, money
from accounting.report import Report, Window, build_report
from accounting.samples import record_serving
from accounting.schema import CAPACITY_SOURCE, CAPACITY_WORKLOADS, UNATTRIBUTED
from accounting.tables import LEDGER, SOURCES
from bridge.slurm.model import AccountingRecord

DB_PROPS = settings(max_examples=25, deadline=None, database=None)

H = 3_600_000
MS = timedelta(milliseconds=1)
CLUSTER = "c1"
W0 = datetime(2026, 1, 31, 21, tzinfo=UTC)  # three hours before February
WINDOW_HOURS = 6
W1 = W0 + timedelta(hours=WINDOW_HOURS)
WINDOW_MS = WINDOW_HOURS * H
WINDOW = Window(W0, W1, "test window")
GPUS_PER_NODE = 4
INVENTORY = (
    NodeCapacity("g0", "train", "h100", GPUS_PER_NODE),
    NodeCapacity("g1", "train", "h100", GPUS_PER_NODE),
    NodeCapacity("g2", "serve", "h100", GPUS_PER_NODE),
    NodeCapacity("g3", "spare", "a100", GPUS_PER_NODE),
)
NODE = {n.node: n for n in INVENTORY}
PARTITION_OF_POOL = {"train": "batch", "serve": "serve", "spare": "spare"}
ACCOUNTS = ("a1", "a2", "a3", "a4")  # a4 maps to no team: it is its own team
CTX = Context(
    pool_of_node={n.node: n.pool for n in INVENTORY},
    gpu_type_of_node={n.node: n.gpu_type for n in INVENTORY},
    workload_of_partition={"batch": "training", "serve": "inference", "spare": "elastic"},
    team_of_account={"a1": "vision", "a2": "vision", "a3": "nlp"},
    known_gpu_types=frozenset({"h100", "a100"}),
    horizon=W1,
    cluster=CLUSTER,
)
RATES = (
    RateSpec("h100", Decimal("2.50"), date(2026, 1, 1), date(2026, 2, 1)),
    RateSpec("h100", Decimal("3.10"), date(2026, 2, 1)),
    RateSpec("h100", Decimal("4.00"), date(2026, 1, 1), pool="serve"),
    RateSpec("a100", Decimal("1.25"), date(2026, 1, 1)),
)
Cell = tuple[str, str, datetime]  # pool, gpu type, hour
EPS = Decimal("1e-12")  # Decimal sums in another order may differ in the 28th digit


# --- generated jobs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One generated run: `gpn` GPUs on each of `nodes` over [start, end) ms of the window
    (`running`: no end recorded yet, so it counts up to the horizon, the window's end)."""

    job_id: str
    nodes: tuple[str, ...]
    gpn: int
    start: int
    end: int
    running: bool
    account: str
    comment: str

    def record(self) -> AccountingRecord:
        start = W0 + self.start * MS
        end = None if self.running else W0 + self.end * MS
        return AccountingRecord(
            cluster=CLUSTER, job_id=self.job_id, array_job_id=None, array_task_id=None,
            name="job", partition=PARTITION_OF_POOL[NODE[self.nodes[0]].pool],
            account=self.account, user="alice", qos="normal",
            state="RUNNING" if self.running else "COMPLETED", submit=start, start=start,
            end=end, elapsed_s=(self.end - self.start) // 1000, nodes=self.nodes,
            gpus=self.gpn * len(self.nodes), gpu_type=None, comment=self.comment, restarts=0,
        )  # fmt: skip


def fits(job: Job, placed: Sequence[Job]) -> bool:
    """Whether `job` keeps every node at or under its GPUs next to the placed jobs."""
    for node in job.nodes:
        others = [j for j in placed if node in j.nodes and j.start < job.end and job.start < j.end]
        # the usage peaks at the start of the job or of one of the others
        for t in {job.start, *(j.start for j in others if j.start > job.start)}:
            used = sum(j.gpn for j in others if j.start <= t < j.end)
            if used + job.gpn > GPUS_PER_NODE:
                return False
    return True


@st.composite
def job_sets(draw: st.DrawFn, max_jobs: int = 12) -> list[Job]:
    candidates = draw(
        st.lists(
            st.tuples(
                st.lists(st.sampled_from(sorted(NODE)), min_size=1, max_size=2, unique=True),
                st.integers(1, GPUS_PER_NODE),
                st.integers(0, WINDOW_MS - 1),
                st.one_of(st.none(), st.integers(1, WINDOW_MS)),
                st.sampled_from(ACCOUNTS),
                st.sampled_from(["", "", "stb:triton", "stb:workload=elastic"]),
            ),
            max_size=max_jobs,
        )
    )
    placed: list[Job] = []
    for i, (nodes, gpn, start, dur, account, comment) in enumerate(candidates):
        # a start on a whole second: the record's key holds the start in seconds
        start -= start % 1000
        end = WINDOW_MS if dur is None else min(start + dur, WINDOW_MS)
        job = Job(f"{100 + i}", tuple(nodes), gpn, start, end, dur is None, account, comment)
        if fits(job, placed):
            placed.append(job)
    return placed


def hour_overlaps(s_ms: int, e_ms: int) -> dict[datetime, int]:
    """Hour bucket -> ms of [s_ms, e_ms) (window offsets) in it."""
    out = {}
    for k in range(WINDOW_HOURS):
        lo, hi = max(s_ms, k * H), min(e_ms, (k + 1) * H)
        if hi > lo:
            out[W0 + timedelta(hours=k)] = hi - lo
    return out


def expected_capacity() -> dict[Cell, int]:
    cap: dict[Cell, int] = defaultdict(int)
    for n in INVENTORY:
        for k in range(WINDOW_HOURS):
            cap[(n.pool, n.gpu_type, W0 + timedelta(hours=k))] += n.gpus * H
    return dict(cap)


def expected_allocation(jobs: Sequence[Job]) -> dict[Cell, int]:
    alloc: dict[Cell, int] = defaultdict(int)
    for j in jobs:
        for node in j.nodes:
            for hour, ms in hour_overlaps(j.start, j.end).items():
                alloc[(NODE[node].pool, NODE[node].gpu_type, hour)] += j.gpn * ms
    return dict(alloc)


# --- ledger helpers -------------------------------------------------------------------------


@contextmanager
def fresh_ledger() -> Iterator[Engine]:
    """An empty, migrated SQLite ledger in a temporary folder (one per hypothesis example)."""
    with tempfile.TemporaryDirectory(prefix="ledger-props-") as d:
        engine = open_ledger(f"sqlite:///{Path(d) / 'ledger.db'}")
        try:
            yield engine
        finally:
            engine.dispose()


def book(
    engine: Engine, records: Sequence[AccountingRecord], chunk_size: int = 2000
) -> IngestSummary:
    """Record the inventory (backfilled over the window), then ingest the window."""
    record_inventory(engine, CLUSTER, INVENTORY, at=W1, backfill_from=W0)
    return ingest_records(engine, records, CTX, since=W0, until=W1, now=W1, chunk_size=chunk_size)


def table_rows(engine: Engine, table: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(table).order_by(table.c.id))]


def ledger_content(engine: Engine) -> Counter[tuple[Any, ...]]:
    """The ledger rows as a multiset, without their ids."""
    return Counter(r[1:] for r in table_rows(engine, LEDGER))


def check_capacity(engine: Engine, allocation: dict[Cell, int], summary: IngestSummary) -> None:
    """allocated + the capacity lines (idle, down) = capacity per pool, GPU type and hour;
    allocation as expected."""
    used: dict[Cell, int] = defaultdict(int)
    idle: dict[Cell, int] = defaultdict(int)
    with engine.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.pool, LEDGER.c.gpu_type, LEDGER.c.bucket, LEDGER.c.workload,
                   LEDGER.c.source, LEDGER.c.gpu_ms)
        ).all()  # fmt: skip
    for pool, gpu_type, bucket, workload, source, ms in rows:
        assert W0 <= bucket < W1
        assert (workload in CAPACITY_WORKLOADS) == (source == CAPACITY_SOURCE)
        cell = (pool, gpu_type, bucket)
        (idle if workload in CAPACITY_WORKLOADS else used)[cell] += ms
    capacity = expected_capacity()
    assert dict(used) == allocation
    assert set(idle) <= set(capacity)
    for cell, cap in capacity.items():
        assert used.get(cell, 0) + idle.get(cell, 0) == cap, cell
    assert summary.overbooked == {}


def check_sources(engine: Engine, jobs: Sequence[Job]) -> None:
    """Each record's rows and its source row hold gpus x duration."""
    per_source: dict[str, int] = defaultdict(int)
    for r in table_rows(engine, LEDGER):
        per_source[r[LEDGER.c.keys().index("source")]] += r[-1]
    want = {j.record().key: j.gpn * len(j.nodes) * (j.end - j.start) for j in jobs}
    per_source.pop(CAPACITY_SOURCE, None)
    assert dict(per_source) == {k: v for k, v in want.items() if v}
    with engine.connect() as conn:
        stored = dict(conn.execute(select(SOURCES.c.key, SOURCES.c.gpu_ms)).all())
    assert stored == want


def check_reingest_is_noop(engine: Engine, records: Sequence[AccountingRecord]) -> None:
    before = (table_rows(engine, LEDGER), table_rows(engine, SOURCES))
    again = book(engine, records)
    assert (again.new, again.changed, again.rows_written) == (0, 0, 0)
    assert again.unchanged == len(records)
    assert (table_rows(engine, LEDGER), table_rows(engine, SOURCES)) == before


def check_team_filter(engine: Engine, rates: RateBook | None, idle: str, step: str | None) -> None:
    """Every team's lines are the same in a report of all teams and in its own report."""
    by = ("team", "workload", "pool")
    full = build_report(engine, WINDOW, by, step=step, idle=idle, rates=rates)
    teams = {line.keys["team"] for line in full.lines}
    assert teams, "the window has rows"
    for team in [*sorted(teams), "nobody"]:
        own = build_report(
            engine, WINDOW, by, step=step, idle=idle, rates=rates, filters={"team": team}
        )
        assert own.lines == [line for line in full.lines if line.keys["team"] == team], team
        # grouped without the team: the same totals
        alone = build_report(
            engine, WINDOW, ("workload",), step=step, idle=idle, rates=rates, filters={"team": team}
        )
        assert alone.total_gpu_ms == own.total_gpu_ms
        assert total_cost(alone) == total_cost(own)
    if rates is not None:  # the teams' (unrounded) costs add up to the whole
        parts = [
            build_report(engine, WINDOW, by, idle=idle, rates=rates, filters={"team": t})
            for t in teams
        ]
        whole = full.total_cost or Decimal(0)
        assert abs(sum((r.total_cost or Decimal(0) for r in parts), Decimal(0)) - whole) < EPS


def total_cost(report: Report) -> Decimal | None:
    cost = report.total_cost
    return None if cost is None else money(cost)


# --- hypothesis-driven (SQLite) ---------------------------------------------------------------


@given(jobs=job_sets(), chunk_size=st.integers(1, 5))
@DB_PROPS
def test_allocated_plus_idle_is_capacity_and_reingest_is_a_noop(
    jobs: list[Job], chunk_size: int
) -> None:
    records = [j.record() for j in jobs]
    with fresh_ledger() as engine:
        summary = book(engine, records, chunk_size)  # records stream through in chunks
        assert (summary.new, summary.changed) == (len(records), 0)
        check_capacity(engine, expected_allocation(jobs), summary)
        check_sources(engine, jobs)
        check_reingest_is_noop(engine, records)


@given(
    jobs=job_sets(),
    priced=st.booleans(),
    idle=st.sampled_from(["line", "shared"]),
    step=st.sampled_from([None, "hour", "day"]),
)
@DB_PROPS
def test_a_team_filter_keeps_the_teams_lines_as_in_the_whole_report(
    jobs: list[Job], priced: bool, idle: str, step: str | None
) -> None:
    with fresh_ledger() as engine:
        book(engine, [j.record() for j in jobs])
        check_team_filter(engine, RateBook(RATES) if priced else None, idle, step)


@st.composite
def changed_job_sets(draw: st.DrawFn) -> tuple[list[Job], list[Job]]:
    """Jobs, and the same jobs with some changed (end earlier, another account, fewer
    GPUs, a running job that ended); changes never add GPU time, so everything fits."""
    jobs = draw(job_sets().filter(bool))
    changed = list(jobs)
    for i in draw(st.sets(st.integers(0, len(jobs) - 1), min_size=1)):
        j = jobs[i]
        kind = draw(st.sampled_from(["end", "account", "gpus"]))
        if kind == "end" and j.end - j.start >= 2:
            j = replace(j, end=draw(st.integers(j.start + 1, j.end - 1)), running=False)
        elif kind == "gpus" and j.gpn >= 2:
            j = replace(j, gpn=draw(st.integers(1, j.gpn - 1)))
        else:
            j = replace(j, account=ACCOUNTS[(ACCOUNTS.index(j.account) + 1) % len(ACCOUNTS)])
        changed[i] = j
    return jobs, changed


@given(pair=changed_job_sets())
@DB_PROPS
def test_a_changed_record_replaces_its_rows(pair: tuple[list[Job], list[Job]]) -> None:
    jobs, changed = pair
    n_changed = sum(a != b for a, b in zip(jobs, changed, strict=True))
    with fresh_ledger() as engine, fresh_ledger() as clean:
        book(engine, [j.record() for j in jobs])
        # only the changed records, no window: the hours they touch get their idle again
        again = ingest_records(engine, [j.record() for j in changed], CTX, now=W1)
        assert (again.new, again.changed, again.unchanged) == (0, n_changed, len(jobs) - n_changed)
        book(clean, [j.record() for j in changed])
        assert ledger_content(engine) == ledger_content(clean)
        check_capacity(engine, expected_allocation(changed), again)
        check_sources(engine, changed)


# --- deterministic, on SQLite and PostgreSQL --------------------------------------------------

SERVING = Job("900", ("g2",), 2, 30 * 60_000, 4 * H + 15 * 60_000, False, "a3", "stb:triton")
FIXED = [
    Job("800", ("g0", "g1"), 4, 0, WINDOW_MS, False, "a1", ""),  # the whole window, two nodes
    # over the month end (00:00 is 3 h into the window)
    Job("801", ("g3",), 3, 2 * H + 17_000, 3 * H + 45 * 60_000, False, "a2", ""),
    Job("802", ("g3",), 1, H, WINDOW_MS, True, "a4", "stb:workload=elastic"),  # still running
    SERVING,
]


def serving_points() -> list[ServingPoint]:
    """Two models on one instance; `bert`'s counter resets (Triton restarted) at 2 h."""
    t = W0 + SERVING.start * MS
    s = 1_000_000.0  # µs per second
    return [
        ServingPoint(SERVING.job_id, "g2:8000", "bert", t + timedelta(hours=1), 1200 * s),
        ServingPoint(SERVING.job_id, "g2:8000", "bert", t + timedelta(hours=2), 300 * s),
        ServingPoint(SERVING.job_id, "g2:8000", "bert", t + timedelta(hours=3), 900 * s),
        ServingPoint(SERVING.job_id, "g2:8000", "llama", t + timedelta(hours=3), 2000 * s),
    ]


def test_fixed_scenario_capacity_reingest_and_team_filter(database_url: str) -> None:
    engine = open_ledger(database_url)
    try:
        record_serving(engine, CLUSTER, serving_points())
        summary = book(engine, [j.record() for j in FIXED])
        check_capacity(engine, expected_allocation(FIXED), summary)
        check_sources(engine, FIXED)

        # the serving job: models + unattributed = the job in every hour; resets count
        per_hour: dict[datetime, int] = defaultdict(int)
        per_model: dict[str, int] = defaultdict(int)
        for r in table_rows(engine, LEDGER):
            row = dict(zip(LEDGER.c.keys(), r, strict=True))
            if row["source"] == SERVING.record().key:
                per_hour[row["bucket"]] += row["gpu_ms"]
                per_model[row["model"]] += row["gpu_ms"]
        assert dict(per_hour) == {
            h: SERVING.gpn * ms for h, ms in hour_overlaps(SERVING.start, SERVING.end).items()
        }
        # bert: 1200 s, then 300 s after the reset, then +600 s; llama 2000 s (in ms, up to
        # 1.5 ms of rounding in each of the job's 4 hours)
        assert abs(per_model["bert"] - 2_100_000) <= 6
        assert abs(per_model["llama"] - 2_000_000) <= 6
        assert per_model[UNATTRIBUTED] == 2 * (SERVING.end - SERVING.start) - sum(
            v for m, v in per_model.items() if m != UNATTRIBUTED
        )

        check_reingest_is_noop(engine, [j.record() for j in FIXED])
        add_rates(engine, RATES)
        stored = RateBook(list_rates(engine))
        for rates in (None, stored):
            for idle in ("line", "shared"):
                check_team_filter(engine, rates, idle, "day")
    finally:
        engine.dispose()


def test_changed_records_replace_their_rows(database_url: str) -> None:
    engine = open_ledger(database_url)
    try:
        book(engine, [j.record() for j in FIXED])
        before = ledger_content(engine)
        changed = [
            replace(FIXED[0], end=2 * H + 1, account="a3"),  # shorter, another team
            FIXED[1],
            replace(FIXED[2], end=4 * H, running=False),  # the running job ended
            replace(FIXED[3], gpn=1),
        ]
        again = ingest_records(engine, [j.record() for j in changed], CTX, now=W1)
        assert (again.new, again.changed, again.unchanged) == (0, 3, 1)
        assert ledger_content(engine) != before
        check_capacity(engine, expected_allocation(changed), again)
        check_sources(engine, changed)
        teams = build_report(engine, WINDOW, ("team",))
        by_team = {line.keys["team"]: line.gpu_ms for line in teams.lines}
        assert by_team["nlp"] == 4 * 2 * (2 * H + 1) + 1 * (SERVING.end - SERVING.start)
        assert "vision" in by_team  # job 801 (a2) is unchanged
        assert by_team["vision"] == 3 * (FIXED[1].end - FIXED[1].start)
        assert by_team["a4"] == 1 * (4 * H - H)
    finally:
        engine.dispose()
