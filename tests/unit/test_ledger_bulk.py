"""The ingest's fast paths against the code they replace (hypothesis, no database):

- `job_entry_tuples` gives `job_entries`' entries, as tuples, in the same order, and the
  same IngestError for a record that cannot be booked (running jobs, month-spanning ones,
  several nodes, serving tags, leases, unknown nodes and GPU types, bad times);
- `capacity_ms` (difference arrays) equals the sum of `split_ms` x GPUs over the spans,
  computed here as the code before it did, cells of 0 GPUs included.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.attribution import (
    Context,
    ServingPoint,
    _as_tuple,
    capacity_ms,
    job_entries,
    job_entry_tuples,
)
from accounting.buckets import split_ms, utc
from bridge.slurm.model import AccountingRecord

PROPS = settings(database=None, deadline=None, max_examples=300)
T0 = datetime(2026, 1, 31, 20, tzinfo=UTC)
US = timedelta(microseconds=1)
NODES = ("n0", "n1", "n2", "n3")
CTX = Context(
    pool_of_node={"n0": "train", "n1": "train", "n2": "infer", "n3": "elastic"},
    gpu_type_of_node={"n0": "h100", "n1": "h100", "n2": "l40s"},
    workload_of_partition={"batch": "training", "serve": "inference"},
    workload_of_pool={"elastic": "elastic"},
    team_of_account={"a1": "nlp"},
    pool_of_lease={"L1": "train"},
    known_gpu_types=frozenset({"h100", "l40s", "a100"}),
    horizon=T0 + timedelta(hours=30),
    cluster="c1",
)


@st.composite
def records(draw: st.DrawFn) -> AccountingRecord:
    start = draw(st.none() | st.integers(0, 40 * 3600 * 10**6).map(lambda us: T0 + us * US))
    end = None
    if start is not None and draw(st.booleans()):
        end = start + draw(st.integers(-3600 * 10**6, 80 * 3600 * 10**6)) * US
    return AccountingRecord(
        cluster=draw(st.sampled_from(["", "c2"])),
        job_id=str(draw(st.integers(1, 99))),
        array_job_id=None,
        array_task_id=None,
        name="j",
        partition=draw(st.sampled_from(["batch", "serve", "other", ""])),
        account=draw(st.sampled_from(["a1", "a2"])),
        user="u",
        qos="normal",
        state="COMPLETED",
        submit=start,
        start=start,
        end=end,
        elapsed_s=0,
        nodes=tuple(draw(st.lists(st.sampled_from(NODES), max_size=3, unique=True))),
        gpus=draw(st.integers(-1, 9)),
        gpu_type=draw(st.sampled_from([None, "h100", "v100"])),
        comment=draw(
            st.sampled_from(
                [
                    "",
                    "stb:triton",
                    "stb:workload=elastic",
                    "stb:lease=L1,stb:triton",
                    "stb:workload=idle",
                    "stb:workload=bogus",
                    "stb:team=x",
                ]
            )
        ),
        restarts=0,
    )


def outcome(f: object, *args: object) -> tuple[str, object]:
    try:
        return "ok", f(*args)  # type: ignore[operator]
    except Exception as exc:
        return type(exc).__name__, str(exc)


@given(rec=records())
@PROPS
def test_entry_tuples_are_the_entries(rec: AccountingRecord) -> None:
    want = outcome(lambda: [_as_tuple(e) for e in job_entries(rec, CTX)])
    assert outcome(job_entry_tuples, rec, CTX) == want


@given(rec=records(), compute=st.lists(st.floats(0, 1e10), min_size=1, max_size=4))
@PROPS
def test_entry_tuples_of_a_serving_job_with_samples(
    rec: AccountingRecord, compute: list[float]
) -> None:
    points = [
        ServingPoint(rec.job_id, "i1", f"m{k % 2}", T0 + timedelta(minutes=37 * k), c)
        for k, c in enumerate(compute)
    ]
    want = outcome(lambda: [_as_tuple(e) for e in job_entries(rec, CTX, points)])
    assert outcome(job_entry_tuples, rec, CTX, points) == want


def capacity_reference(
    spans: list[tuple[str, str, str, int, datetime, datetime | None]],
    start: datetime,
    end: datetime,
) -> dict[tuple[str, str, str, datetime], int]:
    out: dict[tuple[str, str, str, datetime], int] = defaultdict(int)
    for cluster, pool, gpu_type, gpus, s, e in spans:
        lo = max(utc(s), start)
        hi = min(utc(e), end) if e is not None else end
        for bucket, ms in split_ms(lo, hi):
            out[(cluster, pool, gpu_type, bucket)] += ms * gpus
    return dict(out)


moment = st.integers(0, 12 * 3600 * 10**6).map(lambda us: T0 + us * US)
span = st.tuples(
    st.just("c1"),
    st.sampled_from(["train", "infer"]),
    st.sampled_from(["h100", "l40s"]),
    st.integers(0, 8),
    moment,
    st.none() | moment,
)


@given(spans=st.lists(span, max_size=8), start=moment, hours=st.integers(0, 14 * 3600 * 10**6))
@PROPS
def test_capacity_is_the_sum_of_the_spans_hour_parts(
    spans: list[tuple[str, str, str, int, datetime, datetime | None]], start: datetime, hours: int
) -> None:
    end = start + hours * US
    assert capacity_ms(spans, start, end) == capacity_reference(spans, start, end)
