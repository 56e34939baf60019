"""The README's demo, run once for the lab tests that read it (not a test module): the
session fixture `demo_run` (tests/lab/conftest.py imports it).

`stb init` writes a configuration from the live cluster and `stb lab demo`
(`bridge.lab.demo.run`) runs with it: a load step on `busy` through nginx makes the
bridge lend the elastic node and return it. Two tests read the one run, since the run is
most of their time (Slurm's preemption, Triton's start, Triton's 60 s p99 window to
forget the step, the return dwell): tests/lab/test_bridge_e2e.py checks what the demo did
(lease states, no failed request, the node back with Slurm, the lend's cost in the
ledger), tests/lab/test_sim_vs_lab.py compares it with its simulated twin. For that
twin the run records, on each of the scenario's passes (they tick on the grid
t0 + k x tick_s from the step's start t0, as the simulator does), the reconciler's
decisions, busy's sample and the open leases; and at its end, as a site would give them,
the jobs from sacct, busy's rate from a real Prometheus that scraped both Triton servers
every tick, and the lease history. Everything is read before the fixture returns, so
the later test reads none of the lab (other tests' jobs and leases come after).
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bridge.config import BridgeConfig
from bridge.daemon.reconciler import Reconciler
from bridge.daemon.report import TickReport
from bridge.lab import demo
from bridge.lab.showcase import ScenarioResult
from bridge.lab.spec import LabSpec
from bridge.leases.store import LeaseStore, make_engine
from bridge.ledger.lending import LeaseTimeline, read_timelines
from bridge.sim import inputs, labcheck
from bridge.sim.result import Decision
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import AccountingRecord
from bridge.triton.ports import METRICS_PORT

from .fixtures import trails_agree
from .helpers import prometheus_scraping, stb

#: the model of the demo's load step
MODEL = "busy"
#: per model, the rate of successful requests over the last two scrapes: what the
#: reconciler's own counter deltas see each tick
RATE_QUERY = "sum by (model) (irate(nv_inference_request_success[{window:g}s]))"
#: how far past the lab's end the twins run (so that a later decision still shows)
PAST_END_S = 60.0


class PassRecorder:
    """The demo scenario's `on_pass`: each pass's decisions, busy's sample and the open
    leases, at the pass's wall time (epoch s; `DemoRun` makes them times from t0)."""

    def __init__(self) -> None:
        self.config: BridgeConfig | None = None
        self.decisions: list[Decision] = []
        self.samples: list[labcheck.Sample] = []
        #: per pass: its time, its report's lines, the ids of the leases open after it
        self.passes: list[tuple[float, list[str], list[int]]] = []

    def __call__(self, rec: Reconciler, now: datetime, report: TickReport) -> None:
        self.config = rec.config
        at = now.timestamp()

        def lease_of(lease_id: int) -> tuple[str, list[str]]:
            lease = rec.store.get(lease_id)
            return lease.node, list(lease.models)

        self.decisions += [labcheck.decision_of(a, at, lease_of) for a in report.actions]
        s = rec.observer.latest(MODEL)
        if s is not None:
            self.samples.append(labcheck.Sample(at, s.p99_ms, s.mean_ms, s.request_rate, s.pending))
        open_ids = [lease.id for lease in rec.store.open_leases() if lease.id is not None]
        self.passes.append((at, report.lines(), open_ids))


@dataclass
class DemoRun:
    """The demo's run on `stb init`'s configuration, and what it recorded. Times in
    seconds are from t0, the step's start (`ScenarioResult.tick_origin`)."""

    toml: Path
    #: the reconciler's configuration (deploy/lab/bridge.toml with init's pools)
    config: BridgeConfig
    #: just before the demo began
    started: datetime
    result: ScenarioResult
    #: what the demo printed
    printed: str
    wall_s: float
    #: the reconciler's decisions from t0 on
    decisions: list[Decision] = field(default_factory=list)
    #: busy as the policy saw it on each pass from t0 on
    samples: list[labcheck.Sample] = field(default_factory=list)
    #: the passes' lines from t0 on, each with its time
    log: list[str] = field(default_factory=list)
    #: the leases open on some pass from t0 on, by id, in the order they were lent
    lease_ids: list[int] = field(default_factory=list)
    #: their state changes (rank 1: the first lend)
    transitions: list[labcheck.Transition] = field(default_factory=list)
    #: the first pass that found every lease back
    lab_end: float = math.nan
    #: the twins' length: PAST_END_S past `lab_end`, in whole ticks
    horizon: float = math.nan
    #: the site's records: Prometheus's answer for RATE_QUERY from t0 over the horizon
    #: (and a tick more), sacct's jobs of the 15 minutes before t0 to the horizon, the
    #: lease history of the demo's database over the horizon
    prometheus_answer: dict[str, Any] = field(default_factory=dict)
    accounting: list[AccountingRecord] = field(default_factory=list)
    timelines: list[LeaseTimeline] = field(default_factory=list)

    @property
    def step_at(self) -> datetime:
        assert self.result.tick_origin is not None
        return datetime.fromtimestamp(self.result.tick_origin, UTC)


