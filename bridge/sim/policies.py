"""The compared set-ups and how their pools are sized. Called by `stb simulate` and the
bench: `compare(scenario)` runs every policy on the same workload and fleet size.

Every set-up has the same number of nodes; what differs is who owns them and who may lend:

- `separate-peak`: inference owns enough nodes for its peak minute; nothing is lent.
- `separate-mean`: inference owns enough for its mean load; nothing is lent.
- `idle-loan` (Lyra-like): inference owns its peak, but the nodes above its mean serve
  elastic jobs while inference does not need them; the bridge's policy takes them back by
  preemption (a `loan` pool of lend mode preempt). Training and elastic keep the rest.
- `bridge`: inference owns its mean (or what `Scenario.reserve` says: a percentile of
  the per-minute load, the peak, a node count); the bridge lends from the elastic pool
  (preempt) and the training pool (drain), at most as many nodes as the peak needs above
  what it reserves (`Scenario.lend_cap` "peak", the default), or as the site's lend cap
  says: "share:F" (`max_lent_share` F of the elastic pool, past the separate fleet's size
  in a burst; the training pool's share 0: not lent) or a node count N
  (`max_lent_nodes` N).
- `separate-N` (N a node count, e.g. `separate-24`, the site's inference partition as it
  is): separate pools, inference owns N nodes; nothing is lent.

A lend takes whole nodes, or with `Scenario.granularity` "gpu" the GPUs of its replica
(`bridge.sim.lending`); a model's replica GPUs (`Scenario.replica_gpus`) reach the policy
and the engine as its `tensor_parallel` size.

The nodes outside peak inference are split between training and elastic in proportion
to their offered GPU-hours, the same in every set-up (training's guarantee); the nodes a
set-up reserves below the peak go to elastic (the bridge lends from there first). Every
set-up is driven by the real `decide`; the separate ones have
`max_lent_nodes = 0`. A pool larger than the peak takes its extra nodes from elastic,
and from training once elastic is down to one node.

`tradeoff(scenario, sizes, target)` runs what the selection report
(`bridge.sim.selection`) needs beyond the comparison: the bridge at several reserved sizes
(full runs), and separate pools at those sizes and at the sizes a search for the smallest
one meeting the attainment target visits, with no jobs: a separate pool lends nothing, so
its service does not depend on them (tests/unit/test_sim_selection.py checks that), and a
run without jobs costs a fraction of one with them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.policy import capacity
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.latency import LEAST_CONN_CA2
from bridge.sim.result import TRADEOFF_SERIES, PolicyResult, SimReport, Tradeoff
from bridge.sim.tokens import TokenModel, nodes_for_tokens
from bridge.sim.workload import ArrivalSeries, SimJob

POLICIES = ("separate-peak", "separate-mean", "idle-loan", "bridge")
DESCRIPTIONS = {
    "separate-peak": "separate pools, inference sized for its peak minute",
    "separate-mean": "separate pools, inference sized for its mean load",
    "idle-loan": "inference sized for peak, its idle nodes loaned to elastic work and "
    "reclaimed by preemption (Lyra-like)",
    "bridge": "inference sized for mean, the bridge lends elastic (preempt) and "
    "training (drain) nodes on SLO breach",
}
#: `separate-N`: separate pools with N inference nodes (a size the site chooses)
SEPARATE_AT = "separate-"
#: the trade-off runs: the bridge at N reserved nodes is named `bridge@N`
BRIDGE_AT = "bridge@"
#: trade-off sizes `auto_sizes` picks: this many, evenly from 1 node to the peak's
AUTO_POINTS = 4
#: most sizes one trade-off runs (each is a full run of the bridge: the cost is bounded)
MAX_POINTS = 12


def separate_size(policy: str) -> int | None:
    """N of a `separate-N` policy name (N digits), else None (`separate-peak` too)."""
    rest = policy.removeprefix(SEPARATE_AT)
    return int(rest) if rest != policy and rest.isdigit() else None


def known(policy: str) -> bool:
    """A policy `setup_for` accepts by name: one of POLICIES or `separate-N`."""
    return policy in POLICIES or separate_size(policy) is not None


def with_separate(policies: Sequence[str], nodes: int) -> list[str]:
    """`policies` with `separate-NODES` among the separate ones (after the last of them
    given first, else first), once; `nodes` 0: as they are."""
    name = f"{SEPARATE_AT}{nodes}"
    out = list(policies)
    if nodes == 0 or name in out:
        return out
    at = 0
    while at < len(out) and out[at].startswith(SEPARATE_AT):
        at += 1
    return [*out[:at], name, *out[at:]]


def describe(policy: str) -> str:
    """What the set-up is, in one line."""
    n = separate_size(policy)
    if n is not None:
        return f"separate pools, inference owns {n} nodes (a chosen size); nothing is lent"
    return DESCRIPTIONS[policy]


@dataclass(frozen=True)
class Scenario:
    """One comparison's inputs."""

    nodes: int
    gpus_per_node: int
    arrivals: ArrivalSeries
    jobs: Sequence[SimJob]
    #: model -> (SLO p99 ms, service time ms)
    models: Mapping[str, tuple[float, float]]
    horizon_s: float
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tick_s: float = 5.0
    timing: Timing = field(default_factory=Timing)
    service_cv2: float = 0.0
    #: the arrivals' SCV at a replica of a model routed over several (`Setup.routing_ca2`)
    routing_ca2: float = LEAST_CONN_CA2
    series_step_s: float = 300.0
    #: what the report says about the inputs (trace names, seeds, load)
    about: Mapping[str, object] = field(default_factory=dict)
    #: elastic jobs checkpoint every this many seconds of run time (None: never)
    checkpoint_s: float | None = None
    #: the bridge's reserved inference pool: "mean" (the mean load), "pNN" (the NN-th
    #: percentile of the per-minute load), "peak", or a number of nodes
    reserve: str = "mean"
    #: the bridge's lend cap (`parse_lend_cap`): "peak" (the peak's nodes above what it
    #: reserves: no more than a separate fleet would own), "share:F" (F of the elastic
    #: pool's nodes, `max_lent_share`; training not lent) or a node count
    #: (`max_lent_nodes`)
    lend_cap: str = "peak"
    #: the LLM models' token workloads (`bridge.sim.tokens`): sized by the token
    #: capacity model, their TTFT and TPOT attainment reported. Empty: none
    tokens: Mapping[str, TokenModel] = field(default_factory=dict)
    #: parallel requests on one replica (an LLM's sequences); None: one per GPU
    replica_servers: int | None = None
    #: `Setup.warmup_s`: the result's warm share leaves out the requests before it
    warmup_s: float = 0.0
    #: `Setup.granularity`: what a lend takes, "node" (whole nodes) or "gpu" (its
    #: replica's GPUs)
    granularity: str = "node"
    #: per model, the GPUs one replica takes (more than a node's: a gang of whole nodes);
    #: a model not here takes whole nodes
    replica_gpus: Mapping[str, int] = field(default_factory=dict)


