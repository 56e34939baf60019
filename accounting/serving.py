"""What Triton's counters say a model served over a window: the stored serving samples
(`serving_sample`, cumulative per instance, model and version) turned into increases
between consecutive scrapes. Read by the unit economics (`accounting.economics`) and the
capacity plan (`bridge.ledger.replica_plan`).

A series is one (cluster, job, instance, model, version). Triton's counters count from the
model's load: a value below the previous one means the counter was reset (the model was
reloaded) and the new value is the increase since. A series' first sample has no previous
one to subtract: what it counted before is left out (the daemon scrapes a server from its
start, so this is at most one sample interval per series, and nothing for a series whose
first sample is before the window).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from sqlalchemy import Engine, select

from accounting.buckets import utc
from accounting.schema import ServingSample

SAMPLES = ServingSample.__table__  # type: ignore[attr-defined]
#: how far before the window a series' previous sample is looked for (longer than any
#: sample interval the daemon is configured with)
LOOKBEHIND = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Increase:
    """What one series counted over (start, end]: compute microseconds, successful
    requests, prompt and generated tokens (each None where either end of the interval
    lacked that counter)."""

    job_id: str
    instance: str
    model: str
    version: str
    start: datetime
    end: datetime
    compute_us: float
    requests: float | None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    job_id: str
    instance: str
    model: str
    version: str
    at: datetime
    compute_us: float
    requests: float | None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


def _delta(now: float, before: float) -> float:
    return now - before if now >= before else now


def _optional_delta(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else _delta(now, before)


def increases(samples: Iterable[Sample]) -> Iterator[Increase]:
    """Pure: the increases between consecutive samples of each series (any order in)."""
    series: dict[tuple[str, str, str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        series[(s.job_id, s.instance, s.model, s.version)].append(s)
    for (job, inst, model, version), points in sorted(series.items()):
        points.sort(key=lambda s: s.at)
        for prev, cur in pairwise(points):
            if cur.at <= prev.at:
                continue
            yield Increase(
                job, inst, model, version, prev.at, cur.at,
                _delta(cur.compute_us, prev.compute_us),
                _optional_delta(cur.requests, prev.requests),
                _optional_delta(cur.prompt_tokens, prev.prompt_tokens),
                _optional_delta(cur.generation_tokens, prev.generation_tokens),
            )  # fmt: skip


def read_samples(
    engine: Engine, start: datetime, end: datetime, cluster: str | None = None
) -> list[Sample]:
    """The samples in [start - LOOKBEHIND, end) (so each series' previous sample before
    the window is there), optionally of one cluster."""
    q = select(SAMPLES).where(SAMPLES.c.at >= utc(start) - LOOKBEHIND, SAMPLES.c.at < utc(end))
    if cluster is not None:
        q = q.where(SAMPLES.c.cluster == cluster)
    with engine.connect() as conn:
        return [_sample(r) for r in conn.execute(q)]


def _sample(r: Any) -> Sample:
    return Sample(
        r.job_id, r.instance, r.model, r.version, utc(r.at), r.compute_us, r.requests,
        r.prompt_tokens, r.generation_tokens,
    )  # fmt: skip


def window_increases(
    engine: Engine, start: datetime, end: datetime, cluster: str | None = None
) -> list[Increase]:
    """The increases that end inside [start, end): an interval straddling the window's
    start is counted whole in the window (it ends there), one straddling its end is not."""
    lo, hi = utc(start), utc(end)
    return [i for i in increases(read_samples(engine, lo, hi, cluster)) if lo <= i.end < hi]
