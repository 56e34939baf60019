"""Issue 29's matrix: the bridge beside separate-peak on several workloads, each with and
without model load times. Per run: requests and minutes within SLO, mean job wait (and its
ratio to separate-peak's), GPU-hours lost to preemption as a share of elastic GPU-hours,
lends a simulated day, and how much of the lending is flapping: the share of lends that
come within 15 minutes of a return, and the median return-to-lend gap.

Baseline (same run, same workload): separate-peak, inference owning its peak minute.
Usage:
    STB_TRACES_DIR=... .venv/bin/python bench/elasticity.py [--days 3] [--nodes 128]
        [--load 1.1] [--workloads azure,ramps,bursty] [--load-s 0,300] [--mean-rps 3000]
The azure workload (the shared traces: Azure arrivals, Alibaba jobs) needs
STB_TRACES_DIR; without it, it is left out (said on stderr). The other workloads take
their jobs from the Alibaba trace too where STB_TRACES_DIR is set, else generate them.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time

from bridge.paths import traces_dir
from bridge.sim.build import build_scenario, model_rates
from bridge.sim.engine import Timing
from bridge.sim.measures import lost_share, wait_mean_s
from bridge.sim.policies import compare
from bridge.sim.result import PolicyResult

DAY_S = 86400.0
#: a lend this soon after a return counts as a re-lend (issue 29: 81% on a bursty trace)
RELEND_S = 900.0


def _lost_pct(r: PolicyResult) -> float:
    return 100 * lost_share(r)


def flapping(r: PolicyResult) -> tuple[float, float | None]:
    """(share of lends within RELEND_S of an earlier return, median return-to-lend gap in
    seconds; None without any) from the run's decisions."""
    returns = sorted(d.at_s for d in r.decisions if d.kind == "return")
    gaps: list[float] = []
    lends = 0
    for d in r.decisions:
        if d.kind != "lend":
            continue
        lends += 1
        i = bisect.bisect_right(returns, d.at_s)
        if i:
            gaps.append(d.at_s - returns[i - 1])
    if not lends:
        return 0.0, None
    soon = sum(1 for g in gaps if g <= RELEND_S)
    return soon / lends, (statistics.median(gaps) if gaps else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--workloads", default="azure,ramps,bursty")
    parser.add_argument("--load-s", default="0,300")
    parser.add_argument("--mean-rps", type=float, default=3000.0)
    args = parser.parse_args()
    started = time.perf_counter()
    traces = traces_dir() is not None
    workloads = [w for w in args.workloads.split(",") if w]
    if "azure" in workloads and not traces:
        print("azure left out: STB_TRACES_DIR is not set", file=sys.stderr)
        workloads.remove("azure")
    jobs = "alibaba" if traces else "synthetic"
    loads = [float(x) for x in args.load_s.split(",") if x]
    rates = model_rates(4, args.mean_rps)
    print(
        f"{args.days:g} days, {args.nodes} nodes x 8 GPUs, job load {args.load}, jobs {jobs}, "
        f"4 models (m0 {args.mean_rps:g} req/s mean)"
    )
    print(
        f"{'workload':<9}{'load_s':>7} {'set-up':<14}{'req in SLO':>11}{'min in SLO':>11}"
        f"{'job wait':>10}{'/peak':>6}{'lost':>7}{'lends/d':>8}{'re-lend':>8}{'gap':>7}"
    )
    figures: list[str] = []
    for workload in workloads:
        for load_s in loads:
            scenario = build_scenario(
                days=args.days, nodes=args.nodes, gpus_per_node=8, rates=rates,
                slo_ms=100.0, service_ms=20.0, arrivals=workload, arrivals_trace=None,
                jobs=jobs, jobs_trace=None, load=args.load,
                policies=["separate-peak", "bridge"],
                timing=Timing(model_load_s=dict.fromkeys(rates, load_s)) if load_s else None,
            )  # fmt: skip
            peak, bridge = compare(scenario, ["separate-peak", "bridge"]).results
            peak_wait = wait_mean_s(peak)
            for r in (peak, bridge):
                share, gap = flapping(r)
                per_day = r.lends / args.days
                print(
                    f"{workload:<9}{load_s:>7g} {r.policy:<14}{100 * r.within_share:>10.2f}%"
                    f"{100 * r.minutes_share:>10.1f}%{wait_mean_s(r):>9.0f}s"
                    f"{wait_mean_s(r) / max(peak_wait, 1e-9):>6.2f}{_lost_pct(r):>6.2f}%"
                    f"{per_day:>8.0f}{100 * share:>7.0f}%"
                    f"{'-' if gap is None else f'{gap:.0f}s':>7}",
                    flush=True,
                )
            key = f"{workload}_{load_s:g}"
            figures.append(
                f"{key}_peak_within={100 * peak.within_share:.2f} "
                f"{key}_within={100 * bridge.within_share:.2f} "
                f"{key}_wait_ratio={wait_mean_s(bridge) / max(peak_wait, 1e-9):.2f} "
                f"{key}_lost_pct={_lost_pct(bridge):.2f} "
                f"{key}_lends_per_day={bridge.lends / args.days:.0f}"
            )
    print(f"RESULT {' '.join(figures)} wall_s={time.perf_counter() - started:.0f}")


if __name__ == "__main__":
    main()
