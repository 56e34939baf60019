"""Batch jobs from a site's own `sacct --json --duplicates`, replayed as they came
(`replay_records`). The records are parsed by the ledger's own parser
(`bridge.slurm.sacct.parse_sacct_json`); a job's kind comes from its workload tag or its
partition's pool, by the ledger's rule. Called by `stb simulate --jobs sacct`."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from accounting.attribution import comment_tags
from bridge.config import BridgeConfig
from bridge.ledger.feed import WORKLOAD_OF_MODE
from bridge.sim.inputs.common import InputError, aware, iso
from bridge.sim.workload import JobKind, SimJob
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import AccountingRecord
from bridge.slurm.sacct import parse_sacct_json

#: the ledger's workloads that are batch jobs, as the simulator's job kinds
_BATCH: Mapping[str, JobKind] = {"training": "training", "elastic": "elastic"}


def partition_kinds(config: BridgeConfig) -> dict[str, JobKind | None]:
    """Each partition's job kind by the ledger's own rule (`bridge.ledger.feed.context`): a
    pool's partition gets its pool's workload (drain: training, preempt: elastic,
    reserved: inference), `[accounting] workloads` names others. Inference is no batch
    work: None (its jobs are left out)."""
    workloads = {p.partition: WORKLOAD_OF_MODE[p.lend_mode] for p in config.pools.values()}
    workloads.update(config.accounting.workloads)
    return {partition: _BATCH.get(w) for partition, w in workloads.items()}


@dataclass(frozen=True)
class JobReplay:
    """Jobs replayed from a site's records, and what the report says about them."""

    jobs: list[SimJob]
    about: dict[str, object]


def _arrival(rec: AccountingRecord) -> datetime | None:
    """When a run could first start: its eligible time (after its submit for a job held
    by --begin or a dependency), else its submit; never later than its start."""
    arrival = rec.eligible or rec.submit
    if rec.start is not None and (arrival is None or rec.start < arrival):
        return rec.start
    return arrival


#: a run submitted this long after the previous run of its id ended is another job that
#: got the same id (Slurm resets a requeued run's submit time to its requeue)
REUSE_GAP = timedelta(hours=1)


def _end(rec: AccountingRecord) -> datetime | None:
    if rec.start is None:
        return None
    return rec.end or rec.start + timedelta(seconds=rec.elapsed_s)


def _lives(recs: list[AccountingRecord]) -> list[list[AccountingRecord]]:
    """One id's records split into the jobs that carried it: a cluster whose job ids
    started over (a new slurmdbd, the lab), or wrapped at MaxJobId, gives one id to
    several jobs. A run of the same job (a requeue) is submitted as its previous one ends;
    one submitted over REUSE_GAP later is another job."""
    order = sorted(recs, key=lambda r: r.submit or r.start or datetime.min.replace(tzinfo=UTC))
    lives: list[list[AccountingRecord]] = []
    seen: datetime | None = None  # the life's last end (or a waiting run's submit)
    for rec in order:
        submitted = rec.submit or rec.start
        if not lives or (
            submitted is not None and seen is not None and submitted > seen + REUSE_GAP
        ):
            lives.append([])
            seen = None
        lives[-1].append(rec)
        stop = _end(rec) or submitted
        if stop is not None and (seen is None or stop > seen):
            seen = stop
    return lives


def _newer(a: AccountingRecord, b: AccountingRecord) -> bool:
    """`a` is a later reading of the same run than `b` (it ended, or ran longer)."""
    return (a.end is not None, a.elapsed_s) > (b.end is not None, b.elapsed_s)


