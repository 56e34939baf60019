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
  what it reserves.

The nodes outside peak inference are split between training and elastic in proportion
to their offered GPU-hours, the same in every set-up (training's guarantee); the nodes a
set-up reserves below the peak go to elastic (the bridge lends from there first). Every
set-up is driven by the real `decide`; the separate ones have
`max_lent_nodes = 0`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, PoolConfig
from bridge.policy import capacity
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.result import PolicyResult, SimReport
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
    series_step_s: float = 300.0
    #: what the report says about the inputs (trace names, seeds, load)
    about: Mapping[str, object] = field(default_factory=dict)
    #: elastic jobs checkpoint every this many seconds of run time (None: never)
    checkpoint_s: float | None = None
    #: the bridge's reserved inference pool: "mean" (the mean load), "pNN" (the NN-th
    #: percentile of the per-minute load), "peak", or a number of nodes
    reserve: str = "mean"


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
    by the policy's own capacity model (`bridge.policy.capacity`)."""
    demand = {
        m: capacity.Demand(rates[m], service_ms / 1000.0, slo / 1000.0)
        for m, (slo, service_ms) in scenario.models.items()
    }
    models = tuple(sorted(scenario.models))
    for n in range(1, scenario.nodes + 1):
        group = capacity.Group(models, n, scenario.gpus_per_node)
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
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    n, g = scenario.nodes, scenario.gpus_per_node
    infer = {"separate-peak": sizing.peak_nodes, "bridge": sizing.reserved_nodes}.get(
        policy, sizing.mean_nodes
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
    models = {
        m: ModelConfig(slo_p99_ms=slo, min_replicas=1, max_replicas=infer + lendable + 1)
        for m, (slo, _) in scenario.models.items()
    }
    policy_config = scenario.policy.model_copy(
        update={"max_lent_nodes": lendable if lending else 0}
    )
    config = BridgeConfig(
        tick_s=scenario.tick_s,
        pools=pools,
        models=models,
        policy=policy_config,
    )
    return Setup(
        name=policy,
        description=DESCRIPTIONS[policy],
        config=config,
        nodes=nodes,
        jobs=scenario.jobs,
        arrivals=scenario.arrivals,
        service_s={m: ms / 1000.0 for m, (_, ms) in scenario.models.items()},
        horizon_s=scenario.horizon_s,
        timing=scenario.timing,
        service_cv2=scenario.service_cv2,
        series_step_s=scenario.series_step_s,
        checkpoint_s=scenario.checkpoint_s,
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
        timing=asdict(scenario.timing),
        checkpoint_s=scenario.checkpoint_s,
    )
    return SimReport(about, results)
