"""The pure sync planner (`bridge.daemon.planner`) with literal inputs and an injected
clock: every lease state against what Slurm and Triton report, deadlines, drain-mode
fences, retry backoff, returns, orphans, the operator's lend check and the answers to an
operator request taken again after a failover."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.daemon.observation import Observation, TritonServer
from bridge.daemon.planner import (
    RESERVATION_SLACK_S,
    Adopt,
    Cancel,
    Fence,
    LeaseRecord,
    Move,
    Requeue,
    Resume,
    RouteIn,
    RouteOut,
    Settings,
    Step,
    Submit,
    Unfence,
    Unload,
    check_operator_lend,
    deadline,
    is_stuck,
    lease_refs_to_check,
    operator_lend_gpus,
    plan,
    plan_lease,
    plan_orphans,
    plan_return,
    replayed_lend,
    replayed_return,
    return_reasons,
    shared_node_refusal,
    victims_of,
)
from bridge.lifecycle import LeaseState, allowed
from bridge.modelfacts import merge_models
from bridge.slurm.model import Job, Node
from tests.unit.planner_literals import job

S = LeaseState
NOW = 1_800_000_000.0
CREATED = NOW - 3600.0
SETTINGS = Settings(
    requested_deadline_s=120,
    submitted_deadline_s=600,
    starting_deadline_s=300,
    releasing_deadline_s=300,
    drain_timeout_s=30,
    drain_wait_s=1800,
)
CONFIG = BridgeConfig(
    models={"busy": ModelConfig(slo_p99_ms=100), "calm": ModelConfig(slo_p99_ms=200)}
)


# ---- literal inputs -------------------------------------------------------------------

PARTITIONS = {"n1": ("infer",), "n3": ("elastic", "infer"), "n5": ("train",), "n9": ("debug",)}


def node(name: str, *, flags: Iterable[str] = (), reason: str = "") -> Node:
    return Node(
        name,
        f"10.0.0.{name[1:]}",
        PARTITIONS[name],
        "idle",
        frozenset(flags),
        reason,
        "a100",
        4,
        0,
    )


def lease(
    state: LeaseState,
    *,
    lease_id: int = 1,
    on: str = "n3",
    mode: str = "preempt",
    models: tuple[str, ...] = ("busy",),
    job_id: str | None = "100",
    since: float = 10.0,
    created: float = CREATED,
) -> LeaseRecord:
    """A lease in `state` for `since` seconds (updated_at = NOW - since)."""
    pool = {"preempt": "elastic", "drain": "training"}[mode]
    return LeaseRecord(lease_id, on, pool, mode, state, models, created, NOW - since, job_id)


def server(
    j: Job,
    *,
    ready: bool = True,
    models: Iterable[str] = ("busy",),
    pending: Mapping[str, float] | None = None,
    unavailable: Mapping[str, str] | None = None,
    unanswered_s: float = 0.0,
) -> TritonServer:
    on = j.nodes[0]
    return TritonServer(
        j, on, f"10.0.0.{on[1:]}:8000", ready, tuple(models), pending or {},
        unavailable or {}, unanswered_s=unanswered_s,
    )  # fmt: skip


def observe(
    *,
    jobs: Iterable[Job] = (),
    servers: Iterable[TritonServer] = (),
    reservations: Iterable[str] = (),
    nodes: Iterable[Node | str] = ("n1", "n3", "n5"),
) -> Observation:
    known = [n if isinstance(n, Node) else node(n) for n in nodes]
    return Observation(
        NOW,
        {n.name: n for n in known},
        tuple(jobs),
        frozenset(reservations),
        tuple(servers),
        {},
        models=merge_models(None, CONFIG.models),
    )


def with_job(
    lse: LeaseRecord,
    *,
    state: str = "RUNNING",
    reason: str = "None",
    srv: dict[str, object] | None = None,
    reservations: Iterable[str] = (),
    nodes: Iterable[str] = ("n1", "n3", "n5"),
) -> Observation:
    """The lease's job in `state`; with `srv`, its server (TritonServer keywords)."""
    j = job(lse.slurm_job_id or "100", of=lse, on=lse.node, state=state, reason=reason)
    servers = [server(j, **srv)] if srv is not None else []  # type: ignore[arg-type]
    return observe(jobs=[j], servers=servers, reservations=reservations, nodes=nodes)


def fail(lse: LeaseRecord, reason: str) -> Step:
    return Step(lse.id, move=Move(lse.id, lse.state, S.FAILED, reason))


def one(lse: LeaseRecord, obs: Observation, now: float = NOW) -> Step | None:
    return plan_lease(lse, obs, now, SETTINGS)


# ---- requested ------------------------------------------------------------------------


def test_requested_preempt_submits_its_job() -> None:
    lse = lease(S.REQUESTED, job_id=None)
    step = one(lse, observe())
    assert step == Step(
        1,
        (Submit("n3", ("busy",), (1, int(CREATED)), "elastic", None),),
        Move(1, S.REQUESTED, S.SUBMITTED, "submitted"),
    )


def victim(job_id: str, on: str, state: str = "RUNNING", comment: str = "stb:elastic") -> Job:
    return Job(
        job_id, "train", "elastic", "team-nlp", "u", state, "None", (on,), comment, 4, 0, None,
        None,
    )  # fmt: skip


