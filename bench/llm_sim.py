"""The simulator on an LLM's token stream: the bridge beside separate-peak (and the other
set-ups) on the shared Azure LLM conversation trace, each request's prompt and output
lengths drawn from the trace's own token columns, the lab LLM's token profile
(`bridge.policy.tokens.SMOL_LAB`: SmolLM2-135M on two cores, two sequences at once) and
TTFT and TPOT objectives. Per set-up: requests within the TTFT SLO, within the TPOT SLO,
within the request (end-to-end) SLO, mean job wait, lends and returns a day. The bridge
sees the LLM as the daemon does (token SLOs, no request SLO, its profile, each tick's
TTFT/TPOT p99s and token rates): `decide`'s token rules size it (`bridge.policy.llm`).

Rows: the trace's arrival shape (`--arrivals azure`), the same with model load times
(`--load-s`, 300 s by default: an LLM's weights), and a synthetic burst workload
(`--arrivals synthetic`: bursts of x3 for 10 minutes, 4 a day). Baseline (same run, same
workload): separate-peak, inference owning its peak minute by the token capacity model.
Usage:
    STB_TRACES_DIR=... .venv/bin/python bench/llm_sim.py [--days 1] [--nodes 128]
        [--rps 2] [--slo-ttft-s 20] [--slo-tpot-ms 30] [--load-s 300]
        [--policies separate-peak,separate-mean,idle-loan,bridge]
Needs STB_TRACES_DIR (the token lengths come from the trace); says so and exits 2
without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from bridge.paths import traces_dir
from bridge.sim.build import AZURE_TRACE, build_scenario
from bridge.sim.engine import Timing
from bridge.sim.measures import wait_mean_s
from bridge.sim.policies import compare
from bridge.sim.tokens import trace_token_models

DAY_S = 86400.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--rps", type=float, default=2.0, help="mean req/s")
    parser.add_argument("--load", type=float, default=1.1, help="batch job load")
    parser.add_argument("--slo-ttft-s", type=float, default=20.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=30.0)
    parser.add_argument("--load-s", type=float, default=300.0, help="model load time row")
    parser.add_argument("--policies", default="separate-peak,separate-mean,idle-loan,bridge")
    args = parser.parse_args()
    folder = traces_dir()
    if folder is None:
        print("STB_TRACES_DIR is not set: the token lengths come from the trace", file=sys.stderr)
        sys.exit(2)
    started = time.perf_counter()
    tokens = trace_token_models(
        folder / AZURE_TRACE, ["llm"], args.slo_ttft_s, args.slo_tpot_ms / 1000.0
    )
    tm = tokens["llm"]
    policies = [p for p in args.policies.split(",") if p]
    print(
        f"{args.days:g} days, {args.nodes} nodes, job load {args.load}; one LLM at "
        f"{args.rps:g} req/s mean, SLOs TTFT p99 {args.slo_ttft_s:g} s, TPOT p99 "
        f"{args.slo_tpot_ms:g} ms (end-to-end {tm.slo_e2e_ms / 1000:.1f} s); a request "
        f"holds one of {tm.profile.sequences} slots for {tm.service_s():.2f} s on average"
    )
    print(
        f"{'workload':<10}{'load_s':>7} {'set-up':<15}{'nodes':>6}{'TTFT in':>9}"
        f"{'TPOT in':>9}{'req in':>9}{'job wait':>10}{'lends/d':>8}{'returns/d':>10}"
    )
    rows = [("azure", 0.0), ("azure", args.load_s), ("synthetic", 0.0)]
    figures: list[str] = []
    for arrivals, load_s in rows:
        scenario = build_scenario(
            days=args.days, nodes=args.nodes, gpus_per_node=8, rates={"llm": args.rps},
            slo_ms=tm.slo_e2e_ms, service_ms=tm.service_s() * 1000.0, arrivals=arrivals,
            arrivals_trace=None, jobs="alibaba", jobs_trace=None, load=args.load,
            policies=policies, tokens=tokens, replica_servers=tm.profile.sequences,
            timing=Timing(model_load_s={"llm": load_s}) if load_s else None,
        )  # fmt: skip
        scenario = dataclasses.replace(scenario, service_cv2=tm.service_cv2())
        results = compare(scenario, policies).results
        key = f"{arrivals}_{load_s:g}"
        by = {r.policy: r for r in results}
        for r in results:
            print(
                f"{arrivals:<10}{load_s:>7g} {r.policy:<15}{r.pools.get('inference', 0):>6}"
                f"{100 * (r.ttft_share or 0):>8.2f}%{100 * (r.tpot_share or 0):>8.2f}%"
                f"{100 * r.within_share:>8.2f}%{wait_mean_s(r):>9.0f}s"
                f"{r.lends / args.days:>8.0f}{r.returns / args.days:>10.0f}",
                flush=True,
            )
        for name in ("separate-peak", "bridge"):
            r = by.get(name)
            if r is None:
                continue
            tag = "peak" if name == "separate-peak" else "bridge"
            figures.append(
                f"{key}_{tag}_ttft={100 * (r.ttft_share or 0):.2f} "
                f"{key}_{tag}_tpot={100 * (r.tpot_share or 0):.2f}"
            )
    print(f"RESULT {' '.join(figures)} wall_s={time.perf_counter() - started:.0f}")


if __name__ == "__main__":
    main()
