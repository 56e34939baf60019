"""The policy at fleet scale: the cost of one `bridge.policy.decide` call on a synthetic
snapshot of `--nodes` nodes, `--instances` Triton instances and `--models` models, beside
the floor of touching the same data once (the baseline), measured in the same run.

Part `decide` builds, seeded and deterministic, a snapshot as the reconciler would:

- the default pools (training: drain, elastic: preempt, inference: reserved); `--instances`
  reserved inference nodes, each with a Triton job and a baseline replica (`ReplicaView`);
  the other nodes split 60/40 between training and elastic, 1% of them down, 5% idle, the
  rest running jobs (training: one 8-GPU job started up to three days ago; elastic: 1-4
  jobs, 12% of them requeued, half of those within the preemption guard);
- every model on 1-4 baseline replicas chosen at random (about 12 models per replica at
  the default sizes), max_replicas 0-6 above that, an SLO of 20 ms to 1 s;
- `history_depth(config)` samples per model, 5 s apart (a request takes 50 us, so the
  capacity model sees no deficit and the cases exercise the latency rules): about 70%
  steady (p99 between the watermarks, a few with a one-tick spike over the SLO), 20% calm
  (p99 under the low watermark, or no requests at all), 2% without data (no scrape);
- open leases (nodes / 500, at least 5): serving ones with steady models, in-flight ones
  (requested, submitted, starting) carrying models that breach in case (b); `last_lend_at`
  for about 10% of the models, within the scale-out cooldown for some breaching ones;
- `max_lent_nodes` = nodes / 100 (at least 8), so the lend cap leaves room for a lend.

Three cases share the nodes, replicas and leases and differ in the latest samples:
  quiet   nothing breaches, no serving lease is calm: decide returns no action
  breach  models / 200 (at least 8) models breach: some filtered (a lend in flight, the
          cooldown, max_replicas reached), the rest go on one node: a Lend (choose_nodes
          runs over every node)
  calm    the models of one serving lease, past its scale-in cooldown, are calm: a Return
Each is timed `--repeat` times (time.perf_counter, one untimed warm-up), alternating with
the baseline: a plain loop that reads every node's pool, usable and has_triton and every
model's last sample, what any decide must at least read. Printed: median and p95 of each,
and decide's median as a ratio to the baseline's; the build time of the config and of the
snapshot views, for context; "check: ok" when each case gave the action it was built for
(else exit 1).

Part `sim` runs the simulator (`bridge.sim`) on the shared traces (Azure LLM arrivals for
four models, inference about 6% of the fleet; Alibaba GPU jobs at 90% of the GPUs outside
a peak-sized inference pool) at each `--sim-nodes` size for `--sim-days`, and prints the
simulated days per wall second of the bridge policy beside separate pools sized for peak
(the baseline in the same run: the queue and latency model alone, decide never acts).

Part `speed` times the bridge's run at each `--speed` size (nodes:days; default a month
at 1,000 nodes and a day at 10,000, issue 15's targets: 60 s each) on the same traces and
says whether the target is met. Baseline in the same run: the first
`--speed-baseline-days` of the same run with the quiet-tick proof off
(`Setup.prove_quiet = False`, `assess` at every tick) and on; the two results must be
equal (else exit 1), and their wall times give the proof's speed-up. The other speed-ups
(incremental engine state, the policy's faster loops) have no switch: their before is
the figures in docs/benchmarks.md.

No lab needed. Usage:
    .venv/bin/python bench/simulate.py [--part all|decide|sim|speed] [--nodes 10000]
        [--instances 1000] [--models 5000] [--repeat 30] [--seed 1]
        [--sim-nodes 1000,10000] [--sim-days 1,0.1]
        [--speed 1000:30,10000:1] [--speed-baseline-days 1,0.1]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.lifecycle import LeaseState
from bridge.modelfacts import toml_models
from bridge.paths import project_root
from bridge.policy import (
    Action,
    JobView,
    LeaseView,
    Lend,
    ModelSample,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
    decide,
    history_depth,
)
from bridge.sim import build as sim_build
from bridge.sim.engine import Engine
from bridge.sim.policies import Scenario, compare, setup_for, size
from bridge.sim.result import PolicyResult

#: the public traces of the project workspace (development material beside the checkout)
TRACES = project_root().parent / "shared" / "traces"

NOW = 1_800_000_000.0
TICK = 5.0
SLOS = (20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


@dataclass(frozen=True)
class Case:
    name: str
    snapshot: Snapshot
    #: the action the case was built to produce (None: no action at all)
    expect: type[Action] | None


@dataclass(frozen=True)
class Fleet:
    config: BridgeConfig
    cases: tuple[Case, ...]
    config_s: float
    snapshot_s: float
    jobs: int
    samples: int
    leases: int


def _models(n: int, instances: int, rng: random.Random) -> dict[str, ModelConfig]:
    models = {}
    for i in range(n):
        low = min(rng.choice((1, 2, 2, 3, 3, 4)), instances)
        models[f"model-{i:05d}"] = ModelConfig(
            slo_p99_ms=rng.choice(SLOS), min_replicas=low, max_replicas=low + rng.randint(0, 6)
        )
    return models


def _history(
    model: ModelConfig, policy: PolicyConfig, kind: str, rng: random.Random, n: int
) -> tuple[ModelSample, ...]:
    """`n` samples of `kind`: steady, spike (steady with one sample over the SLO), calm,
    idle (calm, no requests), nodata, breach (steady, then breach_evaluations samples over
    the SLO). A request's compute time is 50 us: the capacity model sees no deficit, so
    the cases exercise the measured-latency rules."""
    slo = model.slo_p99_ms
    out = []
    for i in range(n):
        at = NOW - (n - 1 - i) * TICK
        if kind == "nodata":
            out.append(ModelSample(at, None, None))
            continue
        if kind == "idle":
            out.append(ModelSample(at, None, 0.0, 0.0, None))
            continue
        rate = rng.uniform(1.0, 500.0)
        if kind == "calm":
            p99 = slo * rng.uniform(0.05, 0.45)
        elif (kind == "breach" and i >= n - policy.breach_evaluations) or (
            kind == "spike" and i == n - 1
        ):
            p99 = slo * rng.uniform(1.2, 3.0)
        else:
            p99 = slo * rng.uniform(0.55, 0.95)
        out.append(ModelSample(at, p99, rate, 0.0, p99 * rng.uniform(0.55, 0.7), 0.05))
    return tuple(out)


def _jobs(pool: str, rng: random.Random, policy: PolicyConfig, ids: Iterator[int]) -> list[JobView]:
    if pool == "training":
        return [JobView(str(next(ids)), 8, NOW - rng.uniform(600, 3 * 86400))]
    jobs = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.12:  # requeued; half of them within the preemption guard
            guard = policy.preempt_guard_s
            submitted = NOW - (rng.uniform(10, guard) if rng.random() < 0.5 else guard * 2)
            started = min(NOW, submitted + rng.uniform(5, 60))
            restarts = rng.randint(1, 3)
            jobs.append(JobView(str(next(ids)), rng.choice((1, 2)), started, restarts, submitted))
        else:
            started = NOW - rng.uniform(60, 86400)
            jobs.append(JobView(str(next(ids)), rng.choice((1, 2, 4)), started))
    return jobs


def build_fleet(nodes: int, instances: int, n_models: int, seed: int) -> Fleet:
    rng = random.Random(seed)
    if nodes < instances + 10 or instances < 1 or n_models < 10:
        raise SystemExit("need nodes >= instances + 10, instances >= 1, models >= 10")

    start = time.perf_counter()
    policy = PolicyConfig(max_lent_nodes=max(8, nodes // 100))
    config = BridgeConfig(models=_models(n_models, instances, rng), policy=policy)
    # the models as the daemon scales them (no repository here: the TOML's alone)
    specs = toml_models(config)
    config_s = time.perf_counter() - start

    names = list(specs)
    order = names[:]
    rng.shuffle(order)
    n_breach = max(8, n_models // 200)
    n_leases = max(5, nodes // 500)
    # The breaching models: all but one with room below max_replicas.
    models = specs
    room = [m for m in order if models[m].max_replicas > models[m].min_replicas]
    full = [m for m in order if models[m].max_replicas == models[m].min_replicas][:1]
    breach = room[: n_breach - len(full)] + full
    chosen = set(breach)
    rest = [m for m in order if m not in chosen]
    n_calm = len(rest) // 5
    calm, rest = rest[:n_calm], rest[n_calm:]
    n_nodata = len(rest) // 50
    nodata, steady = set(rest[:n_nodata]), rest[n_nodata:]
    calm_set = set(calm)

    start = time.perf_counter()
    # Nodes: the reserved ones first, then training and elastic.
    node_list: list[NodeView] = [
        NodeView(f"inf-{i:05d}", "inference", True, 4, has_triton=True) for i in range(instances)
    ]
    ids = itertools.count(1000)
    jobs = 0
    for i in range(nodes - instances):
        pool = "training" if rng.random() < 0.6 else "elastic"
        usable = rng.random() >= 0.01
        node_jobs = _jobs(pool, rng, policy, ids) if usable and rng.random() >= 0.05 else []
        jobs += len(node_jobs)
        node_list.append(NodeView(f"{pool[:3]}-{i:05d}", pool, usable, 8, tuple(node_jobs)))

    # Baseline replicas: each model on min_replicas reserved nodes.
    placed: list[list[str]] = [[] for _ in range(instances)]
    for name in names:
        for slot in rng.sample(range(instances), specs[name].min_replicas):
            placed[slot].append(name)
    replicas = [ReplicaView(node_list[i].name, tuple(placed[i])) for i in range(instances)]

    # Leases on busy lendable nodes: serving ones hold steady models, in-flight ones carry
    # models that breach in case (b) (the load rose again while the lend was on its way).
    lendable = [i for i, n in enumerate(node_list) if n.pool != "inference" and n.usable and n.jobs]
    lease_nodes = rng.sample(lendable, n_leases)
    S = LeaseState
    states = (S.SERVING, S.SERVING, S.STARTING, S.SUBMITTED, S.REQUESTED)
    leases: list[LeaseView] = []
    last_lend_at: dict[str, float] = {
        name: NOW - rng.uniform(600, 86400) for name in names if rng.random() < 0.1
    }
    steady_pool = iter(steady)
    carried = iter(breach)
    n_carried = 0
    for k, idx in enumerate(lease_nodes):
        node = node_list[idx]
        state = states[k % len(states)]
        mode = "drain" if node.pool == "training" else "preempt"
        lease_id = 100 + k
        if state == S.SERVING:  # past its scale-in cooldown
            on_lease = tuple(next(steady_pool) for _ in range(rng.randint(1, 3)))
            since = NOW - policy.scale_in_cooldown_s - rng.uniform(600, 7200)
            created = since - rng.uniform(30, 300)
            replicas.append(ReplicaView(node.name, on_lease, lease_id))
            node_list[idx] = replace(node, jobs=(), has_triton=True)
        else:
            on_lease = (next(carried),)
            n_carried += 1
            since = None
            created = NOW - rng.uniform(5, min(120, policy.drain_wait_s))
            node_list[idx] = replace(node, has_triton=state == S.STARTING)
        for m in on_lease:
            last_lend_at[m] = created
        leases.append(
            LeaseView(lease_id, node.name, node.pool, mode, state, on_lease, created, since)
        )
    # Two breaching models lent to recently: inside the scale-out cooldown.
    for m in breach[n_carried:][:2]:
        last_lend_at[m] = NOW - policy.scale_out_cooldown_s / 2

    history: dict[str, tuple[ModelSample, ...]] = {}
    depth = history_depth(config)
    for name in names:
        model = specs[name]
        if name in nodata:
            kind = "nodata"
        elif name in calm_set:
            kind = "idle" if rng.random() < 0.1 else "calm"
        else:
            kind = "spike" if rng.random() < 0.05 else "steady"
        history[name] = _history(model, policy, kind, rng, depth)
    quiet = Snapshot(
        tuple(node_list), tuple(replicas), history, tuple(leases), last_lend_at, models=specs
    )
    snapshot_s = time.perf_counter() - start

    breaching = dict(history)
    for name in breach:
        breaching[name] = _history(specs[name], policy, "breach", rng, depth)
    # Case (c) calms the lease that began serving last: decide looks at every other
    # serving lease (oldest first) before it.
    serving = [lease for lease in leases if lease.state == LeaseState.SERVING]
    newest = max(serving, key=lambda lease: lease.serving_since or 0.0)
    calmed = dict(history)
    for name in newest.models:
        calmed[name] = _history(specs[name], policy, "calm", rng, depth)
    cases = (
        Case("quiet", quiet, None),
        Case("breach", replace(quiet, history=breaching), Lend),
        Case("calm", replace(quiet, history=calmed), Return),
    )
    samples = sum(len(h) for h in history.values())
    return Fleet(config, cases, config_s, snapshot_s, jobs, samples, len(leases))


def floor(snapshot: Snapshot, models: list[str]) -> int:
    """The baseline: read every node's pool, usable and has_triton, and every model's last
    sample, once."""
    seen = 0
    for node in snapshot.nodes:
        if node.pool and node.usable and not node.has_triton:
            seen += 1
    history = snapshot.history
    for name in models:
        h = history.get(name)
        if h and h[-1].p99_ms is not None:
            seen += 1
    return seen


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _p95(ts: list[float]) -> float:
    if len(ts) < 2:
        return ts[0]
    return statistics.quantiles(ts, n=20, method="inclusive")[-1]


def _describe(actions: list[Action]) -> str:
    if not actions:
        return "no action"
    parts = []
    for a in actions:
        if isinstance(a, Lend):
            parts.append(f"Lend {a.node} ({a.lend_mode}, {len(a.models)} models)")
        elif isinstance(a, Return):
            parts.append(f"Return lease {a.lease_id}")
        else:
            parts.append(f"StartBaseline {a.node}")
    return ", ".join(parts)


def part_decide(args: argparse.Namespace, result: dict[str, str]) -> int:
    """Time decide on the three cases beside the floor; 0 when every case gave its action.
    Its figures go into `result` (the RESULT line)."""
    fleet = build_fleet(args.nodes, args.instances, args.models, args.seed)
    config = fleet.config
    quiet = fleet.cases[0].snapshot
    names = list(quiet.models)
    print(
        f"decide: {len(quiet.nodes):,} nodes ({args.instances:,} reserved with a baseline "
        f"replica), {fleet.jobs:,} jobs, {len(quiet.replicas):,} replicas, {len(names):,} "
        f"models, {fleet.leases} leases, {fleet.samples:,} samples; {args.repeat} repeats"
    )
    print(
        f"build: config {fleet.config_s * 1e3:.1f} ms, snapshot views "
        f"{fleet.snapshot_s * 1e3:.1f} ms"
    )
    print(
        f"{'case':<7} {'decide median':>13} {'p95':>9} {'floor median':>13} {'p95':>9}"
        f" {'ratio':>7}  actions"
    )
    bad = []
    for case in fleet.cases:
        snapshot = case.snapshot
        gc.collect()  # the build's garbage is not decide's
        actions = decide(snapshot, config, NOW)  # warm-up, and the check
        floor(snapshot, names)
        got = [type(a) for a in actions]
        if got != ([case.expect] if case.expect else []):
            bad.append(f"{case.name}: {_describe(actions)}")
        dt: list[float] = []
        ft: list[float] = []
        for _ in range(args.repeat):
            ft.append(_time(partial(floor, snapshot, names)))
            dt.append(_time(partial(decide, snapshot, config, NOW)))
        d, f = statistics.median(dt), statistics.median(ft)
        result[f"decide_{case.name}_ms"] = f"{d * 1e3:.2f}"
        result[f"floor_{case.name}_ms"] = f"{f * 1e3:.2f}"
        result[f"decide_{case.name}_ratio"] = f"{d / f:.2f}"
        print(
            f"{case.name:<7} {d * 1e3:>10.2f} ms {_p95(dt) * 1e3:>6.2f} ms"
            f" {f * 1e3:>10.2f} ms {_p95(ft) * 1e3:>6.2f} ms {d / f:>6.1f}x  {_describe(actions)}"
        )
    if bad:
        print("check: FAILED: " + "; ".join(bad))
        return 1
    print("check: ok")
    return 0


def part_sim(args: argparse.Namespace, result: dict[str, str]) -> int:
    """Simulated days per wall second of the bridge policy at each fleet size, beside the
    same run with separate pools sized for peak (the baseline: the queue and the latency
    model alone, decide never acts), on the shared traces."""
    sizes = [int(n) for n in args.sim_nodes.split(",")]
    days = [float(d) for d in args.sim_days.split(",")]
    if len(days) != len(sizes):
        print(f"--sim-days needs one value per --sim-nodes size ({len(sizes)})")
        return 2
    print(
        f"{'nodes':>7} {'days':>5} {'jobs':>8} {'set-up':>14} {'wall':>8} {'days/s':>7}"
        f" {'decide calls':>13} {'ms/decide':>9} {'x baseline':>10}"
    )
    for nodes, d in zip(sizes, days, strict=True):
        started = time.perf_counter()
        scenario = _scenario(nodes, d, ["separate-peak", "bridge"], args)
        built = time.perf_counter() - started
        report = compare(scenario, ["separate-peak", "bridge"])
        base, bridge = report.results
        for r in (base, bridge):
            per_decide = ""
            if r.decide_calls:
                # decide's share is not separated from the tick: an upper bound per call
                per_decide = f"<={r.wall_s / r.decide_calls * 1e3:.1f}"
            print(
                f"{nodes:>7,} {d:>5g} {len(scenario.jobs):>8,} {r.policy:>14} "
                f"{r.wall_s:>7.1f}s {d / r.wall_s:>7.3f} {r.decide_calls:>6,}/{r.ticks:<6,}"
                f" {per_decide:>9} {r.wall_s / base.wall_s:>9.2f}x"
            )
        print(f"        (workload generation {built:.1f} s, not counted)")
        result[f"sim_{nodes}_baseline_days_per_s"] = f"{d / base.wall_s:.4f}"
        result[f"sim_{nodes}_bridge_days_per_s"] = f"{d / bridge.wall_s:.4f}"
        result[f"sim_{nodes}_ratio"] = f"{bridge.wall_s / base.wall_s:.2f}"
    return 0


def _scenario(nodes: int, days: float, policies: list[str], args: argparse.Namespace) -> Scenario:
    """The shared traces' workload at `nodes` nodes for `days` (Azure arrivals for four
    models scaled with the fleet, Alibaba jobs at 90% of the GPUs outside peak inference)."""
    return sim_build.build_scenario(
        days=days,
        nodes=nodes,
        gpus_per_node=8,
        rates=sim_build.model_rates(4, args.sim_mean_rps * nodes / 256),
        slo_ms=100.0,
        service_ms=20.0,
        arrivals="azure",
        arrivals_trace=TRACES / sim_build.AZURE_TRACE,
        jobs="alibaba",
        jobs_trace=TRACES / sim_build.ALIBABA_TRACE,
        load=0.9,
        policies=policies,
        seed=args.seed,
    )


def _outcome(result: PolicyResult) -> dict[str, object]:
    """A run's whole result less its wall time (what must not change)."""
    out = result.as_dict()
    out.pop("wall_s")
    return out