def test_requested_preempt_requeues_the_nodes_jobs_after_submitting() -> None:
    lse = lease(S.REQUESTED, job_id=None)
    jobs = [
        victim("7", "n3"),
        victim("8", "n3"),
        victim("9", "n1"),  # another node
        victim("10", "n3", state="COMPLETING"),  # leaving anyway
        job("11", on="n3"),  # a Triton job is never a victim
    ]
    step = one(lse, observe(jobs=jobs))
    assert step.commands == (
        Submit("n3", ("busy",), (1, int(CREATED)), "elastic", None),
        Requeue("n3", ("7", "8")),
    )
    # the site may leave it to slurmctld's preemption pass
    waits = plan_lease(lse, observe(jobs=jobs), NOW, replace(SETTINGS, requeue_victims=False))
    assert waits is not None and waits.commands == (
        Submit("n3", ("busy",), (1, int(CREATED)), "elastic", None),
    )


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def test_requested_partial_lend_asks_for_its_gpus_and_requeues_only_what_frees_them() -> None:
    # n3 has 4 GPUs; two elastic jobs of 2 GPUs each hold them all. A lease of 1 GPU
    # requeues one of them (the younger: the least work lost), not both.
    lse = replace(lease(S.REQUESTED, job_id=None), lent_gpus=1)
    older = replace(victim("7", "n3"), gpus=2, start_time=at(NOW - 3600))
    younger = replace(victim("8", "n3"), gpus=2, start_time=at(NOW - 60))
    step = one(lse, observe(jobs=[older, younger]))
    assert step is not None and step.commands == (
        Submit("n3", ("busy",), (1, int(CREATED)), "elastic", None, 1),
        Requeue("n3", ("8",)),
    )
    # a GPU already free: nothing is requeued
    free = replace(younger, gpus=1)
    step = one(lse, observe(jobs=[older, free]))
    assert step is not None and step.commands == (
        Submit("n3", ("busy",), (1, int(CREATED)), "elastic", None, 1),
    )
    # a job requeued twice already is kept: the other goes, whatever its work
    held = replace(younger, restarts=2, submit_time=at(NOW - 7200))
    step = one(lse, observe(jobs=[older, held]))
    assert step is not None and step.commands[1:] == (Requeue("n3", ("7",)),)


def test_a_whole_node_lease_still_requeues_every_job() -> None:
    lse = lease(S.REQUESTED, job_id=None)
    jobs = [replace(victim("7", "n3"), gpus=2), replace(victim("8", "n3"), gpus=2)]
    step = one(lse, observe(jobs=jobs))
    assert step is not None and step.commands[1:] == (Requeue("n3", ("7", "8")),)


def test_operator_lend_gpus_follow_the_models_replicas() -> None:
    config = BridgeConfig(
        models={
            "small": ModelConfig(slo_p99_ms=100, instance_gpus=1),
            "big": ModelConfig(slo_p99_ms=100, tensor_parallel=4),
            "whole": ModelConfig(slo_p99_ms=100),
        }
    )
    obs = replace(observe(), models=merge_models(None, config.models))
    assert operator_lend_gpus("n3", ("small",), "preempt", obs, config) == 1
    assert operator_lend_gpus("n3", ("small", "big"), "preempt", obs, config) is None  # 4 of 4
    assert operator_lend_gpus("n3", ("small", "whole"), "preempt", obs, config) is None
    assert operator_lend_gpus("n5", ("small",), "drain", obs, config) is None  # fenced whole
    drain = config.model_copy(update={"policy": PolicyConfig(drain_partial_lends=True)})
    assert operator_lend_gpus("n5", ("small",), "drain", obs, drain) == 1  # waits, unfenced
    assert operator_lend_gpus("n99", ("small",), "preempt", obs, config) is None
    whole = config.model_copy(update={"policy": PolicyConfig(partial_lends=False)})
    assert operator_lend_gpus("n3", ("small",), "preempt", obs, whole) is None


def test_requested_drain_never_requeues() -> None:
    lse = lease(S.REQUESTED, on="n5", mode="drain", job_id=None)
    step = one(lse, observe(jobs=[victim("7", "n5")]))
    assert not [c for c in step.commands if isinstance(c, Requeue)]


def test_requested_drain_fences_then_submits_into_the_reservation() -> None:
    lse = lease(S.REQUESTED, on="n5", mode="drain", job_id=None)
    step = one(lse, observe())
    assert step is not None
    assert step.commands == (
        Fence("stb-lease-1", "n5", int(1800 + RESERVATION_SLACK_S)),
        Submit("n5", ("busy",), (1, int(CREATED)), "training", "stb-lease-1"),
    )
    assert step.move == Move(1, S.REQUESTED, S.SUBMITTED, "submitted")


def test_requested_drain_with_its_reservation_does_not_fence_again() -> None:
    lse = lease(S.REQUESTED, on="n5", mode="drain", job_id=None)
    step = one(lse, observe(reservations=["stb-lease-1"]))
    assert step is not None
    assert step.commands == (Submit("n5", ("busy",), (1, int(CREATED)), "training", "stb-lease-1"),)


@pytest.mark.parametrize("job_state", ["RUNNING", "PENDING"])
def test_requested_with_its_tagged_job_records_it(job_state: str) -> None:
    """Submitted before a crash, not recorded: the job is found by its tag, no resubmit."""
    lse = lease(S.REQUESTED, job_id=None)
    obs = observe(jobs=[job("321", of=lse, state=job_state)])
    assert one(lse, obs) == Step(
        1, move=Move(1, S.REQUESTED, S.SUBMITTED, "found its Triton job", "321")
    )


def test_requested_ignores_a_job_tagged_for_another_incarnation_of_its_id() -> None:
    lse = lease(S.REQUESTED, job_id=None)
    other = lease(S.RETURNED, created=CREATED - 86400)
    step = one(lse, observe(jobs=[job("321", of=other)]))
    assert step is not None and isinstance(step.commands[-1], Submit)