def replay_records(
    records: Iterable[AccountingRecord],
    *,
    start: datetime,
    end: datetime,
    kind_of_partition: Mapping[str, JobKind | None],
    source: str = "sacct",
) -> JobReplay:
    """The batch jobs of [start, end) as the simulator replays them: each one submitted
    (`submit_s`, seconds from `start`) when it could first run and running as long as it
    did, on as many nodes and GPUs per node as it had.

    - A requeued job (several runs under one id: `sacct --duplicates`) is one job,
      submitted when its first run became eligible and running as long as its last run
      that ran (elapsed > 0): the simulator requeues by its own policy, so the site's
      requeues are not replayed and the work they lost is not counted as the job's. A job
      that checkpoints resumed from there, so its last run is only the rest of it (then
      shorter than the job was).
    - A job still running takes its elapsed time so far (a lower bound of its length).
    - An array task (`1234_7`) is a job of its own; so is each cluster's job id, and
      each job that got an id another had before (`_lives`: named `1234#2`, ...).
    - A multi-node job keeps its nodes; its GPUs per node are its GPUs over its nodes
      (rounded up).
    - A job submitted before `start` and still running or waiting then is carried in:
      submitted at 0 with the part of its run after `start`, so the fleet starts as busy
      as it was.
    - The kind: the job's `stb:workload=` tag (job_submit.lua's), else its partition's
      (`kind_of_partition`; `partition_kinds` builds it from the bridge's configuration).

    Left out, and counted in `about["left_out"]`: the bridge's Triton servers (`stb:triton`
    or workload inference) and other jobs of an inference partition, jobs that never ran
    (pending, or cancelled before they started), jobs with no GPU, jobs submitted at or
    after `end` or over before `start`. A GPU job in a partition the map does not name
    raises `InputError` naming each such partition, with a job of it."""
    start, end = aware(start, "start"), aware(end, "end")
    if end <= start:
        raise InputError(f"{source}: the window ends ({iso(end)}) before it starts")
    latest: dict[str, AccountingRecord] = {}
    count = 0
    for rec in records:
        count += 1
        old = latest.get(rec.key)
        if old is None or _newer(rec, old):
            latest[rec.key] = rec
    by_id: dict[tuple[str, str], list[AccountingRecord]] = defaultdict(list)
    for rec in latest.values():
        by_id[(rec.cluster, rec.job_id)].append(rec)
    several_clusters = len({cluster for cluster, _ in by_id}) > 1
    by_job: list[tuple[str, str, list[AccountingRecord]]] = []
    reused = 0
    for (cluster, job_id), recs in by_id.items():
        lives = _lives(recs)
        reused += len(lives) > 1
        name = f"{cluster}:{job_id}" if several_clusters else job_id
        by_job += [
            (name if k == 0 else f"{name}#{k + 1}", job_id, life) for k, life in enumerate(lives)
        ]
    left: Counter[str] = Counter()
    unknown: dict[str, list[str]] = defaultdict(list)
    noted: Counter[str] = Counter()
    jobs: list[SimJob] = []
    for name, job_id, recs in by_job:
        ran = sorted((r for r in recs if r.start is not None and r.elapsed_s > 0), key=_started)
        if not ran:
            left["never ran (pending, or cancelled before it started)"] += 1
            continue
        last = ran[-1]
        if last.gpus <= 0:
            left["no GPU"] += 1
            continue
        workload = comment_tags(last.comment).get("workload")
        if workload == "inference":
            left["serving (the bridge's Triton jobs: stb:triton, workload inference)"] += 1
            continue
        arrivals = [a for r in recs if (a := _arrival(r)) is not None]
        arrival = min(arrivals) if arrivals else _started(last)
        assert last.start is not None  # (`ran`)
        run_end = last.end or last.start + timedelta(seconds=last.elapsed_s)
        if arrival >= end:
            left["submitted after the window"] += 1
            continue
        if run_end <= start:
            left["over before the window"] += 1
            continue
        kind: JobKind | None
        if workload is not None and workload in _BATCH:
            kind = _BATCH[workload]
        elif last.partition in kind_of_partition:
            kind = kind_of_partition[last.partition]
            if kind is None:  # a server whose tag slurmdbd has not stored yet, say
                left["in an inference partition"] += 1
                continue
        else:
            unknown[last.partition].append(job_id)
            continue
        duration = float(last.elapsed_s)
        if arrival < start:
            noted["carried_in"] += 1
            submit_s = 0.0
            if last.start < start:
                duration -= (start - last.start).total_seconds()
        else:
            submit_s = (arrival - start).total_seconds()
        nodes = max(1, len(last.nodes))
        gpus_per_node = -(-last.gpus // nodes)
        noted[kind] += 1
        started = sum(r.start is not None for r in recs)
        noted["requeued"] += started > 1 or last.restarts > 0
        noted["array_tasks"] += last.array_task_id is not None
        noted["multi_node"] += nodes > 1
        noted["running_at_end"] += last.end is None
        jobs.append(SimJob(name, kind, submit_s, duration, gpus_per_node, nodes))
    if unknown:
        named = "; ".join(
            f"{p or '(none)'!r} ({len(ids)} job{'s' if len(ids) > 1 else ''}, e.g. {ids[0]})"
            for p, ids in sorted(unknown.items())
        )
        raise InputError(
            f"{source}: GPU jobs in partitions whose kind is not known: {named}. Name each "
            "one's workload (training, elastic or inference): a pool's partition, the "
            "bridge's [accounting] workloads, or stb simulate's --partition-kind PART=KIND"
        )
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    about: dict[str, object] = {
        "source": source,
        "window": [iso(start), iso(end)],
        "records": count,
        "jobs": len(jobs),
        "training": noted["training"],
        "elastic": noted["elastic"],
        "gpu_hours": round(sum(j.gpus * j.duration_s for j in jobs) / 3600.0, 3),
        "requeued": noted["requeued"],
        "array_tasks": noted["array_tasks"],
        "multi_node": noted["multi_node"],
        "running_at_end": noted["running_at_end"],
        "carried_in": noted["carried_in"],
        "reused_ids": reused,
        "left_out": dict(sorted(left.items())),
    }
    return JobReplay(jobs, about)


def _started(rec: AccountingRecord) -> datetime:
    assert rec.start is not None
    return rec.start


def jobs_from_records(
    records: Iterable[AccountingRecord],
    *,
    start: datetime,
    end: datetime,
    kind_of_partition: Mapping[str, JobKind | None],
) -> list[SimJob]:
    """`replay_records`' jobs alone."""
    return replay_records(records, start=start, end=end, kind_of_partition=kind_of_partition).jobs


def read_sacct_files(paths: Sequence[Path]) -> list[AccountingRecord]:
    """Every record of the `sacct --json` documents (one per file), in order. A file that
    cannot be read or parsed raises `InputError` naming it and quoting the parser."""
    if not paths:
        raise InputError("sacct: no file given")
    records: list[AccountingRecord] = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"sacct file {path}: cannot read it: {exc.strerror or exc}") from None
        try:
            records += parse_sacct_json(data)
        except (SlurmError, UnicodeDecodeError) as exc:
            raise InputError(f"sacct file {path}: {exc}") from None
    return records