#: what `Scenario.lend_cap` (`stb simulate --lend-cap`) takes, as a message says it
LEND_CAPS = "peak, share:F (0 < F <= 1: a share of the elastic pool) or a node count N"


def parse_lend_cap(text: str) -> tuple[str, float]:
    """A lend cap (`Scenario.lend_cap`) as ("peak", 0), ("share", F) or ("nodes", N);
    ValueError naming the value otherwise."""
    value = text.strip()
    if value == "peak":
        return "peak", 0.0
    if value.startswith("share:"):
        try:
            share = float(value.removeprefix("share:"))
        except ValueError:
            share = math.nan
        if 0 < share <= 1:
            return "share", share
    elif value.isdigit():
        return "nodes", float(int(value))
    raise ValueError(f"lend cap {text!r}: give {LEND_CAPS}")


@dataclass(frozen=True)
class Sizing:
    peak_nodes: int
    mean_nodes: int
    #: offered inference load, busy GPUs: peak minute and mean
    peak_load: float
    mean_load: float
    #: the bridge's reserved inference nodes (`Scenario.reserve`; the mean by default)
    reserved_nodes: int


def _rates_by_minute(scenario: Scenario) -> dict[str, np.ndarray[Any, np.dtype[np.float64]]]:
    """Each model's mean request rate per minute of the arrivals."""
    steps = max(len(r) for r in scenario.arrivals.rates.values())
    per_minute = max(1, round(60.0 / scenario.arrivals.step_s))
    minutes = max(1, steps // per_minute)
    out = {}
    for model in scenario.models:
        rates = np.zeros(minutes * per_minute)
        given = np.asarray(scenario.arrivals.rates[model], dtype=float)[: len(rates)]
        rates[: len(given)] = given
        out[model] = rates.reshape(minutes, per_minute).mean(axis=1)
    return out


def nodes_for(scenario: Scenario, rates: Mapping[str, float]) -> int:
    """Fewest nodes holding every model whose p99 meets every SLO at these request rates,
    by the policy's own capacity model (`bridge.policy.capacity`); the LLM models
    (`Scenario.tokens`) by the token capacity model (`bridge.policy.tokens`: both p99s,
    TTFT and TPOT, within their SLOs), the larger count of the two."""
    demand = {
        m: capacity.Demand(rates[m], service_ms / 1000.0, slo / 1000.0)
        for m, (slo, service_ms) in scenario.models.items()
        if m not in scenario.tokens
    }
    least = max(1, min(scenario.nodes, nodes_for_tokens(scenario.tokens, rates)))
    if not demand:
        return least
    models = tuple(sorted(scenario.models))
    servers = scenario.replica_servers or scenario.gpus_per_node
    for n in range(least, scenario.nodes + 1):
        group = capacity.Group(models, n, servers)
        if capacity.carries([group], demand, scenario.service_cv2):
            return n
    return scenario.nodes


def size(scenario: Scenario) -> Sizing:
    per_minute = _rates_by_minute(scenario)
    service = {m: ms / 1000.0 for m, (_, ms) in scenario.models.items()}
    load = np.zeros_like(next(iter(per_minute.values())))
    for m in scenario.models:
        load += per_minute[m] * service[m]
    peak_at = int(np.argmax(load))
    peak_rates = {m: float(r[peak_at]) for m, r in per_minute.items()}
    mean_rates = {m: float(r.mean()) for m, r in per_minute.items()}
    peak_nodes = nodes_for(scenario, peak_rates)
    mean_nodes = min(nodes_for(scenario, mean_rates), peak_nodes)
    reserve = scenario.reserve
    if reserve == "mean":
        reserved = mean_nodes
    elif reserve == "peak":
        reserved = peak_nodes
    elif reserve.startswith("p") and reserve[1:].isdigit() and 0 <= int(reserve[1:]) <= 100:
        level = float(np.percentile(load, int(reserve[1:])))
        at = int(np.argmin(np.abs(load - level)))  # the minute nearest that load
        reserved = min(
            nodes_for(scenario, {m: float(r[at]) for m, r in per_minute.items()}), peak_nodes
        )
    elif reserve.isdigit() and 1 <= int(reserve) <= scenario.nodes:
        reserved = int(reserve)
    else:
        raise ValueError(
            f"reserve {reserve!r}: give mean, peak, pNN (a percentile of the per-minute "
            f"load) or a number of nodes from 1 to {scenario.nodes}"
        )
    return Sizing(peak_nodes, mean_nodes, float(load[peak_at]), float(load.mean()), reserved)


def _split(rest: int, jobs: Sequence[SimJob]) -> tuple[int, int]:
    """Training and elastic nodes out of `rest`, by offered GPU-seconds (each at least 1)."""
    work = {"training": 0.0, "elastic": 0.0}
    for j in jobs:
        work[j.kind] += j.gpus * j.duration_s
    total = sum(work.values()) or 1.0
    elastic = min(rest - 1, max(1, round(rest * work["elastic"] / total)))
    return rest - elastic, elastic


def setup_for(policy: str, scenario: Scenario, sizing: Sizing) -> Setup:
    if not known(policy):
        raise ValueError(
            f"unknown policy {policy!r}; choose from {', '.join(POLICIES)} or "
            f"{SEPARATE_AT}N (N inference nodes)"
        )
    if not scenario.routing_ca2 > 0:
        raise ValueError(
            f"routing_ca2 {scenario.routing_ca2!r}: the arrivals' squared coefficient of "
            "variation must be positive (1: Poisson)"
        )
    n, g = scenario.nodes, scenario.gpus_per_node
    chosen = separate_size(policy)
    if chosen is not None and not 1 <= chosen <= n:
        raise ValueError(f"{policy}: give a separate pool of 1 to {n} nodes")
    infer = {"separate-peak": sizing.peak_nodes, "bridge": sizing.reserved_nodes}.get(
        policy, sizing.mean_nodes if chosen is None else chosen
    )
    loan = sizing.peak_nodes - sizing.mean_nodes if policy == "idle-loan" else 0
    rest = n - infer - loan
    if rest < 2:
        raise ValueError(
            f"{n} nodes leave {rest} for training and elastic after inference's "
            f"{infer + loan} ({policy}): give the fleet more nodes or the models less load"
        )
    # Training keeps its share of the fleet outside peak inference in every set-up (the
    # guarantee a separate fleet gives it); the nodes inference no longer reserves (the
    # bridge's peak - reserved) go to the elastic pool, the requeueable work the bridge lends
    # from first, as the loan pool of idle-loan runs elastic work.
    training, _ = _split(n - sizing.peak_nodes, scenario.jobs)
    elastic = rest - training
    if elastic < 1:  # a pool above the peak takes from elastic, then from training
        training, elastic = rest - 1, 1
    nodes: list[SimNode] = []
    layout = [
        ("inference", None, infer),
        ("loan", "elastic", loan),
        ("training", "training", training),
        ("elastic", "elastic", elastic),
    ]
    for pool, partition, count in layout:
        for _ in range(count):
            i = len(nodes)
            nodes.append(SimNode(i, f"n{i:05d}", pool, partition, g))
    pools = {"inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0)}
    lendable = max(1, sizing.peak_nodes - infer)
    if policy == "idle-loan":
        pools["loan"] = PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1)
    elif policy == "bridge":
        pools["elastic"] = PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1)
        pools["training"] = PoolConfig(partition="train", lend_mode="drain", cost_rank=2)
    lending = policy in ("idle-loan", "bridge")
    cap: dict[str, Any] = {"max_lent_nodes": lendable if lending else 0}
    kind, value = parse_lend_cap(scenario.lend_cap)
    if policy == "bridge" and kind == "share":  # the share caps the elastic pool; the
        # training pool is not lent (its idle nodes would go before busy elastic ones)
        cap = {"max_lent_nodes": elastic, "max_lent_share": value}
        pools["training"] = pools["training"].model_copy(update={"max_lent_share": 0.0})
    elif policy == "bridge" and kind == "nodes":
        cap = {"max_lent_nodes": int(value)}
    most = max(lendable, cap["max_lent_nodes"])
    models = {
        m: _model_config(m, slo, scenario.tokens, infer + most + 1, scenario.replica_gpus.get(m))
        for m, (slo, _) in scenario.models.items()
    }
    # GPU-granular lending is the policy's partial lends, sized to the demand
    # (`[policy] partial_lends`, `sized_lends`); node-granular lends whole nodes, which the
    # sized lends' ranking (`lend_ranking` and its options) does not apply to
    gpu = scenario.granularity == "gpu"
    whole: dict[str, object] = (
        {} if gpu else {"lend_ranking": "largest", "shared_lends": False, "lease_cost_gpu_s": 0.0}
    )
    policy_config = scenario.policy.model_copy(
        update={
            **cap,
            **whole,
            "partial_lends": gpu,
            "sized_lends": gpu,
        }
    )
    config = BridgeConfig(tick_s=scenario.tick_s, pools=pools, policy=policy_config)
    return Setup(
        name=policy,
        description=describe(policy),
        config=config,
        nodes=nodes,
        jobs=scenario.jobs,
        arrivals=scenario.arrivals,
        service_s={m: ms / 1000.0 for m, (_, ms) in scenario.models.items()},
        horizon_s=scenario.horizon_s,
        models=models,
        timing=scenario.timing,
        service_cv2=scenario.service_cv2,
        routing_ca2=scenario.routing_ca2,
        series_step_s=scenario.series_step_s,
        checkpoint_s=scenario.checkpoint_s,
        tokens=scenario.tokens,
        replica_servers=scenario.replica_servers,
        warmup_s=scenario.warmup_s,
        granularity=scenario.granularity,
    )