#: issue 15's targets: wall seconds for the bridge's run at each size
TARGET_S = 60.0


def part_speed(args: argparse.Namespace, result: dict[str, str]) -> int:
    """The bridge's run at each `--speed` size (nodes:days; by default a month at 1,000
    nodes and a day at 10,000) against the target of 60 s, beside the baseline of the
    same run's first `--speed-baseline-days` with the quiet-tick proof off
    (`Setup.prove_quiet = False`: `assess` at every tick) and with it on: both must give
    the same result, and their ratio is the proof's speed-up. 1 when a result differs."""
    cases = [tuple(c.split(":")) for c in args.speed.split(",")]
    slices = [float(d) for d in args.speed_baseline_days.split(",")]
    if len(slices) != len(cases) or any(len(c) != 2 for c in cases):
        print("--speed takes nodes:days,...; --speed-baseline-days one value per size")
        return 2
    print(
        f"{'nodes':>7} {'days':>5} {'jobs':>10} {'wall':>8} {'days/s':>7} {'target':>7}"
        f" {'proven':>15} | {'slice':>5} {'proof off':>9} {'proof on':>9} {'speed-up':>8}"
        f" {'same':>4}"
    )
    rc = 0
    for (n_text, d_text), piece in zip(cases, slices, strict=True):
        nodes, days = int(n_text), float(d_text)
        started = time.perf_counter()
        scenario = _scenario(nodes, days, ["bridge"], args)
        setup = setup_for("bridge", scenario, size(scenario))
        built = time.perf_counter() - started
        short = replace(setup, horizon_s=min(piece, days) * sim_build.DAY_S)
        gc.collect()
        slow = Engine(replace(short, prove_quiet=False)).run()
        gc.collect()
        quick = Engine(short).run()
        same = _outcome(slow) == _outcome(quick)
        rc = max(rc, 0 if same else 1)
        gc.collect()
        engine = Engine(setup)
        full = engine.run()
        met = full.wall_s <= TARGET_S
        print(
            f"{nodes:>7,} {days:>5g} {len(scenario.jobs):>10,} {full.wall_s:>7.1f}s"
            f" {days / full.wall_s:>7.3f} {'met' if met else 'MISSED':>7}"
            f" {engine.proven:>7,}/{full.ticks:<7,} | {piece:>5g} {slow.wall_s:>8.1f}s"
            f" {quick.wall_s:>8.1f}s {slow.wall_s / quick.wall_s:>7.2f}x"
            f" {'yes' if same else 'NO':>4}"
        )
        print(f"        (workload generation {built:.1f} s, not counted)")
        tag = f"speed_{nodes}_{days:g}d"
        result[f"{tag}_wall_s"] = f"{full.wall_s:.1f}"
        result[f"{tag}_days_per_s"] = f"{days / full.wall_s:.4f}"
        result[f"{tag}_target_met"] = "yes" if met else "no"
        result[f"{tag}_slice_proof_off_days_per_s"] = f"{piece / slow.wall_s:.4f}"
        result[f"{tag}_slice_speedup"] = f"{slow.wall_s / quick.wall_s:.2f}"
        result[f"{tag}_same_result"] = "yes" if same else "no"
    return rc


