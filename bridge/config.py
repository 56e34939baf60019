"""The bridge's configuration: one TOML file, validated at start, every setting
overridable by an environment variable `STB_<NAME>` (nested: `STB_POLICY__MAX_LENT_NODES`).

Read by `stb daemon`, `stb config check` and the policy. Unknown keys are refused, so a
typo never silently falls back to a default. Each field says its unit and why its default
is what it is. Precedence: environment, then the file, then the defaults.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
#: a GRES type name as gres.conf's `Type=` takes it (`h100`, `h100_1g.10gb`, `1g.10gb+me`)
GRES_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_GPU_TYPE_HELP = (
    "The GRES type one replica's GPUs are of, as the nodes' gres.conf names it: a MIG "
    "slice type (`h100_1g.10gb`) or a whole GPU's (`h100`). A lend for the model then "
    "asks `--gres=gpu:<type>:k` (k: its replica GPUs, 1 when unsaid) of a node with that "
    "many of the type free, and requeues nothing. Unset: any GPU, lent as before."
)


class ConfigError(ValueError):
    """The configuration is invalid; `problems` lists (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {field}: {msg}" for field, msg in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolConfig(_Strict):
    """One pool: a Slurm partition and how the bridge may take its nodes."""

    partition: str = Field(description="Slurm partition whose nodes form the pool.")
    lend_mode: Literal["preempt", "drain", "reserved"] = Field(
        description="preempt: the Triton job requeues the pool's jobs (elastic); drain: "
        "the node takes no new work and is lent once free, no job is killed (training); "
        "reserved: the pool's nodes are inference's own and hold the baseline replicas."
    )
    cost_rank: int = Field(
        default=1,
        ge=0,
        description="Lower is taken first among pools that can lend (elastic 1, "
        "training 2): work that can be requeued is cheaper than work that must wait.",
    )
    max_lent_share: float | None = Field(
        default=None,
        ge=0,
        le=1.0,
        description="Share of this pool's nodes the bridge may hold lent at once (0 to 1; "
        "floor(share x the pool's nodes)); unset: [policy] max_lent_share. 0 never lends "
        "from the pool. Say, elastic 0.5 and training 0: bursts may take half the elastic "
        "pool, and idle training nodes, which a lend takes before busy elastic ones, "
        "stay training's.",
    )


def _check_replica_bounds(low: int | None, high: int | None) -> None:
    """ValueError unless a model's replica bounds are in order (an override may leave
    either unset): the one check of `ModelConfig` and `ModelOverride`."""
    if low is not None and high is not None and high < low:
        raise ValueError(f"max_replicas ({high}) is below min_replicas ({low})")


class ModelConfig(_Strict):
    """A served model's effective service-level objective, replica bounds and replica
    size: what the policy scales it by. Not read from the TOML as such:
    `bridge.modelfacts.merge_models` makes it from the model repository's metadata
    (config.pbtxt's `stb.*` parameters and its instance_group) and the TOML's
    `[models.NAME]` overrides (`ModelOverride`)."""

    slo_p99_ms: float = Field(
        gt=0,
        description="Latency objective: p99 in milliseconds. A model with a token "
        "objective (slo_ttft_p99_ms, slo_tpot_p99_ms) and none of its own has infinity here "
        "(`has_request_slo` is false): no request-latency objective, scaled by its tokens.",
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        description="Replicas kept on the reserved nodes at all times (baseline servers). "
        "0: scale to zero: the baselines do not load it, it is served by lent replicas "
        "alone, and a request that finds none waits at the activator while one starts "
        "(`routing.cold_start_timeout_s`).",
    )
    max_replicas: int = Field(
        default=4,
        ge=1,
        description="Upper bound of replicas, lent ones included; bounds what one model's "
        "burst can take from training.",
    )
    instances: int | None = Field(
        default=None,
        ge=1,
        description="Parallel executions of the model on one replica: its config.pbtxt "
        "instance_group count. Unset: the model shares its node's GPUs with the other "
        "models there, one execution per GPU. The capacity model sizes replicas by it.",
    )
    instance_gpus: int | None = Field(
        default=None,
        ge=1,
        description="GPUs one replica's instances hold: the distinct GPU indices its "
        "config.pbtxt KIND_GPU instance groups name in their `gpus` lists (groups [0, 1] "
        "and [1, 2]: 3). Unset: a GPU group names none (Triton puts its instances on every "
        "GPU of the node) or the model has no GPU group. With tensor_parallel and "
        "pipeline_parallel it sizes a replica in GPUs (`bridge.policy.gang."
        "gpus_per_replica`); all three unset, a replica takes whole nodes.",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Tensor-parallel size of one replica: the GPUs each layer is split "
        "over (config.pbtxt stb.tensor_parallel_size; vLLM's tensor_parallel_size, "
        "TensorRT-LLM's tp_size). One replica needs at least tensor x pipeline parallel "
        "GPUs, on several nodes when one has too few (`bridge.policy.gang`). Unset: 1 "
        "when pipeline_parallel is set, else not said.",
    )
    pipeline_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Pipeline-parallel size of one replica: the stages its layers are "
        "split into, each on its own tensor-parallel GPUs (config.pbtxt "
        "stb.pipeline_parallel_size). Unset: 1 when tensor_parallel is set, else not said.",
    )
    slo_ttft_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="Token objective of an LLM: p99 time to first token in milliseconds "
        "(config.pbtxt stb.slo_ttft_p99_ms). Unset: none.",
    )
    slo_tpot_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="Token objective of an LLM: p99 time per output token (the gap between "
        "tokens) in milliseconds (stb.slo_tpot_p99_ms). Unset: none.",
    )
    slo_e2e_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="An LLM's optional p99 end-to-end request latency in milliseconds "
        "(stb.slo_e2e_p99_ms): mostly the answer's length, so only a bound. Unset: none.",
    )
    gpu_type: str | None = Field(
        default=None, pattern=GRES_TYPE.pattern, description=_GPU_TYPE_HELP
    )

    @property
    def has_request_slo(self) -> bool:
        """Whether it has a request-latency objective (a finite `slo_p99_ms`)."""
        return math.isfinite(self.slo_p99_ms)

    @property
    def has_token_slo(self) -> bool:
        """Whether it has a token objective (TTFT or TPOT p99): an LLM the policy scales
        by its tokens (`bridge.policy.tokens`)."""
        return self.slo_ttft_p99_ms is not None or self.slo_tpot_p99_ms is not None

    @model_validator(mode="after")
    def _bounds(self) -> ModelConfig:
        _check_replica_bounds(self.min_replicas, self.max_replicas)
        return self