def _model_config(
    model: str,
    slo_ms: float,
    tokens: Mapping[str, TokenModel],
    most: int,
    gpus: int | None = None,
) -> ModelConfig:
    """The model as the daemon's facts give it to the policy: its request SLO, or for an
    LLM (`Scenario.tokens`) its TTFT and TPOT objectives and no request SLO (as the lab's
    `smol`: `ModelConfig.has_request_slo` false, scaled by its tokens; `slo_ms` its
    end-to-end bound, the request column's objective); `gpus`, its replica's GPUs, as its
    tensor-parallel size (None: not said, whole nodes)."""
    tm = tokens.get(model)
    if tm is None:
        return ModelConfig(
            slo_p99_ms=slo_ms, min_replicas=1, max_replicas=most, tensor_parallel=gpus
        )
    return ModelConfig(
        tensor_parallel=gpus,
        slo_p99_ms=math.inf,
        min_replicas=1,
        max_replicas=most,
        slo_ttft_p99_ms=tm.slo_ttft_s * 1000.0,
        slo_tpot_p99_ms=tm.slo_tpot_s * 1000.0,
        slo_e2e_p99_ms=slo_ms,
    )


def compare(
    scenario: Scenario,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str, float, float], None] | None = None,
) -> SimReport:
    """Run each policy on the scenario; the report holds them in the order given."""
    sizing = size(scenario)
    setups = [setup_for(p, scenario, sizing) for p in policies]  # all checked before any runs
    results: list[PolicyResult] = []
    for setup in setups:
        hook = None
        if progress is not None:

            def hook(t: float, total: float, name: str = setup.name) -> None:
                progress(name, t, total)

        results.append(Engine(setup).run(hook))
    about = dict(scenario.about)
    about.update(
        nodes=scenario.nodes,
        gpus_per_node=scenario.gpus_per_node,
        horizon_s=scenario.horizon_s,
        tick_s=scenario.tick_s,
        models={m: {"slo_p99_ms": slo, "service_ms": s} for m, (slo, s) in scenario.models.items()},
        jobs=len(scenario.jobs),
        inference_load_peak_gpus=round(sizing.peak_load, 2),
        inference_load_mean_gpus=round(sizing.mean_load, 2),
        inference_nodes_peak=sizing.peak_nodes,
        inference_nodes_mean=sizing.mean_nodes,
        inference_nodes_reserved=sizing.reserved_nodes,
        reserve=scenario.reserve,
        **({"lend_cap": scenario.lend_cap} if scenario.lend_cap != "peak" else {}),
        **({"granularity": scenario.granularity} if scenario.granularity != "node" else {}),
        **({"replica_gpus": dict(scenario.replica_gpus)} if scenario.replica_gpus else {}),
        timing=asdict(scenario.timing),
        checkpoint_s=scenario.checkpoint_s,
    )
    return SimReport(about, results)