@pytest.mark.parametrize(("since", "overdue"), [(119.0, False), (120.0, False), (121.0, True)])
def test_requested_deadline(since: float, overdue: bool) -> None:
    lse = lease(S.REQUESTED, job_id=None, since=since)
    step = one(lse, observe())
    if overdue:
        assert step == fail(lse, "stuck in requested for 121 s (deadline 120 s)")
    else:
        assert step is not None and step.move is not None and step.move.new == S.SUBMITTED


def test_requested_on_a_node_that_vanished_from_slurm_fails() -> None:
    lse = lease(S.REQUESTED, job_id=None)
    assert one(lse, observe(nodes=["n1", "n5"])) == fail(lse, "node n3 vanished from Slurm")


# ---- submitted ------------------------------------------------------------------------


def test_submitted_job_running_moves_to_starting() -> None:
    lse = lease(S.SUBMITTED)
    assert one(lse, with_job(lse)) == Step(
        1, move=Move(1, S.SUBMITTED, S.STARTING, "job 100 running")
    )


def test_submitted_job_running_past_its_deadline_still_starts() -> None:
    lse = lease(S.SUBMITTED, since=10_000)
    step = one(lse, with_job(lse))
    assert step is not None and step.move is not None and step.move.new == S.STARTING


def test_submitted_job_pending_waits() -> None:
    lse = lease(S.SUBMITTED)
    assert one(lse, with_job(lse, state="PENDING", reason="Resources")) is None


@pytest.mark.parametrize("reason", ["JobHeldAdmin", "JobHeldUser", "BadConstraints"])
def test_submitted_job_held_by_slurm_fails(reason: str) -> None:
    lse = lease(S.SUBMITTED)
    assert one(lse, with_job(lse, state="PENDING", reason=reason)) == fail(
        lse, f"Slurm holds Triton job 100: {reason}"
    )


def test_submitted_job_gone_fails() -> None:
    lse = lease(S.SUBMITTED)
    assert one(lse, observe()) == fail(lse, "Triton job vanished before it ran")


def test_submitted_node_vanished_fails() -> None:
    lse = lease(S.SUBMITTED)
    obs = with_job(lse, state="PENDING", reason="Resources", nodes=["n1", "n5"])
    assert one(lse, obs) == fail(lse, "node n3 vanished from Slurm")


@pytest.mark.parametrize(
    ("mode", "drain_wait_s", "expected"),
    [
        ("preempt", 1800, 600),
        ("drain", 1800, 1860),  # drain_wait_s + 60 > submitted_deadline_s
        ("drain", 100, 600),  # submitted_deadline_s is the floor
        ("drain", 540, 600),  # equal: either
        ("drain", 541, 601),
    ],
)
def test_submitted_deadline_by_lend_mode(mode: str, drain_wait_s: float, expected: float) -> None:
    settings = Settings(submitted_deadline_s=600, drain_wait_s=drain_wait_s)
    on = "n5" if mode == "drain" else "n3"
    lse = lease(S.SUBMITTED, on=on, mode=mode)
    assert deadline(lse, settings) == expected
    pending = with_job(lse, state="PENDING", reason="Resources")
    assert plan_lease(replace_since(lse, expected), pending, NOW, settings) is None
    late = replace_since(lse, expected + 1)
    assert plan_lease(late, pending, NOW, settings) == fail(
        late, f"stuck in submitted for {expected + 1:.0f} s (deadline {expected:g} s)"
    )


def replace_since(lse: LeaseRecord, since: float) -> LeaseRecord:
    return replace(lse, updated_at=NOW - since)


# ---- starting -------------------------------------------------------------------------


def test_starting_ready_with_its_models_goes_into_routing_then_serving() -> None:
    lse = lease(S.STARTING)
    assert one(lse, with_job(lse, srv={"models": ("busy", "calm")})) == Step(
        1,
        (RouteIn(1),),
        Move(1, S.STARTING, S.SERVING, "Triton ready, in routing"),
        fails_lease=False,
    )


def test_starting_ready_without_all_its_models_waits() -> None:
    lse = lease(S.STARTING, models=("busy", "calm"))
    assert one(lse, with_job(lse, srv={"models": ("busy",)})) is None


def test_starting_model_unavailable_fails_with_tritons_reason() -> None:
    lse = lease(S.STARTING, models=("busy", "calm"))
    obs = with_job(
        lse,
        srv={
            "models": ("busy",),
            "unavailable": {"calm": "failed to load: out of memory", "other": "ignored"},
        },
    )
    assert one(lse, obs) == fail(lse, "Triton refused to load calm: failed to load: out of memory")


def test_starting_unavailable_model_of_no_concern_to_the_lease_is_ignored() -> None:
    lse = lease(S.STARTING)
    obs = with_job(lse, srv={"models": ("busy",), "unavailable": {"calm": "bad config"}})
    step = one(lse, obs)
    assert step is not None and step.move is not None and step.move.new == S.SERVING


@pytest.mark.parametrize("srv", [{"ready": False, "models": ()}, None], ids=["not-ready", "absent"])
def test_starting_not_ready_waits_until_the_ready_timeout(srv: dict[str, object] | None) -> None:
    lse = lease(S.STARTING, since=300)
    assert one(lse, with_job(lse, srv=srv)) is None
    late = lease(S.STARTING, since=301)
    assert one(late, with_job(late, srv=srv)) == fail(
        late, "Triton not ready in time (stuck in starting for 301 s (deadline 300 s))"
    )


def test_starting_job_gone_fails() -> None:
    lse = lease(S.STARTING)
    assert one(lse, observe()) == fail(lse, "Triton job ended while starting")