class ModelOverride(_Strict):
    """A site's override of a model's facts, field by field (`[models.NAME]`). A model
    needs no entry: its config.pbtxt in the model repository says its SLO
    (`stb.slo_p99_ms`), bounds (`stb.min_replicas`, `stb.max_replicas`), instances and
    their GPUs (instance_group) and parallel sizes (`stb.tensor_parallel_size`,
    `stb.pipeline_parallel_size`). A field set here wins over the repository's, and the
    daemon, `stb config check` and `stb status` say so; unset fields keep the
    repository's value."""

    slo_p99_ms: float | None = Field(
        default=None, gt=0, description="Latency objective: p99 in milliseconds."
    )
    min_replicas: int | None = Field(
        default=None,
        ge=0,
        description="Replicas kept on the reserved nodes at all times (baseline servers); "
        "0: scale to zero (served by lent replicas alone, started by its first request).",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        description="Upper bound of replicas, lent ones included; bounds what one model's "
        "burst can take from training.",
    )
    instances: int | None = Field(
        default=None,
        ge=1,
        description="Parallel executions of the model on one replica (the repository's: "
        "its instance_group count, when every group is on CPU or names its GPUs).",
    )
    instance_gpus: int | None = Field(
        default=None,
        ge=1,
        description="GPUs one replica's instances hold (overrides the repository's: the "
        "distinct GPUs its KIND_GPU instance groups name in their `gpus` lists).",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Tensor-parallel size of one replica, in GPUs (overrides config.pbtxt "
        "stb.tensor_parallel_size).",
    )
    pipeline_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Pipeline-parallel size of one replica, in stages (overrides "
        "config.pbtxt stb.pipeline_parallel_size).",
    )
    slo_ttft_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="Token objective of an LLM: p99 time to first token in milliseconds "
        "(overrides config.pbtxt stb.slo_ttft_p99_ms).",
    )
    slo_tpot_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="Token objective of an LLM: p99 time per output token (the gap between "
        "tokens) in milliseconds (overrides stb.slo_tpot_p99_ms).",
    )
    slo_e2e_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="An LLM's optional p99 end-to-end request latency in milliseconds "
        "(overrides stb.slo_e2e_p99_ms).",
    )
    gpu_type: str | None = Field(
        default=None,
        pattern=GRES_TYPE.pattern,
        description=_GPU_TYPE_HELP + " (Overrides config.pbtxt stb.gpu_type.)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ModelOverride:
        _check_replica_bounds(self.min_replicas, self.max_replicas)
        return self


class PolicyConfig(_Strict):
    """When to lend and return. Defaults favour stability over speed: a lend costs
    requeued work, so it needs a sustained breach; a return needs a longer calm."""

    high_watermark: float = Field(
        default=1.0,
        gt=0,
        description="A model breaches when p99 > high_watermark x SLO. 1.0: the SLO itself.",
    )
    partial_lends: bool = Field(
        default=True,
        description="Lend a model whose replica says its GPUs (instance_group, tensor x "
        "pipeline parallel) just those GPUs of a preempt-mode node, requeueing only the "
        "jobs that hold them (and of a drain-mode node with drain_partial_lends); false: "
        "whole nodes, as before. Models that do not say their GPUs take whole nodes "
        "either way.",
    )
    drain_partial_lends: bool = Field(
        default=False,
        description="With partial_lends: lend a drain-mode (training) node just a "
        "replica's GPUs too, waiting for the jobs that hold them to end (its Triton job "
        "pends on the node at the top priority: no fence, nothing killed, the node's other "
        "jobs go on). Off by default: in the simulator's GPU-granular runs it lost fewer "
        "elastic GPU-hours but kept fewer requests within their SLO (bench/README.md).",
    )
    sized_lends: bool = Field(
        default=False,
        description="With partial_lends: size a lend to several replicas' worth of one "
        "node's GPUs (m x a replica's k, the fewest that carry the demand) rather than one "
        "replica. Off by default in the daemon: its Triton job serves m replicas only "
        "where the model's instances spread over every GPU the job holds (an "
        "instance_group without a device list); a tensor-parallel backend or one naming "
        "its devices would serve one. The simulator's GPU-granular runs turn it on.",
    )
    lend_ranking: Literal["largest", "per_gpu"] = Field(
        default="largest",
        description="With sized_lends, how a sized lend's nodes are chosen. 'largest': "
        "the nodes that give the planned GPUs first (cheapest first), then those that "
        "give one replica fewer, and so on. 'per_gpu': every size from the planned one "
        "down to one replica's together, by the work the victims lose per GPU lent "
        "(plus lease_cost_gpu_s a lease), so free GPUs of busy nodes go first. "
        "per_gpu also plans a gang's small models in lends of their own "
        "(capacity.plan_lends small_apart). In the simulator per_gpu with "
        "lease_cost_gpu_s 900 and shared_lends loses far fewer elastic GPU-hours and "
        "keeps SLO, but some days' jobs wait longer: see bench/README.md first.",
    )
    lease_cost_gpu_s: float = Field(
        default=0.0,
        ge=0,
        description="With lend_ranking 'per_gpu': GPU-seconds of work a lease is charged "
        "besides its victims' (each lease holds a node's lend and a place in its pool's "
        "lend share), so larger leases rank before many small ones. 0: victims' work only.",
    )
    shared_lends: bool = Field(
        default=False,
        description="With lend_ranking 'per_gpu': when a sized lend finds too few nodes "
        "and a model of it is in sustained breach (breach_evaluations), lend GPUs of a "
        "preempt-mode node whose serving leases each hold some of its GPUs, beside them, "
        "on a port slot of its own (bridge/triton/ports.py).",
    )
    low_watermark: float = Field(
        default=0.5,
        gt=0,
        description="A model is calm when p99 < low_watermark x SLO and nothing is pending. "
        "0.5: well below the SLO, so returning a replica does not cause the next breach "
        "(hysteresis).",
    )
    breach_evaluations: int = Field(
        default=3,
        ge=1,
        description="Consecutive breaching ticks before a lend (3 ticks of 5 s: 15 s, "
        "long enough to ignore one slow request, short against a minutes-long burst).",
    )
    scale_out_cooldown_s: float = Field(
        default=60,
        ge=0,
        description="Seconds after a lend's replica began serving (or after the lend, while "
        "it starts) before the next lend for the model: Triton's p99 covers 60 s, so a new "
        "replica shows in it only after about that long.",
    )
    scale_in_cooldown_s: float = Field(
        default=300,
        ge=0,
        description="Seconds a lease serves before it may be returned: no lend-return flap.",
    )
    max_lent_nodes: int = Field(
        default=2,
        ge=0,
        description="Most nodes lent at once, all pools together (a node count): the "
        "training guarantee, an absolute cap beside max_lent_share (the effective cap is "
        "the smaller).",
    )
    max_lent_share: float = Field(
        default=1.0,
        ge=0,
        le=1.0,
        description="Share of each lendable pool's nodes (preempt and drain pools, each "
        "apart; 0 to 1) the bridge may hold lent at once: floor(share x the pool's "
        "nodes); a pool's own [pools.NAME] max_lent_share wins. A site policy (how much "
        "of the elastic pool inference may take in a burst), not a sizing; training "
        "keeps its own protection (drain only, drain_wait_s). 1.0, the default: no cap "
        "beyond max_lent_nodes (today's behaviour). A larger effective cap buys SLO in "
        "bursts with elastic work requeued and jobs waiting longer (docs/simulator.md, "
        "--lend-cap).",
    )
    preempt_guard_s: float = Field(
        default=900,
        ge=0,
        description="A job requeued within this many seconds is not preempted again "
        "(Slurm holds jobs after repeated requeues; MaxBatchRequeue).",
    )
    drain_wait_s: float = Field(
        default=1800,
        ge=0,
        description="Seconds a drained training node may take to become free before the "
        "lend is abandoned and the node resumed (bounded wait).",
    )
    capacity_headroom: float = Field(
        default=1.25,
        ge=1.0,
        description="Lend when the replicas could not carry this multiple of the current "
        "or forecast request rate within the SLO (capacity model): 1.25 covers the "
        "tick-to-tick noise of the rate and the model's own error.",
    )
    return_headroom: float = Field(
        default=1.5,
        ge=1.0,
        description="Return a lease only if the replicas left carry this multiple of the "
        "highest rate of the last return_dwell_s and of the forecast within the "
        "SLO; above capacity_headroom, so a return never sets off the next lend.",
    )
    return_slack: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="A return's test for a model the capacity model finds over its SLO at "
        "the return's rate with every replica held (the replicas cannot carry that rate "
        "anyway): the return may leave its predicted p99 up to this fraction higher "
        "than it is with them, if its measured latency is calm, where 0 (the default) "
        "lets no return make it worse. Without it, one model short of capacity at its "
        "dwell's highest rate holds every lease that shares a replica with it (through "
        "the reserved baseline, all of them). In the simulator 0.1 with the per-GPU "
        "options lets GPU-granular lending give nodes back (bench/README, issue 32).",
    )
    return_dwell_s: float = Field(
        default=300,
        ge=0,
        description="Seconds a lease's models must have been quiet (p99 under "
        "low_watermark x SLO) before it goes back; the return's rate is the highest of "
        "that span. Long against the rate's noise, so one quiet minute on a busy day "
        "does not cost a lend-return cycle (each cycle requeues elastic work); short "
        "enough to give nodes back within minutes (simulated, 3 days: 180, 300, 600 and "
        "900 s kept the same SLO; 300 s gave the shortest job waits).",
    )
    return_dwell_max_s: float = Field(
        default=3600,
        ge=0,
        description="The longest a model's return dwell grows to (`bridge.policy.returns`): "
        "each return of the model that was lent again sooner than the break-even doubles "
        "its dwell, each that stayed out longer halves it, and the return's rate is the "
        "highest of that dwell. An hour: bursty traffic keeps its nodes through its "
        "bursts, and a quiet hour still gives them back.",
    )
    relend_work_s: float = Field(
        default=600,
        ge=0,
        description="Seconds of a node's elastic work a lend throws away (the victims' work "
        "since their start or checkpoint, Slurm's requeue): with the lend's lead time "
        "(Slurm, Triton, the models' load) it is the break-even of a return, the shortest "
        "time a returned node must stay out for the return to have paid.",
    )
    forecast_window_s: float = Field(
        default=180,
        gt=0,
        description="Seconds of recent request rates whose trend is extrapolated over a "
        "lend's lead time (a ramp is met before it arrives).",
    )
    seasonal_days: int = Field(
        default=7,
        ge=0,
        le=28,
        description="Days of each model's request rate (5-minute means, kept in the "
        "bridge's database) the forecast reads at this time of day: a surge every "
        "remembered day had over the lend's lead (at least 2 days) is lent for before it "
        "starts (`bridge.policy.seasonal`). 0: the trend alone.",
    )
    lend_lead_s: float = Field(
        default=30,
        ge=0,
        description="Seconds from a lend to its replica serving, for a pool without a "
        "measured estimate yet (the bridge keeps one per pool from its leases).",
    )
    lend_lead_load_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds of model load a lend's start holds without asking: "
        "lend_lead_s and a pool's measured lend time hold at least this much of the "
        "slowest model's load (Triton's start with small models: the lab's load in about "
        "a second). A scaled model measured to load longer lengthens the lead time, the "
        "forecast's horizon and a return's break-even, by the difference "
        "(bridge.policy.timing).",
    )
    service_cv2: float = Field(
        default=0.0,
        ge=0,
        description="Squared coefficient of variation of a request's compute time, for "
        "the capacity model's queueing (0: constant, 1: exponential).",
    )
    max_requeues_per_job: int = Field(
        default=2,
        ge=0,
        description="A job Slurm has requeued this many times is never preempted by the "
        "bridge again (Slurm holds a job after MaxBatchRequeue requeues).",
    )
    max_preemptions_per_hour: int = Field(
        default=30,
        ge=0,
        description="Most jobs the bridge requeues in any hour, all nodes together: a "
        "budget against thrash while the capacity model is wrong.",
    )
    reservation_lookahead_s: float = Field(
        default=3600,
        ge=0,
        description="A node in a site reservation that is active or starts within this "
        "many seconds is never lent (maintenance windows, a team's booked nodes).",
    )
    placement: bool = Field(
        default=True,
        description="Model placement (on/off, no unit): before lending a node for models the "
        "capacity model finds late, give a serving lease's replica those models in place "
        "of its own when the other replicas still carry them at the return's demand "
        "(`bridge.policy.placement`). On by default: a place costs only the models' load, "
        "a lend a preemption and Slurm's and Triton's start besides; off keeps each "
        "replica's models as lent (the comparison's before).",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> PolicyConfig:
        # (an option another one switches off would do nothing, silently)
        if self.lend_ranking == "per_gpu" and not (self.partial_lends and self.sized_lends):
            raise ValueError("lend_ranking 'per_gpu' needs partial_lends and sized_lends")
        if self.lend_ranking != "per_gpu" and (self.shared_lends or self.lease_cost_gpu_s):
            raise ValueError("shared_lends and lease_cost_gpu_s need lend_ranking 'per_gpu'")
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below high_watermark "
                f"({self.high_watermark}), or lending and returning would flap"
            )
        if self.return_headroom < self.capacity_headroom:
            raise ValueError(
                f"return_headroom ({self.return_headroom}) must be at least "
                f"capacity_headroom ({self.capacity_headroom}), or a return would set off "
                "the next lend"
            )
        if self.return_dwell_max_s < self.return_dwell_s:
            raise ValueError(
                f"return_dwell_max_s ({self.return_dwell_max_s:g}) must be at least "
                f"return_dwell_s ({self.return_dwell_s:g}): it is the longest the dwell grows"
            )
        return self


