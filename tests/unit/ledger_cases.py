"""The ledger's generated and literal cases shared by its property tests
(tests/unit/test_ledger_properties.py) and the batch share's (test_ledger_batch_share.py):
the attribution context of four nodes, a job's sacct record, and generated serving jobs
with their counters worked out by hand. Not a test module."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st

from accounting.attribution import Context, ServingPoint
from bridge.slurm.model import AccountingRecord

# No example database: the tests leave no `.hypothesis/` folder in the checkout.
PROPS = settings(database=None, deadline=None)

H = 3_600_000  # ms per hour
DAY = 24 * H
MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)

#: an hour that is 2 h before a month boundary: serving jobs of up to 4 h cross it
SERVING_BASE = datetime(2026, 1, 31, 22, tzinfo=UTC)
NODES = ("n0", "n1", "n2", "n3")
CTX = Context(
    pool_of_node={n: f"pool{i}" for i, n in enumerate(NODES)},
    gpu_type_of_node=dict.fromkeys(NODES, "h100"),
    workload_of_partition={"batch": "training", "serve": "inference"},
    cluster="c1",
)


def record(
    start: datetime,
    end: datetime | None,
    *,
    gpus: int,
    nodes: tuple[str, ...] = ("n0",),
    comment: str = "",
    partition: str = "batch",
    job_id: str = "42",
) -> AccountingRecord:
    return AccountingRecord(
        cluster="c1",
        job_id=job_id,
        array_job_id=None,
        array_task_id=None,
        name="job",
        partition=partition,
        account="acct",
        user="alice",
        qos="normal",
        state="COMPLETED" if end is not None else "RUNNING",
        submit=start,
        start=start,
        end=end,
        elapsed_s=0,
        nodes=nodes,
        gpus=gpus,
        gpu_type=None,
        comment=comment,
        restarts=0,
    )


@st.composite
def serving_job(
    draw: st.DrawFn,
) -> tuple[datetime, datetime, list[ServingPoint], dict[str, float]]:
    """(start, end, scraped points, compute ms per model worked out by hand). Counters
    rise or reset (a reset drops to a value below the previous one: the increase since)."""
    start = SERVING_BASE + draw(st.integers(0, H - 1)) * MS
    dur = draw(st.integers(1, 4 * H))
    end = start + dur * MS
    models = draw(st.lists(st.sampled_from(["bert", "llama", "resnet"]), min_size=1, unique=True))
    instances = draw(st.lists(st.sampled_from(["n0:8000", "n0:8001"]), min_size=1, unique=True))
    points, hand = [], dict.fromkeys(models, 0.0)
    for inst in instances:
        for model in models:
            n = draw(st.integers(0, min(6, dur + 1)))
            offsets = sorted(
                draw(st.lists(st.integers(0, dur), min_size=n, max_size=n, unique=True))
            )
            v = 0
            for off in offsets:
                if v > 0 and draw(st.integers(0, 3)) == 0:  # reset
                    v = draw(st.integers(0, v - 1))
                    hand[model] += v
                else:  # may compute more than the job held (concurrent instances)
                    inc = draw(st.integers(0, 2 * dur * 1000))
                    v += inc
                    hand[model] += inc
                points.append(ServingPoint("42", inst, model, start + off * MS, float(v)))
    return start, end, points, {m: us / 1000 for m, us in hand.items()}


def serving_record(
    start: datetime, end: datetime, gpus: int, nodes: tuple[str, ...] = ("n0",)
) -> AccountingRecord:
    return record(start, end, gpus=gpus, nodes=nodes, comment="stb:triton", partition="serve")