def test_starting_node_vanished_fails_at_once() -> None:
    lse = lease(S.STARTING)
    step = one(lse, with_job(lse, nodes=["n1", "n5"]))
    assert step is not None and step.move is not None and step.move.new == S.FAILED


# ---- serving --------------------------------------------------------------------------


def test_serving_with_its_server_ready_waits_however_long() -> None:
    lse = lease(S.SERVING, since=10 * 86400)
    assert one(lse, with_job(lse, srv={})) is None


def test_serving_model_gone_from_a_ready_server_is_left_to_routing() -> None:
    lse = lease(S.SERVING)
    assert one(lse, with_job(lse, srv={"models": ()})) is None


@pytest.mark.parametrize(
    ("srv", "job_there", "nodes", "reason"),
    [
        (
            {"ready": False, "models": (), "unanswered_s": 15.0},
            True,
            ("n1", "n3", "n5"),
            "Triton server unanswered for 15s while serving",
        ),
        (None, True, ("n1", "n3", "n5"), "Triton job 100 running, not serving"),
        (None, False, ("n1", "n3", "n5"), "Triton job gone while serving"),
        (None, True, ("n1", "n5"), "node n3 vanished from Slurm"),
    ],
    ids=["server-unanswered-past-grace", "server-absent", "job-gone", "node-vanished"],
)
def test_serving_server_or_job_gone_fails(
    srv: dict[str, object] | None, job_there: bool, nodes: tuple[str, ...], reason: str
) -> None:
    lse = lease(S.SERVING)
    obs = with_job(lse, srv=srv, nodes=nodes) if job_there else observe(nodes=nodes)
    assert one(lse, obs) == fail(lse, reason)


def test_serving_server_that_misses_an_ask_within_the_grace_goes_on_serving() -> None:
    """A server saturated by a burst answers no readiness ask for a tick or two; its job
    still runs, so the replica stays in routing until `unanswered_grace_s` has passed."""
    lse = lease(S.SERVING)
    for silent in (0.0, 2.0, SETTINGS.unanswered_grace_s - 0.1):
        obs = with_job(lse, srv={"ready": False, "models": (), "unanswered_s": silent})
        assert one(lse, obs) is None, silent


# ---- draining -------------------------------------------------------------------------


def test_draining_nothing_pending_unloads_and_cancels() -> None:
    lse = lease(S.DRAINING, models=("busy", "calm"), since=1)
    obs = with_job(lse, srv={"models": ("busy", "calm"), "pending": {"busy": 0.0}})
    assert one(lse, obs) == Step(
        1,
        (Unload("10.0.0.3:8000", ("busy", "calm")), Cancel("100")),
        Move(1, S.DRAINING, S.RELEASING, "no request in flight; unloaded, job cancelled"),
    )


@pytest.mark.parametrize(("since", "waits"), [(0.0, True), (29.9, True), (30.0, False)])
def test_draining_pending_requests_wait_for_the_drain_timeout(since: float, waits: bool) -> None:
    lse = lease(S.DRAINING, models=("busy", "calm"), since=since)
    obs = with_job(lse, srv={"pending": {"busy": 2.0, "calm": 1.0, "other": 9.0}})
    step = one(lse, obs)
    if waits:
        assert step is None
    else:
        assert step == Step(
            1,
            (Unload("10.0.0.3:8000", ("busy", "calm")), Cancel("100")),
            Move(1, S.DRAINING, S.RELEASING, "drain timeout, 3 pending; unloaded, job cancelled"),
        )


def test_draining_pending_on_other_models_does_not_hold_the_lease() -> None:
    lse = lease(S.DRAINING, since=1)
    step = one(lse, with_job(lse, srv={"pending": {"calm": 5.0}}))
    assert step is not None and step.move is not None and step.move.new == S.RELEASING
    assert step.commands == (Unload("10.0.0.3:8000", ("busy",)), Cancel("100"))


@pytest.mark.parametrize("job_there", [True, False], ids=["server-absent", "job-gone"])
def test_draining_server_gone_releases(job_there: bool) -> None:
    lse = lease(S.DRAINING)
    obs = with_job(lse) if job_there else observe()
    assert one(lse, obs) == Step(
        1, move=Move(1, S.DRAINING, S.RELEASING, "server gone while draining")
    )


def test_draining_past_its_deadline_fails() -> None:
    """An unload that never succeeds (retried with backoff) ends at the deadline: the
    failed path cancels the job."""
    lse = lease(S.DRAINING, since=331)
    assert deadline(lse, SETTINGS) == 330
    step = one(lse, with_job(lse, srv={"pending": {"busy": 1.0}}))
    assert step is not None and step.move is not None and step.move.new == S.FAILED
    assert step.move.reason.startswith("stuck in draining")


def test_draining_server_not_answering_is_cancelled_without_an_unload() -> None:
    lse = lease(S.DRAINING)
    step = one(lse, with_job(lse, srv={"ready": False}))
    assert step is not None and step.move is not None and step.move.new == S.RELEASING
    assert [type(c).__name__ for c in step.commands] == ["Cancel"]


# ---- releasing ------------------------------------------------------------------------


def test_releasing_job_gone_returns() -> None:
    lse = lease(S.RELEASING)
    assert one(lse, observe()) == Step(
        1, (), Move(1, S.RELEASING, S.RETURNED, "job gone, node back with Slurm")
    )


