"""The simulator against reality: one short scenario on the lab with the real reconciler,
then the same scenario in the simulator (`bridge.sim.labcheck` builds its twin: the lab's
nodes, the reconciler's configuration, the same jobs, the load generator's own schedule),
and the two runs must decide the same things in the same order at comparable times.

The scenario is the showcase's, shortened: training on the training nodes, an elastic job
on the elastic node, then (t = 0) the load step on `busy` through nginx, 60 req/s for 50 s
(one instance serves 50/s), then 4 req/s until the lease is returned. The reconciler ticks
on a fixed grid t0 + k x tick_s, as the simulator does. Expected: lend the elastic node
for busy, then return it once Triton's 60 s p99 window has forgotten the slow requests.

The simulator runs twice: with the delays this lab lease took (Slurm's preemption,
Triton's start, the cancel; `labcheck.replayed_timing`), since Slurm's preemption alone
took from 9 to 35 s in four runs, and with the bench's medians
(`Timing()`). The first must agree in order and in time, the second in order.

Tolerances (either way), and why:
- lend: 2 ticks + 1 s. Both see the breach in the first ticks of the step; the lab's tick
  starts a few ms after its grid time and the load generator takes a moment to reach
  its rate.
- return: 12 s + 2 ticks. The return waits for Triton's p99 window to forget the slow
  requests. Triton's summary (prometheus-cpp's defaults: 60 s in 5 age buckets of 12 s)
  forgets a request 48 to 60 s after it completed, in steps of 12 s; the simulator keeps
  exactly 60 s of ticks. busy answers a request in about 22 ms on the lab, not the 20 ms
  the simulator takes from its configuration, so the lab's backlog clears a few seconds
  later. The calm then needs `return_dwell_s` of clean ticks on both.

`pytest -s` prints both timelines side by side: the decisions, each lease's states, and
busy's per-tick p99 / mean / rate / pending as each run's policy saw them.
"""

from __future__ import annotations

import contextlib
import math
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.leases.store import make_engine
from bridge.ledger.lending import read_timelines
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import Schedule, poisson
from bridge.sim import inputs, labcheck
from bridge.sim.engine import Timing
from bridge.sim.result import Decision
from bridge.slurm.cli import SlurmCLI
from bridge.triton.ports import METRICS_PORT

from .helpers import Sender, prometheus_scraping, sbatch, squeue_state, tick_until

pytestmark = pytest.mark.lab

MODEL = "busy"
HEAVY_RATE = 60.0  # req/s: 1.2 x what busy's one 20 ms instance serves
HEAVY_S = 50.0  # long enough for the lend to preempt, start Triton and serve
LIGHT_RATE = 4.0
LOAD_S = 200.0  # the schedule's length; the sender is stopped once the lease is back
DEADLINE_S = 180.0  # from t = 0: the lease must be back by then
#: per model, the rate of successful requests over the last two scrapes: what the
#: reconciler's own counter deltas see each tick
RATE_QUERY = "sum by (model) (irate(nv_inference_request_success[{window:g}s]))"


def _schedule() -> Schedule:
    heavy = poisson(HEAVY_RATE, HEAVY_S, seed=11).offsets
    light = poisson(LIGHT_RATE, LOAD_S - HEAVY_S, seed=12).offsets
    offsets = tuple(heavy) + tuple(HEAVY_S + t for t in light)
    return Schedule(offsets, LOAD_S, f"{HEAVY_RATE:g}/s for {HEAVY_S:g}s, then {LIGHT_RATE:g}/s")


