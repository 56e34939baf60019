"""A drain-mode lend of some of a training node's GPUs, on literal inputs: which node the
policy takes (the shortest wait: GPUs free already, else the jobs holding enough GPUs
that end soonest, else the fewest GPUs busy), that it kills nothing and spends none of
the hour's preemption budget, and how its lease is carried: no fence, its Triton job
submitted at once on the node at the top priority, waiting in `submitted` under the
drain deadline and the policy's bounded drain wait, cleaned up as any failed lease. The
JobSpec's priority through sbatch and slurmrestd."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, TritonJobConfig
from bridge.daemon.launcher import triton_job
from bridge.daemon.observation import Observation
from bridge.daemon.planner import (
    Cancel,
    LeaseRecord,
    Move,
    Settings,
    Step,
    Submit,
    plan_lease,
    victims_of,
)
from bridge.lifecycle import LeaseState
from bridge.modelfacts import merge_models, toml_models
from bridge.policy import (
    Action,
    JobView,
    LeaseView,
    Lend,
    ModelSample,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
)
from bridge.policy import decide as policy_decide
from bridge.policy.nodes import choose_nodes, drain_cost, partial, victims_count
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TOP_PRIORITY, TOP_PRIORITY_VALUE, Job, JobSpec, Node
from bridge.slurm.rest import submission
from tests.unit.planner_literals import job

S = LeaseState
NOW = T0 = 1_800_000_000.0
CREATED = NOW - 3600.0
HOUR = 3600.0
SETTINGS = Settings(submitted_deadline_s=600, drain_wait_s=1800)

#: busy's replica takes one GPU; the pools are the defaults (training drains, elastic
#: preempts, inference is reserved)
CONFIG = BridgeConfig(
    models={
        "busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3, instance_gpus=1),
        "echo": ModelConfig(slo_p99_ms=50, min_replicas=1, max_replicas=2),
    },
    policy=PolicyConfig(
        drain_partial_lends=True,
        breach_evaluations=3,
        scale_out_cooldown_s=60,
        max_lent_nodes=2,
        drain_wait_s=300,
    ),
)


RESERVED = NodeView("n4", "inference", True, 4, has_triton=True)
BASELINE = ReplicaView("n4", ("busy", "echo"))


def samples(*p99s: float) -> tuple[ModelSample, ...]:
    """Samples 5 s apart ending at T0, 10 req/s, the tick mean half the p99."""
    n = len(p99s)
    return tuple(
        ModelSample(T0 - (n - 1 - i) * 5.0, p, 10.0, 0.0, p / 2) for i, p in enumerate(p99s)
    )


#: busy over its 100 ms SLO three ticks running: the backstop's breach
BREACH = samples(150, 160, 170)


def running(job_id: str, gpus: int, ends_in: float | None, started: float = T0 - HOUR) -> JobView:
    """A training job holding `gpus` GPUs, ending `ends_in` seconds from T0 (None: no
    time limit)."""
    return JobView(job_id, gpus, started, ends_at=None if ends_in is None else T0 + ends_in)


def train(name: str, *jobs: JobView) -> NodeView:
    return NodeView(name, "training", True, 4, jobs)


def snap(*nodes: NodeView, leases: tuple[LeaseView, ...] = ()) -> Snapshot:
    return Snapshot(
        (*nodes, RESERVED), (BASELINE,), {"busy": BREACH, "echo": samples(10, 10, 10)}, leases
    )


def decide(snapshot: Snapshot, config: BridgeConfig = CONFIG) -> list[Action]:
    return policy_decide(replace(snapshot, models=toml_models(config)), config, T0)


# ---- which node ------------------------------------------------------------------------


def test_a_drain_node_gives_some_of_its_gpus() -> None:
    assert partial(4, 1, "drain", drain=True) and partial(4, 1, "preempt")
    assert not partial(4, 1, "drain")  # drain_partial_lends off: the node is lent whole
    assert not partial(4, 4, "drain", drain=True) and not partial(4, None, "drain", drain=True)
    assert not partial(4, 1, "reserved", drain=True)


def test_the_backstop_takes_the_training_node_whose_jobs_free_the_gpus_soonest() -> None:
    # t1: two 2-GPU jobs, the first to end in 2 h; t2: one 3-GPU job ending in 1 h and a
    # 1-GPU job ending in 10 min (the one GPU is free in 10 min); t3: no time limits
    t1 = train("t1", running("11", 2, 2 * HOUR), running("12", 2, 3 * HOUR))
    t2 = train("t2", running("21", 3, HOUR), running("22", 1, 600))
    t3 = train("t3", running("31", 2, None), running("32", 2, None))
    assert drain_cost(t1, 1, T0) == (2 * HOUR, 4)
    assert drain_cost(t2, 1, T0) == (600, 4)
    assert drain_cost(t2, 2, T0) == (HOUR, 4)  # 1 GPU at 10 min, the second at 1 h
    assert drain_cost(t3, 1, T0) == (float("inf"), 4)
    (a,) = decide(snap(t1, t2, t3))
    assert isinstance(a, Lend) and (a.node, a.lend_mode, a.gpus) == ("t2", "drain", 1)
    # a replica of 2: t2 waits an hour for its 3-GPU job, t1 two hours: t2 still
    two = CONFIG.model_copy(
        update={"models": {**CONFIG.models, "busy": ModelConfig(slo_p99_ms=100, instance_gpus=2)}}
    )
    (a,) = decide(snap(t1, t2, t3), two)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("t2", 2)


def test_with_no_end_known_the_fewest_gpus_busy_go_first() -> None:
    # both wait on jobs with no time limit; u2 has a GPU free beside its job
    u1 = train("u1", running("1", 4, None))
    u2 = train("u2", running("2", 3, None), running("3", 0, None))
    u3 = train("u3", running("4", 2, None), running("5", 1, 600))  # 1 GPU free in 10 min
    assert drain_cost(u2, 2, T0) == (float("inf"), 3)
    got = choose_nodes(snap(u1, u2), CONFIG, T0, 2, waiting=True, gpus=2)
    assert [n.name for n in got] == ["u2", "u1"]
    # a known end beats an unknown one
    got = choose_nodes(snap(u1, u2, u3), CONFIG, T0, 3, waiting=True, gpus=2)
    assert [n.name for n in got] == ["u3", "u2", "u1"]


def test_a_training_node_with_the_gpus_free_costs_nothing_and_serves_capacity() -> None:
    # t1 runs a 2-GPU job: one GPU of it is free now, a lend for a capacity deficit (not
    # the backstop's wait) may take it; t2, all busy, only for the backstop
    t1 = train("t1", running("1", 2, None))
    t2 = train("t2", running("2", 4, 60))
    assert drain_cost(t1, 1, T0) is None  # free already
    assert [n.name for n in choose_nodes(snap(t1, t2), CONFIG, T0, 2, gpus=1)] == ["t1"]
    got = choose_nodes(snap(t2, t1), CONFIG, T0, 2, waiting=True, gpus=1)
    assert [n.name for n in got] == ["t1", "t2"]  # free before any wait
    # whole nodes: a busy training node only for the backstop, as before
    assert choose_nodes(snap(t1, t2), CONFIG, T0, 2) == []


def test_a_drain_lend_kills_nothing_and_spends_no_preemption_budget() -> None:
    t2 = train("t2", running("21", 3, HOUR), running("22", 1, 600))
    assert victims_count(t2, 1, "drain", T0, CONFIG.policy) == 0
    spent = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"max_preemptions_per_hour": 0})}
    )
    (a,) = decide(snap(t2), spent)
    assert isinstance(a, Lend) and (a.node, a.lend_mode, a.gpus) == ("t2", "drain", 1)


def test_a_replica_of_the_whole_node_still_fences_it_whole() -> None:
    whole = CONFIG.model_copy(
        update={"models": {**CONFIG.models, "busy": ModelConfig(slo_p99_ms=100, instance_gpus=4)}}
    )
    t1 = train("t1", running("1", 2, 600))
    (a,) = decide(snap(t1), whole)
    assert isinstance(a, Lend) and (a.node, a.lend_mode, a.gpus) == ("t1", "drain", None)
    off = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"partial_lends": False})}
    )
    (a,) = decide(snap(t1), off)
    assert isinstance(a, Lend) and (a.node, a.gpus) == ("t1", None)


def test_a_partial_drain_lend_still_waiting_past_the_drain_wait_is_returned() -> None:
    t1 = train("t1", running("1", 4, None))
    waiting = LeaseView(
        5, "t1", "training", "drain", S.SUBMITTED, ("busy",), T0 - 301, T0 - 300, "77",
        waiting=True, lent_gpus=1,
    )  # fmt: skip
    actions = decide(snap(t1, leases=(waiting,)))
    assert Return(5, "drain wait over 300s") in actions


# ---- the lease: no fence, the top priority, nothing requeued ----------------------------


def observe(jobs: Iterable[Job] = ()) -> Observation:
    """Slurm shows the training node n5 (4 GPUs) and `jobs`."""
    n5 = Node("n5", "10.0.0.5", ("train",), "mixed", frozenset(), "", "a100", 4, 0)
    return Observation(
        NOW, {"n5": n5}, tuple(jobs), frozenset(), (), {},
        models=merge_models(None, CONFIG.models),
    )  # fmt: skip


def training_job(job_id: str) -> Job:
    return Job(
        job_id, "train", "train", "team-nlp", "u", "RUNNING", "None", ("n5",), "", 2, 0,
        None, None,
    )  # fmt: skip


def fail(lse: LeaseRecord, reason: str) -> Step:
    return Step(lse.id, move=Move(lse.id, lse.state, S.FAILED, reason))


def drain_lease(
    state: LeaseState, *, since: float = 10.0, job_id: str | None = "100"
) -> LeaseRecord:
    return LeaseRecord(
        1, "n5", "training", "drain", state, ("busy",), CREATED, NOW - since, job_id,
        lent_gpus=1,
    )  # fmt: skip


def test_its_job_is_submitted_at_once_at_the_top_priority_without_a_fence() -> None:
    lse = drain_lease(S.REQUESTED, job_id=None)
    obs = observe([training_job("7"), training_job("8")])
    assert plan_lease(lse, obs, NOW, SETTINGS) == Step(
        1,
        (Submit("n5", ("busy",), (1, int(CREATED)), "training", None, 1, top=True),),
        Move(1, S.REQUESTED, S.SUBMITTED, "submitted"),
    )
    assert victims_of(lse, obs, SETTINGS) == ()  # nothing requeued, whatever runs there


def test_its_job_pends_in_submitted_until_the_drain_deadline_then_fails_and_is_cancelled() -> None:
    pending = job("100", of=drain_lease(S.SUBMITTED), on="n5", state="PENDING", reason="Resources")
    # submitted_deadline_s 600, drain_wait_s 1800: the drain lease's deadline is 1860 s
    assert (
        plan_lease(drain_lease(S.SUBMITTED, since=1800), observe([pending]), NOW, SETTINGS) is None
    )
    late = drain_lease(S.SUBMITTED, since=1861)
    assert plan_lease(late, observe([pending]), NOW, SETTINGS) == fail(
        late, "stuck in submitted for 1861 s (deadline 1860 s)"
    )
    failed = drain_lease(S.FAILED)
    assert plan_lease(failed, observe([pending]), NOW, SETTINGS) == Step(
        1, (Cancel("100"),), note="cancelling job 100"
    )
    # its job gone: returned, with no fence to lift
    assert plan_lease(failed, observe(), NOW, SETTINGS) == Step(
        1, move=Move(1, S.FAILED, S.RETURNED, "cleaned up after failure")
    )


def test_it_starts_when_slurm_runs_its_job() -> None:
    lse = drain_lease(S.SUBMITTED)
    run = job("100", of=lse, on="n5")
    assert plan_lease(lse, observe([run]), NOW, Settings()) == Step(
        1, move=Move(1, S.SUBMITTED, S.STARTING, "job 100 running")
    )


# ---- the job's priority through Slurm's interfaces --------------------------------------


def test_the_triton_job_asks_the_top_priority_through_sbatch_and_slurmrestd(
    tmp_path: Path,
) -> None:
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key)
    spec = triton_job(
        cfg, node="n1", models=["busy"], lease=(1, 100), gpus=1, partition="train",
        priority=TOP_PRIORITY,
    )  # fmt: skip
    assert (spec.priority, spec.gpus_per_node, spec.exclusive, spec.reservation) == (
        "TOP",
        1,
        False,
        None,
    )
    assert triton_job(cfg, node="n1", models=["busy"]).priority is None
    seen: list[tuple[str, ...]] = []

    class Recording(SlurmCLI):
        def _run(self, *argv: str, env: object = None) -> str:  # type: ignore[override]
            seen.append(argv)
            return "42\n"

    assert Recording().submit(spec) == "42"
    assert {"--priority=TOP", "--gres=gpu:1", "--nodelist=n1"} <= set(seen[0])
    assert "--exclusive" not in seen[0]
    body = submission(spec, "#!/bin/bash\n", {}, "/")
    assert body["job"]["priority"] == "TOP"
    seen.clear()
    Recording().submit(JobSpec(partition="p", account="a", wrap="true", priority=7))
    assert "--priority=7" in seen[0]
    Recording().submit(JobSpec(partition="p", account="a", wrap="true"))
    assert not any(arg.startswith("--priority") for arg in seen[1])


@pytest.mark.parametrize("bad", ["top", "HIGH", -1, TOP_PRIORITY_VALUE + 1])
def test_a_priority_slurm_would_refuse_is_refused(bad: int | str) -> None:
    with pytest.raises(ValueError, match="priority"):
        JobSpec(partition="p", account="a", wrap="true", priority=bad)
