"""The one per-state sync's modelled world (bridge.policy.leasesync) on literal times: what a
`ModelledLease` shows at each instant, and the steps the sync makes of it, as the shadow
book and the simulator drive it; the one lease view's defaults. The sync's rules
themselves are tested through the planner (tests/unit/test_planner.py)."""

from __future__ import annotations

import math

import pytest

from bridge.lifecycle import LeaseState
from bridge.policy.leasesync import (
    LeaseWorld,
    ModelledLease,
    Settings,
    deadline,
    modelled_settings,
    return_step,
    sync_lease,
)
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Cancel, Move, RouteIn, RouteOut, Step, Unload

S = LeaseState
T0 = 1_800_000_000.0


def modelled(state: LeaseState, **times: float | None) -> ModelledLease:
    view = LeaseView(7, "n3", "elastic", "preempt", state, ("busy",), T0, T0, "sim-7")
    return ModelledLease(view, **times)


def test_a_lease_view_made_without_its_state_time_entered_it_when_made() -> None:
    made = LeaseView(1, "n3", "elastic", "preempt", "serving", ("busy",), T0)
    assert made.updated_at == T0 and made.serving_since == T0
    assert (
        LeaseView(1, "n3", "elastic", "preempt", "starting", ("busy",), T0, None).updated_at == T0
    )
    later = LeaseView(1, "n3", "elastic", "preempt", "serving", ("busy",), T0, T0 + 9)
    assert (later.serving_since, later.lease_id, later.ref) == (T0 + 9, 1, (1, int(T0)))
    with pytest.raises(ValueError):
        LeaseView(1, "n3", "elastic", "preempt", "servin", ("busy",), T0)


def test_the_modelled_job_pends_runs_and_is_gone_at_its_times() -> None:
    lease = modelled(S.SUBMITTED, running_at=T0 + 4, ready_at=T0 + 6)
    pending = lease.world(T0 + 3.9)
    assert pending.job is not None and pending.job.state == "PENDING" and pending.server is None
    running = lease.world(T0 + 4)
    assert running.job is not None and running.job.state == "RUNNING" and running.server is None
    assert running.job.job_id == "sim-7"
    ready = lease.world(T0 + 6).server
    assert ready is not None and ready.ready and ready.models == ("busy",)
    assert ready.pending == {} and ready.unavailable == {}
    lease.gone_at = T0 + 9
    assert lease.world(T0 + 8.9).job is not None and lease.world(T0 + 9).job is None
    # a node Slurm no longer lists takes its job with it
    gone = modelled(S.SERVING, running_at=T0, ready_at=T0).world(T0 + 1, node_listed=False)
    assert gone == LeaseWorld(False)


def step(lease: ModelledLease, now: float) -> Step | None:
    return sync_lease(lease.view, lease.world(now), now, modelled_settings())


def test_the_sync_moves_a_modelled_lease_once_its_time_has_come() -> None:
    lease = modelled(S.SUBMITTED, running_at=T0 + 4, ready_at=T0 + 6)
    assert step(lease, T0 + 3) is None
    assert step(lease, T0 + 4) == Step(
        7, move=Move(7, S.SUBMITTED, S.STARTING, "job sim-7 running")
    )
    lease.view = LeaseView(
        7, "n3", "elastic", "preempt", S.STARTING, ("busy",), T0, T0 + 4, "sim-7"
    )
    assert step(lease, T0 + 5) is None
    served = step(lease, T0 + 6)
    assert served is not None and served.commands == (RouteIn(7),)
    assert served.move is not None and served.move.new == S.SERVING
    # a tick drains it: nothing is in flight on a modelled server
    lease.view = LeaseView(
        7, "n3", "elastic", "preempt", S.DRAINING, ("busy",), T0, T0 + 60, "sim-7"
    )
    drained = step(lease, T0 + 65)
    assert drained is not None and drained.commands == (Unload("", ("busy",)), Cancel("sim-7"))
    assert drained.move is not None and drained.move.new == S.RELEASING


def test_a_modelled_world_is_never_late() -> None:
    settings = modelled_settings(requeue_victims=False)
    assert not settings.requeue_victims
    for state in (S.REQUESTED, S.SUBMITTED, S.STARTING, S.DRAINING, S.RELEASING, S.FAILED):
        assert deadline(modelled(state).view, settings) == math.inf, state
    # a modelled job that pends for a day is still waited for; the daemon's settings fail it
    lease = modelled(S.SUBMITTED)
    assert step(lease, T0 + 86_400) is None
    failed = sync_lease(lease.view, lease.world(T0 + 86_400), T0 + 86_400, Settings())
    assert failed is not None and failed.move is not None and failed.move.new == S.FAILED


def test_the_one_return_drains_a_serving_lease_and_cancels_one_on_its_way() -> None:
    serving = return_step(modelled(S.SERVING).view, "calm", LeaseWorld(True))
    assert serving is not None and serving.commands == (RouteOut(7),)
    assert serving.move == Move(7, S.SERVING, S.DRAINING, "return: calm")
    starting = return_step(modelled(S.STARTING).view, "calm", LeaseWorld(True))
    assert starting is not None and starting.commands == (Cancel("sim-7"),)
    assert return_step(modelled(S.RELEASING).view, "calm", LeaseWorld(True)) is None