_APPTAINER_URIS = ("docker://", "oras://", "library://")
_BIND_MODES = ("ro", "rw")


def _bind_spec(spec: str) -> str:
    """`SRC[:DST][:ro|rw]` as `SRC:DST:MODE` (DST defaults to SRC, MODE to ro)."""
    parts = spec.split(":")
    if parts[-1] in _BIND_MODES:
        mode, parts = parts[-1], parts[:-1]
    else:
        mode = "ro"
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"bind {spec!r} is not SRC[:DST][:ro|rw] (a path holds no ':')")
    src, dst = parts[0], parts[-1]
    for path in (src, dst):
        if not path.startswith("/"):
            raise ValueError(f"bind {spec!r}: {path!r} is not an absolute path")
        if any(c in path for c in ",;=\n") or any(c.isspace() for c in path):
            raise ValueError(
                f"bind {spec!r}: a path may not hold ',', ';', '=' or spaces (both runtimes "
                "split their mount lists on ',', the job's environment on ';')"
            )
    return f"{src}:{dst}:{mode}"


def _image_is_path(runtime: str, image: str) -> bool:
    """Whether `image` names a file on the nodes rather than a registry reference:
    apptainer takes a URI with a scheme, else a path; pyxis takes a path when it starts
    with '/' or '.' (pyxis_slurmstepd.c), else an enroot URI."""
    if runtime == "apptainer":
        return "://" not in image
    return image.startswith(("/", "."))