@pytest.mark.parametrize(("reserved", "commands"), [(True, (Unfence("stb-lease-1"),)), (False, ())])
def test_releasing_drain_lease_lifts_its_fence_only_when_it_exists(
    reserved: bool, commands: tuple[Unfence, ...]
) -> None:
    lse = lease(S.RELEASING, on="n5", mode="drain")
    obs = observe(reservations=["stb-lease-1"] if reserved else ["stb-lease-2"])
    assert one(lse, obs) == Step(
        1, commands, Move(1, S.RELEASING, S.RETURNED, "job gone, node back with Slurm")
    )


def test_releasing_preempt_lease_never_unfences() -> None:
    lse = lease(S.RELEASING)
    step = one(lse, observe(reservations=["stb-lease-1"]))
    assert step is not None and step.commands == ()


def test_releasing_job_still_there_is_cancelled_again() -> None:
    lse = lease(S.RELEASING, since=300)
    assert one(lse, with_job(lse, state="COMPLETING")) == Step(
        1, (Cancel("100"),), note="cancelling job 100"
    )


def test_releasing_past_its_deadline_fails() -> None:
    lse = lease(S.RELEASING, since=301)
    assert one(lse, with_job(lse)) == fail(
        lse, "stuck in releasing for 301 s (deadline 300 s); job 100 still RUNNING"
    )


# ---- failed ---------------------------------------------------------------------------


@pytest.mark.parametrize("since", [1.0, 10 * 86400.0], ids=["fresh", "past-deadline"])
def test_failed_cancels_its_job_and_is_never_failed_again(since: float) -> None:
    lse = lease(S.FAILED, since=since)
    assert one(lse, with_job(lse)) == Step(1, (Cancel("100"),), note="cancelling job 100")


@pytest.mark.parametrize(
    ("mode", "reservations", "commands"),
    [
        ("preempt", ["stb-lease-1"], ()),
        ("drain", ["stb-lease-1"], (Unfence("stb-lease-1"),)),
        ("drain", [], ()),
    ],
)
def test_failed_job_gone_cleans_up_and_returns(
    mode: str, reservations: list[str], commands: tuple[Unfence, ...]
) -> None:
    lse = lease(S.FAILED, on="n5" if mode == "drain" else "n3", mode=mode, since=10 * 86400)
    assert one(lse, observe(reservations=reservations)) == Step(
        1, commands, Move(1, S.FAILED, S.RETURNED, "cleaned up after failure")
    )


# ---- deadlines and stuck --------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "mode", "expected"),
    [
        (S.REQUESTED, "preempt", 120),
        (S.REQUESTED, "drain", 120),
        (S.SUBMITTED, "preempt", 600),
        (S.SUBMITTED, "drain", 1860),
        (S.STARTING, "preempt", 300),
        (S.SERVING, "preempt", None),
        (S.DRAINING, "preempt", 330),
        (S.RELEASING, "preempt", 300),
        (S.FAILED, "preempt", 300),
    ],
)
def test_deadline_per_state(state: LeaseState, mode: str, expected: float | None) -> None:
    lse = lease(state, on="n5" if mode == "drain" else "n3", mode=mode)
    assert deadline(lse, SETTINGS) == expected
    if expected is None:
        assert not is_stuck(replace_since(lse, 10**7), SETTINGS, NOW)
    else:
        assert not is_stuck(replace_since(lse, expected), SETTINGS, NOW)
        assert is_stuck(replace_since(lse, expected + 1), SETTINGS, NOW)


def test_settings_of_config() -> None:
    config = BridgeConfig(
        triton={"ready_timeout_s": 77},
        policy={"drain_wait_s": 900},
        leases={"requested_deadline_s": 11, "releasing_deadline_s": 22},
    )
    s = Settings.of(config)
    assert (s.requested_deadline_s, s.starting_deadline_s, s.releasing_deadline_s) == (11, 77, 22)
    assert (s.submitted_deadline_s, s.drain_timeout_s, s.drain_wait_s) == (600, 300, 900)


# ---- every move the planner makes is legal --------------------------------------------

_SCENARIOS = {
    "ready": dict(srv={"models": ("busy",)}),
    "ready-unavailable": dict(srv={"models": (), "unavailable": {"busy": "boom"}}),
    "not-ready": dict(srv={"ready": False, "models": ()}),
    "no-server": dict(),
    "pending": dict(state="PENDING", reason="Priority"),
    "held": dict(state="PENDING", reason="JobHeldAdmin"),
    "node-vanished": dict(nodes=("n1",)),
    "gone": None,
}
_OPEN = [s for s in LeaseState if s != S.RETURNED]


@pytest.mark.parametrize(
    "state",
    _OPEN,
)
def test_every_planned_move_is_legal_and_from_the_planned_state(state: LeaseState) -> None:
    for (name, scenario), since, mode in itertools.product(
        _SCENARIOS.items(), (0.0, 5.0, 10**6), ("preempt", "drain")
    ):
        lse = lease(state, on="n5" if mode == "drain" else "n3", mode=mode, since=since)
        obs = observe() if scenario is None else with_job(lse, **scenario)  # type: ignore[arg-type]
        step = one(lse, obs)
        if step is None or step.move is None:
            continue
        assert step.lease_id == lse.id == step.move.lease_id, name
        assert step.move.old == state, name
        assert allowed(step.move.old, step.move.new), (name, step.move)


# ---- plan(): returned leases, retry backoff -------------------------------------------


def test_plan_ignores_returned_leases() -> None:
    lse = lease(S.RETURNED, since=10**6)
    assert plan(observe(jobs=[job("100", of=lse)]), [lse], NOW, SETTINGS) == []


