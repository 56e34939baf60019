"""From source records to ledger entries: who used which GPU-milliseconds, in which hour.

Pure: no database, no clock. `ingest` feeds it records and the context it read; the
property tests drive it directly.

- `job_entries`: one sacct run -> entries per hour bucket and node. A multi-node job's GPUs
  are shared evenly among its nodes (sacct reports the total); each node books to its own
  pool. A running job counts up to the horizon.
- The workload: `stb:workload=<w>` in the job's comment (written by job_submit.lua),
  `stb:triton` (a serving job), else the workload of the job's partition, else of the
  node's pool, else "training".
- A serving job (workload inference) is split among its models by compute-time share:
  each model gets the GPU time its instances spent computing in that hour (Triton's
  cumulative compute counters; a counter that goes down was reset and counts from zero),
  scaled down if the models together computed more than the job held; what is left is the
  job's `(unattributed)` row (inference idle). The parts sum to the job exactly.
- `idle_entries`: per cluster, pool, GPU type and hour: capacity minus allocation.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from accounting.buckets import even_split, floor_hour, largest_remainder, split_ms, utc
from accounting.errors import IngestError
from accounting.schema import IDLE_TEAM, UNATTRIBUTED, WORKLOADS
from bridge.slurm.model import TRITON_TAG, AccountingRecord

_TAG = re.compile(r"stb:(workload|lease|team)=([A-Za-z0-9_.:-]+)")


@dataclass(frozen=True, slots=True)
class Entry:
    """GPU-milliseconds of one hour bucket under one set of keys."""

    bucket: datetime
    cluster: str
    pool: str
    partition: str
    workload: str
    account: str
    team: str
    user: str
    model: str
    gpu_type: str
    qos: str
    lease: str
    gpu_ms: int


@dataclass(frozen=True, slots=True)
class ServingPoint:
    """One scrape of one model's cumulative compute time on one Triton instance."""

    job_id: str
    instance: str
    model: str
    at: datetime
    compute_us: float


@dataclass(frozen=True)
class Context:
    """What attribution needs besides the record; built by the caller from the
    configuration, the inventory and the lease history."""

    #: node -> pool (a lendable pool wins over the reserved one)
    pool_of_node: Mapping[str, str] = field(default_factory=dict)
    #: node -> GPU type, for records whose gres names no type
    gpu_type_of_node: Mapping[str, str] = field(default_factory=dict)
    #: partition -> workload (training, elastic, inference)
    workload_of_partition: Mapping[str, str] = field(default_factory=dict)
    #: pool -> workload, for partitions the map does not name
    workload_of_pool: Mapping[str, str] = field(default_factory=dict)
    #: Slurm account -> team (an account is its own team when absent)
    team_of_account: Mapping[str, str] = field(default_factory=dict)
    #: served model -> owning team (stb.team in its config.pbtxt)
    team_of_model: Mapping[str, str] = field(default_factory=dict)
    #: lease id -> the pool the node was lent from
    pool_of_lease: Mapping[str, str] = field(default_factory=dict)
    #: GPU types the cluster has; empty: not checked
    known_gpu_types: frozenset[str] = frozenset()
    #: where a running job's time ends (the ingest's "until", or now)
    horizon: datetime | None = None
    #: cluster name for records that carry none
    cluster: str = ""


def tags(comment: str) -> dict[str, str]:
    """The bridge's tags in a job's comment (comma, semicolon or space separated); the
    last `stb:workload=` wins (the admin comment comes last)."""
    found = dict(_TAG.findall(comment))
    if TRITON_TAG in re.split(r"[\s,;]+", comment):
        found.setdefault("workload", "inference")
    return found


def deferred_reason(rec: AccountingRecord) -> str | None:
    """Why a record is not ingested yet (None: it is ready). slurmdbd briefly holds a
    short job's final record without partition or nodes; the next ingest gets it whole."""
    if rec.start is None or rec.gpus == 0:
        return None
    if not rec.nodes or not rec.partition:
        return "slurmdbd has not written its partition/nodes yet"
    return None


def record_end(rec: AccountingRecord, horizon: datetime | None) -> datetime | None:
    if rec.start is None:
        return None
    if rec.end is not None:
        return rec.end
    return horizon