class TritonJobConfig(_Strict):
    """How a Triton server is submitted (always a Slurm job), and what runs it: the
    wheel's tritonserver, or a Triton container through Apptainer or pyxis/enroot."""

    sbatch_script: Path = Field(
        default=Path("deploy/slurm/triton-server.sbatch"),
        description="Batch script that starts tritonserver; relative to the project root.",
    )
    partition: str = Field(default="infer", description="Partition of Triton jobs.")
    account: str = Field(default="bridge", description="Slurm account of Triton jobs.")
    model_repository: Path = Field(
        default=Path("triton_repo"), description="Triton model repository."
    )
    key_file: Path = Field(
        default=Path("triton-api.key"),
        description="File holding the model-repository API key (X-Stb-Key); mode 0600, "
        "readable on every inference node by the user Triton jobs run as.",
    )
    key_shim: Path | None = Field(
        default=None,
        description="The LD_PRELOAD library that hands tritonserver the key without a "
        "command line (deploy/slurm/stb-keyshim.c); default: built next to key_file.",
    )
    backend_directory: Path | None = Field(
        default=None,
        description="Triton backend directory; default: the nvidia-pytriton wheel's.",
    )
    log_dir: Path | None = Field(
        default=None, description="Where Triton jobs write their output (Slurm's default if unset)."
    )
    ready_timeout_s: float = Field(
        default=300,
        gt=0,
        description="Seconds from job start to Triton ready before a lease fails "
        "(measured start: about 2 s; model loads can take minutes; a container image "
        "given as a registry reference is pulled on a node's first start, which can take "
        "longer: use a local image file there).",
    )
    runtime: Literal["wheel", "apptainer", "pyxis"] = Field(
        default="wheel",
        description="What runs tritonserver inside the Slurm job. wheel: the binary of "
        "the nvidia-pytriton wheel the bridge is installed with (the default: it needs "
        "no container runtime, which is why the lab uses it); apptainer: `apptainer "
        "exec --nv` of `image`; pyxis: `srun --container-image` of `image` "
        "(pyxis/enroot). Readiness, drain on SIGTERM, tags and the key are the same "
        "for all three (deploy/slurm/triton-server.sbatch).",
    )
    image: str | None = Field(
        default=None,
        description="The Triton container, for apptainer and pyxis only (no default: a "
        "site picks its Triton release). apptainer: a `.sif` file (converted once, on "
        "storage the inference nodes read: no pull at start) or "
        "`docker://nvcr.io/nvidia/tritonserver:<yy.mm>-py3`; pyxis: a squashfs file "
        "(`enroot import`, a path starting with '/' or '.') or an enroot URI "
        "`nvcr.io#nvidia/tritonserver:<yy.mm>-py3` ('#' between registry and image). "
        "A relative file path is taken from the working directory, like the other paths.",
    )
    python: Path | None = Field(
        default=None,
        description="The Python whose packages the Python backend's models import (the "
        "backend's stub takes the first python3 on the job's PATH, and this one's folder "
        "goes first); default: the bridge's own. With run_as, one that user can run.",
    )
    run_as: str | None = Field(
        default=None,
        description="The Unix user the server runs as, apart from the site's jobs (issue "
        "33's hand-over hygiene; wheel runtime, a job that starts as root: a bridge run "
        "as root, or the lab). The job then serves in a mount namespace of its own with "
        "a private /tmp and /dev/shm: it sees nothing the node's earlier jobs left there, "
        "and what it writes there is gone when it ends. None: the server runs as the "
        "job's user, the bridge's (run the bridge as a service account of its own, and "
        "Slurm's job_container/tmpfs for every job's /tmp).",
    )
    binds: tuple[str, ...] = Field(
        default=(),
        description="Extra host paths the container sees, each `SRC[:DST][:ro|rw]` "
        "(absolute paths; DST defaults to SRC, the mode to ro: Triton only reads). "
        "The model repository, key_file, the key shim and a set backend_directory are "
        "always bound read-only at their own paths and need no entry here.",
    )

    @field_validator("image")
    @classmethod
    def _image_text(cls, image: str | None) -> str | None:
        if image is not None and (not image or any(c in image for c in ",; \t\n")):
            raise ValueError(
                f"image {image!r} is empty or holds ',', ';' or white space (sbatch "
                "exports the job's environment split on ',')"
            )
        return image

    @field_validator("binds")
    @classmethod
    def _bind_specs(cls, binds: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_bind_spec(b) for b in binds)

    @field_validator("run_as")
    @classmethod
    def _user_name(cls, user: str | None) -> str | None:
        if user is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
            raise ValueError(f"run_as {user!r} is not a Unix user name ([a-z_][a-z0-9_-]*)")
        return user

    @model_validator(mode="after")
    def _runtime_needs(self) -> TritonJobConfig:
        if self.run_as is not None and self.runtime != "wheel":
            raise ValueError(
                f'triton.run_as is for runtime = "wheel"; a {self.runtime} container '
                "runs as the job's user (run the bridge as a service account of its own)"
            )
        if self.runtime == "wheel":
            if self.image is not None or self.binds:
                raise ValueError(
                    'triton.image and triton.binds are for runtime = "apptainer" or '
                    '"pyxis"; runtime "wheel" runs the nvidia-pytriton binary'
                )
            return self
        image = self.image
        if image is None:
            example = (
                '"/shared/triton-24.10.sif" or "docker://nvcr.io/nvidia/tritonserver:24.10-py3"'
                if self.runtime == "apptainer"
                else '"nvcr.io#nvidia/tritonserver:24.10-py3" or "/shared/triton-24.10.sqsh"'
            )
            raise ValueError(f"runtime {self.runtime!r} needs triton.image, e.g. {example}")
        if self.runtime == "apptainer":
            if "://" in image and not image.startswith(_APPTAINER_URIS):
                raise ValueError(
                    f"apptainer image {image!r}: the URI schemes used here are "
                    f"{', '.join(_APPTAINER_URIS)}; else give a .sif file"
                )
            if "://" not in image and not image.endswith(".sif"):
                raise ValueError(
                    f"apptainer image {image!r} is neither a URI (docker://...) nor a .sif file"
                )
            return self
        if image.startswith("oras://") or image.startswith("library://"):
            raise ValueError(f"pyxis image {image!r}: pyxis imports Docker images only")
        ref = image.removeprefix("docker://")
        first = ref.split("/", 1)[0]
        looks_like_host = "/" in ref and ("." in first or ":" in first or first == "localhost")
        if not _image_is_path("pyxis", image) and "#" not in ref and looks_like_host:
            fixed = ref.replace("/", "#", 1)
            raise ValueError(
                f"pyxis image {image!r}: enroot separates the registry from the image "
                f"with '#', or it looks the name up on Docker Hub: write {fixed!r}"
            )
        return self

    @property
    def image_reference(self) -> str | None:
        """`image` as the runtime gets it: a file path made absolute (the job's working
        directory is not the daemon's), a registry reference as written."""
        if self.image is None or not _image_is_path(self.runtime, self.image):
            return self.image
        return str(Path(self.image).resolve())

    @property
    def key_shim_path(self) -> Path:
        """The key shim Triton jobs preload: `key_shim`, else `libstbkey.so` beside the
        key file (built there by `bridge.daemon.keyshim`)."""
        return (self.key_shim or self.key_file.parent / "libstbkey.so").resolve()


