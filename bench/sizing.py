"""How big should the reserved inference pool be? The bridge at several reserved sizes
beside separate-peak, on one workload: requests within SLO, minutes within SLO, mean job
wait, GPU-hours lost to preemption, lends. The trade-off a site picks its point on.

Baseline (same run): separate-peak, inference owning its peak minute.
Usage:
    STB_TRACES_DIR=... .venv/bin/python bench/sizing.py [--days 3] [--nodes 128]
        [--load 1.1] [--reserve p25,p50,mean,p75,p90] [--arrivals azure|synthetic|ramps]
        [--jobs alibaba|synthetic] [--checkpoint-s 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from bridge.sim.build import build_scenario, model_rates
from bridge.sim.measures import lost_share, wait_mean_s
from bridge.sim.policies import compare, size
from bridge.sim.result import PolicyResult


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--reserve", default="p25,p50,mean,p75,p90")
    parser.add_argument("--arrivals", default="azure")
    parser.add_argument("--jobs", default="alibaba")
    parser.add_argument("--mean-rps", type=float, default=3000.0)
    parser.add_argument("--checkpoint-s", type=float, default=0.0)
    args = parser.parse_args()
    started = time.perf_counter()
    base = build_scenario(
        days=args.days,
        nodes=args.nodes,
        gpus_per_node=8,
        rates=model_rates(4, args.mean_rps),
        slo_ms=100.0,
        service_ms=20.0,
        arrivals=args.arrivals,
        arrivals_trace=None,
        jobs=args.jobs,
        jobs_trace=None,
        load=args.load,
        policies=["separate-peak", "bridge"],
        checkpoint_s=args.checkpoint_s or None,
    )
    (peak,) = compare(base, ["separate-peak"]).results
    rows = []
    for level in args.reserve.split(","):
        scenario = dataclasses.replace(base, reserve=level)
        sizing = size(scenario)
        (bridge,) = compare(scenario, ["bridge"]).results
        rows.append((level, sizing.reserved_nodes, bridge))
        print(f"  {level}: {sizing.reserved_nodes} reserved nodes done", file=sys.stderr)
    sizing = size(base)
    print(
        f"{args.days:g} days, {args.nodes} nodes, load {args.load}, arrivals {args.arrivals}, "
        f"jobs {args.jobs}, checkpoints every {args.checkpoint_s:g} s (0: none); inference "
        f"needs {sizing.mean_nodes} nodes at its mean, {sizing.peak_nodes} at its peak minute"
    )
    head = f"{'set-up':<22}{'reserved':>9}{'req in SLO':>12}{'min in SLO':>12}"
    print(head + f"{'job wait':>10}{'wait/peak':>10}{'lost/elastic':>13}{'lends':>7}")
    peak_wait = wait_mean_s(peak)

    def line(name: str, nodes: int, r: PolicyResult) -> str:
        lost = 100 * lost_share(r)
        return (
            f"{name:<22}{nodes:>9}{100 * r.within_share:>11.2f}%{100 * r.minutes_share:>11.1f}%"
            f"{wait_mean_s(r):>9.0f}s{wait_mean_s(r) / max(peak_wait, 1e-9):>10.2f}{lost:>12.2f}%"
            f"{r.lends:>7}"
        )

    print(line("separate-peak", sizing.peak_nodes, peak))
    for level, nodes, r in rows:
        print(line(f"bridge reserve={level}", nodes, r))
    figures = " ".join(
        f"{level}_nodes={nodes} {level}_within={100 * r.within_share:.2f} "
        f"{level}_wait_ratio={wait_mean_s(r) / max(peak_wait, 1e-9):.2f} "
        f"{level}_lost_pct={100 * lost_share(r):.2f}"
        for level, nodes, r in rows
    )
    print(
        f"RESULT peak_nodes={sizing.peak_nodes} peak_within={100 * peak.within_share:.2f} "
        f"peak_wait_s={peak_wait:.0f} {figures} wall_s={time.perf_counter() - started:.0f}"
    )


if __name__ == "__main__":
    main()
