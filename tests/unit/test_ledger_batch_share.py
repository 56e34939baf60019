"""Batch work's share of serving time (`accounting.batchshare`, the split in
`accounting.attribution`): the rule on literal numbers, a serving job's rows with the
batch route's work (each batch job's part to its own team under `batch-inference`, an
unknown job's to "(unknown batch job)"), property tests that the parts still sum to the
serving job exactly, and the ingest end to end on SQLite: counts and batch jobs stored,
the split booked, a re-ingest changing nothing, a batch job learned later rebooked."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounting.attribution import Context, ServingPoint, job_entries
from accounting.batchcounts import record_batch
from accounting.batchshare import BatchUse, batch_ms, requests_by_bucket, split_batch
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.samples import record_serving
from accounting.schema import BATCH_INFERENCE, UNATTRIBUTED, UNKNOWN_BATCH_JOB
from accounting.serving import Sample
from tests.unit.ledger_cases import (
    CTX,
    PROPS,
    record,
    serving_job,
    serving_record,
)

T0 = datetime(2026, 12, 4, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("ms", "answered", "requests", "expected"),
    [
        (3_600_000, 25, 100.0, 900_000),  # a quarter of the requests: a quarter
        (1001, 1, 3.0, 333),  # floored: online keeps the odd millisecond
        (1000, 0, 100.0, 0),  # no batch request: all online
        (1000, 120, 100.0, 1000),  # nginx counted more than Triton: capped at all
        (1000, 5, None, 1000),  # Triton counted none that hour: all
        (0, 5, 10.0, 0),
    ],
)
def test_batch_ms(ms: int, answered: int, requests: float | None, expected: int) -> None:
    assert batch_ms(ms, answered, requests) == expected


def test_split_batch_shares_the_batch_part_among_jobs_exactly() -> None:
    # 3 of 6 requests batch: 500 of 1001 ms, 1:2 between the jobs (largest remainder)
    assert split_batch(1001, {"8": 2, "7": 1, "9": 0}, 6.0) == (501, [("7", 167), ("8", 333)])
    assert split_batch(10, {}, 6.0) == (10, [])
    with pytest.raises(ValueError, match="negative"):
        batch_ms(-1, 1, 1.0)


def test_requests_by_bucket_spreads_increases_over_hours() -> None:
    samples = [
        Sample("1", "n4:8000", "bert", "1", T0 + HOUR / 2, 0.0, 100.0),
        Sample("1", "n4:8000", "bert", "1", T0 + 3 * HOUR / 2, 0.0, 300.0),  # 200 over 1 h
        Sample("2", "n3:8000", "bert", "1", T0, 0.0, 0.0),
        Sample("2", "n3:8000", "bert", "1", T0 + HOUR / 4, 0.0, 50.0),
        Sample("2", "n3:8000", "smol", "1", T0, 0.0, None),  # no request counter
        Sample("2", "n3:8000", "smol", "1", T0 + HOUR / 4, 0.0, None),
    ]
    assert requests_by_bucket(samples) == {
        (T0, "bert"): pytest.approx(150.0),
        (T0 + HOUR, "bert"): pytest.approx(100.0),
    }


CTX_TEAMS = Context(
    pool_of_node={"n4": "inference"},
    gpu_type_of_node={"n4": "h100"},
    team_of_account={"nlp": "team-nlp"},
    team_of_model={"bert": "team-search"},
    cluster="lab",
)


def _serving(gpus: int = 1) -> tuple[object, list[ServingPoint]]:
    rec = record(T0, T0 + HOUR, gpus=gpus, nodes=("n4",), comment="stb:triton", partition="infer")
    rec = rec.__class__(**{**rec.__dict__, "account": "infra", "cluster": "lab", "job_id": "7"})
    # bert computed 1,800 s of the hour (1,800,000 ms)
    points = [ServingPoint("7", "n4:8000", "bert", T0 + HOUR, 1.8e9, "1", 100.0)]
    return rec, points


def test_the_serving_split_books_the_batch_part_to_each_batch_jobs_team() -> None:
    rec, points = _serving()
    use = BatchUse(
        answered={(T0, "bert"): {"500": 30, "": 10}},
        requests={(T0, "bert"): 100.0},
        jobs={"500": ("nlp", "bob")},
    )
    rows = {
        (e.workload, e.account, e.team, e.user, e.model): e.gpu_ms
        for e in job_entries(rec, CTX_TEAMS, points, use)  # type: ignore[arg-type]
    }
    assert rows == {
        # 40 of bert's 100 requests were batch: 720,000 of its 1,800,000 ms, 3:1
        ("inference", "infra", "team-search", "alice", "bert"): 1_080_000,
        (BATCH_INFERENCE, "nlp", "team-nlp", "bob", "bert"): 540_000,
        (BATCH_INFERENCE, UNKNOWN_BATCH_JOB, UNKNOWN_BATCH_JOB, "", "bert"): 180_000,
        ("inference", "infra", "infra", "alice", UNATTRIBUTED): 1_800_000,
    }
    # a job the ledger does not know as batch inference goes to no team
    unknown = BatchUse({(T0, "bert"): {"501": 40}}, {(T0, "bert"): 100.0}, {})
    got = [e for e in job_entries(rec, CTX_TEAMS, points, unknown) if e.workload != "inference"]  # type: ignore[arg-type]
    assert [(e.team, e.gpu_ms) for e in got] == [(UNKNOWN_BATCH_JOB, 720_000)]
    # batch work in another hour, or of another model, splits nothing
    elsewhere = BatchUse({(T0 + HOUR, "bert"): {"500": 1}, (T0, "smol"): {"500": 1}}, {}, {})
    assert job_entries(rec, CTX_TEAMS, points, elsewhere) == job_entries(rec, CTX_TEAMS, points)  # type: ignore[arg-type]


@st.composite
def batch_use(draw: st.DrawFn, buckets: list[datetime]) -> BatchUse:
    answered: dict[tuple[datetime, str], dict[str, int]] = {}
    requests: dict[tuple[datetime, str], float] = {}
    for b in buckets:
        for m in draw(st.lists(st.sampled_from(["bert", "llama", "resnet"]), unique=True)):
            jobs = draw(
                st.dictionaries(st.sampled_from(["", "11", "12", "13_1"]), st.integers(0, 50))
            )
            answered[(b, m)] = jobs
            if draw(st.booleans()):
                requests[(b, m)] = float(draw(st.integers(0, 200)))
    known = draw(st.lists(st.sampled_from(["11", "12", "13_1"]), unique=True))
    return BatchUse(answered, requests, {j: (f"acct{j}", "u") for j in known})


@given(job=serving_job(), gpus=st.integers(1, 8), data=st.data())
@PROPS
def test_batch_parts_and_online_sum_to_each_models_part_and_the_job(
    job: tuple[datetime, datetime, list[ServingPoint], dict[str, float]],
    gpus: int,
    data: st.DataObject,
) -> None:
    start, end, points, _ = job
    rec = serving_record(start, end, gpus)
    buckets = [start.replace(minute=0, second=0, microsecond=0) + k * HOUR for k in range(6)]
    use = data.draw(batch_use(buckets))
    plain = job_entries(rec, CTX, points)
    split = job_entries(rec, CTX, points, use)
    before: dict[tuple[datetime, str], int] = defaultdict(int)
    after: dict[tuple[datetime, str], int] = defaultdict(int)
    batch: dict[tuple[datetime, str], int] = defaultdict(int)
    for e in plain:
        before[(e.bucket, e.model)] += e.gpu_ms
    for e in split:
        assert e.gpu_ms > 0
        after[(e.bucket, e.model)] += e.gpu_ms
        if e.workload == BATCH_INFERENCE:
            batch[(e.bucket, e.model)] += e.gpu_ms
            job_id = e.account.removeprefix("acct")
            assert e.account == UNKNOWN_BATCH_JOB or use.jobs[job_id] == (e.account, e.user)
        else:
            assert e.workload == "inference" and e.account == "acct"
    # the model's part, online + batch, is what it was; so the job's total, every hour
    assert after == before
    for key, ms in batch.items():
        n = sum(use.answered[key].values())
        assert ms == batch_ms(before[key], n, use.requests.get(key)) and key[1] != UNATTRIBUTED


def _ledger(tmp_path: object) -> object:
    return open_ledger(f"sqlite:///{tmp_path}/ledger.db")


def test_the_ingest_books_batch_work_and_rebooks_a_job_learned_later(tmp_path: object) -> None:
    engine = _ledger(tmp_path)
    rec, _ = _serving()
    # two scrapes: bert answered 100 requests and computed 1,800 s in the hour
    record_serving(engine, "lab", [  # type: ignore[arg-type]
        ServingPoint("7", "n4:8000", "bert", T0, 0.0, "1", 0.0),
        ServingPoint("7", "n4:8000", "bert", T0 + HOUR, 1.8e9, "1", 100.0),
    ])  # fmt: skip
    # 25 batch requests from job 500, counted in two passes
    record_batch(engine, "lab", "/l", {(T0, "bert", "500"): 20}, (1, 100), T0)  # type: ignore[arg-type]
    record_batch(engine, "lab", "/l", {(T0, "bert", "500"): 5}, (1, 130), T0)  # type: ignore[arg-type]
    ctx = Context(**{**CTX_TEAMS.__dict__, "horizon": T0 + 2 * HOUR})
    first = ingest_records(engine, [rec], ctx, now=T0 + 2 * HOUR)  # type: ignore[arg-type, list-item]
    assert first.new == 1

    def booked() -> dict[tuple[str, str], int]:
        with engine.connect() as conn:  # type: ignore[attr-defined]
            q = "SELECT workload, team, SUM(gpu_ms) FROM ledger_row GROUP BY workload, team"
            return {(w, t): n for w, t, n in conn.exec_driver_sql(q)}

    # the batch job is not known yet: its share goes to no team
    assert booked() == {
        ("inference", "team-search"): 1_350_000,
        (BATCH_INFERENCE, UNKNOWN_BATCH_JOB): 450_000,
        ("inference", "infra"): 1_800_000,
    }
    again = ingest_records(engine, [rec], ctx, now=T0 + 2 * HOUR)  # type: ignore[arg-type, list-item]
    assert again.unchanged == 1 and again.rows_written == 0
    # the next ingest reads the batch job from sacct (it asked for no GPU): rebooked
    client = record(T0, T0 + HOUR, gpus=0, nodes=("n1",), comment="stb:workload=batch-inference",
                    partition="elastic", job_id="500")  # fmt: skip
    client = client.__class__(
        **{**client.__dict__, "account": "nlp", "user": "bob", "cluster": "lab"}
    )
    later = ingest_records(engine, [client, rec], ctx, now=T0 + 2 * HOUR)  # type: ignore[arg-type, list-item]
    assert later.changed == 1 and later.skipped == 1
    assert booked() == {
        ("inference", "team-search"): 1_350_000,
        (BATCH_INFERENCE, "team-nlp"): 450_000,
        ("inference", "infra"): 1_800_000,
    }
    assert sum(booked().values()) == 3_600_000  # the serving job's hour, exactly