class RoutingConfig(_Strict):
    """Where ready replicas are published."""

    nginx_conf: Path = Field(
        default=Path("routing/stb-upstreams.conf"),
        description="nginx file the bridge writes (upstreams and the routing server).",
    )
    http_sd_file: Path = Field(
        default=Path("routing/http_sd.json"),
        description="Prometheus http_sd document of Triton and bridge metrics targets.",
    )
    listen: str = Field(default="127.0.0.1:8080", description="nginx listen address.")
    managed_nginx_prefix: Path | None = Field(
        default=None,
        description="If set, the daemon runs its own nginx with every file under this "
        "folder (the lab); else it drives the site's nginx below.",
    )
    nginx_main_conf: Path = Field(
        default=Path("/etc/nginx/nginx.conf"),
        description="The site's nginx main configuration, which includes nginx_conf.",
    )
    nginx_pid_file: Path = Field(
        default=Path("/run/nginx.pid"), description="The site's nginx master pid file."
    )
    cold_start_timeout_s: int = Field(
        default=180,
        ge=1,
        le=3600,
        description="Seconds a request of a model at zero replicas (`min_replicas = 0`) "
        "waits at the activator for a replica to start before it is answered 503 with "
        "Retry-After. The lab's cold start is 4.5-7.5 s (docs: Scale to zero); a site's "
        "large model loads in minutes from a shared file system, about one from a node's "
        "weight cache: 180 s covers a cached start with room.",
    )
    activator_queue: int = Field(
        default=64,
        ge=1,
        le=100000,
        description="Requests of one model held at once by the activator while it is at "
        "zero; one more is answered 503 at once. Bounded so a burst at zero cannot hold "
        "every connection of the daemon's HTTP server (128).",
    )


class LeaseConfig(_Strict):
    """How long a lease may stay in one state, and how failed adapter calls are retried.
    A lease past its deadline is failed (reason quoted), cleaned up and returned; the
    policy may lend another node. `starting` uses `triton.ready_timeout_s`."""

    requeue_victims: bool = Field(
        default=True,
        description="A preempt-mode lend requeues the node's jobs itself right after "
        "submitting its Triton job there (Slurm's requeue: SIGTERM, KillWait to "
        "checkpoint, the job runs again); false: wait for slurmctld's own preemption "
        "pass, which enforces GraceTime in the background (18-33 s on the lab vs 3.8 s).",
    )
    requested_deadline_s: float = Field(
        default=120,
        gt=0,
        description="Seconds a lend may wait for its Triton job to be submitted: sbatch "
        "answers in under a second, so two minutes means Slurm kept refusing or timing out.",
    )
    submitted_deadline_s: float = Field(
        default=600,
        gt=0,
        description="Seconds a submitted Triton job may stay pending. A preempting job ran "
        "within 33 s on the lab; a drain-mode lease gets at least `policy.drain_wait_s` "
        "+ 60 s, since it waits for the training job on its node.",
    )
    releasing_deadline_s: float = Field(
        default=300,
        gt=0,
        description="Seconds a cancelled Triton job may take to leave the node (Triton's "
        "exit timeout is 20-30 s); past it the lease is failed and the cleanup retried.",
    )
    drain_timeout_s: float = Field(
        default=300,
        gt=0,
        description="Seconds a replica out of routing waits for its in-flight requests "
        "(an LLM's open streams among them) before its models are unloaded: longer than "
        "any sane request, an LLM's longest answer included (2,000 tokens at 50 ms each "
        "is 100 s); the wait ends as soon as none is in flight, so it delays no return "
        "whose requests end sooner.",
    )
    model_load_timeout_s: float = Field(
        default=1800,
        gt=0,
        description="Seconds a placement's model load may stay under way (asked, Triton "
        "loading it; the passes go on meanwhile) before it is given up: reported as an "
        "error and undone as a load Triton refused is (the lease keeps the models its "
        "replica holds). Generous: a large model's weights load for minutes.",
    )
    unanswered_grace_s: float = Field(
        default=15,
        ge=0,
        description="Seconds a serving replica whose Triton job still runs may go without "
        "answering as ready (a server saturated by a burst, a slow host) before its lease "
        "is failed; the job ending fails it at once. 0: the first unanswered tick fails it.",
    )
    retry_base_s: float = Field(
        default=2,
        gt=0,
        description="First wait before a lease's step is retried after a transient error; "
        "doubled at each further error (a restarting slurmctld is back within seconds).",
    )
    retry_max_s: float = Field(
        default=60,
        gt=0,
        description="Longest wait between retries of one lease's step: bounded so a "
        "recovered controller is used within a minute.",
    )


