"""MIG slices and shards in the ledger, pure: a run's GPU-ms by its share of a GPU
(`accounting.attribution.allocations`, `Share`), a slice type's capacity
(`attribution.capacity_ms` with a unit), rates of a slice (`rates.RateBook`) and the
sreport agreement's count of a slice (`agreement.slurm_ms`), on literal records.

The TRES strings are Slurm's counting of the GRES guide's MIG node
(https://slurm.schedmd.com/gres.html, "MIG Management"; tests/unit/test_slices.py says
where each comes from): the untyped `gres/gpu` counts a slice as 1, `gres/gpu:<type>` the
slices of that type where AccountingStorageTRES lists it.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.agreement import slurm_ms
from accounting.attribution import (
    Context,
    Share,
    allocations,
    capacity_ms,
    digest,
    job_entries,
    job_entry_tuples,
)
from accounting.capacity import NodeAttrs, capacity_entries, event_capacity, units_of
from accounting.errors import IngestError, LedgerError
from accounting.rates import RateBook, RateSpec
from bridge.slurm.model import AccountingRecord, SlurmEvent
from bridge.slurm.slices import SliceRules

H = 3_600_000
T0 = datetime(2026, 11, 3, 10, 20, tzinfo=UTC)
COMPUTE = SliceRules()
MEMORY = SliceRules(share="memory", gpu_memory_gb={"h100": 80})
CTX = Context(
    pool_of_node={"m1": "mig", "n1": "training"},
    gpu_type_of_node={"m1": "h100_4g.40gb", "n1": "h100"},
    known_gpu_types=frozenset({"h100", "h100_4g.40gb", "h100_2g.20gb", "h100_1g.10gb"}),
    cluster="lab",
    slices=COMPUTE,
)
PROPS = settings(database=None, deadline=None)


def run(
    tres: str, minutes: int = 150, *, gpus: int = 1, node: str = "m1", job: str = "7"
) -> AccountingRecord:
    gpu_type = next((k.split(":")[1].split("=")[0] for k in tres.split(",") if ":" in k), None)
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="j",
        partition="mig", account="team-nlp", user="alice", qos="normal", state="COMPLETED",
        submit=T0, start=T0, end=T0 + timedelta(minutes=minutes), elapsed_s=minutes * 60,
        nodes=(node,), gpus=gpus, gpu_type=gpu_type, comment="", restarts=0, gpu_tres=tres,
    )  # fmt: skip


def booked(rec: AccountingRecord, ctx: Context = CTX) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in job_entries(rec, ctx):
        out[e.gpu_type] = out.get(e.gpu_type, 0) + e.gpu_ms
    return out


def test_a_1g_slice_books_a_seventh_of_a_gpu_under_its_own_type() -> None:
    rec = run("gres/gpu=1,gres/gpu:h100_1g.10gb=1")
    ms = 150 * 60_000
    assert booked(rec) == {"h100_1g.10gb": ms // 7}  # 150 min x 1/7 (floors telescope)
    # by memory: 10 GB of an 80 GB H100
    assert booked(rec, dataclasses.replace(CTX, slices=MEMORY)) == {"h100_1g.10gb": ms // 8}
    # the bulk path books the very same rows
    assert [t[-1] for t in job_entry_tuples(rec, CTX)] == [e.gpu_ms for e in job_entries(rec, CTX)]
    assert [t[0] for t in job_entry_tuples(rec, CTX)] == [e.bucket for e in job_entries(rec, CTX)]


def test_each_gpu_counted_once_whole_gpus_at_one() -> None:
    # the GRES guide's node allocated whole: one A100 and two 3g.20gb slices
    ctx = dataclasses.replace(
        CTX, known_gpu_types=frozenset({"a100"}), gpu_type_of_node={"m1": "a100"}
    )
    rec = run("gres/gpu=3,gres/gpu:a100=1,gres/gpu:a100_3g.20gb=2", minutes=60, gpus=3)
    assert booked(rec, ctx) == {"a100": H // 60 * 60, "a100_3g.20gb": 2 * (H * 3 // 7)}
    # a slice of a GPU type the cluster has is known; a type it does not have is named
    with pytest.raises(IngestError, match=r"unknown GPU type 'b200_1g\.23gb'"):
        job_entries(run("gres/gpu=1,gres/gpu:b200_1g.23gb=1"), CTX)


def test_a_plain_gpu_job_is_booked_by_its_count_as_before() -> None:
    rec = run("gres/gpu=2,gres/gpu:h100=2", minutes=60, gpus=2, node="n1")
    assert allocations(rec, CTX) == [("n1", "h100", 2)]
    assert booked(rec) == {"h100": 2 * H}
    # and its digest does not depend on the slice rules
    assert digest(rec, CTX) == digest(rec, dataclasses.replace(CTX, slices=MEMORY))


def test_the_rules_are_part_of_a_slice_runs_digest() -> None:
    rec = run("gres/gpu=1,gres/gpu:h100_2g.20gb=1")
    assert allocations(rec, CTX) == [("m1", "h100_2g.20gb", Share(1, Fraction(2, 7)))]
    assert digest(rec, CTX) != digest(rec, dataclasses.replace(CTX, slices=MEMORY))


def test_untyped_gres_on_a_node_of_one_profile_is_that_profile() -> None:
    # AccountingStorageTRES without the slice types: only gres/gpu=1, on a slice node
    rec = run("gres/gpu=1", minutes=60)
    (got,) = booked(rec).items()
    assert got[0] == "h100_4g.40gb" and abs(got[1] - H * 4 / 7) < 1


def test_shards_book_their_share_of_the_nodes_gpu() -> None:
    ctx = dataclasses.replace(CTX, slices=SliceRules(shards_per_gpu={"n1": 32}))
    rec = run("gres/shard=8", minutes=60, gpus=0, node="n1")
    assert booked(rec, ctx) == {"h100": H // 4}
    with pytest.raises(IngestError, match=r"lab:7:.*no shards per GPU for 'n1'"):
        job_entries(rec, CTX)


def test_a_slice_busy_a_whole_hour_books_exactly_its_capacity() -> None:
    hour = datetime(2026, 11, 3, 11, tzinfo=UTC)
    rec = dataclasses.replace(
        run("gres/gpu=1,gres/gpu:h100_1g.10gb=1"), start=T0, end=hour + timedelta(hours=1)
    )
    used = {e.bucket: e.gpu_ms for e in job_entries(rec, CTX)}
    unit = units_of(COMPUTE)
    cap = capacity_ms([("lab", "mig", "h100_1g.10gb", 1, T0, None)], T0, hour + 2 * HOURS, unit)
    assert used[hour] == cap[("lab", "mig", "h100_1g.10gb", hour)]
    assert used[hour] in (H // 7, H // 7 + 1)
    # whole GPUs' capacity is as before
    whole = capacity_ms([("lab", "t", "h100", 4, T0, None)], T0, hour + HOURS, unit)
    assert whole[("lab", "t", "h100", hour)] == 4 * H


HOURS = timedelta(hours=1)


@PROPS
@given(
    cuts=st.lists(st.integers(1, 3 * H), min_size=1, max_size=6),
    offset=st.integers(0, H - 1),
    profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"]),
)
def test_jobs_one_after_another_on_a_slice_never_exceed_its_capacity(
    cuts: list[int], offset: int, profile: str
) -> None:
    """Back-to-back runs on one slice: per hour they sum to at most its capacity, and to
    exactly it where the slice was busy the whole hour."""
    gpu_type = f"h100_{profile}"
    start = datetime(2026, 11, 3, tzinfo=UTC) + timedelta(milliseconds=offset)
    t, used = start, {}
    for i, ms in enumerate(cuts):
        end = t + timedelta(milliseconds=ms)
        rec = dataclasses.replace(
            run(f"gres/gpu=1,gres/gpu:{gpu_type}=1", job=str(i)), start=t, end=end
        )
        for e in job_entries(rec, CTX):
            used[e.bucket] = used.get(e.bucket, 0) + e.gpu_ms
        t = end
    cap = capacity_ms([("lab", "mig", gpu_type, 1, start, t)], start, t, units_of(COMPUTE))
    for (_, _, _, bucket), ms in cap.items():
        assert used.get(bucket, 0) == ms
    entries, over = capacity_entries(cap, {("lab", "mig", gpu_type, b): v for b, v in used.items()})
    assert not over and not entries  # busy all along: nothing idle, nothing over


def test_event_capacity_of_a_node_of_several_slice_types() -> None:
    hour = datetime(2026, 11, 3, 11, tzinfo=UTC)
    attrs = {
        "m1": [
            NodeAttrs(
                hour, None, "mig", "h100_4g.40gb", 1, (("h100_2g.20gb", 1), ("h100_1g.10gb", 1))
            )
        ]
    }
    reg = SlurmEvent(
        cluster="lab", node="", nodes=("m1",), start=hour, end=None, state_raw=0, state="",
        user="", reason="Cluster Registered TRES", gpus=3,
    )  # fmt: skip
    down = SlurmEvent(
        cluster="lab", node="m1", nodes=("m1",), start=hour, end=hour + HOURS / 2,
        state_raw=0x1, state="DOWN", user="root", reason="test", gpus=3,
    )  # fmt: skip
    unit = units_of(COMPUTE)
    cap, lines = event_capacity([reg, down], attrs, hour, hour + HOURS, unit=unit)
    by_type = {cell[2]: ms for cell, ms in cap.items()}
    # each slice type its fraction of the hour (floored on the epoch's milliseconds)
    exact = {"h100_4g.40gb": H * 4 / 7, "h100_2g.20gb": H * 2 / 7, "h100_1g.10gb": H / 7}
    assert by_type.keys() == exact.keys()
    assert all(abs(by_type[t] - exact[t]) < 1 for t in exact)
    assert abs(sum(cap.values()) - H) < 3  # one H100 cut in 7 of its 7 compute slices
    # Slurm's count: three gres/gpu for the hour, as sreport has it
    assert sum(slurm_ms(ms, c[2], unit) for c, ms in cap.items()) == 3 * H
    half = {cell[2]: ms for (cell, _line, _user), ms in lines.items()}
    assert half.keys() == exact.keys()  # the node's 3 gres/gpu down for half an hour
    assert all(abs(half[t] - exact[t] / 2) < 1 for t in exact)
    with pytest.raises(LedgerError, match="gpu_memory_gb"):
        event_capacity([reg], attrs, hour, hour + HOURS, unit=units_of(SliceRules(share="memory")))


def test_a_slice_without_a_rate_of_its_own_is_priced_at_its_gpus() -> None:
    book = RateBook(
        [
            RateSpec("h100", Decimal("2.80"), date(2026, 1, 1), currency="EUR"),
            RateSpec("h100_1g.10gb", Decimal("0.50"), date(2026, 1, 1), pool="mig", currency="EUR"),
        ]
    )
    day = date(2026, 11, 3)
    assert book.price("h100_2g.20gb", "mig", "", day) == Decimal("2.80")
    assert book.price("h100_1g.10gb", "mig", "", day) == Decimal("0.50")  # its own wins
    with pytest.raises(Exception, match=r"'a100_1g\.10gb' or its GPU 'a100'"):
        book.price("a100_1g.10gb", "mig", "", day)


def test_sreport_counts_a_slice_as_one_gpu() -> None:
    unit = units_of(COMPUTE)
    assert slurm_ms(H * 3 // 7, "h100_3g.40gb", unit) == H
    assert slurm_ms(H, "h100", unit) == H
    assert slurm_ms(H // 8, "h100_1g.10gb", units_of(MEMORY)) == H
