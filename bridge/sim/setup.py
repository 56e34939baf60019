"""What one simulated run is given: `Setup` (the policy's configuration, the fleet, the
jobs, the arrivals, service times, horizon and the run's switches) and `Timing` (how long
each actuation step takes). Built by `bridge.sim.policies` (and `bridge.sim.labcheck`,
`bridge.advise.replay`), played by `bridge.sim.engine.Engine`, which names them too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.config import BridgeConfig, ModelConfig
from bridge.lifecycle import StepTimes
from bridge.sim.fleet import SimNode
from bridge.sim.latency import LEAST_CONN_CA2
from bridge.sim.tokens import TokenModel
from bridge.sim.weights import WeightCache
from bridge.sim.workload import ArrivalSeries, SimJob


@dataclass(frozen=True)
class Timing:
    """Seconds each step takes: by default the lab's measured `bridge.lifecycle.StepTimes`
    (each field's meaning there). A site's own, from its bridge's lease history:
    `bridge.sim.inputs.timing_from_leases`."""

    slurm_start_s: float = StepTimes.slurm_start_s
    preempt_start_s: float = StepTimes.preempt_start_s
    triton_ready_s: float = StepTimes.triton_ready_s
    cancel_s: float = StepTimes.cancel_s
    #: a requeued job may start again after this long (Slurm's fixed requeue delay)
    requeue_delay_s: float = 121.0
    #: per model, the seconds loading it adds after `triton_ready_s` (its weights: a
    #: site's large models); a lent replica is ready once its slowest model is. Empty by
    #: default: the lab's small models load within `triton_ready_s`
    model_load_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: the node-local weight cache (issue 31, `bridge.sim.weights`): how many models'
    #: weights a node keeps after serving them (its most recent; 0: no such cache), the
    #: shorthand for `weights` without staging and every model one unit
    cache_models: int = 0
    #: per model, the seconds a load from a node's cache takes (a model not listed loads
    #: from the cache at `model_load_s`)
    local_load_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: the caches in full: sizes, budget, staging (`bridge.sim.weights.WeightCache`);
    #: None: `cache_models`' cache, or none
    weights: WeightCache | None = None

    def cache(self) -> WeightCache | None:
        """The run's cache: `weights`, else `cache_models`' (each model one unit, that
        many a node, no staging), else None (every load from the shared repository)."""
        if self.weights is not None:
            return self.weights
        if self.cache_models > 0:
            return WeightCache(default_bytes=1.0, budget_bytes=float(self.cache_models))
        return None

    def load_s(self, models: Sequence[str], cached: Collection[str] = ()) -> float:
        """The extra seconds a replica holding `models` takes to be ready, on a node whose
        cache holds `cached` complete (a model there loads at its `local_load_s` where
        the run has a cache)."""
        loads = self.model_load_s
        if not loads:
            return 0.0
        local = self.local_load_s if self.cache() is not None else {}
        return max(
            (local[m] if m in cached and m in local else loads.get(m, 0.0) for m in models),
            default=0.0,
        )


@dataclass
class Setup:
    """Everything one policy's run needs. `config` is the policy's bridge configuration
    (its pools name which simulated pools the policy may lend from)."""

    name: str
    description: str
    config: BridgeConfig
    nodes: list[SimNode]
    jobs: Sequence[SimJob]
    arrivals: ArrivalSeries
    #: per model, service time of one request on one instance (seconds)
    service_s: Mapping[str, float]
    horizon_s: float
    timing: Timing = field(default_factory=Timing)
    #: squared coefficient of variation of service times (0: deterministic)
    service_cv2: float = 0.0
    #: squared coefficient of variation of the arrivals at a replica of a model routed
    #: over several (`latency.LEAST_CONN_CA2`, nginx's least_conn; 1: Poisson)
    routing_ca2: float = LEAST_CONN_CA2
    series_step_s: float = 300.0
    #: keep at most this many decisions in the result
    max_decisions: int = 10_000
    #: call decide at every tick (slow; proves the quiet-tick shortcut in tests)
    always_decide: bool = False
    #: prove ticks quiet without running `assess` where it can (`bridge.sim.quiet`);
    #: False runs `assess` at every tick (the bench's baseline; the same results)
    prove_quiet: bool = True
    #: run `assess` on the ticks proven quiet as well and fail if it would act (tests)
    check_quiet: bool = False
    #: parallel model instances on one replica; None: one per GPU of the node
    replica_servers: int | None = None
    #: elastic jobs checkpoint every this many seconds of run time and report it (the
    #: bridge's `stb:ckpt=` tag); a requeued run resumes there. None: no checkpoints
    checkpoint_s: float | None = None
    #: the models the policy scales, with their effective SLO and bounds (the daemon's:
    #: `bridge.modelfacts.merge_models` of a repository and the TOML); None: the TOML's
    #: `[models]` alone (`toml_models`)
    models: Mapping[str, ModelConfig] | None = None
    #: the LLM models' token workloads (`bridge.sim.tokens`): their TTFT and TPOT
    #: attainment is tallied beside the request SLO's. Empty: no LLM model
    tokens: Mapping[str, TokenModel] = field(default_factory=dict)
    #: what a lend takes (`bridge.sim.lending`): "node", whole nodes (as the bridge lends
    #: today), or "gpu", the GPUs of its replica (its models' `replica_gpus`), the
    #: node's other GPUs running batch work on. The same where no model states its GPUs
    granularity: str = "node"
    #: seconds from the start whose requests the result's warm share leaves out
    #: (`PolicyResult.warm_share`: the run's cold start, an empty forecast and empty
    #: weight caches, apart); 0: none left out
    warmup_s: float = 0.0
