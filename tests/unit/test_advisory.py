"""The advisory pass (bridge.advise.advisory) on literal observations with an injected
clock: it decides what the reconciler decides on the same observations, records each
decision with the snapshot's key figures and each tick's signal, keeps its shadow leases
across a restart and through a database outage, and writes nothing to Slurm, Triton,
the lease store or the operator requests (`stb daemon --advise` wiring included)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Session, select

from bridge.advise import service as advise_service
from bridge.advise.advisory import Advisor, key_figures
from bridge.config import BridgeConfig
from bridge.daemon import service
from bridge.daemon.observation import Observation, TritonServer
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.advice import AdviceStore
from bridge.leases.models import Lease
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.modelfacts import ModelFacts, merge_models
from bridge.policy import Lend, ModelSample, Place, history_depth
from bridge.slurm.model import Job

from .fakes import (
    BASELINE_JOB,
    N1,
    N3,
    N5,
    T0,
    FakeRouter,
    FakeSlurm,
    FakeTriton,
    address_of,
    at,
    make_config,
)

ELASTIC_JOB = Job("20", "exp", "elastic", "team-nlp", "u", "RUNNING", "None", ("n3",), "", 4, 0,
                  at(-3000), at(-3000))  # fmt: skip
TRAIN_JOB = replace(ELASTIC_JOB, job_id="21", partition="train", nodes=("n5",))
BASELINE = TritonServer(BASELINE_JOB, "n1", address_of(N1), True, ("busy", "calm"))
STEP_AT = 30.0  # seconds after T0: busy's load steps from 20 to 200 req/s


def step(seconds: float) -> float:
    return 200.0 if seconds >= STEP_AT else 20.0


class Scripted:
    """An observer that reads a load script instead of Triton: busy's rate from `load`
    (20 ms a request; slow while over 150 req/s), calm at 1 req/s; the fleet fixed."""

    def __init__(self, config: BridgeConfig, load: Callable[[float], float] = step) -> None:
        self.load = load
        depth = history_depth(config)
        #: the models as the daemon's merge gives them from the TOML alone
        self.facts = merge_models(None, config.models)
        self.history: dict[str, deque[ModelSample]] = {
            m: deque(maxlen=depth) for m in self.facts.names
        }
        self.nodes = {n.name: n for n in (N1, N3, N5)}
        self.jobs: tuple[Job, ...] = (BASELINE_JOB, ELASTIC_JOB, TRAIN_JOB)
        self.closed = False

    def observe(self, now: float) -> Observation:
        rate = self.load(now - T0.timestamp())
        slow = rate > 150
        self.history["busy"].append(
            ModelSample(
                now,
                400.0 if slow else 40.0,
                rate,
                30.0 if slow else 0.0,
                200.0 if slow else 21.0,
                20.0,
            )
        )
        self.history["calm"].append(ModelSample(now, 15.0, 1.0, 0.0, 10.0, 5.0))
        return Observation(
            now,
            dict(self.nodes),
            self.jobs,
            frozenset(),
            (BASELINE,),
            {m: tuple(h) for m, h in self.history.items()},
            models=self.facts,
        )

    def models(self) -> ModelFacts:
        return self.facts

    def close(self) -> None:
        self.closed = True


def config_for(tmp_path: Path, **policy: Any) -> BridgeConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = make_config(tmp_path)
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update=policy)})


def advisor(cfg: BridgeConfig, observer: Any = None) -> tuple[Advisor, AdviceStore]:
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = AdviceStore(engine)
    requests = RequestQueue(engine)
    adv = Advisor(cfg, observer or Scripted(cfg), store, holds=requests.holds, now=at(0))
    return adv, store


def ticks(adv: Any, seconds: range) -> list[Any]:
    return [adv.run_once(at(s)) for s in seconds]


def lends(reports: list[Any]) -> list[tuple[float, Lend]]:
    return [
        ((r.at - T0).total_seconds(), a) for r in reports for a in r.actions if isinstance(a, Lend)
    ]


def test_the_advisory_lends_what_the_reconciler_lends_on_the_same_observations(
    tmp_path: Path,
) -> None:
    cfg = config_for(tmp_path / "a", max_lent_nodes=1)
    adv, _ = advisor(cfg)
    # the reconciler on the very same observations (its Slurm and Triton are fakes that
    # take its writes; the script does not change with them)
    rcfg = config_for(tmp_path / "r", max_lent_nodes=1)
    engine = make_engine(rcfg.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB, ELASTIC_JOB, TRAIN_JOB])
    triton = FakeTriton()
    rec = Reconciler(rcfg, slurm, LeaseStore(engine), Scripted(rcfg), triton, FakeRouter())  # type: ignore[arg-type]
    window = range(0, 60, 5)
    advised = lends(ticks(adv, window))
    active = lends(ticks(rec, window))
    assert advised and active[:1] == advised[:1]
    (when, lend), *_ = advised
    # calm shares busy's node and GPUs, so busy's load is calm's wait too: both go
    assert (when, lend.node, lend.pool, lend.models) == (STEP_AT, "n3", "elastic", ("busy", "calm"))
    # the reconciler acted (its job submitted, the victim requeued); the advisory did not
    assert [op for op, _ in slurm.writes][:2] == ["submit", "requeue"]


def test_an_advised_lend_is_a_shadow_the_next_ticks_see(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=2)
    adv, store = advisor(cfg)
    reports = ticks(adv, range(0, 120, 5))
    advised = lends(reports)
    # each lent node once (its shadow holds it), not again every tick as a pass that
    # forgot its own decisions would: the capacity lend at the step, then (the documented
    # difference) the p99 backstop once the scale-out cooldown from the shadow's serving
    # has run, since a shadow lowers no latency: the script's p99 stays at 400 ms
    assert [(when, lend.node) for when, lend in advised] == [(STEP_AT, "n3"), (100.0, "n5")]
    assert advised[1][1].reason.startswith("p99 400 ms over SLO")
    shadows = {lease.node: lease for lease in adv.book.leases.values()}
    assert shadows["n3"].state == LeaseState.SERVING and shadows["n3"].victims == ("20",)
    # the preemption the lend would have made counts in the policy's budget
    assert adv.last_snapshot is not None and adv.last_snapshot.preemptions_last_hour == 1
    # recorded: the advice with the snapshot's key figures, and every tick's signal
    rows = store.advice_between(at(0), at(200))
    first = rows[0]
    assert (first.kind, first.node, first.pool, first.lend_mode, first.models) == (
        "lend", "n3", "elastic", "preempt", ["busy", "calm"],
    )  # fmt: skip
    assert first.at == at(STEP_AT) and first.shadow_lease == 1 and first.shadow_serving == 0
    busy = first.figures["models"]["busy"]
    assert busy == {"p99_ms": 400.0, "rate": 200.0, "pending": 30.0, "replicas": 1}
    assert first.figures["pools"]["elastic"] == {"nodes": 1, "free": 0, "lendable": 1}
    assert first.figures["pools"]["inference"]["lendable"] == 0
    samples = store.samples_between(at(0), at(200))
    assert len(samples) == 2 * len(reports)  # two models, every tick
    assert {(s.model, s.request_rate) for s in samples if s.at == at(STEP_AT)} == {
        ("busy", 200.0),
        ("calm", 1.0),
    }
    assert all(s.replicas == 1 for s in samples)  # real replicas only: the shadow serves none
    stored = {row.id: row.state for row in store.shadows(at(0))}
    assert stored[1] == "serving"
    assert [(a.node, a.shadow_serving) for a in rows] == [("n3", 0), ("n5", 1)]
    assert all(r.outcome.value == "ok" and not r.active for r in reports)
    assert reports[-1].shadow_states == {"serving": 1, "submitted": 1}  # n5 waits for its job


def test_the_advisory_returns_its_shadow_once_the_load_has_been_calm(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1, return_dwell_s=20, scale_in_cooldown_s=20)
    burst = lambda s: 200.0 if STEP_AT <= s < STEP_AT + 40 else 20.0  # noqa: E731
    adv, store = advisor(cfg, Scripted(cfg, burst))
    ticks(adv, range(0, 200, 5))
    kinds = [(a.kind, a.node) for a in store.advice_between(at(0), at(300))]
    assert kinds == [("lend", "n3"), ("return", "n3")]
    assert adv.book.leases == {}
    (row,) = store.shadows(at(0))
    assert row.state == "returned"


def test_a_restarted_advisory_carries_on_with_its_shadows(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1)
    adv, store = advisor(cfg)
    ticks(adv, range(0, 50, 5))
    assert [lease.node for lease in adv.book.leases.values()] == ["n3"]
    # a new advisory on the same database (the daemon restarted): the shadow is back, so
    # the cap holds and n3 is not advised again
    again = Advisor(cfg, Scripted(cfg), store, now=at(50))
    assert [(x.id, x.node) for x in again.book.leases.values()] == [(1, "n3")]
    assert again.book.preemptions_since(at(0).timestamp()) == 1
    later = ticks(again, range(50, 100, 5))
    assert lends(later) == [] and again.book.next_id == 2


class FlakyStore(AdviceStore):
    """The real store whose first `fail` writes raise `error` (a lost database, by
    default)."""

    def __init__(self, engine: Any, fail: int, error: type[Exception] = OperationalError) -> None:
        super().__init__(engine)
        self.fail = fail
        self.error = error

    def write_tick(self, *args: Any) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise self.error("INSERT", {}, Exception("database is locked"))
        super().write_tick(*args)


def test_rows_the_database_refused_are_written_with_the_next_tick(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1)
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = FlakyStore(engine, fail=2)
    adv = Advisor(cfg, Scripted(cfg), store, now=at(0))
    reports = ticks(adv, range(25, 40, 5))  # 25 (calm), 30 (the lend), 35
    assert [(r.outcome.value, [e.step for e in r.errors]) for r in reports] == [
        ("errors", ["record"]),
        ("errors", ["record"]),
        ("ok", []),
    ]
    assert reports[0].errors[0].kind == "transient" and adv.pending_rows == 0
    (row,) = store.advice_between(at(0), at(100))
    assert (row.kind, row.at) == ("lend", at(30))
    assert len(store.samples_between(at(0), at(100))) == 6  # 3 ticks x 2 models, none lost


def test_rows_the_database_refuses_for_good_are_dropped_and_said_so(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1)
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = FlakyStore(engine, fail=1, error=IntegrityError)
    adv = Advisor(cfg, Scripted(cfg), store, now=at(0))
    first, second = ticks(adv, range(30, 40, 5))
    assert [(e.step, e.kind) for e in first.errors] == [("record", "permanent")]
    assert second.outcome.value == "ok" and adv.pending_rows == 0
    assert store.advice_between(at(0), at(100)) == []  # the lend's row went with its tick
    assert len(store.samples_between(at(0), at(100))) == 2  # the next tick's


def test_the_advisory_writes_nothing_but_its_own_tables(tmp_path: Path) -> None:
    # the real observer over fake Slurm and Triton; the reserved node has no baseline, so
    # the daemon would submit one, and an operator's request waits in the queue
    cfg = config_for(tmp_path)
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [ELASTIC_JOB, TRAIN_JOB])
    triton = FakeTriton()
    requests = RequestQueue(engine)
    request = requests.request_lend("n3", ["busy"], at(0), requested_by="olga")
    store = AdviceStore(engine)
    adv = Advisor(cfg, Observer(slurm, cfg, triton), store, holds=requests.holds, now=at(0))
    reports = ticks(adv, range(0, 30, 5))
    assert slurm.writes == [] and triton.servers == {}
    assert [(a.kind, a.node, a.pool) for a in store.advice_between(at(0), at(60))] == [
        ("baseline", "n1", "inference")  # once, though the node stays without its server
    ]
    assert sum(len(r.actions) for r in reports) == 1
    with Session(engine) as session:
        assert session.exec(select(Lease)).all() == []
    assert request.id is not None
    pending = requests.get(request.id)
    assert pending is not None and pending.done_at is None


def test_a_held_pool_lends_nothing_and_gets_its_shadows_back(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1)
    adv, store = advisor(cfg)
    ticks(adv, range(0, 50, 5))
    RequestQueue(make_engine(cfg.database_url)).hold("elastic", at(50), "olga", "firmware")
    ticks(adv, range(50, 60, 5))
    rows = [(a.kind, a.node, a.reason) for a in store.advice_between(at(0), at(100))]
    assert rows[0][:2] == ("lend", "n3")
    assert rows[1] == ("return", "n3", "pool elastic held by olga")
    assert not any(kind == "lend" for kind, _, _ in rows[1:])


def test_key_figures_count_free_and_lendable_nodes_per_pool(tmp_path: Path) -> None:
    cfg = config_for(tmp_path)
    adv, _ = advisor(cfg)
    adv.run_once(at(0))
    assert adv.last_snapshot is not None
    figures = key_figures(adv.last_snapshot, cfg, at(0).timestamp())
    assert figures["pools"] == {
        "training": {"nodes": 1, "free": 0, "lendable": 0},  # busy: drained only by the backstop
        "elastic": {"nodes": 1, "free": 0, "lendable": 1},  # busy, but preemptable
        "inference": {"nodes": 1, "free": 0, "lendable": 0},
    }
    assert figures["models"]["calm"] == {"p99_ms": 15.0, "rate": 1.0, "pending": 0.0,
                                         "replicas": 1}  # fmt: skip


def test_stb_daemon_advise_is_wired_to_act_on_nothing(tmp_path: Path) -> None:
    cfg = config_for(tmp_path)
    bridge = advise_service.build_advisory(cfg)
    try:
        assert isinstance(bridge.loop, Advisor) and bridge.advisory and not bridge.active
        assert bridge.publisher is None and bridge.ledger is None and bridge.leader is None
        assert service.api_routes(bridge) == []  # no operator API
        assert service.scheduler_for(bridge).get_job("tick") is not None
        assert bridge.metrics.role == "advisory"
        _, body = bridge.metrics.health(cfg.tick_s)
        assert body["role"] == "advisory"
        text = _metrics_text(bridge.metrics)
        assert f'stb_active{{instance="{bridge.metrics.instance}"}} 0.0' in text
    finally:
        bridge.close()
    lock = advise_service.advisory_lock(cfg)
    assert lock.name == cfg.daemon.lock_file.name + ".advise"
    # it needs the key Triton lists a server's models behind, as the daemon does
    nokey = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"key_file": lock})})
    with pytest.raises(service.DaemonError, match="key_file"):
        advise_service.build_advisory(nokey)


def _metrics_text(metrics: Any) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_an_advised_place_gives_the_shadow_its_new_models_and_is_recorded(
    tmp_path: Path,
) -> None:
    cfg = config_for(tmp_path, max_lent_nodes=1)
    adv, store = advisor(cfg)
    ticks(adv, range(0, 50, 5))
    (shadow,) = adv.book.leases.values()
    assert shadow.node == "n3" and shadow.state == LeaseState.SERVING
    view = adv.last_observation
    snap = adv.last_snapshot
    assert view is not None and snap is not None
    report = adv.run_once(at(50))
    row = adv._advise(Place(shadow.id, ("calm",), "placement: calm"), view, snap, at(55), report)
    assert row is not None and (row.kind, row.node, row.models) == ("place", "n3", ["calm"])
    assert adv.book.leases[shadow.id].view.models == ("calm",)
    # a shadow that is not serving (or not there) is not placed
    assert adv._advise(Place(99, ("calm",), "x"), view, snap, at(55), report) is None
    adv._record([row], [], report)
    assert [a.kind for a in store.advice_between(at(0), at(300))] == ["lend", "place"]
    # its stand-in server now holds the new models, and a restart keeps them
    served = adv.book.observation(view).servers
    assert ("calm",) in [s.models for s in served if s.node == "n3"]
    again = Advisor(cfg, Scripted(cfg), store, now=at(60))
    assert again.book.leases[shadow.id].view.models == ("calm",)