def test_plan_keeps_lease_order_and_skips_waiting_leases() -> None:
    a = lease(S.REQUESTED, lease_id=1, job_id=None)
    b = lease(S.SUBMITTED, lease_id=2, on="n5", mode="drain", job_id="200")
    c = lease(S.SUBMITTED, lease_id=3, on="n1", job_id="300")
    obs = observe(
        jobs=[
            job("200", of=b, on="n5", state="PENDING", reason="Resources"),
            job("300", of=c, on="n1"),
        ]
    )
    steps = plan(obs, [a, b, c], NOW, SETTINGS)
    assert [s.lease_id for s in steps] == [1, 3]


@pytest.mark.parametrize(("not_before", "planned"), [(NOW + 1, False), (NOW, True), (0.0, True)])
def test_backoff_skips_steps_with_commands(not_before: float, planned: bool) -> None:
    lse = lease(S.REQUESTED, job_id=None)
    steps = plan(observe(), [lse], NOW, SETTINGS, {1: not_before})
    assert bool(steps) is planned
    # another lease's backoff changes nothing for this one
    assert len(plan(observe(), [lse], NOW, SETTINGS, {2: NOW + 100})) == 1


def test_backoff_lets_moves_without_commands_through() -> None:
    waiting = {1: NOW + 60, 2: NOW + 60, 3: NOW + 60}
    running = lease(S.SUBMITTED, lease_id=1)
    overdue = lease(S.REQUESTED, lease_id=2, on="n5", mode="drain", job_id=None, since=121)
    releasing = lease(S.RELEASING, lease_id=3, on="n1", job_id="300")
    obs = observe(jobs=[job("100", of=running)])
    steps = plan(obs, [running, overdue, releasing], NOW, SETTINGS, waiting)
    assert [(s.lease_id, s.move.new if s.move else None, s.commands) for s in steps] == [
        (1, S.STARTING, ()),
        (2, S.FAILED, ()),
        (3, S.RETURNED, ()),
    ]


def test_backoff_holds_a_failed_leases_cancel() -> None:
    lse = lease(S.FAILED)
    assert plan(with_job(lse), [lse], NOW, SETTINGS, {1: NOW + 5}) == []
    assert len(plan(with_job(lse), [lse], NOW + 5, SETTINGS, {1: NOW + 5})) == 1


# ---- plan_return ----------------------------------------------------------------------


def test_return_serving_goes_out_of_routing_then_drains() -> None:
    lse = lease(S.SERVING)
    assert plan_return(lse, "operator", with_job(lse, srv={})) == Step(
        1, (RouteOut(1),), Move(1, S.SERVING, S.DRAINING, "return: operator"), fails_lease=False
    )


@pytest.mark.parametrize("state", [S.SUBMITTED, S.STARTING])
@pytest.mark.parametrize("job_id", ["100", None])
def test_return_on_its_way_cancels_and_releases(state: LeaseState, job_id: str | None) -> None:
    lse = lease(state, job_id=job_id)
    cancel = (Cancel("100"),) if job_id else ()
    assert plan_return(lse, "calm", observe()) == Step(
        1, cancel, Move(1, state, S.RELEASING, "return: calm")
    )


@pytest.mark.parametrize(
    ("mode", "reservations", "commands"),
    [
        ("preempt", ["stb-lease-1"], ()),
        ("drain", ["stb-lease-1"], (Unfence("stb-lease-1"),)),
        ("drain", ["maint"], ()),
    ],
)
def test_return_requested_is_abandoned(
    mode: str, reservations: list[str], commands: tuple[Unfence, ...]
) -> None:
    lse = lease(S.REQUESTED, on="n5" if mode == "drain" else "n3", mode=mode, job_id=None)
    assert plan_return(lse, "drain wait over", observe(reservations=reservations)) == Step(
        1, commands, Move(1, S.REQUESTED, S.RETURNED, "abandoned: drain wait over")
    )


@pytest.mark.parametrize("state", [S.DRAINING, S.RELEASING, S.FAILED, S.RETURNED])
def test_return_of_a_lease_already_leaving_is_none(state: LeaseState) -> None:
    assert plan_return(lease(state), "operator", observe()) is None


# ---- plan_orphans ---------------------------------------------------------------------


def orphans(
    obs: Observation,
    leases: Iterable[LeaseRecord] = (),
    closed: Mapping[int, tuple[int, int]] | None = None,
) -> list[Step]:
    return plan_orphans(obs, list(leases), closed or {}, CONFIG)


@pytest.mark.parametrize("state", ["RUNNING", "PENDING"])
def test_orphans_cancel_the_leaked_job_of_a_closed_lease(state: str) -> None:
    closed = lease(S.RETURNED, lease_id=7)
    obs = observe(jobs=[job("700", of=closed, state=state)])
    assert orphans(obs, closed={7: (7, int(CREATED))}) == [
        Step(None, (Cancel("700"),), note="cancel job 700 of finished lease 7")
    ]


def test_orphans_leave_a_completing_job_of_a_closed_lease() -> None:
    closed = lease(S.RETURNED, lease_id=7)
    obs = observe(jobs=[job("700", of=closed, state="COMPLETING")])
    assert orphans(obs, closed={7: (7, int(CREATED))}) == []


@pytest.mark.parametrize(
    ("on", "pool", "mode"), [("n3", "elastic", "preempt"), ("n5", "training", "drain")]
)
def test_orphans_adopt_an_unknown_running_job_on_a_lendable_node(
    on: str, pool: str, mode: str
) -> None:
    ghost = lease(S.SUBMITTED, lease_id=42, on=on)
    obs = observe(jobs=[job("4200", of=ghost, on=on)])
    assert orphans(obs) == [Step(None, (Adopt("4200", on, pool, mode),))]
    assert lease_refs_to_check(obs, []) == {42}