# -- the selection report's trade-off runs ----------------------------------------------


def auto_sizes(sizing: Sizing, points: int = AUTO_POINTS) -> list[int]:
    """`points` reserved sizes evenly from 1 node to the peak's, and the bridge's own
    reserved size (the comparison has run it already): ascending, each once."""
    peak = sizing.peak_nodes
    steps = max(1, points - 1)
    sizes = {max(1, round(1 + (peak - 1) * i / steps)) for i in range(points)}
    sizes.add(sizing.reserved_nodes)
    return sorted(sizes)


def tradeoff_sizes(text: str, sizing: Sizing, nodes: int) -> list[int]:
    """The reserved sizes a trade-off option names: "auto" (`auto_sizes`), "none" (no
    trade-off: []), or node counts "4,8,16" (each from 1 to the fleet's nodes less 2, at
    most MAX_POINTS). ValueError naming the problem."""
    text = text.strip()
    if text == "none":
        return []
    if text == "auto":
        return auto_sizes(sizing)
    sizes: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part.isdigit() or not 1 <= int(part) <= nodes - 2:
            raise ValueError(
                f"trade-off size {part!r}: give auto, none, or node counts from 1 to "
                f"{nodes - 2} (the fleet's {nodes} less 2 for training and elastic)"
            )
        sizes.add(int(part))
    if len(sizes) > MAX_POINTS:
        raise ValueError(
            f"{len(sizes)} trade-off sizes: at most {MAX_POINTS} (each one is a full run)"
        )
    return sorted(sizes)