def run_demo(lab: LabSpec, work: Path) -> DemoRun:
    toml = work / "bridge.toml"
    made = stb(lab, "init", "-o", str(toml))
    assert made.returncode == 0, made.stdout + made.stderr
    recorder = PassRecorder()
    scraped = [
        f"{n.addr}:{METRICS_PORT}" for n in [*lab.pool_nodes("infer"), *lab.pool_nodes("elastic")]
    ]
    tick = demo.lab_config(lab, toml).tick_s
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        # A real Prometheus scrapes both Triton servers (the baseline and, once lent, the
        # elastic node's) every tick, as a site's would.
        prom_url = stack.enter_context(prometheus_scraping(scraped, tick, work / "prom"))
        started = datetime.now(UTC)
        began = time.monotonic()
        res = demo.run(
            lab,
            Console(file=out, width=160),
            wait_requeued=False,
            pools_from=toml,
            on_pass=recorder,
        )
        wall_s = time.monotonic() - began
        assert recorder.config is not None and res.tick_origin is not None
        config, t0 = recorder.config, res.tick_origin
        run = DemoRun(toml, config, started, res, out.getvalue(), wall_s)
        run.decisions = [replace(d, at_s=d.at_s - t0) for d in recorder.decisions if d.at_s >= t0]
        run.samples = [replace(s, at_s=s.at_s - t0) for s in recorder.samples if s.at_s >= t0]
        for at, lines, open_ids in recorder.passes:
            if at < t0:
                continue
            run.log += [f"{at - t0:6.1f}s {line}" for line in lines]
            run.lease_ids += [i for i in open_ids if i not in run.lease_ids]
            if run.lease_ids and not open_ids and math.isnan(run.lab_end):
                run.lab_end = at - t0
        assert not math.isnan(run.lab_end), "no lease lent and returned:\n" + "\n".join(run.log)
        store = LeaseStore(make_engine(config.database_url))
        run.transitions = [
            labcheck.Transition(e.at.timestamp() - t0, rank, lease.node, e.to_state)
            for rank, lease_id in enumerate(run.lease_ids, start=1)
            for lease in [store.get(lease_id)]
            for e in store.history(lease_id)
        ]
        # The twin from recorded data: what a site gives `stb simulate`. Its request
        # rates from Prometheus (the sample at T is the rate of the tick before T: irate
        # over the last two scrapes, so the series starts one tick after the step, the
        # grid the reconciler ticked on); its jobs from sacct; its delays from the lease
        # history. Read while Prometheus still runs, after the last passes' scrapes.
        run.horizon = math.ceil((run.lab_end + PAST_END_S) / tick) * tick
        until = run.step_at + timedelta(seconds=run.horizon)
        time.sleep(max(0.0, t0 + run.lab_end + 2 * tick - time.time()))
        run.prometheus_answer = inputs.query_range(
            prom_url,
            RATE_QUERY.format(window=3 * tick),
            run.step_at,
            until + timedelta(seconds=tick),
            tick,
        )
    run.accounting = SlurmCLI(env=lab.env()).accounting(run.step_at - timedelta(minutes=15), until)
    run.timelines = read_timelines(make_engine(config.database_url), run.step_at, until)
    return run


@pytest.fixture(scope="session")
def demo_run(lab: LabSpec, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """The README's demo on `stb init`'s configuration, run once a session (`run_demo`);
    its audit trail checked at the end (`trails_agree`)."""
    work = tmp_path_factory.mktemp("demo")
    yield run_demo(lab, work)
    trails_agree(work)
