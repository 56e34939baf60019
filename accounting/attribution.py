"""From source records to ledger entries: who used which GPU-milliseconds, in which hour.

Pure: no database, no clock. `ingest` feeds it records and the context it read; the
property tests drive it directly.

- `job_entries`: one sacct run -> entries per hour bucket and node. A multi-node job's GPUs
  are shared evenly among its nodes (sacct reports the total); each node books to its own
  pool. A running job counts up to the horizon.
- The GPUs a run holds per node and type come from `accounting.allocation`: its
  `gres/gpu` count, or for MIG slices and shards each one's share of a GPU under the
  slice's own type, booked so that a slice busy a whole hour books exactly its capacity.
- The workload: a staging job of the bridge's (`is_staging`: `stb:staging` in its
  comment or a name starting `stb-staging`, in the bridge's account) is `staging`, booked
  to the model its name names (overhead of that model's serving; it asks for no GPU, so it
  books only where the site gave it some); else `stb:workload=<w>` in the job's comment
  (written by job_submit.lua), `stb:triton` (a serving job), else the workload of the
  job's partition, else of the node's pool, else "training".
- A serving job (workload inference) is split among its models by compute-time share:
  each model gets the GPU time its instances spent computing in that hour (Triton's
  cumulative compute counters; a counter that goes down was reset and counts from zero),
  scaled down if the models together computed more than the job held; what is left is the
  job's `(unattributed)` row (inference idle). The parts sum to the job exactly.
- With the batch route's work (`accounting.batchshare.BatchUse`): each model's part in an
  hour is split again between online and batch work by request share, the batch part
  booked to each batch job's own team under `batch-inference` (`accounting.batchshare`);
  the parts still sum to the job exactly.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from types import MappingProxyType

from accounting.allocation import (
    Share,
    allocations,
    holds_gpus,
    record_shares,
    scaled_ms,
    total_gpus,
)
from accounting.batchshare import BatchUse, split_batch
from accounting.buckets import floor_hour, largest_remainder, split_ms, utc
from accounting.errors import IngestError
from accounting.schema import BATCH_INFERENCE, STAGING, UNATTRIBUTED, UNKNOWN_BATCH_JOB, WORKLOADS
from bridge.slurm.model import (
    STAGING_NAME_PREFIX,
    STAGING_TAG,
    TRITON_TAG,
    AccountingRecord,
    staged_version,
)
from bridge.slurm.slices import SliceRules

_TAG = re.compile(r"stb:(workload|lease|team)=([A-Za-z0-9_.:-]+)")
#: the workloads a job may be booked under, for the error that names an unknown one
_BOOKABLE = ", ".join(w for w in WORKLOADS if w != "idle")


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
    """One scrape of one model version's cumulative counters on one Triton instance:
    compute time (the serving split), successful requests and an LLM's prompt and
    generated tokens (the unit economics; None where the page had no such counter)."""

    job_id: str
    instance: str
    model: str
    at: datetime
    compute_us: float
    version: str = ""
    requests: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


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
    #: the accounts whose staging-marked jobs are booked as `staging` (the bridge's);
    #: empty: any account's
    staging_accounts: frozenset[str] = frozenset()
    #: how much of a GPU a MIG slice or shards book (`[accounting.slices]`); also the
    #: unit of a slice type's capacity (`bridge.slurm.slices.unit_share`)
    slices: SliceRules = field(default_factory=SliceRules)


def tags(comment: str) -> dict[str, str]:
    """The bridge's tags in a job's comment (comma, semicolon or space separated); the
    last `stb:workload=` wins (the admin comment comes last)."""
    return dict(comment_tags(comment))


@functools.lru_cache(maxsize=4096)
def comment_tags(comment: str) -> Mapping[str, str]:
    """`tags`, cached (comments repeat across a cluster's jobs): read-only."""
    found = dict(_TAG.findall(comment))
    if TRITON_TAG in re.split(r"[\s,;]+", comment):
        found.setdefault("workload", "inference")
    return MappingProxyType(found)


@functools.lru_cache(maxsize=4096)
def _staging_comment(comment: str) -> bool:
    return STAGING_TAG in re.split(r"[\s,;]+", comment)


def is_staging(rec: AccountingRecord, ctx: Context) -> bool:
    """A run of one of the bridge's staging jobs (`bridge.slurm.staging`): `stb:staging` in
    its comment or its name `stb-staging` or `stb-staging-...`, and its account one of
    `ctx.staging_accounts` (any when empty): another account's job that says so is booked
    as its own workload."""
    named = rec.name == STAGING_NAME_PREFIX or rec.name.startswith(STAGING_NAME_PREFIX + "-")
    if not (named or _staging_comment(rec.comment)):
        return False
    return not ctx.staging_accounts or rec.account in ctx.staging_accounts


def staged_model(name: str) -> str:
    """The model a staging job's name names (`stb-staging-<model>-<version>`); "" for any
    other name."""
    found = staged_version(name)
    return found[0] if found else ""


def record_workload(rec: AccountingRecord, ctx: Context, tagged: Mapping[str, str]) -> str | None:
    """The workload the record's tags, name and partition say (None: the node's pool's);
    `tagged`: `comment_tags(rec.comment)`. A staging job's is `staging` whatever tag
    job_submit.lua gave its partition."""
    if is_staging(rec, ctx):
        return STAGING
    return tagged.get("workload") or ctx.workload_of_partition.get(rec.partition)


def deferred_reason(rec: AccountingRecord) -> str | None:
    """Why a record is not ingested yet (None: it is ready). slurmdbd briefly holds a
    short job's final record without partition or nodes; the next ingest gets it whole."""
    if rec.start is None or not holds_gpus(rec):
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
    batch: BatchUse | None = None,
) -> list[Entry]:
    """The record's entries; [] for a run that never started or held no GPU. Raises
    IngestError naming the record when it cannot be booked. `batch`: the batch route's
    work in the run's hours (a serving job's models' time split with it)."""
    key = rec.key
    if rec.gpus < 0:
        raise IngestError(key, f"negative GPU count {rec.gpus}")
    end = record_end(rec, ctx.horizon)
    if rec.start is None or not holds_gpus(rec) or end is None:
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
    workload = record_workload(rec, ctx, t)
    lease = t.get("lease", "")
    plain_model = staged_model(rec.name) if workload == STAGING else ""
    held = allocations(rec, ctx)
    total = total_gpus(held)
    busy = compute_ms_by_bucket(serving, start, end) if serving else {}
    parts = split_ms(start, end)
    start_ms = _ms(start)
    entries: list[Entry] = []
    for node, gpu_type, gpus in held:
        pool = ctx.pool_of_lease.get(lease) or ctx.pool_of_node.get(node) or rec.partition
        wl = workload or ctx.workload_of_pool.get(pool) or "training"
        if wl not in WORKLOADS or wl == "idle":
            raise IngestError(key, f"unknown workload {wl!r} (one of {_BOOKABLE})")
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
        weight = gpus if isinstance(gpus, int) else gpus.units * gpus.unit
        for bucket, amount in scaled_ms(parts, gpus, start_ms):
            if wl != "inference":
                entries.append(
                    Entry(bucket=bucket, team=team, model=plain_model, gpu_ms=amount, **base)
                )
                continue
            # A multi-node serving job's compute is shared among its nodes like its GPUs.
            share = {m: float(v * weight / total) for m, v in busy.get(bucket, {}).items()}
            entries.extend(_serving_split(bucket, amount, team, base, ctx, share, batch))
    return entries


