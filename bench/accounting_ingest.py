"""The GPU-hour ledger at scale: ingest a million sacct records into SQLite and PostgreSQL,
then a month report by team; time and peak RSS per phase and backend, beside baselines
measured in the same run.

The records take the real path: synthetic `sacct --json` documents in the Slurm 22.05 shape
(the shape of tests/data/slurm/sacct-requeue-22.05.json; checked key for key at start), 10,000
jobs per document, written to files once (phase `generate`, not timed as part of any other) ->
`accounting.ingest.ingest_documents` with `accounting.prepare.read_sacct_file`: a worker
process per CPU (at most 4) reads each file, parses it (`bridge.slurm.sacct.parse_sacct_json`) and
prepares its records (digests, attribution, rows encoded for COPY or executemany) while the
main process does the database work (a few documents in memory at a time). The workload,
seeded and deterministic:

- 1,000 nodes in three pools, partition = pool: train (560 x 8 h100), elastic (280 x 8 a100),
  infer (160 x 4 l40s); submissions arrive evenly over 2026-09-15..2026-12-15, so jobs cross
  the month boundaries; a small scheduler (the GPUs freed earliest among four random
  candidate nodes per node needed) places every run, so no GPU is ever booked twice.
- Durations and GPU counts are drawn from the public Alibaba GPU trace
  (../shared/traces/alibaba_gpu2023_tasks.csv, Weng et al., ATC '23: scheduled_time ->
  deletion_time and num_gpu of the 6,203 tasks that ran with a GPU; median 11 min), capped at
  the 72 h time limit (TIMEOUT). Without the trace: log-normal durations (median 655 s,
  sigma 2) and 1 GPU in 95% of jobs. Training runs are longer than the trace's pods: a
  multi-node job's duration is 3x a draw, an elastic job's 2x, a serving job's 6x.
- Mix of submissions: 5% multi-node training (2-8 nodes, 8/4/2/1 GPUs per node), 1.5% job
  arrays (4-32 tasks, ids like 1234_7; ~20% of the records), 8% Triton serving jobs
  (`stb:triton`, partition infer, no compute samples: booked "(unattributed)"), the rest
  single-node train/elastic jobs; 1% are cancelled before they start (no GPU: skipped).
  A run is requeued (train, 3%: REQUEUED) or preempted (elastic, 12%: PREEMPTED), up to
  three runs, each run its own record with its own start. 6 teams, 13 accounts, ~250 users.
  At 1,000,000 records the fleet is about a third busy.

Phases, each in its own process (peak RSS = that process's ru_maxrss, from wait4):
  generate     write the documents (the input; its time is printed, not compared)
  parse        read and parse the documents (msgspec), nothing else (baseline: the input's
               own cost; only reading and parsing are timed, not the tally of the records)
  parse-plain  the same with `parse_sacct_json_plain` (json and dicts: the reader before)
  floor        per backend, into a separate empty database: the same ledger and source rows
               (the same pure attribution) written in one transaction by the ingest's bulk
               writer alone, COPY (PostgreSQL) or one executemany per 2,000 records (SQLite);
               only the writes are timed (the floor for the same rows; idle rows not included)
  setup        `open_ledger` (Alembic migration) + `record_inventory` (1,000 nodes)
  ingest       end to end: read, parse and ingest (one transaction), `ingest_documents`; its
               peak RSS is the main process's, the largest worker's beside it (RESULT: main +
               workers x the largest worker's, a bound on their sum)
  report       `build_report` of 2026-11 by team (it reads the daily roll-up, `ledger_day`)
At the end the report's GPU-ms per team (idle, the team "(idle)" line, excluded) must equal
the sum over the ingested records of GPUs x their time inside the month, computed from the
parsed records independently of the ledger, and the ledger must hold one row per node and
hour each run touched: "check: ok", or exit 1.

Usage:
    .venv/bin/python bench/accounting_ingest.py [--records 1000000] [--backends sqlite,postgresql]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres] [--keep] [--seed 1]
        [--no-floor] [--no-plain] [--workers N]
PostgreSQL: a database `stb_bench_ledger_<hex>` (and `<hex>_floor`) is made from the admin URL
and dropped at the end, even on error. SQLite: files in a temporary folder (`--keep` keeps
them); the documents in another, removed at the end. Progress: a line per 100,000 records to
stderr. The last line of stdout: `RESULT key=value ...` (seconds, ratios, MiB).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from accounting.attribution import Context, digest, job_entry_tuples, record_end
from accounting.bulk import LEDGER_COLUMNS, SOURCE_COLUMNS, bind_rows, insert_rows
from accounting.db import open_ledger
from accounting.ingest import ingest_documents
from accounting.inventory import NodeCapacity, record_inventory
from accounting.prepare import SACCT, default_workers, read_sacct_file
from accounting.report import Window, build_report
from accounting.schema import CAPACITY_SOURCE, IDLE_TEAM, LedgerRow, SourceRecord
from accounting.tables import batched
from bridge.paths import project_root
from bridge.slurm.hostlist import compress
from bridge.slurm.model import AccountingRecord
from bridge.slurm.sacct import parse_sacct_json, parse_sacct_json_plain

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]

CLUSTER = "gpu1"
#: pool (= partition), GPU type, GPUs per node, nodes
POOLS = (("train", "h100", 8, 560), ("elastic", "a100", 8, 280), ("infer", "l40s", 4, 160))
WORKLOAD_OF = {"train": "training", "elastic": "elastic", "infer": "inference"}
TEAMS = {
    "nlp": ("nlp-pretrain", "nlp-finetune", "nlp-eval"),
    "vision": ("vision-det", "vision-gen"),
    "speech": ("speech-asr", "speech-tts"),
    "recsys": ("recsys-rank",),
    "research": ("research-rl", "research-theory", "research-interns"),
    "platform": ("platform-serving", "platform-ci"),
}
TEAM_OF_ACCOUNT = {a: t for t, accounts in TEAMS.items() for a in accounts}
ARRIVALS_FROM = datetime(2026, 9, 15, tzinfo=UTC)
ARRIVALS_TO = datetime(2026, 12, 15, tzinfo=UTC)
INVENTORY_AT = datetime(2026, 9, 1, tzinfo=UTC)
#: where a running job's time would end; every generated run ends before it
HORIZON = datetime(2027, 1, 1, tzinfo=UTC)
REPORT_MONTH = "2026-11"
TIME_LIMIT_S = 72 * 3600
PER_DOC = 10_000
TRACE = project_root().parent / "shared" / "traces" / "alibaba_gpu2023_tasks.csv"
RECORDED = project_root() / "tests" / "data" / "slurm" / "sacct-requeue-22.05.json"


# --- the workload ---------------------------------------------------------------------


@dataclass
class Trace:
    durations: list[int]
    gpus: list[int]
    source: str

    @staticmethod
    def load(path: Path = TRACE) -> Trace:
        """Run times and GPU counts of the trace's tasks that were scheduled and held a GPU."""
        durations, gpus = [], []
        if path.exists():
            with path.open(newline="") as f:
                for row in csv.DictReader(f):
                    try:
                        n, s, e = int(row["num_gpu"]), row["scheduled_time"], row["deletion_time"]
                        if n > 0 and s and e and int(e) > int(s):
                            durations.append(min(int(e) - int(s), TIME_LIMIT_S))
                            gpus.append(n)
                    except (KeyError, ValueError):
                        continue
        if durations:
            return Trace(durations, gpus, f"{path.name} ({len(durations)} GPU tasks)")
        rng = random.Random(0)
        durations = [
            max(1, min(int(rng.lognormvariate(math.log(655), 2.0)), TIME_LIMIT_S))
            for _ in range(5000)
        ]
        gpus = [1] * 95 + [2] * 2 + [4] * 2 + [8]
        return Trace(durations, gpus, "synthetic (trace not found)")


