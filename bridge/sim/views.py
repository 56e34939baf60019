"""The policy's view of the simulated world, made fast: `bridge.policy`'s frozen
dataclasses (`ModelSample`, `NodeView`, `JobView`) built without their `__init__`.

A frozen dataclass's `__init__` sets each field with `object.__setattr__`: for the
samples the engine makes at every tick (one per model) and the views a decide call's
snapshot makes (one per node whose jobs changed, one per job on it), that was a tenth of
the run. These makers fill a fresh instance's `__dict__` with every field, in the class's
order, so it compares, hashes and prints as one made by the class
(tests/unit/test_sim_speed.py checks each against its class). Called by
`bridge.sim.engine` and `bridge.sim.serving` (an LLM's samples: `token_sample`).
"""

from __future__ import annotations

import dataclasses

from bridge.policy import JobView, ModelSample, NodeView


def job_view(
    job_id: str,
    gpus: int,
    started_at: float | None,
    restarts: int,
    submitted_at: float | None,
    checkpoint_at: float | None,
    gpus_here: int | None = None,
) -> JobView:
    """`JobView(job_id, gpus, ...)`, made as `model_sample` is (a snapshot makes one
    for each job on the nodes whose jobs changed: thousands)."""
    obj = object.__new__(JobView)  # (no `__init__`)
    d = obj.__dict__
    d["job_id"] = job_id
    d["gpus"] = gpus
    d["started_at"] = started_at
    d["restarts"] = restarts
    d["submitted_at"] = submitted_at
    d["checkpoint_at"] = checkpoint_at
    d["ends_at"] = None  # (no time limit is simulated: the policy sees none)
    d["gpus_here"] = gpus_here
    d["gpu_types"] = ()  # (the simulator models no GPU types)
    return obj


def node_view(
    name: str,
    pool: str,
    gpus: int,
    jobs: tuple[JobView, ...],
    has_triton: bool,
    cached: frozenset[str] = frozenset(),
    triton_gpus: int = 0,
) -> NodeView:
    """`NodeView(name, pool, True, gpus, jobs, has_triton, False, cached, triton_gpus)`,
    made as `model_sample` is (a decide call's snapshot makes one for each node whose jobs
    or weight cache changed). `triton_gpus`: the GPUs GPU-granular leases hold (a
    node-granular lease takes its node whole: 0)."""
    obj = object.__new__(NodeView)  # (no `__init__`)
    d = obj.__dict__
    d["name"] = name
    d["pool"] = pool
    d["usable"] = True
    d["gpus"] = gpus
    d["jobs"] = jobs
    d["has_triton"] = has_triton
    d["reserved"] = False
    d["cached"] = cached
    d["triton_gpus"] = triton_gpus
    d["free_types"] = ()  # (the simulator models no GPU types)
    return obj


#: `ModelSample`'s fields after the six `model_sample` is given (the token signal), in
#: the class's order (`model_sample` sets them None): read from the class, so a field
#: added there is never left out
_TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSample))[6:]


def model_sample(
    at: float,
    p99_ms: float | None,
    request_rate: float | None,
    pending: float | None,
    mean_ms: float | None,
    compute_ms: float | None,
) -> ModelSample:
    """`ModelSample(at, p99_ms, ...)`, made without the frozen dataclass's `__init__` (its
    six `object.__setattr__` calls are a tenth of a tick's latency model): an instance
    whose `__dict__` is filled directly with every field, in the class's order, so it
    compares and hashes as one made by `ModelSample(...)` (tests/unit/test_sim_speed.py
    checks each of these makers against its class)."""
    obj = object.__new__(ModelSample)  # (no `__init__`)
    d = obj.__dict__
    d["at"] = at
    d["p99_ms"] = p99_ms
    d["request_rate"] = request_rate
    d["pending"] = pending
    d["mean_ms"] = mean_ms
    d["compute_ms"] = compute_ms
    for token_field in _TOKEN_FIELDS:
        d[token_field] = None  # (the token signal: none in this maker's samples)
    return obj


def token_sample(
    at: float,
    p99_ms: float | None,
    request_rate: float | None,
    pending: float | None,
    mean_ms: float | None,
    compute_ms: float | None,
    ttft_p99_ms: float | None,
    tpot_p99_ms: float | None,
    prompt_tps: float | None,
    output_tps: float | None,
    running: float | None,
    prompt_lengths: tuple[float, ...] | None = None,
    output_lengths: tuple[float, ...] | None = None,
) -> ModelSample:
    """`ModelSample(...)` of an LLM: `model_sample`'s fields and its token signal (the
        TTFT and TPOT p99s of the tick, prompt and output tokens/s, streams being generated,
    the length quantiles),
        made the same way: `model_sample`'s instance, its token fields (there, in the class's
        order, as None) then set."""
    obj = model_sample(at, p99_ms, request_rate, pending, mean_ms, compute_ms)
    d = obj.__dict__
    d["ttft_p99_ms"] = ttft_p99_ms
    d["tpot_p99_ms"] = tpot_p99_ms
    d["prompt_tps"] = prompt_tps
    d["output_tps"] = output_tps
    d["running"] = running
    d["prompt_lengths"] = prompt_lengths
    d["output_lengths"] = output_lengths
    return obj
