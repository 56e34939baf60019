"""The scenario `stb simulate`'s options describe (`build_scenario`): the arrivals and the
jobs, generated (the generators' fixed parameters are here and go into the report's
scenario), read from the public traces (`$STB_TRACES_DIR`, or a file given) or replaced
by a site's own data (`bridge.sim.inputs`), on a fleet sized first for the peak
inference load. Called by `bridge.sim.cli`, the benches and the golden tests; raises
`BadInput` (a ValueError) naming the problem.

Generated models are named m0, m1, ...; model i gets `mean_rps` / (i + 1) requests per
second on average (`model_rates`: a Zipf-like popularity). Generated jobs are a share
(`load`) of the GPUs left outside a peak-sized inference pool, so every set-up faces the
same offered work; a site's jobs are replayed as they came.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from bridge.config import PolicyConfig
from bridge.paths import traces_dir
from bridge.sim import workload
from bridge.sim.engine import Timing
from bridge.sim.inputs import JobReplay
from bridge.sim.inputs.site import SITE_ARRIVALS, SITE_JOBS
from bridge.sim.lending import GRANULARITIES
from bridge.sim.policies import LEND_CAPS, Scenario, parse_lend_cap, setup_for, size
from bridge.sim.tokens import TokenModel
from bridge.sim.workload import ArrivalSeries, SimJob

AZURE_TRACE = "azure_llm_conv_2023.csv"
ALIBABA_TRACE = "alibaba_gpu2023_tasks.csv"
DAY_S = 86400.0
#: steps of the arrival series (the bridge's tick)
STEP_S = 5.0
#: the generators' parameters: fixed, and written into the report's scenario
AZURE_PARAMS: Mapping[str, float] = {"diurnal_amplitude": 0.5, "weekly_amplitude": 0.2}
#: the Azure trace as an intensity: its counts averaged over a minute, each step's rate
#: drawn as Poisson arrivals at the target rate (`workload.azure_series`: the trace's own
#: sampling noise at 3 req/s is not scaled up to thousands)
AZURE_INTENSITY: Mapping[str, float] = {"smooth_s": 60.0}
SYNTHETIC_SERIES_PARAMS: Mapping[str, float] = {
    **AZURE_PARAMS,
    "bursts_per_day": 4.0,
    "burst_factor": 3.0,
    "burst_s": 600.0,
    "noise": 0.1,
}
#: steep ramps (5x in 30 min) and sudden steps (3x in a minute) on a flat base
RAMP_PARAMS: Mapping[str, float] = {
    "ramps_per_day": 3.0,
    "ramp_factor": 5.0,
    "ramp_s": 1800.0,
    "steps_per_day": 3.0,
    "step_factor": 3.0,
    "step_rise_s": 60.0,
    "noise": 0.05,
}
#: a surge (4x within 2 minutes, held 30 minutes) at the same hour each day, model i 3 hours
#: after model i-1 (`workload.daily_series`: the seasonal forecast's case)
DAILY_PARAMS: Mapping[str, float] = {
    "surge_at_s": 9 * 3600.0,
    "surge_every_s": 3 * 3600.0,
    "surge_factor": 4.0,
    "rise_s": 120.0,
    "hold_s": 1800.0,
    "jitter_s": 60.0,
    "noise": 0.05,
}
#: bursts between minutes of near-silence, 5-second spikes, a model mix that shifts within
#: the hour, surges each day above the days before (`workload.bursty_series`)
BURSTY_PARAMS: Mapping[str, float] = {
    "burst_s": 300.0,
    "gap_s": 420.0,
    "quiet": 0.05,
    "spike_sigma": 0.35,
    "mix_amplitude": 0.7,
    "mix_period_s": 3600.0,
    "surges_per_day": 2.0,
    "surge_growth": 0.5,
    "surge_s": 900.0,
}
SYNTHETIC_JOBS_PARAMS: Mapping[str, float] = {"elastic_share": 0.4, "multi_node_share": 0.1}


class BadInput(ValueError):
    """An option or input the simulation cannot run with: exit 2."""


def model_rates(models: int, mean_rps: float) -> dict[str, float]:
    """m0..m{models-1}: model i gets mean_rps / (i + 1) requests per second."""
    return {f"m{i}": mean_rps / (i + 1) for i in range(models)}


def default_trace(name: str) -> Path | None:
    """`$STB_TRACES_DIR/NAME`, or None when that folder is not set."""
    folder = traces_dir()
    return folder / name if folder is not None else None


def _trace(path: Path | None, name: str, option: str) -> Path:
    trace = path if path is not None else default_trace(name)
    if trace is None:
        raise BadInput(
            f"{option}: give the {name} file, or set STB_TRACES_DIR to the folder that "
            "holds it (or choose the synthetic generator)"
        )
    if not trace.is_file():
        raise BadInput(f"{option}: trace file {trace} not found")
    return trace


def _arrivals(
    kind: str, trace: Path | None, rates: Mapping[str, float], horizon_s: float, seed: int
) -> tuple[ArrivalSeries, dict[str, object]]:
    """The arrival series and what the report says about it."""
    about: dict[str, object] = {"source": kind, "step_s": STEP_S, "mean_rps": dict(rates)}
    if kind == "azure":
        path = _trace(trace, AZURE_TRACE, "--arrivals-trace")
        about.update(trace=path.name, **AZURE_PARAMS, **AZURE_INTENSITY, arrivals="poisson")
        series = workload.azure_series(
            path, rates, horizon_s, STEP_S, seed=seed, draw=True, **AZURE_PARAMS, **AZURE_INTENSITY
        )
        return series, about
    if kind == "ramps":
        about.update(RAMP_PARAMS)
        return workload.ramp_series(rates, horizon_s, STEP_S, seed=seed, **RAMP_PARAMS), about
    if kind == "daily":
        about.update(DAILY_PARAMS)
        return workload.daily_series(rates, horizon_s, STEP_S, seed=seed, **DAILY_PARAMS), about
    if kind == "bursty":
        about.update(BURSTY_PARAMS)
        return workload.bursty_series(rates, horizon_s, STEP_S, seed=seed, **BURSTY_PARAMS), about
    about.update(SYNTHETIC_SERIES_PARAMS)
    return workload.synthetic_series(
        rates, horizon_s, STEP_S, seed=seed, **SYNTHETIC_SERIES_PARAMS
    ), about


def _jobs(
    kind: str, trace: Path | None, horizon_s: float, capacity: int, load: float, gpn: int, seed: int
) -> tuple[list[SimJob], dict[str, object]]:
    """The job list and what the report says about it."""
    about: dict[str, object] = {"source": kind, "capacity_gpus": capacity}
    if kind == "alibaba":
        path = _trace(trace, ALIBABA_TRACE, "--jobs-trace")
        about["trace"] = path.name
        return workload.alibaba_jobs(
            path, horizon_s, capacity, load, gpus_per_node=gpn, seed=seed
        ), about
    about.update(SYNTHETIC_JOBS_PARAMS)
    return workload.synthetic_jobs(
        horizon_s, capacity, load, gpus_per_node=gpn, seed=seed, **SYNTHETIC_JOBS_PARAMS
    ), about


def build_scenario(
    *,
    days: float,
    nodes: int,
    gpus_per_node: int,
    rates: Mapping[str, float],
    slo_ms: float,
    service_ms: float,
    arrivals: str,
    arrivals_trace: Path | None,
    jobs: str,
    jobs_trace: Path | None,
    load: float,
    policies: list[str],
    seed: int = 0,
    checkpoint_s: float | None = None,
    reserve: str = "mean",
    lend_cap: str = "peak",
    policy: PolicyConfig | None = None,
    tick_s: float = STEP_S,
    about: Mapping[str, object] | None = None,
    series: ArrivalSeries | None = None,
    site_jobs: JobReplay | None = None,
    models: Mapping[str, tuple[float, float]] | None = None,
    timing: Timing | None = None,
    tokens: Mapping[str, TokenModel] | None = None,
    replica_servers: int | None = None,
    granularity: str = "node",
    replica_gpus: Mapping[str, int] | None = None,
) -> Scenario:
    """The scenario the options describe. The fleet is sized first without jobs (the peak
    inference pool), so the job load can be a share of the GPUs outside it; every policy's
    set-up is checked before the jobs are generated. `policy` and `tick_s` are the bridge's
    (defaults: PolicyConfig's and 5 s); `about` adds to what the report says about the
    inputs. A site's own data (`bridge.sim.inputs`) replaces what would be generated:
    `series` the arrivals (its `about` goes to the report), `site_jobs` the jobs (as they
    came: `load` does not scale them); `models` gives each model's (SLO ms, service ms)
    (default: `slo_ms`, `service_ms` for every model of `rates`), `timing` the actuation
    times (default: the lab's), `tokens` the LLM models' token workloads and
    `replica_servers` their sequences per replica (`Scenario`'s); `granularity` and
    `replica_gpus` what a lend takes (`Scenario`'s, `bridge.sim.lending`). Raises
    ValueError (BadInput for the options) naming the problem."""
    horizon = days * DAY_S
    if granularity not in GRANULARITIES:
        raise BadInput(f"--granularity {granularity!r}: choose from {', '.join(GRANULARITIES)}")
    for model, gpus in (replica_gpus or {}).items():
        if model not in rates and (models is None or model not in models):
            raise BadInput(f"--replica-gpus: no model {model!r} in this run")
        if gpus < 1:
            raise BadInput(f"--replica-gpus {model}={gpus}: a replica takes at least 1 GPU")
    try:
        parse_lend_cap(lend_cap)
    except ValueError:
        raise BadInput(f"--lend-cap {lend_cap!r}: give {LEND_CAPS}") from None
    if arrivals in SITE_ARRIVALS and series is None:
        raise ValueError(f"{arrivals} arrivals are the site's: pass them as `series`")
    if jobs in SITE_JOBS and site_jobs is None:
        raise ValueError(f"{jobs} jobs are the site's: pass them as `site_jobs`")
    if series is None:
        series, arrivals_about = _arrivals(arrivals, arrivals_trace, rates, horizon, seed)
    else:
        arrivals_about = dict(series.about)
    probe = Scenario(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        arrivals=series,
        jobs=[],
        models=dict(models) if models is not None else {m: (slo_ms, service_ms) for m in rates},
        horizon_s=horizon,
        policy=policy or PolicyConfig(),
        tick_s=tick_s,
        checkpoint_s=checkpoint_s,
        reserve=reserve,
        lend_cap=lend_cap,
        timing=timing or Timing(),
        tokens=dict(tokens or {}),
        replica_servers=replica_servers,
        granularity=granularity,
        replica_gpus=dict(replica_gpus or {}),
    )
    sizing = size(probe)
    rest = nodes - sizing.peak_nodes
    if rest < 2:
        more = " or more" if rest <= 0 else ""
        raise BadInput(
            f"the models' peak load ({sizing.peak_load:.1f} busy GPUs) needs "
            f"{sizing.peak_nodes}{more} of the {nodes} nodes, leaving {max(rest, 0)} for "
            "training and elastic (at least 2): give the fleet more nodes or the models "
            "less load"
        )
    for name in policies:
        setup_for(name, probe, sizing)  # a fleet too small says so here
    capacity = (nodes - sizing.peak_nodes) * gpus_per_node
    if site_jobs is None:
        job_list, jobs_about = _jobs(jobs, jobs_trace, horizon, capacity, load, gpus_per_node, seed)
    else:
        job_list = list(site_jobs.jobs)
        jobs_about = {**site_jobs.about, "capacity_gpus": capacity}
    described = {
        "days": days,
        "seed": seed,
        "load": load if site_jobs is None else None,  # a site's jobs come as they came
        "arrivals": arrivals_about,
        "batch_jobs": jobs_about,
        **(about or {}),
    }
    return dataclasses.replace(probe, jobs=job_list, about=described)
