"""Batch jobs from the bridge's GPU-hour ledger (`replay_ledger`): for a site whose
slurmdbd purged old jobs that the ledger still books. Called by `stb simulate --jobs
ledger` (`bridge.sim.inputs.site`).

The ledger keeps each sacct run's source record (`source_record`: key
`cluster:job_id:start_epoch`, job id, state, start, end, GPU-ms) and one row per node
and hour the run touched (`ledger_row`: partition, workload, GPU-ms, ...). Each run with
rows in the window, and every other run of its job id, is made an `AccountingRecord`
again, and the records go through `jobs.replay_records`: the rules of `--jobs sacct`
(a requeued job is one job, array tasks and ids given again, jobs carried in, what is
left out counted). What the ledger does not keep is approximated, and `about` says so:

- Arrival: a job arrives at its first run's start. The ledger keeps no submit or
  eligible time, so queueing seen at the site before a job started is not replayed: the
  simulator's waits start from a fleet that let every job start when it did.
- Requeues: a run after one of its id that ended REQUEUED, PREEMPTED or NODE_FAIL is
  taken as resubmitted when that one ended (as Slurm resubmits it); any other run that
  starts over `jobs.REUSE_GAP` after the previous run of its id ended is another job
  that got the id again (`1234#2`), as with sacct's records.
- Nodes: the rows of the run's first hour, one per node that held GPUs (the ledger names
  no node: a node of a multi-node job that got none of its GPUs has no row and is not
  counted). GPUs: each row's GPU-ms over the run's milliseconds in that hour, rounded to
  whole GPUs. A row that is not whole GPUs, or a run whose GPU-ms are not those GPUs over
  its whole run (a record restated or written by hand), is counted in
  `about["gpus_inconsistent"]` with an example and why.
- Kind: the ledger's workload of the run's rows, as the ingest decided it (the
  `stb:workload=` tag, else the partition's or the node's pool's workload under the
  ledger's configuration, else training): training and elastic are batch jobs;
  inference is the bridge's serving, left out and counted; any other workload (a ledger
  written by something else) takes its partition's kind from `kind_of_partition`, and a
  partition it does not name raises `InputError` naming it, as with sacct's records.
- A run still running at the last ingest (state RUNNING, SUSPENDED, ...) runs as long as
  that ingest booked it (a lower bound of its length, like sacct's elapsed time so far).
- Not in the ledger, so neither replayed nor counted: jobs that never ran, jobs with no
  GPU, records slurmdbd had not finished writing at the last ingest. Idle and down rows
  (source `capacity`) are no jobs.

Read-only: a database that does not exist, holds no ledger, or whose schema is at an
older revision is an `InputError` naming it; it is never created or migrated here (`stb
accounting migrate` does that).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Connection, Engine, and_, func, select
from sqlalchemy.exc import SQLAlchemyError

from accounting.buckets import floor_hour, split_ms
from accounting.db import VERSION_TABLE, current_revision, head_revision
from accounting.prepare import SACCT
from accounting.schema import LedgerRow, SourceRecord
from bridge.sim.inputs.common import InputError, aware, iso, open_database, shown_db
from bridge.sim.inputs.jobs import JobReplay, replay_records
from bridge.sim.workload import JobKind
from bridge.slurm.model import AccountingRecord

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]

#: the states a run ends in when Slurm requeues its job: the next run is the same job
REQUEUED_STATES = frozenset({"REQUEUED", "PREEMPTED", "NODE_FAIL"})
#: the states of a run that had not ended at the last ingest (which booked it to then)
RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"})
#: the workloads the ledger books a sacct run under (`accounting.schema.WORKLOADS`)
BOOKED = ("training", "elastic", "inference")
#: what `about` says of the arrivals
ARRIVAL = (
    "each job's first run's start: the ledger keeps no submit or eligible time, so "
    "queueing seen at the site before a job started is not replayed"
)
_ARRAY_TASK = re.compile(r"(\d+)_(\d+)")
#: where a run that never started sorts (after the others)
_NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Run:
    """One run's source record."""

    key: str
    job_id: str
    state: str
    start: datetime | None
    end: datetime | None
    gpu_ms: int

    @property
    def cluster(self) -> str:
        return self.key.rsplit(":", 2)[0]


@dataclass
class _Hour:
    """The rows of a run's first hour (one per node that held GPUs)."""

    bucket: datetime
    partition: str
    workload: str
    account: str
    user: str
    qos: str
    gpu_ms: list[int]


