"""Batch work's share of a model's serving time: the rule (pure) and what it reads.

Triton cannot tell a batch request from an online one; nginx's batch access log can, and
the daemon stores per hour, model and batch job the batch requests answered
(`accounting.batchcounts`). In an hour, a model's attributed serving time (its compute
share of a serving job, `accounting.attribution`) is split between online and batch work
by request share:

    batch share = min(1, batch requests answered / the model's requests that hour)

the model's requests being what Triton's request counters (`nv_inference_request_success`
in the serving samples) counted that hour over all its replicas, every serving job. The
batch part, `floor(time x share)` milliseconds, is shared among the batch jobs by their
requests (largest remainder: whole milliseconds, exact); the rest stays the model's
(online). Where Triton counted no more requests than the batch route answered (or none:
no sample with request counters that hour) the share is 1. Each batch job's part is booked
to its own account and team under `batch-inference`; a job id the ledger does not know as
a batch-inference job (`batch_job`, from sacct) and a request that named none go to
`UNKNOWN_BATCH_JOB`.

A request share, not each request's compute: a batch request costing more (or less) than
the model's online ones is booked at the model's mean. The parts still sum to the serving
job exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, select

from accounting.batchcounts import BATCH, JOBS
from accounting.buckets import floor_hour, largest_remainder, split_ms, utc
from accounting.serving import LOOKBEHIND, Sample, increases
from accounting.tables import SAMPLES, batched

_HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class BatchUse:
    """What the serving split needs to know of the batch route's work."""

    #: (hour bucket, model) -> job id -> batch requests answered ("": no job named)
    answered: Mapping[tuple[datetime, str], Mapping[str, int]] = field(default_factory=dict)
    #: (hour bucket, model) -> the model's requests that hour (Triton's counters, every
    #: replica); absent: none counted
    requests: Mapping[tuple[datetime, str], float] = field(default_factory=dict)
    #: job id -> (account, user) of the batch-inference jobs the ledger knows
    jobs: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.answered)

    def within(self, start: datetime, end: datetime) -> BatchUse:
        """The hours that overlap [start, end) only (one serving run's)."""
        lo, hi = floor_hour(utc(start)), utc(end)
        answered = {k: v for k, v in self.answered.items() if lo <= k[0] < hi}
        ids = {j for v in answered.values() for j in v}
        return BatchUse(
            answered,
            {k: v for k, v in self.requests.items() if k in answered},
            {j: a for j, a in self.jobs.items() if j in ids},
        )

    def facts(self) -> tuple[object, ...]:
        """Everything the split reads, in a fixed order (the record's digest)."""
        return (
            sorted((k, sorted(v.items())) for k, v in self.answered.items()),
            sorted(self.requests.items()),
            sorted(self.jobs.items()),
        )


def batch_ms(ms: int, answered: int, requests: float | None) -> int:
    """The batch part of a model's `ms` milliseconds in an hour: `ms` x min(1, answered /
    requests), floored; all of it where Triton counted no more requests than the batch
    route answered (or none), nothing when the route answered none."""
    if ms < 0 or answered < 0:
        raise ValueError(f"negative time or count: {ms} ms, {answered} requests")
    if answered == 0 or ms == 0:
        return 0
    if requests is None or requests <= answered:
        return ms
    return min(ms, math.floor(ms * answered / requests))


def split_batch(
    ms: int, answered: Mapping[str, int], requests: float | None
) -> tuple[int, list[tuple[str, int]]]:
    """(online ms, [(job id, ms), ...] in job id order) of a model's `ms` in an hour: the
    batch part (`batch_ms`) shared among the jobs by their answered requests, in whole
    milliseconds that sum exactly; online + batch parts == `ms`."""
    jobs = sorted(j for j, n in answered.items() if n > 0)
    counts = [answered[j] for j in jobs]
    batch = batch_ms(ms, sum(counts), requests)
    parts = largest_remainder(batch, counts)
    return ms - sum(parts), [(j, p) for j, p in zip(jobs, parts, strict=True) if p > 0]


def requests_by_bucket(samples: Iterable[Sample]) -> dict[tuple[datetime, str], float]:
    """Per (hour bucket, model), the requests Triton counted (every series' increases,
    each spread over the hours between its two samples in proportion to time)."""
    out: dict[tuple[datetime, str], float] = defaultdict(float)
    for inc in increases(samples):
        if inc.requests is None or inc.requests <= 0:
            continue
        parts = split_ms(inc.start, inc.end)
        total = sum(p for _, p in parts)
        for bucket, p in parts:
            out[(bucket, inc.model)] += inc.requests * p / total
    return dict(out)


def read_batch_use(
    conn: Connection, clusters: Sequence[str], start: datetime, end: datetime
) -> BatchUse:
    """The batch route's work in the hours overlapping [start, end) as the ledger's
    database holds it (counts stored under any of `clusters`), the models' requests those
    hours from the serving samples, and the batch jobs the counts name."""
    lo, hi = floor_hour(utc(start)), utc(end)
    answered: dict[tuple[datetime, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    q = select(BATCH.c.bucket, BATCH.c.model, BATCH.c.job_id, BATCH.c.requests).where(
        BATCH.c.cluster.in_(clusters), BATCH.c.bucket >= lo, BATCH.c.bucket < hi
    )
    for bucket, model, job, n in conn.execute(q):
        answered[(utc(bucket), model)][job] += int(n)
    if not answered:
        return BatchUse()
    models = sorted({m for _, m in answered})
    first = min(b for b, _ in answered)
    last = max(b for b, _ in answered) + _HOUR
    samples = []
    q = select(SAMPLES).where(
        SAMPLES.c.cluster.in_(clusters),
        SAMPLES.c.model.in_(models),
        SAMPLES.c.at >= first - LOOKBEHIND,
        SAMPLES.c.at < last + LOOKBEHIND,
    )
    for r in conn.execute(q):
        samples.append(
            Sample(r.job_id, f"{r.cluster}/{r.instance}", r.model, r.version, utc(r.at),
                   r.compute_us, r.requests)
        )  # fmt: skip
    requests = {k: v for k, v in requests_by_bucket(samples).items() if k in answered}
    ids = sorted({j for v in answered.values() for j in v if j})
    jobs: dict[str, tuple[str, str]] = {}
    for part in batched(ids, 500):
        q = select(JOBS.c.job_id, JOBS.c.account, JOBS.c.user_name).where(
            JOBS.c.cluster.in_(clusters), JOBS.c.job_id.in_(part)
        )
        for job, account, user in conn.execute(q):
            jobs[job] = (account, user)
    return BatchUse({k: dict(v) for k, v in answered.items()}, requests, jobs)