def _slim(result: PolicyResult) -> PolicyResult:
    """A trade-off run as the report keeps it: no decisions, only TRADEOFF_SERIES."""
    series = {k: v for k, v in result.series.items() if k in TRADEOFF_SERIES}
    return dataclasses.replace(result, decisions=[], series=series)


def tradeoff(
    scenario: Scenario,
    sizes: Sequence[int],
    target: float,
    progress: Callable[[str, float, float], None] | None = None,
    done: Sequence[PolicyResult] = (),
) -> Tradeoff:
    """The bridge at each reserved size in `sizes` (`bridge@N`; a bridge run in `done` of
    that size is taken as it is), and separate pools with no jobs: at each size from the
    mean load's nodes up (smaller ones cannot carry the mean load), and at those a
    bisection for the smallest pool whose share of requests within SLO is at least
    `target` visits (in 1 .. nodes - 2; more nodes never serve worse). A separate run in
    `done` (the comparison's) stands for its size, jobs and all. `progress` gets (run
    name, simulated seconds, horizon) as `compare`'s does."""

    def run(setup: Setup) -> PolicyResult:
        hook = None
        if progress is not None:

            def hook(t: float, total: float, name: str = setup.name) -> None:
                progress(name, t, total)

        return _slim(Engine(setup).run(hook))

    bridge = []
    for n in sizes:
        given = next(
            (r for r in done if r.policy == "bridge" and r.pools.get("inference") == n), None
        )
        if given is not None:
            result = _slim(dataclasses.replace(given, policy=f"{BRIDGE_AT}{n}"))
        else:
            at = dataclasses.replace(scenario, reserve=str(n))
            setup = setup_for("bridge", at, size(at))
            result = run(dataclasses.replace(setup, name=f"{BRIDGE_AT}{n}"))
        bridge.append(dataclasses.replace(result, description=f"the bridge, {n} reserved nodes"))

    sizing = size(scenario)
    alone = dataclasses.replace(scenario, jobs=[])
    separate: dict[int, PolicyResult] = {}
    for r in done:  # the comparison's separate pools: their service is the same
        if r.policy.startswith(SEPARATE_AT) and r.pools.get("loan", 0) == 0:
            n = r.pools.get("inference", 0)
            separate.setdefault(n, _slim(dataclasses.replace(r, policy=f"{SEPARATE_AT}{n}")))

    def attains(n: int) -> bool:
        if n not in separate:
            setup = setup_for(f"{SEPARATE_AT}{n}", alone, sizing)
            separate[n] = run(
                dataclasses.replace(setup, description=f"{setup.description}; no jobs")
            )
        return separate[n].within_share >= target

    for n in sizes:
        if n >= sizing.mean_nodes:  # (smaller pools cannot carry the mean load, and runs
            attains(n)  # of overloaded pools are the slowest; the search may still visit)
    top = scenario.nodes - 2
    hi = min(sizing.peak_nodes, top)
    if not attains(hi) and hi < top:
        hi = top
    if attains(hi):  # bisect between the largest failing and the smallest attaining size
        hi = min(n for n in separate if attains(n))
        lo = max((n for n in separate if n < hi and not attains(n)), default=0)
        capacity.smallest(lo, hi, attains)  # (each size it tries is run and kept)
    return Tradeoff(bridge, [separate[n] for n in sorted(separate)], target)