def test_orphans_adopt_a_partial_lends_job_as_a_lease_of_its_gpus() -> None:
    """A job holding 1 of its node's 4 GPUs is adopted as a lease of 1 GPU, so the node's
    other leases of some GPUs (sharing it, each on its own ports) may stand beside it."""
    ghost = lease(S.SUBMITTED, lease_id=42, on="n3")
    obs = observe(jobs=[dataclasses.replace(job("4200", of=ghost, on="n3"), gpus=1)])
    assert orphans(obs) == [Step(None, (Adopt("4200", "n3", "elastic", "preempt", (), 1),))]


def test_orphans_adopt_a_job_whose_lease_id_names_another_incarnation() -> None:
    ghost = lease(S.SUBMITTED, lease_id=7, created=CREATED - 86400)
    obs = observe(jobs=[job("700", of=ghost)])
    assert orphans(obs, closed={7: (7, int(CREATED))}) == [
        Step(None, (Adopt("700", "n3", "elastic", "preempt"),))
    ]


@pytest.mark.parametrize(
    ("on", "state"),
    [("n1", "RUNNING"), ("n9", "RUNNING"), ("n3", "PENDING")],
    ids=["reserved-node", "no-pool", "pending"],
)
def test_orphans_do_not_adopt(on: str, state: str) -> None:
    ghost = lease(S.SUBMITTED, lease_id=42, on=on)
    obs = observe(jobs=[job("4200", of=ghost, on=on, state=state)], nodes=["n1", "n3", "n9"])
    assert orphans(obs) == []


def test_orphans_leave_open_leases_and_baselines_alone() -> None:
    by_ref = lease(S.REQUESTED, lease_id=1, job_id=None)
    by_id = lease(S.SUBMITTED, lease_id=2, on="n5", job_id="200")
    jobs = [
        job("100", of=by_ref),
        # tagged for another incarnation, but it is the job the open lease 2 holds
        job("200", of=lease(S.RETURNED, lease_id=2, created=1.0), on="n5"),
        job("10", on="n1"),  # baseline
    ]
    assert orphans(observe(jobs=jobs), [by_ref, by_id]) == []


def test_orphans_lift_bridge_reservations_no_open_lease_holds() -> None:
    holder = lease(S.SUBMITTED, lease_id=1, on="n5", mode="drain")
    returned = lease(S.RETURNED, lease_id=3, on="n3")
    obs = observe(
        reservations=["stb-lease-1", "stb-lease-3", "stb-lease-9", "stb-lease-x", "maint"]
    )
    assert orphans(obs, [holder, returned]) == [
        Step(
            None, (Unfence("stb-lease-3"),), note="lifted fence stb-lease-3: no open lease holds it"
        ),
        Step(
            None, (Unfence("stb-lease-9"),), note="lifted fence stb-lease-9: no open lease holds it"
        ),
    ]


def test_orphans_resume_bridge_drained_nodes_no_lease_holds() -> None:
    held = lease(S.SERVING, lease_id=1, on="n5")
    nodes = [
        node("n1", flags={"DRAIN"}, reason="stb: lend"),
        node("n3", flags={"DRAIN"}, reason="admin: bad gpu"),
        node("n5", flags={"DRAIN"}, reason="stb: lend"),
        node("n9", flags=(), reason="stb: old"),
    ]
    assert orphans(observe(nodes=nodes), [held]) == [
        Step(None, (Resume("n1"),), note="resumed n1: bridge drain, no lease")
    ]


# ---- check_operator_lend --------------------------------------------------------------


@pytest.mark.parametrize(
    ("on", "models", "leases", "expected"),
    [
        ("n7", [], [], "refused: Slurm has no node 'n7'"),
        ("n1", [], [], "refused: n1 is in no lendable pool (pool inference)"),
        ("n9", [], [], "refused: n9 is in no lendable pool (pool None)"),
        ("n3", [], [lease(S.FAILED)], "refused: n3 is already lent"),
        ("n3", ["busy", "zz", "aa"], [], "refused: unknown models aa, zz"),
    ],
)
def test_operator_lend_refusals(
    on: str, models: list[str], leases: list[LeaseRecord], expected: str
) -> None:
    obs = observe(nodes=["n1", "n3", "n5", "n9"])
    assert check_operator_lend(on, models, obs, leases, CONFIG) == expected


@pytest.mark.parametrize(
    ("on", "models", "expected"),
    [
        ("n3", ["calm"], ("elastic", "preempt", ("calm",))),
        ("n3", [], ("elastic", "preempt", ("busy", "calm"))),
        ("n5", ["busy"], ("training", "drain", ("busy",))),
    ],
)
def test_operator_lend_accepted(
    on: str, models: list[str], expected: tuple[str, str, tuple[str, ...]]
) -> None:
    returned = lease(S.RETURNED, on=on)  # a returned lease does not hold the node
    assert check_operator_lend(on, models, observe(), [returned], CONFIG) == expected