#: an entry as a plain tuple, in `Entry`'s field order (bucket, cluster, pool, partition,
#: workload, account, team, user, model, gpu_type, qos, lease, gpu_ms)
EntryTuple = tuple[datetime, str, str, str, str, str, str, str, str, str, str, str, int]

_HOUR_MS = 3_600_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
#: epoch ms of an hour -> its bucket (the ledger's hours repeat across records)
_BUCKETS: dict[int, datetime] = {}


def _bucket(ms: int) -> datetime:
    b = _BUCKETS.get(ms)
    if b is None:
        if len(_BUCKETS) > 200_000:
            _BUCKETS.clear()
        b = _BUCKETS[ms] = _EPOCH + timedelta(milliseconds=ms)
    return b


def _hour_parts(start: datetime, end: datetime) -> list[tuple[datetime, int]]:
    """`split_ms(start, end)` in integer milliseconds (the same parts)."""
    s, e = (start - _EPOCH) // _ONE_MS, (end - _EPOCH) // _ONE_MS
    out = []
    h = s - s % _HOUR_MS
    while h < e:
        lo, hi = max(s, h), min(e, h + _HOUR_MS)
        if hi > lo:
            out.append((_bucket(h), hi - lo))
        h += _HOUR_MS
    return out


def job_entry_tuples(
    rec: AccountingRecord,
    ctx: Context,
    serving: Sequence[ServingPoint] = (),
    batch: BatchUse | None = None,
) -> list[EntryTuple]:
    """`job_entries` as tuples (the same entries, in the same order), built without an
    `Entry` per hour and node: the ingest's bulk path. A record with serving samples goes
    through `job_entries` itself (its split among models, and with `batch`)."""
    if serving:
        return [_as_tuple(e) for e in job_entries(rec, ctx, serving, batch)]
    if rec.gpus < 0:
        raise IngestError(rec.key, f"negative GPU count {rec.gpus}")
    end = record_end(rec, ctx.horizon)
    if rec.start is None or not holds_gpus(rec) or end is None:
        return []
    start = utc(rec.start)
    end = utc(end)
    if end < start:
        raise IngestError(
            rec.key, f"ends ({end.isoformat()}) before it starts ({start.isoformat()})"
        )
    if not rec.nodes:
        raise IngestError(rec.key, "holds GPUs but names no node")
    cluster = rec.cluster or ctx.cluster
    if not cluster:
        raise IngestError(rec.key, "names no cluster")
    t = comment_tags(rec.comment)
    workload = record_workload(rec, ctx, t)
    lease = t.get("lease", "")
    plain_model = staged_model(rec.name) if workload == STAGING else ""
    parts = _hour_parts(start, end)
    team = ctx.team_of_account.get(rec.account, rec.account)
    out: list[EntryTuple] = []
    for node, gpu_type, gpus in allocations(rec, ctx):
        pool = ctx.pool_of_lease.get(lease) or ctx.pool_of_node.get(node) or rec.partition
        wl = workload or ctx.workload_of_pool.get(pool) or "training"
        if wl not in WORKLOADS or wl == "idle":
            raise IngestError(rec.key, f"unknown workload {wl!r} (one of {_BOOKABLE})")
        # No serving samples: a serving job's time is all its (unattributed) row.
        model = UNATTRIBUTED if wl == "inference" else plain_model
        head = (cluster, pool, rec.partition, wl, rec.account, team, rec.user, model)
        tail = (gpu_type, rec.qos, lease)
        if isinstance(gpus, int):
            out += [(bucket, *head, *tail, ms * gpus) for bucket, ms in parts]
        else:
            start_ms = _ms(start)
            out += [(b, *head, *tail, ms) for b, ms in scaled_ms(parts, gpus, start_ms)]
    return out