class DaemonConfig(_Strict):
    """The daemon process itself."""

    exporter_listen: str = Field(
        default="127.0.0.1:9108",
        description="host:port of /metrics, /healthz and /sd (loopback by default).",
    )
    lock_file: Path = Field(
        default=Path("stb-bridge.lock"),
        description="Held (flock) while a daemon runs on SQLite: two copies never act at "
        "once. On PostgreSQL the leader row decides instead (several hosts, one active).",
    )
    instance: str = Field(
        default="",
        max_length=200,
        description="This daemon's name in the leader row, the metrics and `stb status` "
        "(empty: host:pid).",
    )
    leader_ttl_s: float = Field(
        default=0,
        ge=0,
        description="PostgreSQL only: seconds a leader's lease lasts unrenewed; renewed "
        "every third of it, so a standby takes over within this plus a third of it after "
        "the leader dies or loses the database (0: tick_s, which keeps takeover within two "
        "ticks).",
    )


class RolloutConfig(_Strict):
    """How a gradual rollout (`stb models publish --canary`) judges the new version
    against the old at each step (`bridge.policy.rollout.judge`)."""

    hold_s: float = Field(
        default=300,
        ge=0,
        description="Seconds each step runs before it may advance, where the plan names "
        "none: long enough for Triton's 60 s p99 window to hold mostly this step's requests.",
    )
    min_requests: int = Field(
        default=200,
        ge=1,
        description="Requests the new version must answer in a step before it is judged; "
        "with fewer, a p99 is one slow request and a failure rate is noise.",
    )
    p99_margin: float = Field(
        default=0.25,
        ge=0,
        description="The new version is rolled back when its p99 is over the old one's by "
        "more than this share (and by `p99_floor_ms`).",
    )
    p99_floor_ms: float = Field(
        default=5,
        ge=0,
        description="...and by more than these milliseconds: a 1 ms model jitters by 25%.",
    )


class BatchConfig(_Strict):
    """Batch inference on the serving replicas' spare capacity: the batch route
    (`/batch/v2/models/<model>/...` in nginx, beside the online one) and its gate, closed
    each pass online load rises and opened again after a calm dwell
    (`bridge.policy.batch`). Off by default: no batch route, nothing changes."""

    enabled: bool = Field(
        default=False,
        description="Publish the batch route and decide its gate each pass. Off: batch "
        "paths answer 404, as before.",
    )
    access_log: Path = Field(
        default=Path("routing/batch-access.log"),
        description="nginx's log of the batch route's requests (one line each), which the "
        "bridge reads each pass to tell batch load from online load (Triton's counters "
        "cannot). Made absolute from the daemon's working directory; nginx's master "
        "process must be able to write it.",
    )
    close_utilisation: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="The gate closes when a replica's GPUs (or a model's own instances) "
        "are busier than this share with online requests alone (measured rate less the "
        "batch route's, times compute time per request): 0.7 leaves the queueing room an "
        "M/G/c pool needs to hold its p99 near its service time.",
    )
    open_utilisation: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="...and may open again only when every replica is at most this busy "
        "with online requests (below `close_utilisation`: the band keeps the gate from "
        "flapping on noise).",
    )
    close_p99_ratio: float = Field(
        default=0.8,
        gt=0,
        description="The gate closes when a model's newest p99 (TTFT/TPOT for an LLM) is "
        "over this share of its SLO: before the policy's breach (high_watermark), so the "
        "batch work yields before a node is lent.",
    )
    open_p99_ratio: float = Field(
        default=0.6,
        gt=0,
        description="...and may open again only when every model is under this share.",
    )
    calm_s: float = Field(
        default=120,
        ge=0,
        description="Seconds every replica and model must stay calm (under both `open_` "
        "thresholds, nothing lent) before a closed gate opens: two Triton p99 windows, so "
        "the p99 the gate reads no longer holds the rise.",
    )
    retry_after_s: int = Field(
        default=30,
        ge=1,
        le=86400,
        description="Retry-After (seconds) of a closed gate's 429: a batch client waits "
        "this long before it tries again.",
    )

    @model_validator(mode="after")
    def _bands(self) -> BatchConfig:
        if self.open_utilisation > self.close_utilisation:
            raise ValueError(
                f"open_utilisation ({self.open_utilisation}) must not exceed "
                f"close_utilisation ({self.close_utilisation})"
            )
        if self.open_p99_ratio > self.close_p99_ratio:
            raise ValueError(
                f"open_p99_ratio ({self.open_p99_ratio}) must not exceed "
                f"close_p99_ratio ({self.close_p99_ratio})"
            )
        return self


