"""The batch gate in the reconciler's pass, on the Slurm, Triton and routing fakes
(tests/unit/fakes.py) and a scripted observation: with `[batch]` off nothing changes; on,
the gate is published closed, opens after the calm dwell, and closes in the pass that sees
an online rise, published before that pass's lend is carried out; the batch route's load
(nginx's batch access log says whose load it is) is taken off the rates the policy reads,
so it asks for no lend; unknown counts never hold a lend back. Fast aids for the loop's
logic; nginx itself answering the gate is tests/lab/test_batch_route_nginx.py."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.config import BatchConfig, BridgeConfig
from bridge.daemon.observation import Observation, TritonServer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.modelfacts import ModelFacts, merge_models
from bridge.policy import Lend, ModelSample, history_depth
from bridge.routing.table import RoutingTable
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
BASELINE = TritonServer(BASELINE_JOB, "n1", address_of(N1), True, ("busy", "calm"))
STEP_AT = 30.0


class Scripted:
    """An observer reading a load script: busy's (rate, slow) from `load` (20 ms a
    request; p99 400 ms when slow, else 40), calm at 1 req/s; the fleet fixed."""

    def __init__(self, config: BridgeConfig, load: Callable[[float], tuple[float, bool]]) -> None:
        self.load = load
        self.facts = merge_models(None, config.models)
        depth = history_depth(config)
        self.history: dict[str, deque[ModelSample]] = {
            m: deque(maxlen=depth) for m in self.facts.names
        }

    def observe(self, now: float) -> Observation:
        rate, slow = self.load(now - T0.timestamp())
        p99, pending, mean = (400.0, 30.0, 200.0) if slow else (40.0, 0.0, 21.0)
        self.history["busy"].append(ModelSample(now, p99, rate, pending, mean, 20.0))
        self.history["calm"].append(ModelSample(now, 15.0, 1.0, 0.0, 10.0, 5.0))
        return Observation(
            now,
            {n.name: n for n in (N1, N3, N5)},
            (BASELINE_JOB, ELASTIC_JOB),
            frozenset(),
            (BASELINE,),
            {m: tuple(h) for m, h in self.history.items()},
            models=self.facts,
        )

    def models(self) -> ModelFacts:
        return self.facts

    def close(self) -> None:
        pass


class OrderedRouter(FakeRouter):
    """Records, with each table, how many Slurm writes had been made when it was
    published (a gate published before a lend's submit shows the writes before it)."""

    def __init__(self, slurm: FakeSlurm) -> None:
        super().__init__()
        self.slurm = slurm
        self.writes_at: list[int] = []

    def publish(self, table: RoutingTable) -> object:
        self.writes_at.append(len(self.slurm.writes))
        return super().publish(table)


def rig(
    tmp_path: Path, load: Callable[[float], tuple[float, bool]], **batch: Any
) -> tuple[Reconciler, FakeSlurm, OrderedRouter, Path]:
    cfg = make_config(tmp_path)
    log = tmp_path / "batch-access.log"
    log.write_text("")  # nginx opens it at its reload
    cfg = cfg.model_copy(update={"batch": BatchConfig(access_log=log, **batch)})
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB, ELASTIC_JOB])
    router = OrderedRouter(slurm)
    rec = Reconciler(cfg, slurm, LeaseStore(engine), Scripted(cfg, load), FakeTriton(), router)  # type: ignore[arg-type]
    return rec, slurm, router, log


def batch_requests(log: Path, model: str, n: int) -> None:
    """`n` batch requests to `model` as nginx logs them."""
    with open(log, "a") as f:
        f.write(f"1767528000.000 200 /batch/v2/models/{model}/infer\n" * n)


def gates(router: FakeRouter) -> list[bool | None]:
    return [None if t.batch is None else t.batch.open for t in router.tables]


def test_off_by_default_nothing_is_published_of_it(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    assert cfg.batch.enabled is False
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB, ELASTIC_JOB])
    router = FakeRouter()
    rec = Reconciler(cfg, slurm, LeaseStore(engine), Scripted(cfg, lambda s: (20.0, False)),  # type: ignore[arg-type]
                     FakeTriton(), router)  # fmt: skip
    for s in range(0, 30, 5):
        rec.run_once(at(s))
    assert router.tables and all(t.batch is None for t in router.tables)
    assert rec.batch is None