def test_an_operator_lend_shares_a_node_only_as_a_lease_of_gpus_beside_leases_of_gpus() -> None:
    """n3 (4 GPUs) holds lease 1 of 1 GPU: a lend of 2 more GPUs shares it (it then
    takes a port slot of its own); a whole-node lend, a drain, or more GPUs than the
    leases leave are refused; a node a whole-node lease holds is refused at once."""
    obs = observe()
    one = replace(lease(S.SERVING), lent_gpus=1)
    assert check_operator_lend("n3", ["calm"], obs, [one], CONFIG) == (
        "elastic", "preempt", ("calm",)
    )  # fmt: skip
    assert shared_node_refusal("n3", 2, "preempt", None, obs, [one]) is None
    assert shared_node_refusal("n3", 3, "preempt", None, obs, [one]) is None  # 4 - 1 left
    assert shared_node_refusal("n3", 4, "preempt", None, obs, [one]) == (
        "refused: n3's leases 1 hold all but 3 of its GPUs; the lend takes 4"
    )
    two = replace(lease(S.STARTING, lease_id=2), lent_gpus=2, slot=1)
    assert shared_node_refusal("n3", 2, "preempt", None, obs, [one, two]) == (
        "refused: n3's leases 1, 2 hold all but 1 of its GPUs; the lend takes 2"
    )
    assert shared_node_refusal("n3", None, "preempt", None, obs, [one]) == (
        "refused: n3 is already lent (a whole node or a drain is not shared)"
    )
    assert shared_node_refusal("n3", 1, "drain", None, obs, [one]) is not None
    # slices of a type are checked free elsewhere (`operator_typed`), not counted here
    assert shared_node_refusal("n3", 9, "preempt", "a100_1g.10gb", obs, [one, two]) is None
    # no lease holds the node: nothing to share
    assert shared_node_refusal("n3", None, "preempt", None, obs, []) is None
    whole = lease(S.SERVING)
    assert check_operator_lend("n3", ["calm"], obs, [whole], CONFIG) == (
        "refused: n3 is already lent"
    )


def test_a_second_lease_of_a_shared_node_counts_the_gpus_a_pending_lease_job_waits_for() -> None:
    """n3 (4 GPUs) runs a 2-GPU elastic job; lease 1's Triton job pends there for 1 GPU
    (its victims still being requeued). Lease 2 of 2 GPUs must requeue the elastic job:
    the 2 GPUs free now are not free for it once lease 1's job starts on one."""
    first = replace(lease(S.SUBMITTED, lease_id=1, job_id="100"), lent_gpus=1)
    pending = replace(job("100", of=first, on="n3", state="PENDING"), gpus=1)
    started = datetime.fromtimestamp(NOW - 3600, UTC)
    elastic = Job(
        "50", "train", "elastic", "team", "u", "RUNNING", "None", ("n3",), "", 2, 0,
        started, started,
    )  # fmt: skip
    second = replace(lease(S.REQUESTED, lease_id=2, job_id=None), lent_gpus=2, slot=1)
    obs = observe(jobs=[pending, elastic])
    assert victims_of(second, obs, Settings()) == ("50",)
    # lease 1's own job is not counted against lease 1 (a retried submit of its own)
    assert victims_of(replace(first, state=S.REQUESTED), obs, Settings()) == ()


# ---- operator requests taken again after a failover -----------------------------------

WHY = "operator request 7 by ops"


@pytest.mark.parametrize(
    ("made", "moves", "expected"),
    [
        # killed after the lease was made, before or after its job was submitted
        (lease(S.REQUESTED, job_id=None), [], "lease 1 lending n3"),
        (lease(S.SUBMITTED), [], "lease 1 lending n3"),
        (lease(S.SERVING), [], "lease 1 lending n3"),
        # its submit was refused: the first attempt's own answer
        (
            replace(lease(S.FAILED), reason="submit: sbatch: no"),
            [],
            "failed: lease 1: submit: sbatch: no",
        ),
        (
            replace(lease(S.RETURNED), reason="cleaned up after failure"),
            [
                (S.REQUESTED, WHY),
                (S.FAILED, "submit: sbatch: no"),
                (S.RETURNED, "cleaned up after failure"),
            ],
            "failed: lease 1: submit: sbatch: no",
        ),
        # it served, and was returned before the request was taken again
        (
            lease(S.RETURNED),
            [(S.REQUESTED, WHY), (S.SUBMITTED, "submitted"), (S.RETURNED, "abandoned: calm")],
            "lease 1 lending n3",
        ),
    ],
)
def test_a_lend_taken_again_is_answered_from_its_lease(
    made: LeaseRecord, moves: list[tuple[LeaseState, str]], expected: str
) -> None:
    assert replayed_lend(made, moves) == expected


def test_return_reasons_are_the_moves_plan_return_makes() -> None:
    back, abandoned = return_reasons(WHY)
    serving, requested = lease(S.SERVING), lease(S.REQUESTED, job_id=None)
    step = plan_return(serving, WHY, with_job(serving, srv={}))
    assert step is not None and step.move is not None and step.move.reason == back
    step = plan_return(requested, WHY, observe())
    assert step is not None and step.move is not None and step.move.reason == abandoned


@pytest.mark.parametrize(
    ("state", "moves", "expected"),
    [
        # this request's own move: it drained, released or abandoned the lease
        (S.DRAINING, [(S.SERVING, "ready"), (S.DRAINING, f"return: {WHY}")], "lease 1 returning"),
        (
            S.RETURNED,
            [(S.RELEASING, f"return: {WHY}"), (S.RETURNED, "job gone")],
            "lease 1 returning",
        ),
        (S.RETURNED, [(S.RETURNED, f"abandoned: {WHY}")], "lease 1 returning"),
        # someone else's: another request's, the policy's, a failure's (answered as such)
        (S.DRAINING, [(S.DRAINING, "return: operator request 6 by ops")], None),
        (S.RETURNED, [(S.DRAINING, "return: calm"), (S.RETURNED, "job gone")], None),
        (S.FAILED, [(S.FAILED, f"submit: {WHY}")], None),
    ],
)
def test_a_return_taken_again_finds_its_own_move(
    state: LeaseState, moves: list[tuple[LeaseState, str]], expected: str | None
) -> None:
    assert replayed_return(lease(state), moves, WHY) == expected