class WeightsConfig(_Strict):
    """The node-local weight cache (`bridge.weights`): where a lendable node keeps copies
    of model versions, how much it may hold, and how staging jobs copy them there (Slurm
    jobs on the target node, at the lowest priority, throttled)."""

    cache_root: Path | None = Field(
        default=None,
        description="Folder on each lendable node's local disk holding the copies "
        "(`<cache_root>/<model>/<version>/`); unset: no cache, Triton jobs read the shared "
        "repository as before. The same path on every node; the staging and Triton jobs' "
        "user writes it.",
    )
    verify: Literal["stamp", "full"] = Field(
        default="stamp",
        description="How a Triton job checks a copy before it serves from it: `stamp` takes "
        "a copy whose files keep the size, mtime, ctime and inode they had when a staging "
        "job or `stb weights verify` last read every byte (any write or `touch` changes the "
        "ctime); `full` reads every byte at every start (1.4 s for 2 GB on the lab), which "
        "also sees a change below the file system (a disk's bit rot).",
    )
    source: str | None = Field(
        default=None,
        description="Where staging jobs copy versions from: the shared repository as a "
        "folder the nodes see, or an http(s) origin serving it; default: "
        "`triton.model_repository`.",
    )
    budget_bytes: int = Field(
        default=100_000_000_000,
        gt=0,
        description="Bytes the cache may hold on one node: 100 GB is a few large models and "
        "a small share of a GPU node's local NVMe, which jobs also use as scratch.",
    )
    bandwidth_bytes_s: float = Field(
        default=200_000_000,
        ge=0,
        description="Bytes a second one staging job reads from the source at most (0: no "
        "limit): 200 MB/s is a small share of a parallel file system's per-client "
        "bandwidth, so the training jobs reading it beside are not slowed.",
    )
    partition: str | None = Field(
        default=None,
        description="Partition of staging jobs; unset: the partition of the target node's "
        "pool (the job must be allowed on that node).",
    )
    account: str | None = Field(
        default=None,
        description="Slurm account of staging jobs; unset: `triton.account` (the "
        "bridge's), so staging is booked to serving.",
    )
    qos: str | None = Field(
        default=None,
        description="QOS of staging jobs: the site's scavenger/elastic QOS, so they are the "
        "first preempted and never delay training; unset: the account's default QOS.",
    )
    nice: int = Field(
        default=10000,
        ge=0,
        le=2147483645,
        description="sbatch --nice of staging jobs: far below any other job's priority, so "
        "a staging job starts only on a node nothing else wants.",
    )
    max_jobs: int = Field(
        default=2,
        ge=1,
        description="Staging jobs queued or running at once, in the whole cluster: each "
        "reads the shared source at `bandwidth_bytes_s`.",
    )
    plan_every_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between two of the daemon's staging plans (each reads the "
        "staging jobs' outcomes and submits new ones): a copy takes minutes at "
        "`bandwidth_bytes_s`, so a minute loses little and keeps Slurm's load small.",
    )
    time_limit_min: int = Field(
        default=120,
        ge=1,
        description="Minutes a staging job may run (a 140 GB model at 200 MB/s takes 12).",
    )
    sbatch_script: Path = Field(
        default=Path("deploy/slurm/stage-weights.sbatch"),
        description="Batch script of staging jobs; relative to the project root.",
    )

    @field_validator("source")
    @classmethod
    def _source_text(cls, source: str | None) -> str | None:
        if source is not None and (not source or any(c in source for c in ", \t\n")):
            raise ValueError(
                f"source {source!r} is empty or holds ',' or white space (sbatch exports "
                "the job's environment split on ',')"
            )
        return source

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"{value!r} is not a Slurm name (letters, digits, '_', '-', '.')")
        return value


class ObserveConfig(_Strict):
    """Where each tick's latency and load signal comes from."""

    source: Literal["direct", "prometheus"] = Field(
        default="direct",
        description="direct: scrape every Triton server's metrics page each tick (small "
        "sites); prometheus: a few PromQL queries over deploy/prometheus/rules.yml (at "
        "scale; the signal lags by up to a scrape and a rule interval).",
    )
    prometheus_url: str = Field(
        default="http://127.0.0.1:9090",
        description="The Prometheus server that scrapes the Triton servers (source = prometheus).",
    )
    max_staleness_s: float = Field(
        default=15,
        gt=0,
        description="A replica whose last successful scrape is older than this gives no "
        "data (never a calm reading): three 5 s scrape intervals.",
    )
    concurrency: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Triton servers asked at once each tick (readiness, models, and on the "
        "direct path the metrics page); 1 asks them in turn on the tick's thread. A site "
        "with hundreds of servers sets 8-32.",
    )
    timeout_s: float = Field(default=3, gt=0, description="Seconds a Prometheus query may take.")