def test_an_online_rise_closes_the_gate_before_the_lend_in_the_same_pass(
    tmp_path: Path,
) -> None:
    def load(s: float) -> tuple[float, bool]:
        return (200.0, True) if s >= STEP_AT else (20.0, False)

    rec, slurm, router, _ = rig(tmp_path, load, enabled=True, calm_s=20, retry_after_s=15)
    reports = [rec.run_once(at(s)) for s in range(0, 30, 5)]
    # closed until the calm has lasted 20 s, then open
    assert gates(router) == [False, False, False, False, True, True]
    assert reports[4].lines() == ["batch route opened (calm)"]
    assert all(t.batch is not None and t.batch.retry_after_s == 15 for t in router.tables)
    # the step: online load (the batch log shows none), a lend wanted, the gate closed
    published = len(router.tables)
    step = rec.run_once(at(STEP_AT))
    (lend,) = [a for a in step.actions if isinstance(a, Lend)]
    assert lend.node == "n5"  # the idle training node: idle before busy
    assert step.events[0] == "batch route closed: a lend is wanted (n5 for busy, calm)"
    # published closed before the lend's sbatch: the first publish of the pass saw no
    # write of it; the lend was carried out after (its submit among the writes)
    assert router.tables[published].batch is not None
    assert router.tables[published].batch.open is False
    assert router.writes_at[published] == 0
    assert slurm.writes  # the drain lend's reservation and Triton job, after it
    assert all(t.batch is not None and not t.batch.open for t in router.tables[published:])
    assert rec.batch_gate.open is False


def test_the_batch_routes_load_asks_for_no_lend(tmp_path: Path) -> None:
    """busy measures 200 req/s from the step on, 180 of them the batch route's (nginx's
    log): the policy sees the online 20 req/s and lends nothing, now or later (its rate
    history holds online rates); the gate closes on the p99 the batch load made and
    opens again after a calm dwell once it is gone."""

    def load(s: float) -> tuple[float, bool]:
        return (200.0, True) if STEP_AT <= s < STEP_AT + 10 else (20.0, False)

    rec, slurm, router, log = rig(tmp_path, load, enabled=True, calm_s=20)
    for s in range(0, 30, 5):
        rec.run_once(at(s))
    assert rec.batch_gate.open
    batch_requests(log, "busy", 900)  # 180 req/s over the 5 s window
    step = rec.run_once(at(STEP_AT))
    assert not [a for a in step.actions if isinstance(a, Lend)]
    assert step.events == ["batch route closed: busy's p99 is 4.00 x its SLO (closes over 0.8)"]
    snap = rec.last_snapshot
    assert snap is not None and snap.history["busy"][-1].request_rate == 20.0
    # said on the exporter: the gate and the batch route's rate
    assert (step.batch_open, step.batch_rates) == (False, {"busy": 180.0})
    reg = rec.metrics.registry
    assert reg.get_sample_value("stb_batch_gate_open") == 0.0
    assert reg.get_sample_value("stb_batch_request_rate", {"model": "busy"}) == 180.0
    batch_requests(log, "busy", 900)  # in flight while the gate closed
    after = [rec.run_once(at(s)) for s in range(35, 75, 5)]
    assert not [a for r in after for a in r.actions if isinstance(a, Lend)]
    assert slurm.writes == []
    # still slow at 35; calm from 40; open once 20 s of calm have passed (60)
    assert gates(router)[-8:] == [False] * 5 + [True] * 3


def test_unknown_batch_counts_never_hold_a_lend_back(tmp_path: Path) -> None:
    """The log gone (counts unknown): the whole measured load is online's, and the lend is
    made as without batch work."""

    def load(s: float) -> tuple[float, bool]:
        return (200.0, True) if s >= STEP_AT else (20.0, False)

    rec, _, router, log = rig(tmp_path, load, enabled=True, calm_s=20)
    for s in range(0, 30, 5):
        rec.run_once(at(s))
    log.unlink()
    step = rec.run_once(at(STEP_AT))
    assert [a.node for a in step.actions if isinstance(a, Lend)] == ["n5"]
    assert not router.tables[-1].batch.open  # type: ignore[union-attr]
    assert rec.batch_gate.open is False
