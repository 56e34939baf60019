"""The simulator against reality: the README's demo on the lab with the real reconciler
(the `demo_run` fixture, tests/lab/demo_run.py: the run tests/lab/test_bridge_e2e.py also
checks), then the same scenario in the simulator (`bridge.sim.labcheck` builds its twin:
the lab's nodes, the reconciler's configuration, the same jobs, the load generator's own
schedule), and the two runs must decide the same things in the same order at comparable
times.

The scenario is the showcase's (`bridge.lab.showcase`) on `stb init`'s pools and
deploy/lab/bridge.toml's policy: training on the training nodes, an elastic job on the
elastic node, then (t = 0) the load step on `busy` through nginx, 70 req/s for 50 s (one
instance serves under 50/s), then 4 req/s until the lease is returned. The reconciler
ticks on a fixed grid t0 + k x tick_s, as the simulator does. Expected: lend the elastic
node for busy, then return it once Triton's 60 s p99 window has forgotten the slow
requests and the return dwell has passed.

The simulator runs twice: with the delays this lab lease took (Slurm's preemption,
Triton's start, the cancel; `labcheck.replayed_timing`), since Slurm's preemption alone
took from 9 to 35 s in four runs, and with the bench's medians
(`Timing()`). The first must agree in order and in time, the second in order. A third
twin is built from the run's own records as a site would give them (sacct's jobs,
Prometheus's rates, the lease history's delays) and must agree in order and in time.

Tolerances (either way), and why:
- lend: 2 ticks + 1 s. Both see the breach in the first ticks of the step; the lab's tick
  starts a few ms after its grid time and the load generator takes a moment to reach
  its rate.
- return: 12 s + 2 ticks. The return waits for Triton's p99 window to forget the slow
  requests. Triton's summary (prometheus-cpp's defaults: 60 s in 5 age buckets of 12 s;
  Triton 2.51's `--metrics-config` sets the quantiles, not the window) forgets a request
  48 to 60 s after it completed, in steps of 12 s; the simulator keeps exactly 60 s of
  ticks. busy answers a request in about 22 ms on the lab, not the 20 ms the simulator
  takes from its configuration, so the lab's backlog clears a few seconds later. The
  calm then needs `return_dwell_s` of clean ticks on both.

`pytest -s` prints both timelines side by side: the decisions, each lease's states, and
busy's per-tick p99 / mean / rate / pending as each run's policy saw them.
"""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest

from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.sim import inputs, labcheck
from bridge.sim.engine import Timing

from .demo_run import MODEL, DemoRun

pytestmark = pytest.mark.lab


def test_simulator_decides_as_the_lab_does(lab: LabSpec, demo_run: DemoRun) -> None:
    run = demo_run
    config = run.config
    tick = config.tick_s
    tolerance = labcheck.Tolerance(
        default_s=2 * tick + 1, per_kind={"lend": 2 * tick + 1, "return": 12 + 2 * tick}
    )
    res, horizon, lab_decisions = run.result, run.horizon, run.decisions
    step_at = run.step_at

    # The simulator on the twin: same nodes, configuration, jobs and requests, run past
    # the lab's end so that a later return still shows. Twice: with the delays this lab
    # lease took (Slurm's preemption, Triton's start, the cancel: they vary from run to
    # run), which is what the tolerances hold it to, and with the bench's medians.
    offsets = {MODEL: [t for t in res.offsets if t < horizon]}
    jobs = labcheck.showcase_jobs(lab, training_ids=res.training_jobs, elastic_id=res.victim)
    models = list(labcheck.lab_models(config))  # the repository's, with the TOML's overrides
    arrivals = labcheck.arrivals_from_offsets(offsets, models, tick, horizon)
    replayed = labcheck.replayed_timing(run.transitions, tick)
    pools = labcheck.node_pools(lab, config)
    runs = {}
    for name, timing in (("the lab's delays", replayed), ("the bench's delays", Timing())):
        setup = labcheck.lab_setup(lab, config, jobs, arrivals, horizon, timing=timing)
        runs[name] = labcheck.simulate(setup)
    until = step_at + timedelta(seconds=horizon)
    site_jobs = inputs.replay_records(
        run.accounting, start=step_at, end=until, kind_of_partition=inputs.partition_kinds(config)
    )
    site_arrivals = inputs.arrivals_from_prometheus(
        run.prometheus_answer,
        start=step_at + timedelta(seconds=tick),
        step_s=tick,
        end=until + timedelta(seconds=tick),
    )
    for model in models:  # a model Prometheus has no series of got no request
        site_arrivals.rates.setdefault(model, np.zeros(int(horizon // tick)))
    site_timing, timing_about = inputs.timing_from_leases(
        run.timelines, lend_mode_of_pool=inputs.lend_modes(config), tick_s=tick
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

    heavy, light = res.heavy, res.light
    assert heavy is not None and light is not None
    print(
        f"\nlab: the demo took {run.wall_s:.0f}s, scenario {run.lab_end:.0f}s from the step; "
        f"load: {heavy.total.ok} + {light.total.ok} ok, "
        f"{sum(heavy.total.errors.values()) + sum(light.total.errors.values())} errors, "
        f"{heavy.total.dropped + light.total.dropped} dropped"
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
            + labcheck.format_transitions(run.transitions, trace.transitions)
        )
    print(
        f"\n{MODEL} as the policy saw it, lab | simulator with the lab's delays "
        "(ms, req/s; the lab's rate counts answers, the simulator's arrivals)\n"
        + labcheck.format_samples(
            run.samples, [x for x in twin.samples[MODEL] if x.at_s <= run.lab_end + tick], tick
        )
    )
    log = run.log
    print("\nlab events\n" + "\n".join(log))

    # The scenario did what it is for: one lend of the elastic node for busy, returned.
    elastic_node = lab.pool_nodes("elastic")[0].name
    assert [(d.kind, d.node, d.models) for d in lab_decisions] == [
        ("lend", elastic_node, (MODEL,)),
        ("return", elastic_node, (MODEL,)),
    ], "\n".join(log)
    assert [t.state for t in run.transitions][-1] == LeaseState.RETURNED.value
    # And the simulator agrees, decision by decision: in time with the lab's delays, in
    # order (kind, node, pool, models) with the bench's.
    assert all(r.ok for r in rows), labcheck.format_decisions(rows)
    assert all(r.ok for r in bench_rows), labcheck.format_decisions(bench_rows)
    # And from the site's own records alone (sacct's jobs, Prometheus's rates, the lease
    # history's delays), in order and in time as with the lab's delays.
    assert all(r.ok for r in recorded_rows), labcheck.format_decisions(recorded_rows)