def replay_ledger(
    url_or_engine: str | Engine,
    *,
    start: datetime,
    end: datetime,
    kind_of_partition: Mapping[str, JobKind | None],
) -> JobReplay:
    """The batch jobs of [start, end) in the ledger at `url_or_engine` (a URL, or an
    engine the caller keeps), replayed as `jobs.replay_records` replays sacct's, with the
    approximations of the module's docstring; `about` names the ledger (its password
    hidden), says how arrivals are approximated and what was left out."""
    start, end = aware(start, "start"), aware(end, "end")
    if end <= start:
        raise InputError(f"ledger: the window ends ({iso(end)}) before it starts")
    if isinstance(url_or_engine, str):
        engine, owned = open_database(url_or_engine, "ledger"), True
        shown = shown_db(url_or_engine)
    else:
        engine, owned = url_or_engine, False
        shown = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn:
            _check_schema(conn, shown)
            window_keys, runs, hours = _read(conn, start, end)
            span = _span(conn) if not window_keys else None
    except SQLAlchemyError as exc:
        msg = str(exc).splitlines()[0]
        raise InputError(f"ledger {shown}: cannot read its jobs: {msg}") from None
    finally:
        if owned:
            engine.dispose()
    if not window_keys:
        held = f"its runs span {iso(span[0])} to {iso(span[1])}" if span else "it holds none"
        raise InputError(
            f"ledger {shown}: no sacct run booked in the window {iso(start)} to {iso(end)} ({held})"
        )
    records, odd = _records(runs, window_keys, hours)
    replay = replay_records(
        records, start=start, end=end, kind_of_partition=kind_of_partition, source=f"ledger {shown}"
    )
    replay.about.update(
        source="ledger",
        ledger=_named(engine),
        arrival=ARRIVAL,
        not_in_ledger="jobs that never ran or held no GPU (the ledger books no time for them)",
        gpus_inconsistent={"runs": len(odd), **({"e.g.": odd[0]} if odd else {})},
    )
    return replay


def _named(engine: Engine) -> str:
    """The ledger as the report names it: a SQLite file by its name (a report carries no
    path of the machine it was made on), another database by its URL, password hidden."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).name
    return url.render_as_string(hide_password=True)


def _check_schema(conn: Connection, shown: str) -> None:
    """The ledger's schema at the latest revision; `InputError` naming it otherwise."""
    have, want = current_revision(conn.engine), head_revision()
    if have is None:
        raise InputError(
            f"ledger {shown}: holds no ledger (no {VERSION_TABLE} table): give the database "
            "`stb accounting ingest` writes to"
        )
    if have != want:
        raise InputError(
            f"ledger {shown}: its schema is at revision {have}, not {want}: run `stb "
            "accounting migrate` (the simulator reads a ledger, never migrates it)"
        )


def _span(conn: Connection) -> tuple[datetime, datetime] | None:
    """From the first sacct run's start to the last one's end; None without one."""
    cols = SOURCES.c
    lo, hi = conn.execute(
        select(func.min(cols.start), func.max(cols.end)).where(cols.kind == SACCT)
    ).one()
    return (lo, hi) if lo is not None and hi is not None else None


def _read(
    conn: Connection, start: datetime, end: datetime
) -> tuple[set[str], list[_Run], dict[str, _Hour]]:
    """The keys of the sacct runs with rows in [start, end) (by hour bucket); every run
    of those runs' job ids; each of those runs' first hour of rows, by key."""
    in_window = (
        select(SOURCES.c.key)
        .join(LEDGER, LEDGER.c.source == SOURCES.c.key)
        .where(SOURCES.c.kind == SACCT, LEDGER.c.bucket >= floor_hour(start))
        .where(LEDGER.c.bucket < end)
        .distinct()
    )
    window_keys = set(conn.scalars(in_window))
    if not window_keys:
        return window_keys, [], {}
    ids = select(SOURCES.c.job_id).where(SOURCES.c.kind == SACCT, SOURCES.c.key.in_(in_window))
    of_ids = and_(SOURCES.c.kind == SACCT, SOURCES.c.job_id.in_(ids))
    fields = ("key", "job_id", "state", "start", "end", "gpu_ms")
    runs = [_Run(*r) for r in conn.execute(select(*(SOURCES.c[f] for f in fields)).where(of_ids))]
    first = (
        select(LEDGER.c.source, func.min(LEDGER.c.bucket).label("bucket"))
        .where(LEDGER.c.source.in_(select(SOURCES.c.key).where(of_ids)))
        .group_by(LEDGER.c.source)
        .subquery()
    )
    names = ("source", "bucket", "partition", "workload", "account", "user_name", "qos", "gpu_ms")
    rows = conn.execute(
        select(*(LEDGER.c[n] for n in names))
        .join(first, and_(LEDGER.c.source == first.c.source, LEDGER.c.bucket == first.c.bucket))
        .order_by(LEDGER.c.source, LEDGER.c.id)
    )
    hours: dict[str, _Hour] = {}
    for r in rows:
        hour = hours.get(r.source)
        if hour is None:
            hour = hours[r.source] = _Hour(
                r.bucket, r.partition, r.workload, r.account, r.user_name, r.qos, []
            )
        hour.gpu_ms.append(r.gpu_ms)
        if r.workload != hour.workload and "inference" in (r.workload, hour.workload):
            hour.workload = "inference"  # a serving job whose nodes' pools disagree
    return window_keys, runs, hours