def job_entries(
    rec: AccountingRecord,
    ctx: Context,
    serving: Sequence[ServingPoint] = (),
) -> list[Entry]:
    """The record's entries; [] for a run that never started or held no GPU. Raises
    IngestError naming the record when it cannot be booked."""
    key = rec.key
    if rec.gpus < 0:
        raise IngestError(key, f"negative GPU count {rec.gpus}")
    end = record_end(rec, ctx.horizon)
    if rec.start is None or rec.gpus == 0 or end is None:
        return []
    start = utc(rec.start)
    end = utc(end)
    if end < start:
        raise IngestError(key, f"ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    if not rec.nodes:
        raise IngestError(key, "holds GPUs but names no node")
    cluster = rec.cluster or ctx.cluster
    if not cluster:
        raise IngestError(key, "names no cluster")
    t = tags(rec.comment)
    workload = t.get("workload") or ctx.workload_of_partition.get(rec.partition)
    lease = t.get("lease", "")
    per_node = even_split(rec.gpus, len(rec.nodes))
    busy = compute_ms_by_bucket(serving, start, end) if serving else {}
    entries: list[Entry] = []
    for node, gpus in zip(rec.nodes, per_node, strict=True):
        if gpus == 0:
            continue
        gpu_type = rec.gpu_type or ctx.gpu_type_of_node.get(node) or ""
        if not gpu_type:
            raise IngestError(key, f"no GPU type: its gres names none and node {node} is unknown")
        if ctx.known_gpu_types and gpu_type not in ctx.known_gpu_types:
            known = ", ".join(sorted(ctx.known_gpu_types))
            raise IngestError(key, f"unknown GPU type {gpu_type!r} (the cluster has: {known})")
        pool = ctx.pool_of_lease.get(lease) or ctx.pool_of_node.get(node) or rec.partition
        wl = workload or ctx.workload_of_pool.get(pool) or "training"
        if wl not in WORKLOADS or wl == "idle":
            raise IngestError(key, f"unknown workload {wl!r} (one of training, elastic, inference)")
        team = ctx.team_of_account.get(rec.account, rec.account)
        base = dict(
            cluster=cluster,
            pool=pool,
            partition=rec.partition,
            workload=wl,
            account=rec.account,
            user=rec.user,
            gpu_type=gpu_type,
            qos=rec.qos,
            lease=lease,
        )
        for bucket, ms in split_ms(start, end):
            amount = ms * gpus
            if wl != "inference":
                entries.append(Entry(bucket=bucket, team=team, model="", gpu_ms=amount, **base))
                continue
            # A multi-node serving job's compute is shared among its nodes like its GPUs.
            share = {m: v * gpus / rec.gpus for m, v in busy.get(bucket, {}).items()}
            entries.extend(_serving_split(bucket, amount, team, base, ctx, share))
    return entries


def _serving_split(
    bucket: datetime,
    amount: int,
    job_team: str,
    base: Mapping[str, str],
    ctx: Context,
    busy: Mapping[str, float],
) -> list[Entry]:
    models = sorted(m for m, v in busy.items() if v > 0)
    weights = [busy[m] for m in models]
    # Whole milliseconds, never more than computed: no model gets more than its compute
    # rounded up (largest remainder over a floored total).
    attributed = min(amount, math.floor(sum(weights)))
    parts = largest_remainder(attributed, weights)
    out = [
        Entry(bucket=bucket, team=ctx.team_of_model.get(m, job_team), model=m, gpu_ms=p, **base)
        for m, p in zip(models, parts, strict=True)
        if p > 0
    ]
    rest = amount - sum(parts)
    if rest > 0:
        out.append(Entry(bucket=bucket, team=job_team, model=UNATTRIBUTED, gpu_ms=rest, **base))
    return out


def compute_ms_by_bucket(
    serving: Sequence[ServingPoint], start: datetime, end: datetime
) -> dict[datetime, dict[str, float]]:
    """Per hour bucket and model, the compute milliseconds the job's instances spent.

    Each (instance, model) series starts from zero at the job's start (Triton's counters
    count from the model's load); a value below the previous one means the counter was
    reset and the new value is the increase since. An increase between two scrapes is
    spread over the hours between them in proportion to time."""
    series: dict[tuple[str, str], list[ServingPoint]] = defaultdict(list)
    for p in serving:
        series[(p.instance, p.model)].append(p)
    out: dict[datetime, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (_, model), points in series.items():
        points.sort(key=lambda p: p.at)
        prev_at, prev_v = start, 0.0
        for p in points:
            at = min(max(utc(p.at), start), end)
            delta_us = p.compute_us - prev_v if p.compute_us >= prev_v else p.compute_us
            _spread(out, model, prev_at, at, delta_us / 1000.0)
            prev_at, prev_v = at, p.compute_us
    return {b: dict(m) for b, m in out.items()}


def _spread(
    out: dict[datetime, dict[str, float]], model: str, a: datetime, b: datetime, ms: float
) -> None:
    if ms <= 0:
        return
    parts = split_ms(a, b)
    if not parts:  # two scrapes in the same millisecond: book at the later one
        out[floor_hour(b)][model] += ms
        return
    total = sum(p for _, p in parts)
    for bucket, p in parts:
        out[bucket][model] += ms * p / total


def capacity_ms(
    spans: Iterable[tuple[str, str, str, int, datetime, datetime | None]],
    start: datetime,
    end: datetime,
) -> dict[tuple[str, str, str, datetime], int]:
    """(cluster, pool, gpu_type, hour) -> GPU-ms of capacity in [start, end), from node
    spans (cluster, pool, gpu_type, gpus, span start, span end or None = still open)."""
    out: dict[tuple[str, str, str, datetime], int] = defaultdict(int)
    for cluster, pool, gpu_type, gpus, s, e in spans:
        lo = max(utc(s), start)
        hi = min(utc(e), end) if e is not None else end
        for bucket, ms in split_ms(lo, hi):
            out[(cluster, pool, gpu_type, bucket)] += ms * gpus
    return dict(out)


def idle_entries(
    capacity: Mapping[tuple[str, str, str, datetime], int],
    allocated: Mapping[tuple[str, str, str, datetime], int],
) -> tuple[list[Entry], dict[tuple[str, str, str, datetime], int]]:
    """Idle entries (capacity minus allocation) and the over-allocated cells (allocation
    above capacity, or with no recorded capacity at all: the inventory missed a node or
    started later, or clocks disagree); those book no idle."""
    entries, over = [], {}
    for cell, used in allocated.items():
        if used > 0 and cell not in capacity:  # the inventory does not cover this cell
            over[cell] = used
    for (cluster, pool, gpu_type, bucket), cap in sorted(capacity.items()):
        used = allocated.get((cluster, pool, gpu_type, bucket), 0)
        if used > cap:
            over[(cluster, pool, gpu_type, bucket)] = used - cap
        idle = max(0, cap - used)
        if idle:
            entries.append(
                Entry(
                    bucket=bucket,
                    cluster=cluster,
                    pool=pool,
                    partition="",
                    workload="idle",
                    account="",
                    team=IDLE_TEAM,
                    user="",
                    model="",
                    gpu_type=gpu_type,
                    qos="",
                    lease="",
                    gpu_ms=idle,
                )
            )
    return entries, over


def digest(rec: AccountingRecord, ctx: Context, serving: Sequence[ServingPoint] = ()) -> str:
    """Everything a record's rows depend on (the record, its effective end, the context's
    answers for it, its serving samples): equal digests, equal rows."""
    h = hashlib.sha256()
    fields = (
        rec.cluster or ctx.cluster,
        rec.job_id,
        rec.partition,
        rec.account,
        rec.user,
        rec.qos,
        rec.start,
        record_end(rec, ctx.horizon),
        rec.nodes,
        rec.gpus,
        rec.gpu_type,
        rec.comment,
        [(ctx.pool_of_node.get(n), ctx.gpu_type_of_node.get(n)) for n in rec.nodes],
        ctx.workload_of_partition.get(rec.partition),
        ctx.team_of_account.get(rec.account),
        sorted(ctx.team_of_model.items()) if serving else None,
        sorted(ctx.pool_of_lease.items()) if "stb:lease=" in rec.comment else None,
    )
    h.update(repr(fields).encode())
    for p in sorted(serving, key=lambda p: (p.instance, p.model, p.at)):
        h.update(repr((p.instance, p.model, p.at, p.compute_us)).encode())
    return h.hexdigest()[:32]