def _as_tuple(e: Entry) -> EntryTuple:
    return (
        e.bucket, e.cluster, e.pool, e.partition, e.workload, e.account, e.team, e.user,
        e.model, e.gpu_type, e.qos, e.lease, e.gpu_ms,
    )  # fmt: skip


def _serving_split(
    bucket: datetime,
    amount: int,
    job_team: str,
    base: Mapping[str, str],
    ctx: Context,
    busy: Mapping[str, float],
    batch: BatchUse | None = None,
) -> list[Entry]:
    models = sorted(m for m, v in busy.items() if v > 0)
    weights = [busy[m] for m in models]
    # Whole milliseconds, never more than computed: no model gets more than its compute
    # rounded up (largest remainder over a floored total).
    attributed = min(amount, math.floor(sum(weights)))
    parts = largest_remainder(attributed, weights)
    out: list[Entry] = []
    for m, p in zip(models, parts, strict=True):
        answered = batch.answered.get((bucket, m)) if batch is not None else None
        if batch is not None and answered and p > 0:
            p, jobs = split_batch(p, answered, batch.requests.get((bucket, m)))
            out += [_batch_entry(bucket, m, ms, job, base, ctx, batch) for job, ms in jobs]
        if p > 0:
            team = ctx.team_of_model.get(m, job_team)
            out.append(Entry(bucket=bucket, team=team, model=m, gpu_ms=p, **base))
    rest = amount - sum(parts)
    if rest > 0:
        out.append(Entry(bucket=bucket, team=job_team, model=UNATTRIBUTED, gpu_ms=rest, **base))
    return out


def _batch_entry(
    bucket: datetime,
    model: str,
    ms: int,
    job: str,
    base: Mapping[str, str],
    ctx: Context,
    batch: BatchUse,
) -> Entry:
    """A batch job's part of a model's serving time: to its account and team under
    `batch-inference` (where the serving job's GPUs are), or to `UNKNOWN_BATCH_JOB`."""
    known = batch.jobs.get(job) if job else None
    account, user = known if known is not None else (UNKNOWN_BATCH_JOB, "")
    team = ctx.team_of_account.get(account, account) if known is not None else account
    keys = {**base, "workload": BATCH_INFERENCE, "account": account, "user": user}
    return Entry(bucket=bucket, team=team, model=model, gpu_ms=ms, **keys)


