"""Which elastic jobs a lease of k GPUs requeues (`bridge.policy.victims`), on literal
nodes: the fewest GPUs first, then the least work lost, the fewest jobs, the ids; pending
jobs, Triton's GPUs, kept jobs and the preemption budget respected; the greedy stand-in
beyond `EXHAUSTIVE_JOBS`. And which jobs a drain-mode lease of k GPUs waits for: those
that end first, until their GPUs make k; no answer past a job with no end."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.policy.snapshot import JobView, NodeView
from bridge.policy.victims import (
    EXHAUSTIVE_JOBS,
    DrainWait,
    Victims,
    choose_victims,
    drain_wait,
    work_lost,
)

NOW = 1_800_000_000.0
HOUR = 3600.0


def node(*jobs: JobView, gpus: int = 8) -> NodeView:
    return NodeView("e1", "elastic", True, gpus, jobs)


#: an 8-GPU node running jobs of 1, 2 and 4 GPUs (1 free), each started an hour ago
ONE = JobView("101", 1, NOW - HOUR)
TWO = JobView("102", 2, NOW - HOUR)
FOUR = JobView("104", 4, NOW - HOUR)
MIXED = node(ONE, TWO, FOUR)


def test_a_node_with_enough_free_gpus_needs_no_victim() -> None:
    assert choose_victims(MIXED, 1, NOW, triton_gpus=0) == Victims((), 0, 0.0)


def test_the_fewest_gpus_are_requeued_not_the_largest_job() -> None:
    # 1 free: 2 GPUs need one more; the 1-GPU job gives it, not the 2 or the 4
    assert choose_victims(MIXED, 2, NOW, triton_gpus=0) == Victims(("101",), 1, HOUR)


def test_a_three_gpu_lease_with_one_free_requeues_the_two_gpu_job() -> None:
    assert choose_victims(MIXED, 3, NOW, triton_gpus=0) == Victims(("102",), 2, 2 * HOUR)


def test_a_one_gpu_lease_on_a_full_node_requeues_the_one_gpu_job() -> None:
    full = node(ONE, TWO, FOUR, JobView("105", 1, NOW - HOUR))
    assert choose_victims(full, 1, NOW, triton_gpus=0) == Victims(("101",), 1, HOUR)


def test_two_jobs_are_taken_when_they_requeue_fewer_gpus_than_one_big_one() -> None:
    # 1 free, 4 GPUs wanted: 1 + 2 (3 GPUs) beats the 4-GPU job alone
    got = choose_victims(MIXED, 4, NOW, triton_gpus=0)
    assert got == Victims(("101", "102"), 3, 3 * HOUR)


def test_equal_gpus_go_to_the_job_that_checkpointed_last() -> None:
    a = JobView("201", 2, NOW - 2 * HOUR, checkpoint_at=NOW - 600)
    b = JobView("202", 2, NOW - HOUR)
    got = choose_victims(node(a, b, gpus=4), 1, NOW, triton_gpus=0)
    assert got == Victims(("201",), 2, 1200.0)


def test_equal_gpus_and_work_go_to_fewer_jobs_then_the_lower_id() -> None:
    # 2 GPUs wanted, none free: the 2-GPU job (2 h of GPU-work) or the two 1-GPU jobs
    # (1 h each): same GPUs, same work, one job fewer
    pair = (JobView("301", 1, NOW - HOUR), JobView("302", 1, NOW - HOUR))
    big = JobView("303", 2, NOW - HOUR)
    assert choose_victims(node(*pair, big, gpus=4), 2, NOW, triton_gpus=0) == Victims(
        ("303",), 2, 2 * HOUR
    )
    twins = node(JobView("402", 2, NOW - HOUR), JobView("401", 2, NOW - HOUR), gpus=4)
    assert choose_victims(twins, 1, NOW, triton_gpus=0) == Victims(("401",), 2, 2 * HOUR)


def test_the_work_lost_is_what_nodes_counts_for_the_same_jobs() -> None:
    a = JobView("501", 3, NOW - 5000.0, checkpoint_at=NOW - 700.0)
    b = JobView("502", 2, NOW - 900.0)
    got = choose_victims(node(a, b, gpus=5), 5, NOW, triton_gpus=0)
    assert got is not None and got.jobs == ("501", "502")
    assert got.lost == work_lost(node(a, b, gpus=5), NOW) == 3 * 700.0 + 2 * 900.0


def test_a_node_that_cannot_give_k_gpus_gives_none() -> None:
    assert choose_victims(MIXED, 9, NOW, triton_gpus=0) is None
    assert choose_victims(MIXED, 6, NOW, triton_gpus=3) is None  # 5 left beside Triton


def test_pending_jobs_hold_no_gpus_and_are_never_requeued() -> None:
    pending = JobView("601", 4, None)
    busy = node(ONE, TWO, pending, gpus=4)  # the pending job's 4 GPUs are not held
    assert choose_victims(busy, 1, NOW, triton_gpus=0) == Victims((), 0, 0.0)
    assert choose_victims(busy, 2, NOW, triton_gpus=0) == Victims(("101",), 1, HOUR)


def test_gpus_held_by_triton_are_neither_free_nor_freed() -> None:
    # 1 free without Triton; with 1 held by Triton none is: a 1-GPU lease needs a victim
    assert choose_victims(MIXED, 1, NOW, triton_gpus=1) == Victims(("101",), 1, HOUR)
    # 4 held by Triton, 3 by jobs on an 8-GPU node: 1 free, 4 wanted needs 3 more, and
    # only the jobs' 3 can give them
    beside = node(ONE, TWO, gpus=8)
    got = choose_victims(beside, 4, NOW, triton_gpus=4)
    assert got == Victims(("101", "102"), 3, 3 * HOUR)
    assert choose_victims(beside, 5, NOW, triton_gpus=4) is None


def test_kept_jobs_are_never_requeued() -> None:
    got = choose_victims(MIXED, 2, NOW, triton_gpus=0, keep={"101"})
    assert got == Victims(("102",), 2, 2 * HOUR)
    assert choose_victims(MIXED, 2, NOW, triton_gpus=0, keep={"101", "102", "104"}) is None


def test_the_preemption_budget_bounds_the_jobs_requeued() -> None:
    # 4 wanted: 1 + 2 is best, but a budget of one job takes the 4-GPU job alone
    got = choose_victims(MIXED, 4, NOW, triton_gpus=0, max_jobs=1)
    assert got == Victims(("104",), 4, 4 * HOUR)
    assert choose_victims(MIXED, 4, NOW, triton_gpus=0, max_jobs=0) is None
    assert choose_victims(MIXED, 1, NOW, triton_gpus=0, max_jobs=0) == Victims((), 0, 0.0)


def test_jobs_without_gpus_are_not_victims() -> None:
    cpu = JobView("701", 0, NOW - 10.0)
    got = choose_victims(node(cpu, JobView("702", 4, NOW - HOUR), gpus=4), 1, NOW, triton_gpus=0)
    assert got == Victims(("702",), 4, 4 * HOUR)


def test_a_lease_takes_at_least_one_gpu() -> None:
    with pytest.raises(ValueError, match="k=0"):
        choose_victims(MIXED, 0, NOW, triton_gpus=0)


def test_beyond_the_exhaustive_cap_the_greedy_choice_still_frees_k() -> None:
    # 17 one-GPU jobs and a 2-GPU job on a 19-GPU node, none free: 2 wanted
    small = [JobView(f"8{i:02d}", 1, NOW - HOUR + i) for i in range(EXHAUSTIVE_JOBS + 1)]
    crowded = node(*small, JobView("899", 2, NOW - 10.0), gpus=EXHAUSTIVE_JOBS + 3)
    got = choose_victims(crowded, 2, NOW, triton_gpus=0)
    # the 2-GPU job alone loses 20 GPU-s; two 1-GPU jobs an hour each
    assert got == Victims(("899",), 2, 20.0)
    budget = choose_victims(crowded, 3, NOW, triton_gpus=0, max_jobs=2)
    assert budget is not None and budget.gpus == 3 and len(budget.jobs) == 2
    assert "899" in budget.jobs


def test_triton_gpus_default_to_the_nodes_own() -> None:
    beside = replace(MIXED, triton_gpus=1)  # 1 free without Triton; none with it
    assert choose_victims(beside, 1, NOW) == Victims(("101",), 1, HOUR)
    # a caller that knows better (nothing of Triton's there after all) says so
    assert choose_victims(beside, 1, NOW, triton_gpus=0) == Victims((), 0, 0.0)
    assert choose_victims(MIXED, 1, NOW) == Victims((), 0, 0.0)  # NodeView's default: 0


#: the same 8-GPU node (1 free), its jobs ending in 1 h, 2 h and 30 min
ENDING = node(
    replace(ONE, ends_at=NOW + HOUR),
    replace(TWO, ends_at=NOW + 2 * HOUR),
    replace(FOUR, ends_at=NOW + HOUR / 2),
)


def test_a_drain_waits_for_the_jobs_that_end_first_until_k_gpus_are_free() -> None:
    assert drain_wait(ENDING, 1, NOW) == DrainWait((), NOW)  # 1 free already
    # 1 more wanted: the 4-GPU job ends first (not the smallest job, 101)
    assert drain_wait(ENDING, 2, NOW) == DrainWait(("104",), NOW + HOUR / 2)
    assert drain_wait(ENDING, 5, NOW) == DrainWait(("104",), NOW + HOUR / 2)
    assert drain_wait(ENDING, 6, NOW) == DrainWait(("104", "101"), NOW + HOUR)
    got = drain_wait(ENDING, 8, NOW)
    assert got is not None
    jobs, free_at = got  # (a named pair)
    assert jobs == ("104", "101", "102") and free_at == NOW + 2 * HOUR


def test_a_drain_cannot_get_more_than_the_node_has_beside_triton() -> None:
    assert drain_wait(ENDING, 9, NOW) is None
    held = replace(ENDING, triton_gpus=2)  # 6 GPUs left beside Triton, none free
    assert drain_wait(held, 7, NOW) is None
    assert drain_wait(held, 1, NOW) == DrainWait(("104",), NOW + HOUR / 2)
    assert drain_wait(held, 1, NOW, triton_gpus=0) == DrainWait((), NOW)  # the caller's word


def test_a_needed_job_without_an_end_leaves_the_wait_unknown() -> None:
    endless = node(
        replace(ONE, ends_at=NOW + HOUR),
        TWO,  # no time limit: no end
        replace(FOUR, ends_at=NOW + HOUR / 2),
    )
    assert drain_wait(endless, 6, NOW) == DrainWait(("104", "101"), NOW + HOUR)  # not needed
    assert drain_wait(endless, 7, NOW) is None  # needed: when is not known


def test_pending_jobs_and_jobs_without_gpus_are_not_waited_for() -> None:
    cpu = JobView("701", 0, NOW - 10.0)  # no GPU and no end: frees nothing, blocks nothing
    pending = JobView("601", 4, None)
    on = node(cpu, pending, replace(TWO, ends_at=NOW + HOUR), gpus=4)
    assert drain_wait(on, 2, NOW) == DrainWait((), NOW)
    assert drain_wait(on, 4, NOW) == DrainWait(("102",), NOW + HOUR)


def test_a_job_past_its_end_frees_its_gpus_now_and_ties_go_by_id() -> None:
    over = node(
        JobView("902", 2, NOW - HOUR, ends_at=NOW - 5.0),  # past its limit, still seen
        JobView("901", 2, NOW - HOUR, ends_at=NOW - 5.0),
        gpus=4,
    )
    assert drain_wait(over, 2, NOW) == DrainWait(("901",), NOW)
    with pytest.raises(ValueError, match="k=0"):
        drain_wait(over, 0, NOW)


def test_guarded_jobs_are_those_requeued_lately_or_too_often() -> None:
    from bridge.policy.victims import guarded

    fresh = JobView("1", 1, NOW - 60, restarts=1, submitted_at=NOW - 100)
    assert guarded(fresh, NOW, guard_s=600, max_requeues=2)
    assert not guarded(fresh, NOW, guard_s=60, max_requeues=2)  # past the guard
    assert guarded(replace(fresh, restarts=2), NOW, guard_s=60, max_requeues=2)
    assert not guarded(JobView("2", 1, NOW - 60), NOW, guard_s=600, max_requeues=2)


def test_a_job_on_several_nodes_frees_its_gpus_here_and_loses_them_all() -> None:
    # a 16-GPU job on two nodes holds 8 here (it frees 8), a requeue loses all 16
    wide = JobView("201", 16, NOW - HOUR, gpus_here=8)
    small = JobView("202", 4, NOW - HOUR, gpus_here=None)
    full = node(wide, gpus=12)
    assert choose_victims(full, 4, NOW, triton_gpus=0) == Victims((), 0, 0.0)  # 4 free
    both = node(wide, small, gpus=12)
    # 4 GPUs: the small job (4 lost) beats the wide one (16 lost, though it frees 8)
    assert choose_victims(both, 4, NOW, triton_gpus=0).jobs == ("202",)
    # 8: only the wide one frees that many here
    assert choose_victims(both, 8, NOW, triton_gpus=0) == Victims(
        ("201",), 16, work_lost(node(wide), NOW)
    )
