"""Issue 32's simulator target: GPU-granular lending beside node-granular, on 8-GPU nodes,
with a model mix whose replicas take 1, 2, 4, 8 and 16 GPUs (16: a gang of two whole
nodes, lent and returned together, all or nothing). Per workload, both modes run on the
same scenario (arrivals, jobs, fleet, policy) in this run; per mode: elastic GPU-hours
lost to requeues (`Fleet.preempt`, counted the same way in both), mean and p95 job wait
(all jobs; p95 of each kind), the share of requests within SLO, lends and lends refused
(a gang or replica with no room); then lost_gpu / lost_node. Baseline: node-granular
(`stb simulate --granularity node`, a lease holds whole nodes as the bridge lends today).

Target (issue 32): GPU-granular lending loses at most half the elastic GPU-hours that
node-granular loses, with job wait no worse (mean and p95 of all jobs) and SLO attainment
unchanged: not more than 0.1 pp below node-granular's.

The scenario: the models m0..m4 (`--models`) at `--mean-rps` / (i + 1), every service
time 20 ms, SLOs 100, 150, 200, 250, 300 ms (`MIX_SLO_MS`): models that differ, so a
lend carries the models late at that time (identical models are late together, and
every lend would carry all five: one replica the size of the largest, a gang, in both
modes). A replica runs one execution per GPU it holds: a whole node's 8 (node mode, or a
replica of 8 or more GPUs), a partial lease's own (`Lend.gpus`: m x k, the replicas' worth
the policy sized it to, `bridge.policy.capacity.plan_lends`), as the daemon's view of
it says (`ReplicaView.gpus` = `LeaseView.lent_gpus`). Under each pair of rows, each
model's share of requests within SLO per mode (`models`).
Placement (`Place`) is off: a placement would give a replica models larger than its
GPUs. The lend cap is `--lend-cap`, one pair of rows per cap (default 100 and 200
leases: the "peak" cap counts nodes that hold every model, which single-model lends run
out of; the verdict is per workload and cap, and `target_met` needs every one).

Workloads: `azure` is the shared traces (Azure LLM arrivals scaled to `--mean-rps`,
Alibaba GPU jobs at `--load`; needs STB_TRACES_DIR, else left out, said on stderr);
`ramps` and `bursty` are the simulator's generated arrivals with the Alibaba jobs (or
generated jobs without STB_TRACES_DIR). One simulated day of 128 nodes by default: each
workload's two runs take some 10-40 s on one core.

`--seed` takes a list: each seed draws other jobs and arrivals from the same traces and
generators, and the verdict is given per seed and as the count met (`met_runs`): one
seed's day turns on a few episodes, and a rule judged on one seed is judged on one day.

Usage:
    STB_TRACES_DIR=... .venv/bin/python bench/gpu_lending.py [--days 1] [--nodes 128]
        [--load 1.1] [--mean-rps 3000] [--workloads azure,ramps] [--lend-cap 100,200]
        [--replica-gpus 1,2,4,8,16] [--seed 0,1,2,3]
        [--ranking largest|per_gpu [--lease-cost GPU_S] [--shared]] [--return-slack F]
        [--timeline]

`--ranking`, `--lease-cost` and `--shared` set GPU mode's `[policy] lend_ranking`,
`lease_cost_gpu_s` and `shared_lends` (node mode lends whole nodes either way).
`--return-slack` sets GPU mode's `[policy] return_slack` (node mode keeps the default,
0: bench/README says what node mode does with it).
`--timeline` prints each run's capacity and pending jobs over the day beside node mode's
(`timeline`).
"""

from __future__ import annotations

import argparse
import sys
import time

from bridge.config import PolicyConfig
from bridge.paths import traces_dir
from bridge.sim.build import build_scenario, model_rates
from bridge.sim.lending import parse_replica_gpus
from bridge.sim.measures import wait_mean_s
from bridge.sim.policies import compare
from bridge.sim.result import PolicyResult

#: the models' SLOs (ms), cycled; every service time is SERVICE_MS
MIX_SLO_MS = (100.0, 150.0, 200.0, 250.0, 300.0)
SERVICE_MS = 20.0
#: SLO attainment may fall this far (percentage points) and still count as unchanged
SLO_SLACK_PP = 0.1
MODES = ("node", "gpu")


def wait_p95_s(r: PolicyResult) -> float:
    """The larger of the job kinds' p95 waits (the result keeps a p95 per kind)."""
    return max((q.wait_p95_s for q in r.queues.values()), default=0.0)