class Fleet:
    """Per GPU, when it is next free; places a run on the nodes whose GPUs free up earliest
    among four random candidates per node needed (no backfill), so no GPU holds two runs at
    once and the inventory's capacity is never overbooked."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes: dict[str, list[str]] = {}
        self.free: dict[str, list[int]] = {}
        self.inventory: list[NodeCapacity] = []
        start = int(ARRIVALS_FROM.timestamp())
        i = 0
        for pool, gpu_type, gpus, count in POOLS:
            names = [f"gpu{i + k + 1:04d}" for k in range(count)]
            i += count
            self.nodes[pool] = names
            for name in names:
                self.free[name] = [start] * gpus
                self.inventory.append(NodeCapacity(name, pool, gpu_type, gpus))

    def place(self, pool: str, n: int, g: int, arrival: int) -> tuple[int, list[str]]:
        names = self.nodes[pool]
        cand = self.rng.sample(names, min(len(names), 4 * n))
        scored = sorted((sorted(self.free[x])[g - 1], x) for x in cand)[:n]
        return max(arrival, scored[-1][0]), [x for _, x in scored]

    def occupy(self, nodes: list[str], g: int, end: int) -> None:
        for x in nodes:
            f = self.free[x]
            f.sort()
            f[:g] = [end] * g


@dataclass
class Run:
    job_id: int
    array: tuple[int, int] | None
    name: str
    partition: str
    account: str
    user: str
    qos: str
    state: str
    submit: int
    start: int
    end: int
    nodes: list[str]
    gpus_per_node: int
    comment: str | None


def _weighted(rng: random.Random, weights: dict[Any, float]) -> Any:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def sacct_jobs(n: int, seed: int, trace: Trace | None = None) -> Iterator[dict[str, Any]]:
    """Exactly `n` sacct job entries (one per run), in submission order."""
    rng = random.Random(seed)
    trace = trace or Trace.load()
    fleet = Fleet(rng)
    users = {
        a: [f"{a.split('-')[0][:3]}{a.split('-')[1][:2]}{k:02d}" for k in range(rng.randint(8, 30))]
        for a in TEAM_OF_ACCOUNT
    }
    account_weight = {a: 1.0 / (k + 1) ** 0.8 for k, a in enumerate(rng.sample(sorted(users), 13))}
    t0, span = int(ARRIVALS_FROM.timestamp()), int((ARRIVALS_TO - ARRIVALS_FROM).total_seconds())
    next_id = 1_000_000
    emitted = 0
    names = ("train", "finetune", "eval", "sweep", "pretrain", "bench", "wrap", "ddp", "infer")

    def runs_of(
        job_id: int, array: tuple[int, int] | None, partition: str, account: str, user: str,
        n_nodes: int, g: int, duration: int, submit: int, comment: str | None,
    ) -> list[Run]:  # fmt: skip
        qos = {"train": "normal", "elastic": "scavenger", "infer": "serving"}[partition]
        if partition == "train" and n_nodes > 1 and rng.random() < 0.3:
            qos = "high"
        name = rng.choice(names)
        if comment is None and rng.random() < 0.01:  # cancelled while pending
            return [Run(job_id, array, name, partition, account, user, qos, "CANCELLED",
                        submit, 0, submit + rng.randint(10, 3600), [], g, None)]  # fmt: skip
        runs, arrival, left = [], submit, duration
        p_stop = {"train": 0.03, "elastic": 0.12}.get(partition, 0.0)
        for k in range(3):
            start, nodes = fleet.place(partition, n_nodes, g, arrival)
            if k < 2 and left > 120 and rng.random() < p_stop:
                end = start + rng.randint(60, left - 30)
                state = "PREEMPTED" if partition == "elastic" else "REQUEUED"
                left = max(60, left - (end - start) + rng.randint(0, 1800))
            else:
                end = start + left
                state = _weighted(rng, {"COMPLETED": 0.85, "FAILED": 0.1, "CANCELLED": 0.05})
                if left >= TIME_LIMIT_S:
                    state = "TIMEOUT"
            fleet.occupy(nodes, g, end)
            runs.append(Run(job_id, array, name, partition, account, user, qos, state,
                            submit, start, end, nodes, g, comment))  # fmt: skip
            if state not in ("PREEMPTED", "REQUEUED"):
                break
            arrival = end + rng.randint(60, 900)
        return runs

    while emitted < n:
        submit = t0 + span * emitted // n + rng.randint(0, 59)
        account = _weighted(rng, account_weight)
        kind = _weighted(rng, {"multi": 0.05, "array": 0.015, "serve": 0.08, "single": 0.855})
        batch: list[Run] = []
        if kind == "serve":
            if rng.random() < 0.5:
                account = "platform-serving"
            g = min(4, rng.choice(trace.gpus))
            dur = min(TIME_LIMIT_S, 6 * rng.choice(trace.durations))
            user = rng.choice(users[account])
            batch = runs_of(next_id, None, "infer", account, user, 1, g, dur, submit, "stb:triton")
            next_id += 1
        elif kind == "multi":
            n_nodes = rng.randint(2, 8)
            g = _weighted(rng, {8: 0.5, 4: 0.25, 2: 0.15, 1: 0.1})
            dur = min(TIME_LIMIT_S, 3 * rng.choice(trace.durations))
            user = rng.choice(users[account])
            batch = runs_of(next_id, None, "train", account, user, n_nodes, g, dur, submit, None)
            next_id += 1
        elif kind == "array":
            partition = rng.choice(("train", "elastic"))
            user = rng.choice(users[account])
            g = rng.choice(trace.gpus)
            master = next_id
            for task in range(rng.randint(4, 32)):
                dur = rng.choice(trace.durations)
                batch += runs_of(next_id, (master, task), partition, account, user, 1, g, dur,
                                 submit, None)  # fmt: skip
                next_id += 1
        else:
            partition = rng.choice(("train", "elastic"))
            g = rng.choice(trace.gpus)
            dur = min(
                TIME_LIMIT_S, (2 if partition == "elastic" else 1) * rng.choice(trace.durations)
            )
            user = rng.choice(users[account])
            batch = runs_of(next_id, None, partition, account, user, 1, g, dur, submit, None)
            next_id += 1
        for run in batch[: n - emitted]:
            yield sacct_job(run)
        emitted += len(batch)


_GPU_TYPE = {pool: t for pool, t, _, _ in POOLS}


def sacct_job(r: Run) -> dict[str, Any]:
    """One run as Slurm 22.05's `sacct --json` prints a job (dbv0.0.38)."""
    n_nodes = len(r.nodes)
    gpus = n_nodes * r.gpus_per_node
    cpus = 12 * gpus
    started = bool(r.nodes)
    gres_req = {"type": "gres", "name": "gpu", "id": 1001, "count": r.gpus_per_node}
    requested = [
        {"type": "cpu", "name": None, "id": 1, "count": cpus or 12},
        {"type": "mem", "name": None, "id": 2, "count": 65536 * max(1, n_nodes)},
        {"type": "node", "name": None, "id": 4, "count": max(1, n_nodes)},
        {"type": "billing", "name": None, "id": 5, "count": cpus or 12},
        gres_req,
    ]
    allocated = (
        [
            {"type": "cpu", "name": None, "id": 1, "count": cpus},
            {"type": "energy", "name": None, "id": 3, "count": None},
            {"type": "node", "name": None, "id": 4, "count": n_nodes},
            {"type": "billing", "name": None, "id": 5, "count": cpus},
            {"type": "gres", "name": "gpu", "id": 1001, "count": gpus},
            {"type": "gres", "name": f"gpu:{_GPU_TYPE[r.partition]}", "id": 1002, "count": gpus},
        ]
        if started
        else []
    )
    ok = r.state == "COMPLETED"
    exit_code = {"status": "SUCCESS" if ok else "FAILED", "return_code": 0 if ok else 1}
    array_id, task = r.array or (0, None)
    return {
        "account": r.account,
        "comment": {"administrator": None, "job": r.comment, "system": None},
        "allocation_nodes": n_nodes,
        "array": {
            "job_id": array_id,
            "limits": {"max": {"running": {"tasks": 0}}},
            "task": None,
            "task_id": task,
        },
        "association": {
            "account": r.account,
            "cluster": CLUSTER,
            "partition": None,
            "user": r.user,
        },
        "cluster": CLUSTER,
        "constraints": "",
        "container": None,
        "derived_exit_code": exit_code,
        "time": {
            "elapsed": r.end - r.start if started else 0,
            "eligible": r.submit,
            "end": r.end if started else 0,
            "start": r.start,
            "submission": r.submit,
            "suspended": 0,
            "system": {"seconds": 0, "microseconds": 0},
            "limit": TIME_LIMIT_S // 60,
            "total": {"seconds": 0, "microseconds": 0},
            "user": {"seconds": 0, "microseconds": 0},
        },
        "exit_code": exit_code,
        "flags": ["CLEAR_SCHEDULING", "STARTED_ON_BACKFILL"] if started else [],
        "group": r.account.split("-")[0],
        "het": {"job_id": 0, "job_offset": None},
        "job_id": r.job_id,
        "name": r.name,
        "mcs": {"label": ""},
        "nodes": compress(r.nodes) if started else "None assigned",
        "partition": r.partition,
        "priority": 4294901760 - r.job_id % 100_000,
        "qos": r.qos,
        "required": {"CPUs": cpus or 12, "memory": 0},
        "kill_request_user": None,
        "reservation": {"id": 0, "name": 0},
        "state": {"current": r.state, "reason": "None"},
        "steps": [],
        "tres": {"allocated": allocated, "requested": requested},
        "user": r.user,
        "wckey": {"wckey": "", "flags": []},
        "working_directory": f"/home/{r.user}",
    }


