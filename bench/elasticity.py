"""Issue 29's matrix: the bridge beside separate-peak on several workloads, each with and
without model load times. Per run: requests and minutes within SLO, mean job wait (and its
ratio to separate-peak's), GPU-hours lost to preemption as a share of elastic GPU-hours,
lends a simulated day, how much of the lending is flapping (the share of lends that come
within 15 minutes of a return, and the median return-to-lend gap), and model placements
(`Place`: a lent replica given other models) a simulated day.

Baseline (same run, same workload): separate-peak, inference owning its peak minute; with
`--placement on,off` the bridge with model placement switched off too (`policy.placement`,
the bridge before issue 29's placement). `--mix`: the four models with different
objectives and service times (`MIX`) instead of all 100 ms / 20 ms: with identical models
sharing a replica's GPUs every lend carries every model (all are late together), so
placement has nothing to move; with a mix, lends carry the models late at the time.
`--seasonal on,off`: the bridge without its seasonal forecast too (`seasonal_days = 0`;
`--workloads daily --days 4` is its case: a surge at the same hour each day, met before
it starts from the two days before). `--lend-cap`: the bridge's lend caps (`stb simulate
--lend-cap`), one bridge row each:
peak (the default: the peak's nodes above what it reserves, no more than separate-peak
owns), share:F (F of each lendable pool's nodes, `max_lent_share`) or a node count.
Usage:
    STB_TRACES_DIR=... .venv/bin/python bench/elasticity.py [--days 3] [--nodes 128]
        [--load 1.1] [--workloads azure,ramps,bursty] [--load-s 0,300] [--mean-rps 3000]
        [--placement on|off|on,off] [--seasonal on|off|on,off] [--mix]
        [--lend-cap peak,share:0.5,share:1] [--reserve mean|peak|pNN|N]
        [--cache off,4:10,stage:4:10] [--stage-mbps 250] [--weights-gb 140]
`--cache` (issue 31), a bridge row each: off (every load from the shared repository at
--load-s), N:S (each node keeps the weights of the N models it served last and loads
them in S seconds: `Timing.cache_models`), stage:N:S (the same cache, N models of
--weights-gb each, with the weights staged ahead of the forecast's lends at --stage-mbps
per node: `bridge.sim.weights`), read as `stb simulate --cache` reads it
(`bridge.sim.cache_option`). The policy prefers the nodes holding a lend's weights
and plans its lead time on them in both cache rows. `--warmup-s` (default an hour): the
"warm" column is the requests within SLO after it (every row, separate-peak's too): a
run starts cold (no forecast, empty caches, the bridge's reserved pool under the load),
which one simulated day weighs heavily. The "nodes" column: the inference nodes each
set-up owns (separate-peak: its peak minute's; the bridge: its reserve, `--reserve`).
The azure workload (the shared traces: Azure arrivals, Alibaba jobs) needs
STB_TRACES_DIR; without it, it is left out (said on stderr). The other workloads take
their jobs from the Alibaba trace too where STB_TRACES_DIR is set, else generate them.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import statistics
import sys
import time

from bridge.config import PolicyConfig
from bridge.paths import traces_dir
from bridge.sim.build import build_scenario, model_rates
from bridge.sim.cache_option import CacheOption, parse_cache, with_cache
from bridge.sim.engine import Setup, Timing
from bridge.sim.measures import lost_share, wait_mean_s
from bridge.sim.policies import compare
from bridge.sim.result import PolicyResult
from bridge.sim.weights import DEFAULT_MODEL_BYTES, DEFAULT_STAGE_BYTES_S

DAY_S = 86400.0
#: a lend this soon after a return counts as a re-lend (issue 29: 81% on a bursty trace)
RELEND_S = 900.0
#: `--mix`: model i's (SLO ms, service ms), cycled
MIX = ((100.0, 20.0), (250.0, 40.0), (150.0, 30.0), (400.0, 60.0))


def _pct(share: float | None) -> str:
    """A share as a percentage with two decimals ("-": none)."""
    return "-" if share is None else f"{100 * share:.2f}"


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


def _cache(text: str) -> CacheOption:
    """`--cache`'s value (`bridge.sim.cache_option.parse_cache`; a bad one ends the run
    naming it)."""
    try:
        return parse_cache(text)
    except ValueError as exc:
        sys.exit(str(exc))


def timing(
    models: list[str], load_s: float, cache: CacheOption, gb: float, mbps: float
) -> Timing | None:
    """The run's timing: every model loading in `load_s` from the shared repository, and
    the cache `--cache` names (`bridge.sim.cache_option.with_cache`; None: the default
    timing, no load time)."""
    if not load_s:
        return None
    shared = Timing(model_load_s=dict.fromkeys(models, load_s))
    local = dict.fromkeys(models, cache.local_s or 0.0)
    return with_cache(shared, cache, local, model_bytes=gb * 1e9, stage_bytes_s=mbps * 1e6)


def _cache_label(cache: CacheOption) -> str:
    if not cache.on:
        return ""
    return f", {'staged' if cache.staging else 'cache'} {cache.models}:{cache.local_s or 0.0:g}"


def _cache_key(cache: CacheOption) -> str:
    if not cache.on:
        return ""
    return f"_{'stage' if cache.staging else 'cache'}{cache.models}_{cache.local_s or 0.0:g}"


def places(r: PolicyResult) -> int:
    """Model placements in the run's decisions (all of them: the bench's runs keep fewer
    decisions than `Setup.max_decisions`, checked by the caller)."""
    return sum(1 for d in r.decisions if d.kind == "place")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--workloads", default="azure,ramps,bursty")
    parser.add_argument("--load-s", default="0,300")
    parser.add_argument("--mean-rps", type=float, default=3000.0)
    parser.add_argument("--placement", default="on", help="on, off, or on,off (both rows)")
    parser.add_argument(
        "--seasonal",
        default="on",
        help="on, off, or on,off: the bridge with its seasonal forecast (policy.seasonal_days "
        "at its default) and without (0)",
    )
    parser.add_argument("--mix", action="store_true", help="models of different objectives")
    parser.add_argument(
        "--reserve",
        default="mean",
        help="the bridge's reserved inference nodes: mean, peak, pNN or a count (stb simulate)",
    )
    parser.add_argument(
        "--lend-cap", default="peak", help="the bridge's lend caps, comma-separated: one row each"
    )
    parser.add_argument(
        "--cache",
        default="off",
        help="node-local weight caches, comma-separated, a bridge row each: off, N:S (each "
        "node keeps the weights of the N models it served last and loads them in S seconds "
        "instead of --load-s: `Timing.cache_models`, `local_load_s`), or stage:N:S (the same, "
        "with weights staged ahead of the forecast's lends: `bridge.sim.weights`)",
    )
    parser.add_argument(
        "--stage-mbps",
        type=float,
        default=DEFAULT_STAGE_BYTES_S / 1e6,
        help="stage:N:S's staging bandwidth per node, MB/s",
    )
    parser.add_argument(
        "--weights-gb",
        type=float,
        default=DEFAULT_MODEL_BYTES / 1e9,
        help="each model's weights, GB (stage:N:S: a node's budget is N of them)",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=3600.0,
        help="the warm column leaves out the requests of the run's first this many seconds",
    )
    args = parser.parse_args()
    placements = [p == "on" for p in args.placement.split(",") if p in ("on", "off")]
    caps = [c.strip() for c in args.lend_cap.split(",") if c.strip()]
    seasons = [p == "on" for p in args.seasonal.split(",") if p in ("on", "off")]
    caches = [_cache(c.strip()) for c in args.cache.split(",") if c.strip()]
    runs = [
        (placing, cap, seasonal, cache)
        for cap in caps
        for placing in placements
        for seasonal in seasons
        for cache in caches
    ]
    started = time.perf_counter()
    traces = traces_dir() is not None
    workloads = [w for w in args.workloads.split(",") if w]
    if "azure" in workloads and not traces:
        print("azure left out: STB_TRACES_DIR is not set", file=sys.stderr)
        workloads.remove("azure")
    jobs = "alibaba" if traces else "synthetic"
    loads = [float(x) for x in args.load_s.split(",") if x]
    rates = model_rates(4, args.mean_rps)
    models = {m: MIX[i % len(MIX)] for i, m in enumerate(rates)} if args.mix else None
    print(
        f"{args.days:g} days, {args.nodes} nodes x 8 GPUs, job load {args.load}, jobs {jobs}, "
        f"4 models (m0 {args.mean_rps:g} req/s mean{', a mix of objectives' if args.mix else ''})"
    )
    print(
        f"{'workload':<9}{'load_s':>7} {'set-up':<22}{'nodes':>6}{'req in SLO':>11}"
        f"{'min in SLO':>11}{'warm':>8}{'job wait':>10}{'/peak':>6}{'lost':>7}{'lends/d':>8}"
        f"{'re-lend':>8}{'gap':>7}{'places/d':>9}"
    )
    figures: list[str] = []
    for workload in workloads:
        for load_s in loads:
            peak_wait = 0.0
            for i, (placing, cap, seasonal, cache) in enumerate(runs):
                policies = ["separate-peak", "bridge"] if i == 0 else ["bridge"]
                scenario = build_scenario(
                    days=args.days, nodes=args.nodes, gpus_per_node=8, rates=rates,
                    slo_ms=100.0, service_ms=20.0, arrivals=workload, arrivals_trace=None,
                    jobs=jobs, jobs_trace=None, load=args.load, policies=policies,
                    timing=timing(
                        list(rates), load_s, cache, args.weights_gb, args.stage_mbps
                    ),
                    policy=policy(placing, seasonal), models=models, lend_cap=cap,
                    reserve=args.reserve,
                )  # fmt: skip
                scenario = dataclasses.replace(scenario, warmup_s=args.warmup_s)
                report = compare(scenario, policies)
                results = report.results
                owned = {
                    "separate-peak": report.scenario["inference_nodes_peak"],
                    "bridge": report.scenario["inference_nodes_reserved"],
                }
                if i == 0:
                    peak = results[0]
                    peak_wait = wait_mean_s(peak)
                bridge = results[-1]
                if len(bridge.decisions) >= scenario_cap():
                    print("(decisions capped: places/d undercounted)", file=sys.stderr)
                name = (
                    ("bridge" if placing else "bridge, no place")
                    + ("" if seasonal else ", no season")
                    + ("" if cap == "peak" else f" {cap}")
                    + _cache_label(cache)
                )
                for r in results:
                    share, gap = flapping(r)
                    label = name if r is bridge else r.policy
                    print(
                        f"{workload:<9}{load_s:>7g} {label:<22}{owned[r.policy]:>6}"
                        f"{100 * r.within_share:>10.2f}%"
                        f"{100 * r.minutes_share:>10.1f}%{_pct(r.warm_share):>8}"
                        f"{wait_mean_s(r):>9.0f}s"
                        f"{wait_mean_s(r) / max(peak_wait, 1e-9):>6.2f}{_lost_pct(r):>6.2f}%"
                        f"{r.lends / args.days:>8.0f}{100 * share:>7.0f}%"
                        f"{'-' if gap is None else f'{gap:.0f}s':>7}"
                        f"{places(r) / args.days:>9.0f}",
                        flush=True,
                    )
                key = (
                    f"{workload}_{load_s:g}"
                    + ("" if placing else "_noplace")
                    + ("" if seasonal else "_noseason")
                    + ("" if cap == "peak" else "_cap" + cap.replace(":", "").replace(".", "p"))
                    + _cache_key(cache)
                )
                figures.append(
                    f"{key}_peak_within={100 * peak.within_share:.2f} "
                    f"{key}_within={100 * bridge.within_share:.2f} "
                    f"{key}_peak_warm_within={_pct(peak.warm_share)} "
                    f"{key}_warm_within={_pct(bridge.warm_share)} "
                    f"{key}_wait_ratio={wait_mean_s(bridge) / max(peak_wait, 1e-9):.2f} "
                    f"{key}_lost_pct={_lost_pct(bridge):.2f} "
                    f"{key}_lends_per_day={bridge.lends / args.days:.0f} "
                    f"{key}_places_per_day={places(bridge) / args.days:.0f} "
                    f"{key}_reserved_nodes={owned['bridge']} "
                    f"{key}_peak_nodes={owned['separate-peak']}"
                )
    print(f"RESULT {' '.join(figures)} wall_s={time.perf_counter() - started:.0f}")


def policy(placing: bool, seasonal: bool) -> PolicyConfig:
    """The bridge's policy: its defaults, with placement and the seasonal forecast as
    asked."""
    if seasonal:
        return PolicyConfig(placement=placing)
    return PolicyConfig(placement=placing, seasonal_days=0)


def scenario_cap() -> int:
    """The most decisions a run keeps (`Setup.max_decisions`' default)."""
    return Setup.__dataclass_fields__["max_decisions"].default  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
