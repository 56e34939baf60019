"""Which elastic jobs a lease of k GPUs requeues (`bridge.policy.victims`), on literal
nodes: the fewest GPUs first, then the least work lost, the fewest jobs, the ids; pending
jobs, Triton's GPUs, kept jobs and the preemption budget respected; the greedy stand-in
beyond `EXHAUSTIVE_JOBS`."""

from __future__ import annotations

import pytest

from bridge.policy.nodes import work_lost
from bridge.policy.snapshot import JobView, NodeView
from bridge.policy.victims import EXHAUSTIVE_JOBS, Victims, choose_victims

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