def compute_ms_by_bucket(
    serving: Sequence[ServingPoint], start: datetime, end: datetime
) -> dict[datetime, dict[str, float]]:
    """Per hour bucket and model, the compute milliseconds the job's instances spent.

    Each (instance, model, version) series starts from zero at the job's start (Triton's counters
    count from the model's load); a value below the previous one means the counter was
    reset and the new value is the increase since. An increase between two scrapes is
    spread over the hours between them in proportion to time."""
    series: dict[tuple[str, str, str], list[ServingPoint]] = defaultdict(list)
    for p in serving:
        series[(p.instance, p.model, p.version)].append(p)
    out: dict[datetime, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (_, model, _), points in series.items():
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
    unit: Callable[[str], Fraction] | None = None,
) -> dict[tuple[str, str, str, datetime], int]:
    """(cluster, pool, gpu_type, hour) -> GPU-ms of capacity in [start, end), from node
    spans (cluster, pool, gpu_type, gpus, span start, span end or None = still open).

    The sum over spans of `split_ms` x GPUs, without a step per node and hour: a span's
    whole hours go into a difference array per (cluster, pool, GPU type), its partial first
    and last hours directly; one sweep over the hours adds them up. A cell is present when
    some span covers part of it (as with `split_ms`, even with 0 GPUs).

    `unit`: the GPUs one unit of a type is (`bridge.slurm.slices.unit_share`: a MIG
    slice's fraction); a span of a type whose unit is not 1 books, per hour, its count x
    `Share.ms` of the hour, as a job on those slices does."""
    lo_ms, hi_ms = _ms(utc(start)), _ms(utc(end))
    groups: dict[tuple[str, str, str], _CapacityCells] = {}
    for cluster, pool, gpu_type, gpus, s, e in spans:
        lo = max(_ms(utc(s)), lo_ms)
        hi = min(_ms(utc(e)), hi_ms) if e is not None else hi_ms
        if hi <= lo:
            continue
        g = groups.get((cluster, pool, gpu_type))
        if g is None:
            g = groups[(cluster, pool, gpu_type)] = _CapacityCells()
        share = unit(gpu_type) if unit is not None else 1
        if share != 1:
            slices = Share(gpus, Fraction(share))
            h = lo - lo % _HOUR_MS
            while h < hi:
                g.part(h, slices.ms(max(lo, h), min(hi, h + _HOUR_MS)))
                h += _HOUR_MS
            continue
        first, last = lo - lo % _HOUR_MS, hi - hi % _HOUR_MS
        if first == last:
            g.part(first, (hi - lo) * gpus)
            continue
        g.part(first, (first + _HOUR_MS - lo) * gpus)
        if last > first + _HOUR_MS:
            g.whole(first + _HOUR_MS, last, gpus * _HOUR_MS)
        if hi > last:
            g.part(last, (hi - last) * gpus)
    out: dict[tuple[str, str, str, datetime], int] = {}
    for (cluster, pool, gpu_type), g in groups.items():
        for h, ms in g.sweep():
            out[(cluster, pool, gpu_type, _bucket(h))] = ms
    return out


class _CapacityCells:
    """Per hour (epoch ms): partial amounts, and whole hours as difference arrays."""

    __slots__ = ("amount", "cover", "partial")

    def __init__(self) -> None:
        self.partial: dict[int, int] = defaultdict(int)
        self.amount: dict[int, int] = defaultdict(int)
        self.cover: dict[int, int] = defaultdict(int)

    def part(self, hour: int, ms: int) -> None:
        self.partial[hour] += ms

    def whole(self, first: int, stop: int, ms: int) -> None:
        """`ms` in each hour of [first, stop)."""
        self.amount[first] += ms
        self.amount[stop] -= ms
        self.cover[first] += 1
        self.cover[stop] -= 1

    def sweep(self) -> Iterator[tuple[int, int]]:
        marks = self.partial.keys() | self.cover.keys()
        amount = cover = 0
        for h in range(min(marks), max(marks) + 1, _HOUR_MS):
            amount += self.amount.get(h, 0)
            cover += self.cover.get(h, 0)
            if cover > 0 or h in self.partial:
                yield h, amount + self.partial.get(h, 0)


def _ms(t: datetime) -> int:
    return (t - _EPOCH) // _ONE_MS


def digest(
    rec: AccountingRecord,
    ctx: Context,
    serving: Sequence[ServingPoint] = (),
    batch: BatchUse | None = None,
) -> str:
    """Everything a record's rows depend on (the record, its effective end, the context's
    answers for it, its serving samples and the batch route's work): equal digests, equal
    rows."""
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
    if is_staging(rec, ctx):  # only then: every other record keeps its digest
        h.update(repr((STAGING, rec.name)).encode())
    shares = record_shares(rec, ctx)
    if shares is not None:  # only on slices or shards: what their rules made of the TRES
        h.update(repr(("shares", rec.gpu_tres, sorted(shares.items(), key=str))).encode())
    for p in sorted(serving, key=lambda p: (p.instance, p.model, p.version, p.at)):
        # the version only where there is one: samples stored before versions keep their
        # digests (requests and tokens do not change the rows: not hashed)
        tail = (p.version,) if p.version else ()
        h.update(repr((p.instance, p.model, p.at, p.compute_us, *tail)).encode())
    if serving and batch:  # only then: a record with no batch work keeps its digest
        teams = sorted({(a, ctx.team_of_account.get(a, a)) for a, _ in batch.jobs.values()})
        h.update(repr(("batch", batch.facts(), teams)).encode())
    return h.hexdigest()[:32]