def _document(jobs: Iterator[dict[str, Any]], meta: Any, per_doc: int) -> str | None:
    chunk = [j for _, j in zip(range(per_doc), jobs, strict=False)]
    return json.dumps({"meta": meta, "errors": [], "jobs": chunk}) if chunk else None


def documents(n: int, seed: int, per_doc: int = PER_DOC) -> Iterator[str]:
    """The runs as `sacct --json` documents of `per_doc` jobs each."""
    meta = json.loads(RECORDED.read_text())["meta"]
    jobs = sacct_jobs(n, seed)
    while (doc := _document(jobs, meta, per_doc)) is not None:
        yield doc


def generate(folder: Path, n: int, seed: int) -> tuple[int, int]:
    """Write the runs as `sacct --json` documents (`sacct-00000.json`, ...) into `folder`:
    the input, as an ingest reads it from sacct. Returns (files, bytes)."""
    files = size = 0
    for k, doc in enumerate(documents(n, seed)):
        path = folder / f"sacct-{k:05d}.json"
        path.write_text(doc)
        files, size = files + 1, size + len(doc)
    return files, size


def records(
    folder: Path,
    progress: Callable[[int], None] | None = None,
    parse: Callable[[str], list[AccountingRecord]] = parse_sacct_json,
    clock: list[float] | None = None,
) -> Iterator[AccountingRecord]:
    """The documents in `folder`, read and parsed one at a time (`clock[0]` adds up the
    seconds spent reading and parsing)."""
    done = 0
    for path in sorted(folder.glob("sacct-*.json")):
        t0 = time.perf_counter()
        recs = parse(path.read_text())
        if clock is not None:
            clock[0] += time.perf_counter() - t0
        done += len(recs)
        yield from recs
        if progress:
            progress(done)