#: the parts, in the order `--part all` runs them
PARTS: dict[str, Callable[[argparse.Namespace, dict[str, str]], int]] = {
    "decide": part_decide,
    "sim": part_sim,
    "speed": part_speed,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=["all", *PARTS], default="all")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--instances", type=int, default=1_000, help="reserved nodes = replicas")
    ap.add_argument("--models", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-nodes", default="1000,10000", help="fleet sizes of part sim")
    ap.add_argument("--sim-days", default="1,0.1", help="simulated days, one per size")
    ap.add_argument(
        "--sim-mean-rps",
        type=float,
        default=3000.0,
        help="m0's mean requests/s per 256 nodes (stb simulate's default), scaled with size",
    )
    ap.add_argument(
        "--speed",
        default="1000:30,10000:1",
        help="part speed: nodes:days of each bridge run timed against the 60 s target",
    )
    ap.add_argument(
        "--speed-baseline-days",
        default="1,0.1",
        help="part speed: days of each run also run with the quiet-tick proof off and on",
    )
    args = ap.parse_args(argv)
    rc = 0
    result: dict[str, str] = {}
    for name, part in PARTS.items():
        if args.part in ("all", name):
            rc = max(rc, part(args, result))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return rc


if __name__ == "__main__":
    sys.exit(main())