def test_simulator_decides_as_the_lab_does(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    config = rec.config
    tick = config.tick_s
    tolerance = labcheck.Tolerance(
        default_s=2 * tick + 1, per_kind={"lend": 2 * tick + 1, "return": 12 + 2 * tick}
    )
    began = time.monotonic()
    gpus = f"--gres=gpu:{lab.gpus_per_node}"
    training = [
        sbatch(lab, "-p", "train", "-A", "team-vision", "-w", n.name, gpus, "--wrap", "sleep 1800")
        for n in lab.pool_nodes("train")
    ]
    elastic = sbatch(
        lab, "-p", "elastic", "-A", "team-nlp", "--exclusive", gpus, "--requeue",
        "--wrap", "sleep 1800",
    )  # fmt: skip
    log: list[str] = []
    sender: Sender | None = None
    # A real Prometheus scrapes both Triton servers (the baseline and, once lent, the
    # elastic node's) every tick, as a site's would: the twin from recorded data reads the
    # run's request rates from it.
    scraped = [
        f"{n.addr}:{METRICS_PORT}" for n in [*lab.pool_nodes("infer"), *lab.pool_nodes("elastic")]
    ]
    prometheus = contextlib.ExitStack()
    prom_url = prometheus.enter_context(prometheus_scraping(scraped, tick, tmp_path / "prom"))
    try:
        # Before t = 0: the baseline Triton up and scraped twice (so the first tick of
        # the step has counter deltas), every batch job running.
        def ready() -> bool:
            sample = rec.observer.latest(MODEL)
            return (
                sample is not None
                and sample.request_rate is not None
                and all(squeue_state(lab, j)[0] == "RUNNING" for j in [*training, elastic])
            )

        before: list[str] = []
        tick_until(rec, ready, 120, before)
        log += [f"  <0s  {line}" for line in before]
        setup_s = time.monotonic() - began

        schedule = _schedule()
        sender = Sender(endpoint, schedule, MODEL)
        t0 = time.time()
        sender.start()
        lab_decisions: list[Decision] = []
        samples: list[labcheck.Sample] = []
        lease_ids: list[int] = []

        def lease_of(lease_id: int) -> tuple[str, list[str]]:
            lease = rec.store.get(lease_id)
            return lease.node, list(lease.models)

        k = 0
        while True:
            k += 1
            late = time.time() - (t0 + k * tick)
            if late > tick:  # the pass overran a whole tick: back onto the grid
                k += int(late // tick)
            time.sleep(max(0.0, t0 + k * tick - time.time()))
            now = datetime.now(UTC)
            at = now.timestamp() - t0
            report = rec.run_once(now)
            log += [f"{at:6.1f}s {line}" for line in report.lines()]
            lab_decisions += [labcheck.decision_of(a, at, lease_of) for a in report.actions]
            s = rec.observer.latest(MODEL)
            if s is not None:
                samples.append(labcheck.Sample(at, s.p99_ms, s.mean_ms, s.request_rate, s.pending))
            open_ids = [lease.id for lease in rec.store.open_leases() if lease.id is not None]
            lease_ids += [i for i in open_ids if i not in lease_ids]
            if lease_ids and not open_ids and at > HEAVY_S:
                break
            assert at < DEADLINE_S, "the lease was not back in time:\n" + "\n".join(log)
        sender.stop()
        lab_end = at
        transitions = [
            labcheck.Transition(e.at.timestamp() - t0, rank, lease.node, e.to_state.value)
            for rank, lease_id in enumerate(lease_ids, start=1)
            for lease in [rec.store.get(lease_id)]
            for e in rec.store.history(lease_id)
        ]
        # The twin from recorded data: what a site gives `stb simulate`. Its request
        # rates from Prometheus (the sample at T is the rate of the tick before T: irate
        # over the last two scrapes, so the series starts one tick after the step, the
        # grid the reconciler ticked on); its jobs from sacct; its delays from the lease
        # history. Read while Prometheus still runs; the horizon as below.
        horizon = math.ceil((at + 60.0) / tick) * tick
        step_at = datetime.fromtimestamp(t0, UTC)
        until = step_at + timedelta(seconds=horizon)
        time.sleep(2 * tick)  # the last ticks' scrapes
        answer = inputs.query_range(
            prom_url,
            RATE_QUERY.format(window=3 * tick),
            step_at,
            until + timedelta(seconds=tick),
            tick,
        )
    finally:
        if sender is not None:
            sender.stop()
        slurm(lab, "scancel", elastic, *training, check=False)
        prometheus.close()
    lab_s = time.monotonic() - began

    # The simulator on the twin: same nodes, configuration, jobs and requests, run past
    # the lab's end so that a later return still shows. Twice: with the delays this lab
    # lease took (Slurm's preemption, Triton's start, the cancel: they vary from run to
    # run), which is what the tolerances hold it to, and with the bench's medians.
    offsets = {MODEL: [t for t in schedule.offsets if t < horizon]}
    jobs = labcheck.showcase_jobs(lab, training_ids=training, elastic_id=elastic)
    models = list(labcheck.lab_models(config))  # the repository's, with the TOML's overrides
    arrivals = labcheck.arrivals_from_offsets(offsets, models, tick, horizon)
    replayed = labcheck.replayed_timing(transitions, tick)
    pools = labcheck.node_pools(lab, config)
    runs = {}
    for name, timing in (("the lab's delays", replayed), ("the bench's delays", Timing())):
        setup = labcheck.lab_setup(lab, config, jobs, arrivals, horizon, timing=timing)
        runs[name] = labcheck.simulate(setup)
    records = SlurmCLI(env=lab.env()).accounting(step_at - timedelta(minutes=15), until)
    site_jobs = inputs.replay_records(
        records, start=step_at, end=until, kind_of_partition=inputs.partition_kinds(config)
    )
    site_arrivals = inputs.arrivals_from_prometheus(
        answer,
        start=step_at + timedelta(seconds=tick),
        step_s=tick,
        end=until + timedelta(seconds=tick),
    )
    for model in models:  # a model Prometheus has no series of got no request
        site_arrivals.rates.setdefault(model, np.zeros(int(horizon // tick)))
    site_timing, timing_about = inputs.timing_from_leases(
        read_timelines(make_engine(config.database_url), step_at, until),
        lend_mode_of_pool=inputs.lend_modes(config),
        tick_s=tick,
    )
    recorded = labcheck.simulate(
        labcheck.lab_setup(lab, config, site_jobs.jobs, site_arrivals, horizon, timing=site_timing)
    )
    runs["recorded data"] = recorded
    recorded_rows = labcheck.compare_decisions(
        lab_decisions, recorded.result.decisions, pools, tolerance
    )
    twin, bench = runs["the lab's delays"], runs["the bench's delays"]
    rows = labcheck.compare_decisions(lab_decisions, twin.result.decisions, pools, tolerance)
    order_only = labcheck.Tolerance(default_s=math.inf)
    bench_rows = labcheck.compare_decisions(
        lab_decisions, bench.result.decisions, pools, order_only
    )

    c = sender.counters
    print(
        f"\nlab: {setup_s:.0f}s to the baseline, scenario {lab_end:.0f}s, {lab_s:.0f}s in all; "
        f"load {schedule.source}: {c.sent} sent, {c.ok} ok, {c.errors} errors "
        f"(in flight at the stop count as errors), {c.dropped} dropped"
    )
    print(
        f"lab's delays: preemption {replayed.preempt_start_s:.0f}s, Triton ready "
        f"{replayed.triton_ready_s:.0f}s, cancel {replayed.cancel_s:.0f}s (each +-{tick / 2:g}s); "
        f"bench's: {Timing().preempt_start_s:g}s, {Timing().triton_ready_s:g}s, "
        f"{Timing().cancel_s:g}s"
    )
    print(f"tolerance: lend ±{tolerance.of('lend'):g}s, return ±{tolerance.of('return'):g}s")
    print(
        f"recorded data: {site_jobs.about['jobs']} jobs from {site_jobs.about['records']} "
        f"sacct records (left out: {site_jobs.about['left_out']}); {MODEL}'s rate from "
        f"Prometheus, mean {float(np.mean(site_arrivals.rates[MODEL])):.1f} req/s over "
        f"{horizon:g}s (sent: {len(offsets[MODEL]) / horizon:.1f}); delays {timing_about}"
    )
    tables = (
        ("the lab's delays", rows),
        ("the bench's delays", bench_rows),
        ("recorded data (sacct, Prometheus, lease history)", recorded_rows),
    )
    for name, table in tables:
        print(
            f"\ndecisions, simulator with {name} (t: seconds from the load step)\n"
            + labcheck.format_decisions(table)
        )
    for name, trace in runs.items():
        print(
            f"\nlease states, simulator with {name}\n"
            + labcheck.format_transitions(transitions, trace.transitions)
        )
    print(
        f"\n{MODEL} as the policy saw it, lab | simulator with the lab's delays "
        "(ms, req/s; the lab's rate counts answers, the simulator's arrivals)\n"
        + labcheck.format_samples(
            samples, [x for x in twin.samples[MODEL] if x.at_s <= lab_end + tick], tick
        )
    )
    print("\nlab events\n" + "\n".join(log))

    # The scenario did what it is for: one lend of the elastic node for busy, returned.
    elastic_node = lab.pool_nodes("elastic")[0].name
    assert [(d.kind, d.node, d.models) for d in lab_decisions] == [
        ("lend", elastic_node, (MODEL,)),
        ("return", elastic_node, (MODEL,)),
    ], "\n".join(log)
    assert [t.state for t in transitions][-1] == LeaseState.RETURNED.value
    # And the simulator agrees, decision by decision: in time with the lab's delays, in
    # order (kind, node, pool, models) with the bench's.
    assert all(r.ok for r in rows), labcheck.format_decisions(rows)
    assert all(r.ok for r in bench_rows), labcheck.format_decisions(bench_rows)
    # And from the site's own records alone (sacct's jobs, Prometheus's rates, the lease
    # history's delays), in order and in time as with the lab's delays.
    assert all(r.ok for r in recorded_rows), labcheck.format_decisions(recorded_rows)