def shape_check() -> None:
    """The generated jobs have exactly the keys of the recorded 22.05 jobs, at every level."""

    def keys(v: Any, at: str = "") -> set[str]:
        if isinstance(v, dict):
            return {f"{at}.{k}" for k in v} | {
                x for k, w in v.items() for x in keys(w, f"{at}.{k}")
            }
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return keys(v[0], at + "[]")
        return set()

    real = json.loads(RECORDED.read_text())["jobs"][0]
    ours = next(j for j in json.loads(next(documents(100, 0)))["jobs"] if j["tres"]["allocated"])
    if keys(real) != keys(ours):
        raise SystemExit(f"shape differs from {RECORDED.name}: {keys(real) ^ keys(ours)}")


def context() -> Context:
    pool_of_node, type_of_node = {}, {}
    for n in Fleet(random.Random(0)).inventory:
        pool_of_node[n.node] = n.pool
        type_of_node[n.node] = n.gpu_type
    return Context(
        pool_of_node=pool_of_node,
        gpu_type_of_node=type_of_node,
        workload_of_partition=WORKLOAD_OF,
        workload_of_pool=WORKLOAD_OF,
        team_of_account=TEAM_OF_ACCOUNT,
        known_gpu_types=frozenset(t for _, t, _, _ in POOLS),
        horizon=HORIZON,
        cluster=CLUSTER,
    )


