"""Property tests (hypothesis) for the ledger's pure arithmetic: `accounting.buckets` and
`accounting.attribution`, no database.

What is checked, each against an expectation computed here from the generated integers
(not by calling the code under test):

- A job split across hour buckets sums exactly to its whole, gpus x duration in ms (times
  truncated to whole ms), per hour, per node/pool (multi-node jobs: the GPUs are shared
  evenly) and per month; month-spanning jobs are generated on purpose; a running job
  counts up to the horizon.
- `largest_remainder`: the parts sum to the total and each is within 1 of its exact share
  (computed with `Fraction`); all-zero weights share nothing.
- A serving job's model rows plus its "(unattributed)" row sum to the job's GPU-ms in every
  hour, all compute is attributed when the job held enough GPU time (+-1 ms), and no model
  gets more than it computed: at most its compute rounded up to a whole ms, on one node
  and on several (a multi-node job's compute is shared among its nodes like its GPUs).
- Triton counter resets: `compute_ms_by_bucket` over a series with resets totals the sum of
  the increases worked out by hand (after a reset the new value is the increase), and
  never books a negative amount.
- `capacity.capacity_entries` (no down lines): with allocation <= capacity, allocated +
  idle = capacity in every cell and nothing is over-allocated; otherwise the excess is
  reported and idle is never negative; allocation where the inventory records no capacity
  at all is reported too.

The `@example`s are the counterexamples these properties found in earlier code: a model
given round(3.5) = 4 ms for 3 ms of compute; each node of a two-node serving job given
the whole job's compute; allocation outside the inventory not reported.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from accounting.attribution import (
    ServingPoint,
    compute_ms_by_bucket,
    job_entries,
)
from accounting.buckets import largest_remainder
from accounting.capacity import capacity_entries
from accounting.schema import UNATTRIBUTED
from tests.unit.ledger_cases import (
    CTX,
    DAY,
    MS,
    NODES,
    PROPS,
    SERVING_BASE,
    US,
    H,
    record,
    serving_job,
    serving_record,
)

#: month starts the generated jobs cluster around (a leap February included)
MONTH_STARTS = [
    datetime(y, m, 1, tzinfo=UTC)
    for y, m in [(2025, 12), (2026, 1), (2026, 2), (2026, 3), (2028, 2), (2028, 3), (2028, 4)]
]


def hour_overlaps(s_ms: int, e_ms: int) -> dict[int, int]:
    """Hour index (relative to an hour-aligned origin) -> ms of [s_ms, e_ms) in it."""
    out = {}
    k = s_ms // H
    while k * H < e_ms:
        lo, hi = max(s_ms, k * H), min(e_ms, (k + 1) * H)
        if hi > lo:
            out[k] = hi - lo
        k += 1
    return out


def month_key(t: datetime) -> tuple[int, int]:
    return (t.year, t.month)


def next_month(y: int, m: int) -> tuple[int, int]:
    return (y + 1, 1) if m == 12 else (y, m + 1)


def month_overlaps(start: datetime, end: datetime) -> dict[tuple[int, int], int]:
    """(year, month) -> ms of [start, end) in that month, by calendar arithmetic."""
    out = {}
    y, m = start.year, start.month
    while datetime(y, m, 1, tzinfo=UTC) < end:
        ny, nm = next_month(y, m)
        lo = max(start, datetime(y, m, 1, tzinfo=UTC))
        hi = min(end, datetime(ny, nm, 1, tzinfo=UTC))
        if hi > lo:
            out[(y, m)] = (hi - lo) // MS
        y, m = ny, nm
    return out


# --- a job split across hours and months ------------------------------------------------


@given(
    origin=st.sampled_from(MONTH_STARTS),
    start_us=st.integers(-40 * DAY * 1000, 40 * DAY * 1000),
    dur_us=st.one_of(st.integers(0, 3 * DAY * 1000), st.integers(0, 70 * DAY * 1000)),
    gpus=st.integers(1, 64),
    n_nodes=st.integers(1, 4),
    workload=st.sampled_from(["", "stb:workload=elastic", "stb:triton"]),
    running=st.booleans(),
)
@PROPS
def test_job_split_across_hours_nodes_and_months_sums_to_whole(
    origin: datetime,
    start_us: int,
    dur_us: int,
    gpus: int,
    n_nodes: int,
    workload: str,
    running: bool,
) -> None:
    start = origin + start_us * US
    end = start + dur_us * US
    nodes = NODES[:n_nodes]
    rec = record(start, None if running else end, gpus=gpus, nodes=nodes, comment=workload)
    ctx = dataclasses.replace(CTX, horizon=end) if running else CTX
    entries = job_entries(rec, ctx)

    # times are truncated to whole ms (the origin is on a whole ms)
    s_ms, e_ms = start_us // 1000, (start_us + dur_us) // 1000
    dur_ms = e_ms - s_ms
    assert sum(e.gpu_ms for e in entries) == gpus * dur_ms
    if dur_ms == 0:
        assert entries == []
        return
    assert all(e.gpu_ms > 0 for e in entries)
    assert all(e.bucket.minute == e.bucket.second == e.bucket.microsecond == 0 for e in entries)

    # per node (each node is its own pool here): an even share of the GPUs, every hour
    per_pool: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    for e in entries:
        per_pool[e.pool][e.bucket] += e.gpu_ms
    hours = {origin + k * H * MS: ms for k, ms in hour_overlaps(s_ms, e_ms).items()}
    shares = []
    for i in range(n_nodes):
        got = per_pool.get(f"pool{i}", {})
        node_total = sum(got.values())
        assert node_total % dur_ms == 0
        g = node_total // dur_ms
        shares.append(g)
        if g:
            assert dict(got) == {h: g * ms for h, ms in hours.items()}
    assert sum(shares) == gpus
    assert max(shares) - min(shares) <= 1
    assert set(per_pool) <= {f"pool{i}" for i in range(n_nodes)}

    # per month
    t0, t1 = origin + s_ms * MS, origin + e_ms * MS
    per_month: dict[tuple[int, int], int] = defaultdict(int)
    for e in entries:
        per_month[month_key(e.bucket)] += e.gpu_ms
    assert dict(per_month) == {m: gpus * ms for m, ms in month_overlaps(t0, t1).items()}


@given(
    boundary=st.sampled_from(MONTH_STARTS),
    before_ms=st.integers(1, 3 * DAY),
    after_ms=st.integers(1, 3 * DAY),
    gpus=st.integers(1, 32),
    n_nodes=st.integers(1, 4),
)
@PROPS
def test_month_spanning_job_books_each_month_exactly_its_part(
    boundary: datetime, before_ms: int, after_ms: int, gpus: int, n_nodes: int
) -> None:
    rec = record(
        boundary - before_ms * MS, boundary + after_ms * MS, gpus=gpus, nodes=NODES[:n_nodes]
    )
    per_month: dict[tuple[int, int], int] = defaultdict(int)
    for e in job_entries(rec, CTX):
        per_month[month_key(e.bucket)] += e.gpu_ms
    prev = month_key(boundary - MS)
    assert dict(per_month) == {prev: gpus * before_ms, month_key(boundary): gpus * after_ms}


# --- largest remainder ------------------------------------------------------------------

weights_st = st.lists(
    st.one_of(
        st.integers(0, 10**9),
        st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
        st.just(0),
    ),
    max_size=12,
)


@given(total=st.integers(0, 10**12), weights=weights_st)
@PROPS
def test_largest_remainder_sums_to_total_and_stays_within_one_of_exact_share(
    total: int, weights: list[float]
) -> None:
    parts = largest_remainder(total, weights)
    assert len(parts) == len(weights)
    assert all(isinstance(p, int) and p >= 0 for p in parts)
    wsum = sum(Fraction(w) for w in weights)
    if wsum == 0:
        assert parts == [0] * len(weights)
        return
    assert sum(parts) == total
    for p, w in zip(parts, weights, strict=True):
        exact = Fraction(total) * Fraction(w) / wsum
        assert abs(p - exact) < 1, (p, float(exact))


def test_largest_remainder_ties_go_to_the_earlier_weight() -> None:
    assert largest_remainder(1, [1, 1]) == [1, 0]
    assert largest_remainder(2, [1, 1, 1]) == [1, 1, 0]
    assert largest_remainder(10, [0, 0]) == [0, 0]
    with pytest.raises(ValueError):
        largest_remainder(-1, [1])
    with pytest.raises(ValueError):
        largest_remainder(1, [1, -1])


# --- serving jobs: counters, resets, the split among models --------------------------------


@given(job=serving_job())
@PROPS
def test_counter_resets_total_the_increases_and_never_go_negative(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]],
) -> None:
    start, end, points, hand = job
    busy = compute_ms_by_bucket(points, start, end)
    totals: dict[str, float] = defaultdict(float)
    first = start.replace(minute=0, second=0, microsecond=0)
    for bucket, models in busy.items():
        assert first <= bucket < end
        for model, ms in models.items():
            assert ms >= 0
            totals[model] += ms
    for model, want in hand.items():
        assert totals.get(model, 0.0) == pytest.approx(want, rel=1e-9, abs=1e-6), model


def test_counter_reset_counts_from_zero_and_spreads_over_time() -> None:
    t0 = datetime(2026, 3, 1, 10, tzinfo=UTC)
    s = 1_000_000  # µs per second
    points = [
        ServingPoint("42", "n0:8000", "bert", t0 + timedelta(hours=1), 1000.0 * s),
        ServingPoint("42", "n0:8000", "bert", t0 + timedelta(hours=2), 200.0 * s),  # reset
        ServingPoint("42", "n0:8000", "bert", t0 + timedelta(hours=3), 500.0 * s),
        # scraped out of order: sorted by time
        ServingPoint("42", "n0:8001", "bert", t0 + timedelta(hours=3), 100.0 * s),
        ServingPoint("42", "n0:8001", "bert", t0 + timedelta(minutes=30), 60.0 * s),
    ]
    busy = compute_ms_by_bucket(points, t0, t0 + timedelta(hours=3))
    # instance 8001: 60 s over [0, 30 min), 40 s over [30 min, 3 h) -> 8 s in hour 0
    assert busy == {
        t0: {"bert": pytest.approx(1_000_000 + 60_000 + 8_000)},
        t0 + timedelta(hours=1): {"bert": pytest.approx(200_000 + 16_000)},
        t0 + timedelta(hours=2): {"bert": pytest.approx(300_000 + 16_000)},
    }


def check_serving_split(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]],
    gpus: int,
    nodes: tuple[str, ...],
    over_by: float,
) -> None:
    """Model rows + unattributed = the job's GPU-ms per hour; all compute is attributed
    when the job held enough; a model gets at most its compute + `over_by` per hour,
    summed over the job's nodes (over_by=0 means: at most the compute rounded up to ms, on
    each node)."""
    start, end, points, _ = job
    entries = job_entries(serving_record(start, end, gpus, nodes), CTX, points)
    busy = compute_ms_by_bucket(points, start, end)
    s_ms = (start - SERVING_BASE) // MS
    e_ms = (end - SERVING_BASE) // MS
    job_ms = {SERVING_BASE + k * H * MS: gpus * ms for k, ms in hour_overlaps(s_ms, e_ms).items()}
    per_bucket: dict[datetime, int] = defaultdict(int)
    per_model: dict[tuple[datetime, str], int] = defaultdict(int)
    for e in entries:
        assert e.workload == "inference" and e.gpu_ms > 0
        per_bucket[e.bucket] += e.gpu_ms
        per_model[(e.bucket, e.model)] += e.gpu_ms
    assert dict(per_bucket) == job_ms
    for bucket, amount in job_ms.items():
        computed = busy.get(bucket, {})
        attributed = 0
        for model, ms in computed.items():
            got = per_model.get((bucket, model), 0)
            attributed += got
            # each node rounds its share up to a whole ms at most
            limit = (math.ceil(ms) + len(nodes) - 1) if over_by == 0 else ms + over_by
            assert got <= limit, (bucket, model, got, ms)
        assert {m for b, m in per_model if b == bucket} <= {*computed, UNATTRIBUTED}
        assert per_model.get((bucket, UNATTRIBUTED), 0) == amount - attributed
        # what the models computed is attributed, up to the job's GPU time (each node
        # books whole milliseconds: +-1 ms of rounding per node)
        assert abs(attributed - min(amount, sum(computed.values()))) <= len(nodes)


@given(job=serving_job(), gpus=st.integers(1, 8))
@PROPS
def test_serving_rows_sum_to_the_job_and_models_get_what_they_computed(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]], gpus: int
) -> None:
    check_serving_split(job, gpus, ("n0",), over_by=0)


_T = SERVING_BASE
_ROUND_UP_EXAMPLE = (
    _T,
    _T + timedelta(hours=1),
    [
        ServingPoint("42", "n0:8000", "bert", _T + timedelta(minutes=30), 3000.0),
        ServingPoint("42", "n0:8000", "llama", _T + timedelta(minutes=30), 250.0),
        ServingPoint("42", "n0:8000", "resnet", _T + timedelta(minutes=30), 250.0),
    ],
    {"bert": 3.0, "llama": 0.25, "resnet": 0.25},
)


@given(job=serving_job(), gpus=st.integers(1, 8))
@example(job=_ROUND_UP_EXAMPLE, gpus=1)
@PROPS
def test_serving_model_never_gets_more_than_its_compute_rounded_up(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]], gpus: int
) -> None:
    check_serving_split(job, gpus, ("n0",), over_by=0)


_TWO_NODE_EXAMPLE = (
    _T,
    _T + timedelta(hours=1),
    [ServingPoint("42", "n0:8000", "bert", _T + timedelta(hours=1), 3_600_000_000.0)],
    {"bert": 3_600_000.0},
)


@given(job=serving_job(), gpus=st.integers(2, 8), n_nodes=st.integers(2, 4))
@example(job=_TWO_NODE_EXAMPLE, gpus=2, n_nodes=2)
@PROPS
def test_multi_node_serving_job_gives_no_model_more_than_it_computed(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]], gpus: int, n_nodes: int
) -> None:
    check_serving_split(job, gpus, NODES[:n_nodes], over_by=0)


# --- idle -------------------------------------------------------------------------------

_HOURS = [datetime(2026, 1, 31, 22, tzinfo=UTC) + timedelta(hours=k) for k in range(4)]
cells = st.tuples(
    st.just("c1"),
    st.sampled_from(["train", "serve", "spare"]),
    st.sampled_from(["h100", "a100"]),
    st.sampled_from(_HOURS),
)
Cell = tuple[str, str, str, datetime]


def idle_by_cell(capacity: dict[Cell, int], allocated: dict[Cell, int]) -> tuple[dict, dict]:
    entries, over = capacity_entries(capacity, allocated)
    idle: dict[Cell, int] = {}
    for e in entries:
        cell = (e.cluster, e.pool, e.gpu_type, e.bucket)
        assert cell not in idle, "one idle entry per cell"
        assert e.workload == "idle" and e.gpu_ms > 0
        assert (e.account, e.user) == ("", "")  # idle belongs to no job
        idle[cell] = e.gpu_ms
    return idle, over


@given(capacity=st.dictionaries(cells, st.integers(0, 16 * H)), data=st.data())
@PROPS
def test_idle_fills_capacity_exactly_when_allocation_fits(
    capacity: dict[Cell, int], data: st.DataObject
) -> None:
    allocated = {
        cell: data.draw(st.integers(0, cap))
        for cell, cap in capacity.items()
        if data.draw(st.booleans())
    }
    idle, over = idle_by_cell(capacity, allocated)
    assert over == {}
    assert set(idle) <= set(capacity)
    for cell, cap in capacity.items():
        assert allocated.get(cell, 0) + idle.get(cell, 0) == cap


@given(
    capacity=st.dictionaries(cells, st.integers(0, 16 * H)),
    extra=st.dictionaries(cells, st.integers(0, 32 * H)),
)
@PROPS
def test_idle_reports_over_allocation_and_is_never_negative(
    capacity: dict[Cell, int], extra: dict[Cell, int]
) -> None:
    allocated = {cell: extra.get(cell, 0) for cell in capacity}  # cells the inventory covers
    idle, over = idle_by_cell(capacity, allocated)
    for cell, cap in capacity.items():
        used = allocated[cell]
        assert idle.get(cell, 0) == max(0, cap - used)
        assert over.get(cell, 0) == max(0, used - cap)
    assert set(over) <= set(capacity)


def test_allocation_where_the_inventory_has_no_capacity_is_reported() -> None:
    cell = ("c1", "train", "h100", _HOURS[0])
    _, over = capacity_entries({}, {cell: 1000})
    assert over == {cell: 1000}