def record_span(records: Iterable[AccountingRecord]) -> tuple[datetime, datetime] | None:
    """From the first run's arrival to the last run's end (a running one's elapsed so
    far): the window the records cover; None without a run."""
    lo: datetime | None = None
    hi: datetime | None = None
    for rec in records:
        if rec.start is None:
            continue
        arrival = _arrival(rec) or rec.start
        stop = rec.end or rec.start + timedelta(seconds=rec.elapsed_s)
        lo = arrival if lo is None or arrival < lo else lo
        hi = stop if hi is None or stop > hi else hi
    return (lo, hi) if lo is not None and hi is not None and hi > lo else None


def replay_sacct_files(
    paths: Sequence[Path],
    *,
    start: datetime,
    end: datetime,
    kind_of_partition: Mapping[str, JobKind | None],
) -> JobReplay:
    """`replay_records` of the files' records; `about` names the files."""
    replay = replay_records(
        read_sacct_files(paths),
        start=start,
        end=end,
        kind_of_partition=kind_of_partition,
        source="sacct " + ", ".join(p.name for p in paths),
    )
    replay.about["files"] = [p.name for p in paths]
    return replay


def jobs_from_sacct_files(
    paths: Sequence[Path],
    *,
    start: datetime,
    end: datetime,
    kind_of_partition: Mapping[str, JobKind | None],
) -> list[SimJob]:
    """`replay_sacct_files`' jobs alone."""
    return replay_sacct_files(paths, start=start, end=end, kind_of_partition=kind_of_partition).jobs