# --- what the ledger must say, from the parsed records alone --------------------------


@dataclass
class Tally:
    records: int = 0
    #: runs that held GPU time (the ones the ledger books)
    booked: int = 0
    skipped: int = 0
    array_tasks: int = 0
    multi_node: int = 0
    requeued_runs: int = 0
    serving: int = 0
    crossing_month: int = 0
    #: ledger rows the runs must make (node x hour touched)
    job_rows: int = 0
    gpu_ms: int = 0
    #: sum of start - submit (queueing), seconds; the latest end (epoch s)
    wait_s: int = 0
    last_end: int = 0
    #: team -> GPU-ms inside the report month
    month_by_team: dict[str, int] = field(default_factory=dict)

    def watch(self, recs: Iterable[AccountingRecord]) -> Iterator[AccountingRecord]:
        w = Window.parse(REPORT_MONTH)
        lo, hi = int(w.start.timestamp()), int(w.end.timestamp())
        for rec in recs:
            self.records += 1
            if rec.start is None or rec.end is None or rec.gpus == 0:
                self.skipped += 1
                yield rec
                continue
            s, e = int(rec.start.timestamp()), int(rec.end.timestamp())
            if e > int(HORIZON.timestamp()):
                raise SystemExit(f"run {rec.key} ends after the horizon {HORIZON}")
            self.booked += 1
            self.array_tasks += rec.array_task_id is not None
            self.multi_node += len(rec.nodes) > 1
            self.requeued_runs += rec.state in ("REQUEUED", "PREEMPTED")
            self.serving += rec.partition == "infer"
            self.crossing_month += rec.start.month != rec.end.month
            self.job_rows += len(rec.nodes) * (-(-e // 3600) - s // 3600)
            self.gpu_ms += rec.gpus * (e - s) * 1000
            self.wait_s += s - int(rec.submit.timestamp()) if rec.submit else 0
            self.last_end = max(self.last_end, e)
            inside = min(e, hi) - max(s, lo)
            if inside > 0:
                team = TEAM_OF_ACCOUNT[rec.account]
                self.month_by_team[team] = (
                    self.month_by_team.get(team, 0) + rec.gpus * inside * 1000
                )
            yield rec


# --- phases (each runs in its own process) ---------------------------------------------


def _progress(label: str, n: int) -> Callable[[int], None]:
    t0 = time.perf_counter()

    def say(done: int) -> None:
        if done % 100_000 and done != n:
            return
        dt = time.perf_counter() - t0
        print(
            f"[{label}] {done:,}/{n:,} records  {dt:7.1f} s  {done / dt:8,.0f} rec/s",
            file=sys.stderr,
            flush=True,
        )

    return say


def phase_generate(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    files, size = generate(Path(args.input), args.records, args.seed)
    return {"seconds": time.perf_counter() - t0, "files": files, "bytes": size}


def phase_parse(args: argparse.Namespace) -> dict[str, Any]:
    """Read and parse alone (the tally of the records is not counted in the time)."""
    tally = Tally()
    clock = [0.0]
    for _ in tally.watch(records(Path(args.input), _progress("parse", args.records), clock=clock)):
        pass
    return {"seconds": clock[0], "tally": asdict(tally)}


def phase_parse_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The same with the reference parser (json and dicts): the reader before issue 15."""
    clock = [0.0]
    n = 0
    for _ in records(
        Path(args.input),
        _progress("parse-plain", args.records),
        parse=parse_sacct_json_plain,
        clock=clock,
    ):
        n += 1
    return {"seconds": clock[0], "records": n}


def phase_floor(args: argparse.Namespace) -> dict[str, Any]:
    """The same ledger and source rows written in one transaction by the ingest's bulk
    writer alone (COPY on PostgreSQL, executemany on SQLite); only the writes are timed."""
    engine = open_ledger(args.url)
    ctx = context()
    label = f"{args.backend} floor"
    write_s = 0.0
    rows_written = sources_written = 0
    t0 = time.perf_counter()
    with engine.begin() as conn:
        now = datetime.now(UTC)
        for batch in batched(records(Path(args.input), _progress(label, args.records)), 2000):
            rows: list[tuple[Any, ...]] = []
            sources: list[tuple[Any, ...]] = []
            for rec in batch:
                entries = job_entry_tuples(rec, ctx)
                if not entries:
                    continue
                key = rec.key
                rows += [
                    (e[0], e[0].date(), f"{e[0]:%Y-%m}", *e[1:12], key, e[12]) for e in entries
                ]
                sources.append(
                    (SACCT, key, now, digest(rec, ctx), rec.job_id, rec.state, rec.start,
                     record_end(rec, ctx.horizon), sum(e[12] for e in entries), now)
                )  # fmt: skip
            rows = bind_rows(conn, LEDGER, LEDGER_COLUMNS, rows)
            sources = bind_rows(conn, SOURCES, SOURCE_COLUMNS, sources)
            w0 = time.perf_counter()
            if rows:
                insert_rows(conn, LEDGER, LEDGER_COLUMNS, rows, True, bound=True)
            if sources:
                insert_rows(conn, SOURCES, SOURCE_COLUMNS, sources, True, bound=True)
            write_s += time.perf_counter() - w0
            rows_written, sources_written = rows_written + len(rows), sources_written + len(sources)
        w0 = time.perf_counter()
    write_s += time.perf_counter() - w0  # the commit
    return {
        "seconds": write_s,
        "total_s": time.perf_counter() - t0,
        "rows": rows_written,
        "sources": sources_written,
    }


def phase_setup(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine = open_ledger(args.url)
    t1 = time.perf_counter()
    spans = record_inventory(
        engine, CLUSTER, Fleet(random.Random(0)).inventory, INVENTORY_AT, backfill_from=None
    )
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "migrate_s": t1 - t0, "inventory_s": t2 - t1, "spans": spans}


def phase_ingest(args: argparse.Namespace) -> dict[str, Any]:
    """End to end: read the sacct documents, parse them, ingest (one transaction); the
    reading, parsing and attribution in a worker process (`ingest_documents`)."""
    engine = open_ledger(args.url)
    ctx = context()
    label = f"{args.backend} {args.phase}"
    say = _progress(label, args.records)
    done = [0]

    def progress(n: int) -> None:
        done[0] += n
        say(done[0])

    t0 = time.perf_counter()
    paths = sorted(Path(args.input).glob("sacct-*.json"))
    workers = args.workers if args.workers >= 0 else default_workers()
    summary = ingest_documents(
        engine, paths, read_sacct_file, ctx, progress=progress, workers=workers
    )
    seconds = time.perf_counter() - t0
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(f"[{label}] {summary.line()}", file=sys.stderr, flush=True)
    return {
        "seconds": seconds,
        #: the largest worker's peak (getrusage gives the largest child's, not their sum)
        "workers_rss_kib": kids.ru_maxrss,
        "workers": workers,
        #: CPU seconds of the main process (with its writer thread) and of its workers
        "cpu_s": [own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime],
        "summary": {
            "records": summary.records,
            "new": summary.new,
            "skipped": summary.skipped,
            "deferred": len(summary.deferred),
            "rows_written": summary.rows_written,
            "idle_hours": summary.idle_hours,
            "overbooked": len(summary.overbooked),
        },
    }


def phase_report(args: argparse.Namespace) -> dict[str, Any]:
    engine = open_ledger(args.url)
    t0 = time.perf_counter()
    rep = build_report(engine, Window.parse(REPORT_MONTH), by=("team",))
    seconds = time.perf_counter() - t0
    with engine.connect() as conn:
        ledger_rows = conn.scalar(select(func.count()).select_from(LEDGER))
        idle_rows = conn.scalar(
            select(func.count()).select_from(LEDGER).where(LEDGER.c.source == CAPACITY_SOURCE)
        )
        sources = conn.scalar(select(func.count()).select_from(SOURCES))
        size = (
            conn.scalar(text("SELECT pg_database_size(current_database())"))
            if engine.dialect.name == "postgresql"
            else Path(make_url(args.url).database or "").stat().st_size
        )
    return {
        "seconds": seconds,
        "lines": {line.keys["team"]: line.gpu_ms for line in rep.lines},
        "ledger_rows": ledger_rows,
        "idle_rows": idle_rows,
        "source_rows": sources,
        "db_bytes": size,
    }


def phase_imports(args: argparse.Namespace) -> dict[str, Any]:
    return {"seconds": 0.0}


PHASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "imports": phase_imports,
    "generate": phase_generate,
    "parse": phase_parse,
    "parse-plain": phase_parse_plain,
    "floor": phase_floor,
    "setup": phase_setup,
    "ingest": phase_ingest,
    "report": phase_report,
}


def run_phase(
    phase: str,
    records_n: int,
    seed: int,
    input_dir: Path,
    backend: str = "",
    url: str = "",
    workers: int = -1,
) -> dict[str, Any]:
    """Run a phase in a fresh interpreter; its result, with its peak RSS (KiB)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", phase]
    cmd += ["--records", str(records_n), "--seed", str(seed), "--backend", backend, "--url", url]
    cmd += ["--input", str(input_dir), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"phase {phase} ({backend or 'no database'}) failed: exit {proc.returncode}"
        )
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["rss_kib"] = usage.ru_maxrss
    print(
        f"[{backend or '-'} {phase}] done: {result['seconds']:.1f} s,"
        f" peak RSS {_mib(usage.ru_maxrss)}",
        file=sys.stderr,
        flush=True,
    )
    return result


# --- databases --------------------------------------------------------------------------


class Databases:
    """Empty databases for a backend, removed on exit (SQLite files unless --keep)."""

    def __init__(self, backend: str, admin_url: str, keep: bool) -> None:
        self.backend, self.admin_url, self.keep = backend, admin_url, keep
        self.made: list[str] = []
        self.folder: Path | None = None
        self.tag = secrets.token_hex(4)

    def __enter__(self) -> Databases:
        return self

    def new(self, suffix: str = "") -> str:
        if self.backend == "sqlite":
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="stb-bench-ledger-"))
            return f"sqlite:///{self.folder / f'ledger{suffix}.db'}"
        import psycopg

        name = f"stb_bench_ledger_{self.tag}{suffix}"
        with psycopg.connect(self._libpq(), autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        url = make_url(self.admin_url).set(drivername="postgresql+psycopg", database=name)
        return url.render_as_string(hide_password=False)

    def _libpq(self) -> str:
        url = make_url(self.admin_url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            if self.keep:
                print(f"kept the SQLite files in {self.folder}")
            else:
                shutil.rmtree(self.folder, ignore_errors=True)
        if self.made:
            import psycopg

            with psycopg.connect(self._libpq(), autocommit=True, connect_timeout=5) as admin:
                for name in self.made:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the run ----------------------------------------------------------------------------


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


def check(tally: dict[str, Any], ingest: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """What disagrees between the records and the ledger ([] when all agrees)."""
    bad = []
    lines = dict(report["lines"])
    idle = lines.pop(IDLE_TEAM, 0)
    want = {t: ms for t, ms in tally["month_by_team"].items() if ms}
    if lines != want:
        bad.append(f"report by team {lines} != the records' GPU-ms in {REPORT_MONTH} {want}")
    if sum(lines.values()) != sum(want.values()):
        bad.append(f"report total {sum(lines.values())} != records {sum(want.values())}")
    if want and not idle:
        bad.append("the report has no idle line")
    if "tally" in ingest and ingest["tally"] != tally:
        bad.append("the ingest saw other records than the baseline (generator not deterministic)")
    s = ingest["summary"]
    if "records" in s and s["records"] != tally["records"]:
        bad.append(f"the ingest read {s['records']} records, the baseline {tally['records']}")
    if s["new"] != tally["booked"] or s["skipped"] != tally["skipped"] or s["deferred"]:
        bad.append(f"ingest summary {s} does not match the records {tally}")
    if report["ledger_rows"] - report["idle_rows"] != tally["job_rows"]:
        bad.append(
            f"{report['ledger_rows'] - report['idle_rows']} job rows, expected {tally['job_rows']}"
        )
    if report["source_rows"] != tally["booked"]:
        bad.append(f"{report['source_rows']} source rows, expected {tally['booked']}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument(
        "--postgres-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="admin URL: the bench creates (and drops) its databases from it",
    )
    ap.add_argument("--keep", action="store_true", help="keep the SQLite files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-floor", action="store_true", help="skip the write-floor baseline")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain parser's baseline")
    ap.add_argument(
        "--workers", type=int, default=-1,
        help="the ingest's worker processes (default: one per CPU, at most 4; 0: none)",
    )  # fmt: skip
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--input", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.phase:  # a child: one phase, its result as the last line of stdout
        result = PHASES[args.phase](args)
        print(json.dumps(result, default=str))
        return 0

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgresql"}
    if unknown:
        ap.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    shape_check()
    trace = Trace.load()
    pools = ", ".join(f"{p} {n}x{g} {t}" for p, t, g, n in POOLS)
    print(
        f"{args.records:,} sacct records, {PER_DOC:,} jobs per document, seed {args.seed};"
        f" {sum(p[3] for p in POOLS):,} nodes ({pools}); durations and GPU counts from"
        f" {trace.source}; {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="stb-bench-ledger-input-") as tmp:
        return _run(args, backends, Path(tmp))


def _run(args: argparse.Namespace, backends: list[str], inp: Path) -> int:
    n, seed = args.records, args.seed
    floor = run_phase("imports", 0, seed, inp)
    gen = run_phase("generate", n, seed, inp)
    base = run_phase("parse", n, seed, inp)
    plain = None if args.no_plain else run_phase("parse-plain", n, seed, inp)
    tally = base["tally"]
    print(
        f"input: {gen['files']:,} documents, {gen['bytes'] / 2**20:,.0f} MiB of sacct JSON,"
        f" generated in {gen['seconds']:.1f} s (not part of any phase below)"
    )
    print(
        f"records: {tally['records']:,} ({tally['booked']:,} with GPU time, {tally['skipped']:,}"
        f" cancelled before start); {tally['array_tasks']:,} array tasks,"
        f" {tally['multi_node']:,} multi-node, {tally['requeued_runs']:,} requeued/preempted"
        f" runs, {tally['serving']:,} serving, {tally['crossing_month']:,} crossing a month;"
        f" {tally['gpu_ms'] / 3.6e6:,.0f} GPU-hours; {tally['job_rows']:,} job rows expected;"
        f" mean wait {tally['wait_s'] / max(1, tally['booked']) / 60:,.1f} min, last end"
        f" {datetime.fromtimestamp(tally['last_end'], UTC):%Y-%m-%d %H:%M}"
    )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    failures: list[str] = []
    for backend in backends:
        with Databases(backend, args.postgres_url, args.keep) as dbs:
            phases: dict[str, dict[str, Any]] = {}
            if not args.no_floor:
                url = dbs.new("_floor")
                phases["floor"] = run_phase("floor", n, seed, inp, backend, url)
            url = dbs.new()
            for phase in ("setup", "ingest", "report"):
                phases[phase] = run_phase(phase, n, seed, inp, backend, url, args.workers)
            results[backend] = phases
        failures += [f"{backend}: {b}" for b in check(tally, phases["ingest"], phases["report"])]

    b = base["seconds"]
    print()
    print(f"interpreter + imports alone: peak RSS {_mib(floor['rss_kib'])}")
    print(f"{'backend':<11} {'phase':<11} {'time':>9} {'x parse':>8} {'peak RSS':>10}  notes")
    print(
        f"{'-':<11} {'parse':<11} {b:8.1f}s {1:>7.2f}x {_mib(base['rss_kib']):>10}"
        "  baseline: read + parse (msgspec) alone"
    )
    if plain is not None:
        print(
            f"{'-':<11} {'parse-plain':<11} {plain['seconds']:8.1f}s"
            f" {plain['seconds'] / b:>7.2f}x {_mib(plain['rss_kib']):>10}"
            "  read + the plain parser (json, dicts): the reader before"
        )
    figures: dict[str, str] = {"records": str(n), "parse_s": f"{b:.1f}"}
    if plain is not None:
        figures["parse_plain_s"] = f"{plain['seconds']:.1f}"
        figures["parse_speedup"] = f"{plain['seconds'] / b:.2f}"
    for backend, phases in results.items():
        for phase, r in phases.items():
            note = ""
            if phase == "floor":
                note = (
                    f"{r['rows']:,} ledger + {r['sources']:,} source rows,"
                    f" {'COPY' if backend == 'postgresql' else 'executemany'} alone"
                    f" (the phase took {r['total_s']:.1f} s in all)"
                )
            elif phase == "setup":
                note = f"migrate {r['migrate_s']:.1f} s, inventory {r['inventory_s']:.1f} s"
            elif phase == "ingest":
                s = r["summary"]
                note = (
                    f"end to end (read, parse, ingest): {s['rows_written']:,} ledger rows +"
                    f" {s['new']:,} source rows; idle for {s['idle_hours']:,} hours;"
                    f" {r['workers']} worker(s), the largest's peak RSS"
                    f" {_mib(r['workers_rss_kib'])};"
                    f" CPU {r['cpu_s'][0]:.0f} s main + {r['cpu_s'][1]:.0f} s workers"
                )
                if "floor" in phases:
                    note += f"; {r['seconds'] / phases['floor']['seconds']:.2f}x floor"
            elif phase == "report":
                note = (
                    f"{len(r['lines'])} lines; db {r['db_bytes'] / 2**20:,.0f} MiB,"
                    f" {r['ledger_rows']:,} ledger rows"
                )
            print(
                f"{backend:<11} {phase:<11} {r['seconds']:8.1f}s {r['seconds'] / b:>7.2f}x"
                f" {_mib(r['rss_kib']):>10}  {note}"
            )
        tag = "pg" if backend == "postgresql" else backend
        ing = phases["ingest"]
        figures[f"{tag}_ingest_s"] = f"{ing['seconds']:.1f}"
        # the main process and its workers together, each at the largest one's peak (a
        # bound on their sum: getrusage gives no sum)
        figures[f"{tag}_ingest_rss_mib"] = (
            f"{(ing['rss_kib'] + ing['workers'] * ing['workers_rss_kib']) / 1024:.0f}"
        )
        figures[f"{tag}_report_s"] = f"{phases['report']['seconds']:.2f}"
        if "floor" in phases:
            figures[f"{tag}_floor_s"] = f"{phases['floor']['seconds']:.1f}"
            figures[f"{tag}_x_floor"] = f"{ing['seconds'] / phases['floor']['seconds']:.2f}"
    if results:
        first = next(iter(results.values()))["report"]["lines"]
        used = sum(ms for team, ms in first.items() if team != IDLE_TEAM)
        print(
            f"\n{REPORT_MONTH} by team (GPU-hours), utilization"
            f" {used / max(1, sum(first.values())):.0%}:"
        )
        for team, ms in sorted(first.items(), key=lambda kv: -kv[1]):
            print(f"  {team:<10} {ms / 3.6e6:14,.1f}")
    for f in failures:
        print(f"check FAILED: {f}", file=sys.stderr)
    if results:
        print("check: ok" if not failures else "check: FAILED")
        figures["check"] = "ok" if not failures else "failed"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
