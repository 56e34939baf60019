"""Shadow leases (bridge.advise.shadow) on literal observations with an injected clock:
they move through the lease states on the simulator's timing, each move one the
lifecycle table allows, and the advisory's view shows them as the active daemon would
see its real leases (a serving replica, the Triton job on its node, the requeued
victims)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from bridge.advise.shadow import SHADOW_TAG, ShadowBook, ShadowLease
from bridge.daemon.observation import Observation, TritonServer
from bridge.lifecycle import TRANSITIONS, LeaseState, StepTimes
from bridge.policy import LeaseView, Lend
from bridge.sim.engine import Timing
from bridge.slurm.model import TRITON_TAG, Job, Node

S = LeaseState
T0 = 1_800_000_000.0


def node(name: str, partitions: tuple[str, ...]) -> Node:
    return Node(name, f"10.0.0.{name[1:]}", partitions, "idle", frozenset(), "", "a100", 4, 0)


NODES = {n.name: n for n in (node("n3", ("elastic", "infer")), node("n5", ("train",)))}


def job(job_id: str, on: str, restarts: int = 0) -> Job:
    at = datetime.fromtimestamp(T0 - 3000, UTC)
    return Job(job_id, "exp", "elastic", "team-nlp", "u", "RUNNING", "None", (on,), "", 4,
               restarts, at, at)  # fmt: skip


def obs(at: float, jobs: Sequence[Job] = (), nodes: dict[str, Node] | None = None) -> Observation:
    return Observation(at, NODES if nodes is None else nodes, tuple(jobs), frozenset(), (), {})


def lend(node: str = "n3", mode: str = "preempt", pool: str = "elastic") -> Lend:
    return Lend(node, pool, mode, ("busy",), "capacity: busy 72 req/s")


def states(book: ShadowBook, lease_id: int = 1) -> LeaseState | None:
    lease = book.leases.get(lease_id)
    return lease.state if lease is not None else None


def test_the_shadow_timing_is_the_simulators() -> None:
    # the shadows and the simulator's defaults both take the lab's StepTimes
    sim = dataclasses.asdict(Timing())
    for name, value in dataclasses.asdict(StepTimes()).items():
        assert sim[name] == value, name


def test_a_preempt_lend_of_a_busy_node_moves_on_the_simulators_timing() -> None:
    book = ShadowBook()
    victim = job("7", "n3", restarts=0)
    lease, moves = book.lend(lend(), obs(T0, [victim]), T0)
    # requested -> submitted in the lend's own pass, as the reconciler submits at once
    assert [(m.old, m.new) for m in moves] == [(None, S.REQUESTED), (S.REQUESTED, S.SUBMITTED)]
    assert lease.victims == ("7",) and book.preemptions_since(T0 - 3600) == 1
    t = StepTimes()
    run_at = T0 + t.preempt_start_s
    # one state a tick at most, and only once the modelled time has come
    assert book.sync(obs(run_at - 0.1, [victim]), run_at - 0.1) == []
    (m,) = book.sync(obs(run_at, [victim]), run_at)
    assert (m.old, m.new) == (S.SUBMITTED, S.STARTING)
    assert book.sync(obs(run_at + 1, [victim]), run_at + 1) == []
    ready = run_at + t.triton_ready_s
    (m,) = book.sync(obs(ready, [victim]), ready)
    assert (m.old, m.new) == (S.STARTING, S.SERVING)
    # returned: drained at the next tick, the node back cancel_s later
    move = book.return_(1, "quiet", ready + 30)
    assert move is not None and move.new == S.DRAINING
    (m,) = book.sync(obs(ready + 32), ready + 32)
    assert m.new == S.RELEASING
    assert book.sync(obs(ready + 34), ready + 34) == []  # 2 s < cancel_s
    (m,) = book.sync(obs(ready + 36), ready + 36)
    assert m.new == S.RETURNED and book.leases == {}
    changed = book.take_changed()
    assert [x.state for x in changed] == [S.RETURNED] and book.take_changed() == []


def test_a_free_node_starts_sooner_and_a_lend_on_its_way_is_cancelled_at_once() -> None:
    book = ShadowBook()
    lease, _ = book.lend(lend(), obs(T0), T0)
    assert lease.running_at == pytest.approx(T0 + StepTimes().slurm_start_s)
    assert lease.victims == () and book.preemptions_since(0) == 0
    move = book.return_(lease.id, "load fell", T0 + 1)  # its job would still be pending
    assert move is not None and (move.old, move.new) == (S.SUBMITTED, S.RELEASING)
    (m,) = book.sync(obs(T0 + 2), T0 + 2)  # nothing ran: no cancel to wait for
    assert m.new == S.RETURNED


def test_a_drain_lend_waits_for_its_node_to_be_free() -> None:
    book = ShadowBook()
    training = job("9", "n5")
    lease, _ = book.lend(lend("n5", "drain", "training"), obs(T0, [training]), T0)
    assert lease.running_at is None and lease.victims == ()  # nothing is requeued
    for k in range(1, 5):
        assert book.sync(obs(T0 + 5 * k, [training]), T0 + 5 * k) == []
    free_at = T0 + 25
    assert book.sync(obs(free_at), free_at) == []  # its job is given its start now
    t = StepTimes()
    (m,) = book.sync(obs(free_at + t.slurm_start_s), free_at + t.slurm_start_s)
    assert m.new == S.STARTING


def test_the_advisorys_view_shows_shadows_as_real_leases() -> None:
    book = ShadowBook()
    victim = job("7", "n3", restarts=1)
    book.lend(lend(), obs(T0, [victim]), T0)
    view = book.observation(obs(T0 + 1, [victim]))
    stand_in = [j for j in view.jobs if SHADOW_TAG in j.tags]
    assert [(j.nodes, TRITON_TAG in j.tags) for j in stand_in] == [((), True)]  # pending
    requeued = next(j for j in view.jobs if j.job_id == "7")
    # the lend's requeue as the policy's guard reads it: one more restart, resubmitted then
    assert requeued.restarts == 2 and requeued.submit_time == datetime.fromtimestamp(T0, UTC)
    assert view.servers == ()  # not serving yet: no replica
    t = StepTimes()
    for at in (T0 + t.preempt_start_s, T0 + t.preempt_start_s + t.triton_ready_s):
        book.sync(obs(at, [victim]), at)
    assert states(book) == S.SERVING
    view = book.observation(obs(T0 + 10, [victim]))
    assert view.servers == (
        TritonServer(
            next(j for j in view.jobs if SHADOW_TAG in j.tags),
            "n3",
            "10.0.0.3:8000",
            True,
            ("busy",),
        ),
    )
    # a real requeue of the job (Slurm's own count moved) wins over the remembered one
    real = job("7", "n3", restarts=2)
    assert next(j for j in book.observation(obs(T0 + 11, [real])).jobs if j.job_id == "7") == real
    # the would-be requeue is forgotten after remember_s
    assert book.sync(obs(T0 + 3600, [victim]), T0 + 3600) == []
    assert book.preemptions_since(0) == 0


def test_a_shadow_whose_node_vanished_fails_then_is_returned() -> None:
    book = ShadowBook()
    book.lend(lend(), obs(T0), T0)
    gone = {"n5": NODES["n5"]}
    (m,) = book.sync(obs(T0 + 5, nodes=gone), T0 + 5)
    assert (m.old, m.new) == (S.SUBMITTED, S.FAILED)
    (m,) = book.sync(obs(T0 + 10, nodes=gone), T0 + 10)
    assert m.new == S.RETURNED and book.leases == {}


def test_every_move_is_one_the_lifecycle_allows() -> None:
    book = ShadowBook()
    seen = []
    _, moves = book.lend(lend(), obs(T0, [job("7", "n3")]), T0)
    seen += moves
    t = T0
    while book.leases:
        t += 1.0
        seen += book.sync(obs(t), t)
        lease = book.leases.get(1)
        if lease is not None and lease.state == S.SERVING:
            move = book.return_(1, "quiet", t)
            assert move is not None
            seen.append(move)
    assert [m.new for m in seen] == [
        S.REQUESTED, S.SUBMITTED, S.STARTING, S.SERVING, S.DRAINING, S.RELEASING, S.RETURNED,
    ]  # fmt: skip
    assert all(m.old is None or m.new in TRANSITIONS[m.old] for m in seen)


def test_an_advised_baseline_becomes_a_replica_until_a_real_job_is_there() -> None:
    infer = node("n1", ("infer",))
    nodes = {"n1": infer, **NODES}
    book = ShadowBook(baseline_models=("busy", "echo"))
    assert book.baseline("n1", T0) and not book.baseline("n1", T0 + 5)
    view = book.observation(obs(T0, nodes=nodes))
    assert [j.requested_nodes for j in view.jobs] == [("n1",)] and view.servers == ()
    t = StepTimes()
    ready = T0 + t.slurm_start_s + t.triton_ready_s
    (server,) = book.observation(obs(ready, nodes=nodes)).servers
    assert server.node == "n1" and server.models == ("busy", "echo") and server.ready
    real = dataclasses.replace(job("10", "n1"), comment=TRITON_TAG)
    book.sync(obs(ready + 5, [real], nodes), ready + 5)
    assert book.baselines == {}


def test_a_book_carries_on_from_stored_shadows() -> None:
    serving = ShadowLease(LeaseView(4, "n3", "elastic", "preempt", S.SERVING, ("busy",), T0 - 100,
                                    T0 - 90, reason="ready"), victims=("7",))  # fmt: skip
    done = ShadowLease(LeaseView(3, "n5", "training", "drain", S.RETURNED, ("busy",), T0 - 200,
                                 T0 - 150))  # fmt: skip
    book = ShadowBook.restore([done, serving], next_id=5)
    assert list(book.leases) == [4] and book.next_id == 5
    assert book.preemptions_since(T0 - 3600) == 1  # the stored lend's victim still counts
    requeued = next(j for j in book.observation(obs(T0, [job("7", "n3")])).jobs if j.job_id == "7")
    assert requeued.restarts == 1
    (record,) = book.open_records()
    assert (record.id, record.state, record.updated_at) == (4, S.SERVING, T0 - 90)