def run_workload(
    args: argparse.Namespace, workload: str, cap: str, traces: bool, seed: int
) -> dict[str, PolicyResult]:
    """Both modes on the workload's scenario at `seed`: mode -> result."""
    rates = model_rates(args.models, args.mean_rps)
    models = {m: (MIX_SLO_MS[i % len(MIX_SLO_MS)], SERVICE_MS) for i, m in enumerate(rates)}
    sizes = parse_replica_gpus(args.replica_gpus, list(rates))
    out: dict[str, PolicyResult] = {}
    for mode in MODES:
        scenario = build_scenario(
            days=args.days,
            nodes=args.nodes,
            gpus_per_node=8,
            rates=rates,
            slo_ms=MIX_SLO_MS[0],
            service_ms=SERVICE_MS,
            arrivals=workload,
            arrivals_trace=None,
            jobs="alibaba" if traces else "synthetic",
            jobs_trace=None,
            load=args.load,
            policies=["bridge"],
            seed=seed,
            lend_cap=cap,
            policy=PolicyConfig(
                placement=False,
                sized_lends=True,
                lend_ranking=args.ranking,
                lease_cost_gpu_s=args.lease_cost,
                shared_lends=args.shared,
                return_slack=args.return_slack if mode == "gpu" else 0.0,
            ),
            models=models,
            granularity=mode,
            replica_gpus=sizes,
        )
        out[mode] = compare(scenario, ["bridge"]).results[0]
    return out


def row(workload: str, mode: str, r: PolicyResult) -> str:
    refused = sum(1 for d in r.decisions if d.kind == "refused")
    return (
        f"{workload:<10} {mode:<5} {r.gpu_hours_lost:>10.2f} {r.preemptions:>6} "
        f"{wait_mean_s(r):>9.1f} {wait_p95_s(r):>9.1f} {100 * r.within_share:>9.3f} "
        f"{r.lends:>6} {refused:>7} {r.wall_s:>6.1f}"
    )