class ApiConfig(_Strict):
    """Who may use the HTTP API (every path but /metrics and /healthz), and TLS."""

    tokens_file: Path | None = Field(
        default=None,
        description="File of bearer tokens, one per line: `name roles token` (roles "
        "comma-separated: finance, operator, metrics); mode 0600 or stricter. Without "
        "it every path but /metrics and /healthz answers 401.",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate: serve HTTPS (needs tls_key)."
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("api.tls_cert and api.tls_key go together: set both or neither")
        return self


class SliceConfig(_Strict):
    """`[accounting.slices]`: how much of a GPU a MIG slice or a GPU shard books in the
    ledger (docs/finance/slices.md). A whole GPU books 1 GPU-hour per hour; a slice its
    fraction of its GPU; shards their share. Slurm's own counts are kept beside: sacct and
    sreport count a slice as one `gres/gpu`, and the sreport agreement counts the same."""

    share: Literal["compute", "memory"] = Field(
        default="compute",
        description="What a MIG slice's fraction measures: `compute`, its compute slices "
        "over its GPU's (a 1g.10gb slice of an H100: 1/7; a GPU cut into slices books "
        "exactly one GPU), or `memory`, its memory over its GPU's (1g.10gb of 80 GB: 1/8; "
        "needs gpu_memory_gb). Compute by default: the slices of a GPU sum to that GPU.",
    )
    compute_slices: int = Field(
        default=7,
        ge=1,
        description="Compute slices per GPU: 7 on A100, H100, H200 and B200 (NVIDIA's MIG "
        "user guide).",
    )
    compute_slices_of: dict[str, int] = Field(
        default_factory=dict,
        description="GPU type -> compute slices, for GPUs not cut in compute_slices (A30: 4).",
    )
    gpu_memory_gb: dict[str, int] = Field(
        default_factory=dict,
        description="GPU type -> its memory in GB as its whole-GPU MIG profile names it "
        '(h100 = 80 for 7g.80gb). Needed with share = "memory", for every GPU type that '
        "has slices.",
    )
    shards_per_gpu: dict[str, int] = Field(
        default_factory=dict,
        description="Node name or GPU type -> shards per GPU (a node's `Gres=gpu:2,"
        "shard:64`: 32); a node's entry wins. No default: a job on shards of a node not "
        "listed is an ingest error naming it, never a guess.",
    )

    @field_validator("compute_slices_of", "gpu_memory_gb", "shards_per_gpu")
    @classmethod
    def _whole_numbers(cls, table: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in table.items() if v < 1}
        if bad:
            raise ValueError(f"counts must be whole numbers >= 1, got {bad}")
        return table

    @model_validator(mode="after")
    def _memory_needs_sizes(self) -> SliceConfig:
        if self.share == "memory" and not self.gpu_memory_gb:
            raise ValueError(
                'share = "memory" books a slice by its GB over its GPU\'s: set '
                "gpu_memory_gb (GPU type -> GB, e.g. { h100 = 80 })"
            )
        return self


class AccountingConfig(_Strict):
    """The GPU-hour ledger: where it is, how the daemon feeds it, how jobs map to teams."""

    ledger_url: str = Field(
        default="sqlite:///stb-ledger.db",
        description="SQLAlchemy URL of the ledger (SQLite file by default; "
        "postgresql://... in production). May be the lease store's database.",
    )
    cluster: str = Field(
        default="",
        description="Cluster name for the ledger; empty: Slurm's ClusterName (scontrol "
        "show config), the name slurmdbd keys its records by.",
    )
    capacity: Literal["events", "inventory"] = Field(
        default="events",
        description="Where capacity comes from: `events`, slurmdbd's registration and node "
        "events, as sreport counts it (an ingest finding no registration of the cluster is "
        "an error naming the clusters slurmdbd knows); `inventory`, the nodes Slurm lists at "
        "each ingest, each from its first observation or its first job run (for a slurmdbd "
        "that keeps no events; down time is then not seen between ingests).",
    )
    ingest_interval_s: float = Field(
        default=300,
        ge=0,
        description="Seconds between the daemon's ingests (0: the daemon does not ingest; "
        "run `stb accounting ingest` from cron instead). 5 minutes keeps the ledger "
        "current to the hour without loading slurmdbd.",
    )
    lookback_s: float = Field(
        default=7200,
        gt=0,
        description="Each daemon ingest re-reads this many seconds back: records that "
        "slurmdbd completes late (ends, requeues) are picked up; unchanged ones cost nothing.",
    )
    sample_interval_s: float = Field(
        default=30,
        ge=0,
        description="Seconds between stored Triton compute samples per server (the split "
        "is hourly; a sample per tick would only grow the table). The last interval of a "
        "server that stops books as unattributed.",
    )
    sample_retention_days: float = Field(
        default=62,
        gt=0,
        description="Days serving samples and batch request counts are kept: two months "
        "covers a restatement of the previous month.",
    )
    gpu_usage_dir: Path | None = Field(
        default=None,
        description="Folder of the GPU sampler's per-job records (slurm_plugins/"
        "gpu_sampler.py spools, collected from the nodes); read at each ingest. None: no "
        "used-vs-allocated figures.",
    )
    teams: dict[str, str] = Field(
        default_factory=dict,
        description="Slurm account -> team; an account not listed is its own team.",
    )
    workloads: dict[str, Literal["training", "elastic", "inference", "batch-inference"]] = Field(
        default_factory=dict,
        description="Partition -> workload, for partitions no pool names; a pool's "
        "partition gets its pool's workload (drain: training, preempt: elastic, "
        "reserved: inference). A job's `stb:workload=` tag wins over both "
        "(job_submit.lua tags an elastic job with `--comment=stb:batch` "
        "`batch-inference`).",
    )
    idle_cost: Literal["line", "shared"] = Field(
        default="line",
        description="Reports: idle cost as its own line, or shared within each pool in "
        "proportion to use.",
    )
    slices: SliceConfig = Field(
        default_factory=SliceConfig,
        description="MIG slices and GPU shards: the fraction of a GPU each books.",
    )


class BridgeConfig(BaseSettings):
    """The whole configuration."""

    model_config = SettingsConfigDict(
        env_prefix="STB_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    tick_s: float = Field(
        default=5,
        gt=0,
        description="Seconds between control passes: Triton's summaries cover 60 s, so "
        "5 s ticks see a breach within a few samples without hammering slurmctld.",
    )
    database_url: str = Field(
        default="sqlite:///stb-bridge.db",
        description="Lease and ledger database (SQLAlchemy URL); PostgreSQL in production.",
    )
    pools: dict[str, PoolConfig] = Field(
        default_factory=lambda: {
            "training": PoolConfig(partition="train", lend_mode="drain", cost_rank=2),
            "elastic": PoolConfig(partition="elastic", lend_mode="preempt", cost_rank=1),
            "inference": PoolConfig(partition="infer", lend_mode="reserved", cost_rank=0),
        },
        description="Pools by name.",
    )
    models: dict[str, ModelOverride] = Field(
        default_factory=dict,
        description="Per-site overrides of the model repository's facts, by Triton model "
        "name, field by field (bridge.modelfacts). Empty by default: every model's facts "
        "come from its config.pbtxt.",
    )
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    triton: TritonJobConfig = Field(default_factory=TritonJobConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    leases: LeaseConfig = Field(default_factory=LeaseConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    observe: ObserveConfig = Field(default_factory=ObserveConfig)
    accounting: AccountingConfig = Field(default_factory=AccountingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)

    @field_validator("models", mode="before")
    @classmethod
    def _overrides(cls, value: Any) -> Any:
        """A complete `ModelConfig` given in code (tests, tools) is taken as the override
        of the fields it sets."""
        if isinstance(value, dict):
            return {
                k: v.model_dump(exclude_unset=True) if isinstance(v, ModelConfig) else v
                for k, v in value.items()
            }
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BridgeConfig:
        for name in [*self.pools, *self.models]:
            if not _NAME.match(name):
                raise ValueError(f"name {name!r} may hold only letters, digits, '_', '-', '.'")
        if not any(p.lend_mode == "reserved" for p in self.pools.values()):
            raise ValueError('no pool has lend_mode = "reserved": Triton needs its own nodes')
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the file (given as init arguments), not the reverse.
        return env_settings, init_settings


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(file)"


def load_config(path: Path | None) -> BridgeConfig:
    """Read and validate; raises ConfigError naming every bad field."""
    source = str(path) if path else "(defaults)"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(source, [("(file)", "no such file")]) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, [("(file)", f"not valid TOML: {exc}")]) from exc
    try:
        return BridgeConfig(**data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key (a typo? it would otherwise be ignored)"
            problems.append((_loc(err["loc"]), msg))
        raise ConfigError(source, problems) from exc


#: STB_ variables that belong to other parts of the project, not to this file.
OTHER_ENV = {
    "STB_HOME",
    "STB_LAB_DIR",
    "STB_LAB_KEEP",
    "STB_LAB_DB_HOST",
    "STB_LAB_DB_PORT",
    "STB_LAB_DB_USER",
    "STB_LAB_DB_PASSWORD",
    "STB_SLURM_BACKEND",
    # the slurmrestd backend's settings (bridge.slurm.rest.RestSettings)
    "STB_SLURM_REST_URL",
    "STB_SLURM_REST_USER",
    "STB_SLURM_REST_TOKEN",
    "STB_SLURM_REST_TOKEN_LIFESPAN_S",
    "STB_SLURM_REST_TIMEOUT_S",
    "STB_SLURM_REST_VERSION",
}


def unknown_env(environ: dict[str, str]) -> list[str]:
    """STB_ variables that name no setting (typos the environment would ignore)."""
    fields = {f"STB_{name.upper()}" for name in BridgeConfig.model_fields}
    return sorted(
        key
        for key in environ
        if key.startswith("STB_") and key not in OTHER_ENV and key.split("__", 1)[0] not in fields
    )


class _InPartitions(Protocol):
    @property
    def partitions(self) -> Sequence[str]: ...


def pool_of(node: _InPartitions, config: BridgeConfig) -> str | None:
    """The configured pool of a node (a `bridge.slurm.model.Node`): the one whose partition
    holds it; a lendable pool wins over the reserved one (the elastic nodes are also in the
    inference partition)."""
    matches = [
        (pool.lend_mode == "reserved", name)
        for name, pool in config.pools.items()
        if pool.partition in node.partitions
    ]
    return min(matches)[1] if matches else None