def _records(
    runs: Sequence[_Run], window_keys: set[str], hours: Mapping[str, _Hour]
) -> tuple[list[AccountingRecord], list[str]]:
    """The runs of each job id (per cluster) that has a run in the window, as sacct's
    records; and the runs whose GPUs do not add up (key: why)."""
    by_id: dict[tuple[str, str], list[_Run]] = defaultdict(list)
    for run in runs:
        by_id[(run.cluster, run.job_id)].append(run)
    records: list[AccountingRecord] = []
    odd: list[str] = []
    for (cluster, _), group in by_id.items():
        if not any(run.key in window_keys for run in group):
            continue  # another cluster's job of the same id
        previous: _Run | None = None
        for run in sorted(group, key=lambda r: r.start or _NEVER):
            requeued = previous is not None and previous.state in REQUEUED_STATES
            submit = previous.end if previous is not None and requeued else None
            hour = hours.get(run.key)
            gpus, why = _gpus(run, hour) if hour is not None else (0, None)
            if why is not None:
                odd.append(f"{run.key}: {why}")
            records.append(_record(cluster, run, hour, gpus, submit))
            previous = run
    return records, odd


def _gpus(run: _Run, hour: _Hour) -> tuple[int, str | None]:
    """The run's GPUs (its first hour's rows' GPU-ms over its milliseconds in that hour,
    whole GPUs per row) and why they do not add up (None: they do)."""
    assert run.start is not None  # (it has rows)
    parts = split_ms(run.start, run.end or run.start)
    whole_ms = sum(ms for _, ms in parts)
    in_hour = dict(parts).get(hour.bucket, 0)
    if in_hour <= 0:
        gpus = round(run.gpu_ms / whole_ms) if whole_ms else 0
        return gpus, f"its rows' first hour {iso(hour.bucket)} is not in its run"
    if hour.workload == "inference":  # split among its models: not a row per node
        return round(sum(hour.gpu_ms) / in_hour), None
    per_row = [ms / in_hour for ms in hour.gpu_ms]
    gpus = sum(round(g) for g in per_row)
    bad = next((g for g in per_row if abs(g - round(g)) > 1e-6), None)
    if bad is not None:
        return gpus, f"a row of hour {iso(hour.bucket)} holds {bad:.3f} GPUs"
    if gpus * whole_ms != run.gpu_ms:
        return gpus, (
            f"its {run.gpu_ms} GPU-ms are not its first hour's {gpus} GPUs over its {whole_ms} ms"
        )
    return gpus, None


def _record(
    cluster: str, run: _Run, hour: _Hour | None, gpus: int, submit: datetime | None
) -> AccountingRecord:
    """The run as sacct's record of it, as far as the ledger knows it (a run without rows,
    such as a requeued run cancelled as it started, ran for 0 s)."""
    running = run.state in RUNNING_STATES
    elapsed = 0
    if hour is not None and run.start is not None and run.end is not None:
        elapsed = int((run.end - run.start) / timedelta(seconds=1))
    array = _ARRAY_TASK.fullmatch(run.job_id)
    workload = hour.workload if hour is not None else ""
    return AccountingRecord(
        cluster=cluster,
        job_id=run.job_id,
        array_job_id=int(array[1]) if array else None,
        array_task_id=int(array[2]) if array else None,
        name="",
        partition=hour.partition if hour is not None else "",
        account=hour.account if hour is not None else "",
        user=hour.user if hour is not None else "",
        qos=hour.qos if hour is not None else "",
        state=run.state,
        submit=submit,
        start=run.start,
        end=None if running else (run.end if hour is not None else run.start),
        elapsed_s=elapsed,
        # the ledger names no node: one per row of the first hour
        nodes=("",) * len(hour.gpu_ms) if hour is not None else (),
        gpus=gpus,
        gpu_type=None,
        comment=f"stb:workload={workload}" if workload in BOOKED else "",
        restarts=0,
    )