def timeline(label: str, got: dict[str, PolicyResult]) -> list[str]:
    """Both modes' capacity over the run (`--timeline`), one row an hour and one at every
    sample where a mode's worst p99 is over its SLO: requests/s, then per mode the worst
    p99 over SLO, the GPUs serving, the nodes held lent and the jobs pending (training /
    elastic). Where GPU mode misses and node mode does not, it shows whether GPU mode
    lacked GPUs then, and since when; where its jobs wait longer, which queue grew."""
    node, gpu = got["node"].series, got["gpu"].series
    step = got["gpu"].series_step_s
    per_hour = max(1, round(3600.0 / step))
    mode_head = "p99/SLO GPUs lent pend t/e"
    out = [f"{label:<10} {'hour':>6} {'req/s':>8}   node: {mode_head}   gpu: {mode_head}"]

    def cells(s: dict[str, list[float]], i: int) -> str:
        return (
            f"{s['worst_p99_over_slo'][i]:>7.2f} {s['gpus_inference'][i]:>4.0f} "
            f"{s['lent_nodes'][i]:>4.0f} {s['pending_training'][i]:>4.0f}/"
            f"{s['pending_elastic'][i]:<4.0f}"
        )

    for i, worst in enumerate(gpu["worst_p99_over_slo"]):
        late = max(worst, node["worst_p99_over_slo"][i]) > 1.0
        if not late and i % per_hour:
            continue
        out.append(
            f"{label:<10} {i * step / 3600.0:>6.2f} {gpu['requests_per_s'][i]:>8.0f}   "
            f"      {cells(node, i)}        {cells(gpu, i)}{'  late' if late else ''}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--mean-rps", type=float, default=3000.0)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--workloads", default="azure,ramps")
    parser.add_argument("--lend-cap", default="100,200", help="lend caps, comma-separated")
    parser.add_argument("--replica-gpus", default="1,2,4,8,16")
    parser.add_argument(
        "--seed", default="0", help="seeds, comma-separated: each a run of every workload and cap"
    )
    parser.add_argument(
        "--ranking",
        choices=("largest", "per_gpu"),
        default="largest",
        help="GPU mode's [policy] lend_ranking",
    )
    parser.add_argument(
        "--lease-cost",
        type=float,
        default=0.0,
        help="GPU mode's [policy] lease_cost_gpu_s (with --ranking per_gpu)",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="GPU mode's [policy] shared_lends (with --ranking per_gpu)",
    )
    parser.add_argument(
        "--return-slack",
        type=float,
        default=0.0,
        help="GPU mode's [policy] return_slack (0 to 1)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print each run's capacity and pending jobs over the day, both modes (hourly "
        "and when late)",
    )
    args = parser.parse_args()
    if args.ranking != "per_gpu" and (args.shared or args.lease_cost):
        parser.error("--shared and --lease-cost need --ranking per_gpu")
    if not 0.0 <= args.return_slack <= 1.0:
        parser.error(f"--return-slack {args.return_slack:g}: from 0 to 1")
    try:
        seeds = [int(x) for x in args.seed.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--seed {args.seed!r}: integers, comma-separated")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seed {args.seed!r}: one seed or more, each once")
    traces = traces_dir() is not None
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not traces and "azure" in workloads:
        print("STB_TRACES_DIR not set: the azure workload left out", file=sys.stderr)
        workloads.remove("azure")
    print(
        f"{args.days:g} days, {args.nodes} nodes of 8 GPUs, job load {args.load:g}, "
        f"{args.models} models (replica GPUs {args.replica_gpus}; SLOs "
        f"{', '.join(f'{s:g}' for s in MIX_SLO_MS)} ms, service {SERVICE_MS:g} ms), "
        f"lend caps {args.lend_cap}, placement off, seeds {','.join(map(str, seeds))}; "
        f"GPU mode's ranking {args.ranking}"
        f"{f', lease cost {args.lease_cost:g} GPU-s' if args.lease_cost else ''}"
        f"{', shared lends' if args.shared else ''}"
        f"{f', return slack {args.return_slack:g}' if args.return_slack else ''}; "
        f"jobs: {'Alibaba trace' if traces else 'generated'}"
    )
    print(
        f"{'work@cap':<10} {'mode':<5} {'lost GPUh':>10} {'preem':>6} {'wait s':>9} {'p95 s':>9} "
        f"{'SLO %':>9} {'lends':>6} {'refused':>7} {'wall s':>6}"
    )
    started = time.perf_counter()
    verdicts: list[str] = []
    met_runs = 0
    caps = [c.strip() for c in args.lend_cap.split(",") if c.strip()]
    runs = [(w, c, s) for s in seeds for w in workloads for c in caps]
    #: per workload and cap, the seeds met
    met_by: dict[str, list[int]] = {}
    for workload, cap, seed in runs:
        got = run_workload(args, workload, cap, traces, seed)
        label = f"{workload}@{cap}"
        if len(seeds) > 1:
            print(f"-- seed {seed}")
        node, gpu = got["node"], got["gpu"]
        for mode in MODES:
            print(row(label, mode, got[mode]))
        for mode in MODES:
            per = got[mode].models
            shares = " ".join(f"{m} {100 * o.within_share:.3f}" for m, o in per.items())
            print(f"{label:<10} {mode:<5} models: {shares}")
        if args.timeline:
            print("\n".join(timeline(label, got)))
        ratio = gpu.gpu_hours_lost / node.gpu_hours_lost if node.gpu_hours_lost > 0 else None
        lost_ok = gpu.gpu_hours_lost <= 0.5 * node.gpu_hours_lost
        wait_ok = wait_mean_s(gpu) <= wait_mean_s(node) and wait_p95_s(gpu) <= wait_p95_s(node)
        slo_pp = 100 * (gpu.within_share - node.within_share)
        slo_ok = slo_pp >= -SLO_SLACK_PP
        met = lost_ok and wait_ok and slo_ok
        met_runs += met
        if met:
            met_by.setdefault(f"{workload}_cap{cap}", []).append(seed)
        shown = "-" if ratio is None else f"{ratio:.3f}"
        print(
            f"{label:<10} lost_gpu/lost_node {shown} (target <= 0.5: {lost_ok}), wait no "
            f"worse: {wait_ok}, SLO {slo_pp:+.3f} pp (>= -{SLO_SLACK_PP}: {slo_ok})"
        )
        key = f"{workload}_cap{cap}" if len(seeds) == 1 else f"{workload}_cap{cap}_s{seed}"
        verdicts.append(
            f"{key}_lost_node_gpuh={node.gpu_hours_lost:.2f} "
            f"{key}_lost_gpu_gpuh={gpu.gpu_hours_lost:.2f} {key}_ratio={shown} "
            f"{key}_wait_node_s={wait_mean_s(node):.1f} "
            f"{key}_wait_gpu_s={wait_mean_s(gpu):.1f} "
            f"{key}_slo_node_pct={100 * node.within_share:.3f} "
            f"{key}_slo_gpu_pct={100 * gpu.within_share:.3f} {key}_met={met}"
        )
    if len(seeds) > 1:
        for workload, cap in ((w, c) for w in workloads for c in caps):
            key = f"{workload}_cap{cap}"
            got_seeds = met_by.get(key, [])
            print(f"{workload}@{cap}: met at {len(got_seeds)} of {len(seeds)} seeds {got_seeds}")
            verdicts.append(f"{key}_met_seeds={len(got_seeds)}/{len(seeds)}")
    wall = time.perf_counter() - started
    print(
        f"RESULT {' '.join(verdicts)} met_runs={met_runs}/{len(runs)} "
        f"target_met={met_runs == len(runs)} wall_s={wall:.0f}"
    )


if __name__ == "__main__":
    main()
