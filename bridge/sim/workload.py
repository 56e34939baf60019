"""Simulation inputs: inference arrival series and job lists, from synthetic generators
(`stb simulate`'s defaults) or the public traces in the formats of `shared/traces/` (see
its SOURCES.md). A site's own data is read into the same types by `bridge.sim.inputs`.

Called by `bridge.sim.policies` and `stb simulate`. Pure functions of their inputs and a
seed: the same arguments give the same workload, so every compared policy sees the same one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from bridge.load.arrivals import read_trace
from bridge.sim.alibaba import TraceTask, read_alibaba_tasks
from bridge.sim.arguments import (
    at_least,
    check_load,
    check_series,
    positive,
    share,
)

JobKind = Literal["training", "elastic"]


@dataclass(frozen=True, slots=True)
class SimJob:
    """One batch job as submitted to Slurm."""

    job_id: str
    kind: JobKind
    #: seconds from the start of the simulation
    submit_s: float
    #: run time once started (a requeued job starts over: no checkpoint)
    duration_s: float
    #: GPUs on each node it runs on
    gpus_per_node: int
    #: nodes it needs (more than one: whole nodes, `gpus_per_node` = the node's GPUs)
    nodes: int = 1

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class ArrivalSeries:
    """Per model, the request rate (requests per second) in consecutive steps of
    `step_s` seconds from t = 0; past the last step the rate is 0."""

    step_s: float
    rates: dict[str, npt.NDArray[np.float64]]
    #: what its source says about it (a site's series: where it came from, its gaps);
    #: the report's scenario carries it. Not compared: the rates are the series
    about: Mapping[str, object] = field(default_factory=dict, compare=False)
    #: the wall-clock time of t = 0 for a site's own series (`bridge.sim.inputs`); None
    #: for a generated one
    origin: datetime | None = field(default=None, compare=False)

    def rate(self, model: str, t: float) -> float:
        series = self.rates[model]
        i = int(t // self.step_s)
        return float(series[i]) if 0 <= i < len(series) else 0.0

    @property
    def horizon_s(self) -> float:
        return self.step_s * max((len(r) for r in self.rates.values()), default=0)


FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DAY_S = 86400.0
#: the diurnal profile peaks at 15:00 (t = 0 is a Monday 00:00)
PEAK_HOUR = 15.0


# --- inference arrival series ---------------------------------------------------------


def _envelope(steps: int, step_s: float, diurnal: float, weekly: float) -> FloatArray:
    """Diurnal x weekly factor at each step's midpoint: 1 + diurnal * cos peaking at
    PEAK_HOUR each day; Saturday and Sunday (days 5 and 6 from t = 0) times 1 - weekly."""
    t = (np.arange(steps) + 0.5) * step_s
    day = 1.0 + diurnal * np.cos(2 * np.pi * (t - PEAK_HOUR * 3600.0) / DAY_S)
    weekend = (t // DAY_S) % 7 >= 5
    return np.asarray(day * np.where(weekend, 1.0 - weekly, 1.0), dtype=np.float64)


def _scale_to_mean(profile: FloatArray, rate: float) -> FloatArray:
    """`profile` scaled to mean `rate`; a profile that is zero throughout counts as flat."""
    mean = float(profile.mean())
    if mean <= 0:
        return np.full(len(profile), rate, dtype=np.float64)
    return profile * (rate / mean)


def read_azure_arrivals(path: Path) -> FloatArray:
    """Arrival times (s from the first request, sorted) of an Azure LLM inference trace
    (`TIMESTAMP,ContextTokens,GeneratedTokens`). Parsing is `bridge.load.arrivals`'s: a bad
    timestamp raises ValueError naming the file and line, as does a file with no rows."""
    trace = read_trace(path)
    if trace.format != "azure-llm":
        raise ValueError(f"{path}: not an Azure LLM trace (no TIMESTAMP column)")
    return np.asarray(trace.times, dtype=np.float64)


def azure_series(
    path: Path,
    models: Mapping[str, float],
    horizon_s: float,
    step_s: float = 5.0,
    *,
    diurnal_amplitude: float = 0.5,
    weekly_amplitude: float = 0.2,
    smooth_s: float = 0.0,
    draw: bool = False,
    seed: int = 0,
) -> ArrivalSeries:
    """Per model (name -> mean req/s), a series with the Azure trace's burst shape.

    The trace's arrivals are counted in whole `step_s` bins (a partial last bin is
    dropped) and normalised to mean 1. Each model replays that shape cyclically from its
    own seeded offset (so models do not burst in lockstep), times the diurnal x weekly
    envelope (peak 15:00; t = 0 is Monday 00:00), scaled so its mean is exactly the
    model's rate. ceil(horizon_s / step_s) steps.

    As an intensity (`smooth_s` > 0, `draw`): the trace carries about 3 requests a second,
    so its per-step counts hold its own sampling noise (a 5 s bin of 15 requests varies
    by about a quarter), which scaling to thousands of requests a second would turn into
    load swings no fleet of that size has. The counts are first averaged over `smooth_s`
    (cyclically: the shape is replayed in a loop), and with `draw` each step's rate is
    drawn as Poisson arrivals at the model's scaled intensity: the noise of the target
    rate, not of the trace's. The intensity's mean is the model's rate; the drawn
    series' mean is within that noise of it.
    """
    steps = check_series(models, horizon_s, step_s, diurnal_amplitude, weekly_amplitude)
    at_least("smooth_s", smooth_s, 0)
    arrivals = read_azure_arrivals(path)
    bins = int(arrivals[-1] // step_s)
    if bins < 1:
        raise ValueError(
            f"{path}: the trace spans {arrivals[-1]:g} s, less than one step_s={step_s:g}"
        )
    counts = np.bincount((arrivals // step_s).astype(np.int64), minlength=bins)[:bins]
    width = min(bins, max(1, round(smooth_s / step_s)))
    if width > 1:  # a centred moving average over `width` bins, wrapping round
        wrapped = np.concatenate([counts[-(width // 2) :], counts, counts[: width - width // 2]])
        sums = np.cumsum(np.concatenate([[0.0], wrapped]))
        counts = (sums[width : width + bins] - sums[:bins]) / width
    shape = counts / counts.mean()  # bin 0 holds the first arrival: the mean is > 0
    envelope = _envelope(steps, step_s, diurnal_amplitude, weekly_amplitude)
    rng = np.random.default_rng(seed)
    arrivals_rng = np.random.default_rng([seed, 1])  # the draws leave the offsets as they were
    rates: dict[str, FloatArray] = {}
    for name, rate in models.items():
        offset = int(rng.integers(bins))
        tiled = np.resize(np.roll(shape, -offset), steps)
        rates[name] = _scale_to_mean(tiled * envelope, rate)
        if draw:
            rates[name] = arrivals_rng.poisson(rates[name] * step_s) / step_s
    return ArrivalSeries(step_s=step_s, rates=rates)


def synthetic_series(
    models: Mapping[str, float],
    horizon_s: float,
    step_s: float = 5.0,
    *,
    diurnal_amplitude: float = 0.5,
    weekly_amplitude: float = 0.2,
    bursts_per_day: float = 4.0,
    burst_factor: float = 3.0,
    burst_s: float = 600.0,
    noise: float = 0.1,
    seed: int = 0,
) -> ArrivalSeries:
    """Per model (name -> mean req/s), a generated series.

    The base is the diurnal x weekly envelope (as in `azure_series`) times lognormal noise
    (sigma `noise`, independent per step), scaled so its mean is exactly the model's rate.
    Bursts come on top: a Poisson number (`bursts_per_day` a day) at uniform start times,
    each multiplying the steps it touches by `burst_factor` for `burst_s` (overlapping
    bursts do not compound). So the series' mean is the rate only without bursts; with
    them it is higher, by (burst_factor - 1) x the share of steps in a burst.
    """
    steps = check_series(models, horizon_s, step_s, diurnal_amplitude, weekly_amplitude)
    at_least("bursts_per_day", bursts_per_day, 0)
    at_least("burst_factor", burst_factor, 1)
    positive("burst_s", burst_s)
    at_least("noise", noise, 0)
    envelope = _envelope(steps, step_s, diurnal_amplitude, weekly_amplitude)
    rng = np.random.default_rng(seed)
    rates: dict[str, FloatArray] = {}
    for name, rate in models.items():
        base = _scale_to_mean(envelope * np.exp(noise * rng.standard_normal(steps)), rate)
        # Bursts may start up to burst_s before t = 0, so one can be under way at the start.
        count = rng.poisson(bursts_per_day * (horizon_s + burst_s) / DAY_S)
        in_burst = np.zeros(steps, dtype=bool)
        for start in rng.uniform(-burst_s, horizon_s, count):
            first = max(0, math.floor(start / step_s))
            in_burst[first : math.ceil((start + burst_s) / step_s)] = True
        rates[name] = np.where(in_burst, base * burst_factor, base)
    return ArrivalSeries(step_s=step_s, rates=rates)


def _trapezoid(x: FloatArray, rise_s: float, hold_s: float) -> FloatArray:
    """0 -> 1 over `rise_s` from x = 0, 1 for `hold_s`, then back to 0 over `rise_s`: the
    shape of a ramp or a daily surge at times `x` after its start."""
    up = np.clip(x / rise_s, 0.0, 1.0)
    down = np.clip((2 * rise_s + hold_s - x) / rise_s, 0.0, 1.0)
    return np.minimum(up, down)


def ramp_series(
    models: Mapping[str, float],
    horizon_s: float,
    step_s: float = 5.0,
    *,
    ramps_per_day: float = 3.0,
    ramp_factor: float = 5.0,
    ramp_s: float = 1800.0,
    ramp_hold_s: float = 1800.0,
    steps_per_day: float = 3.0,
    step_factor: float = 3.0,
    step_rise_s: float = 60.0,
    step_hold_s: float = 600.0,
    noise: float = 0.05,
    seed: int = 0,
) -> ArrivalSeries:
    """Per model (name -> base req/s), the hard case for a lending policy: a flat base
    (lognormal noise `noise`) with steep ramps (x `ramp_factor` over `ramp_s`, held
    `ramp_hold_s`, down over `ramp_s`) and sudden steps (x `step_factor` within
    `step_rise_s`, held `step_hold_s`, then back at once), each at Poisson times
    (`ramps_per_day`, `steps_per_day`), independent per model. Events that overlap take
    the larger factor. The mean is above the base by the events' share."""
    steps = check_series(models, horizon_s, step_s, 0.0, 0.0)
    for name, value in (("ramp_factor", ramp_factor), ("step_factor", step_factor)):
        at_least(name, value, 1)
    for name, value in (("ramps_per_day", ramps_per_day), ("steps_per_day", steps_per_day)):
        at_least(name, value, 0)
    for name, value in (
        ("ramp_s", ramp_s),
        ("ramp_hold_s", ramp_hold_s),
        ("step_rise_s", step_rise_s),
        ("step_hold_s", step_hold_s),
    ):
        positive(name, value)
    t = np.arange(steps) * step_s
    rng = np.random.default_rng(seed)
    rates: dict[str, FloatArray] = {}
    for name, rate in models.items():
        factor = np.ones(steps)
        span = 2 * ramp_s + ramp_hold_s
        for start in rng.uniform(-span, horizon_s, rng.poisson(ramps_per_day * horizon_s / DAY_S)):
            rise = _trapezoid(t - start, ramp_s, ramp_hold_s)
            factor = np.maximum(factor, 1.0 + (ramp_factor - 1.0) * rise)
        span = step_rise_s + step_hold_s
        for start in rng.uniform(-span, horizon_s, rng.poisson(steps_per_day * horizon_s / DAY_S)):
            x = t - start
            up = np.clip(x / step_rise_s, 0.0, 1.0) * (x < span)
            factor = np.maximum(factor, 1.0 + (step_factor - 1.0) * up)
        rates[name] = rate * factor * np.exp(noise * rng.standard_normal(steps))
    return ArrivalSeries(step_s=step_s, rates=rates)


def daily_series(
    models: Mapping[str, float],
    horizon_s: float,
    step_s: float = 5.0,
    *,
    surge_at_s: float = 9 * 3600.0,
    surge_every_s: float = 3 * 3600.0,
    surge_factor: float = 4.0,
    rise_s: float = 120.0,
    hold_s: float = 1800.0,
    jitter_s: float = 60.0,
    noise: float = 0.05,
    seed: int = 0,
) -> ArrivalSeries:
    """Per model (name -> base req/s), the surge that comes every day at the same hour (the
    morning's logins, a nightly evaluation batch): a flat base (lognormal noise `noise`)
    and, each day, x `surge_factor` within `rise_s`, held `hold_s`, then back within
    `rise_s`. Model i surges at `surge_at_s` + i x `surge_every_s` into its day, each day
    within `jitter_s` of that. The case the seasonal forecast is for
    (`bridge.policy.seasonal`): a trend sees such a rise only once it has begun."""
    steps = check_series(models, horizon_s, step_s, 0.0, 0.0)
    at_least("surge_factor", surge_factor, 1)
    for name, value in (("rise_s", rise_s), ("hold_s", hold_s)):
        positive(name, value)
    for name, value in (("jitter_s", jitter_s), ("surge_at_s", surge_at_s)):
        at_least(name, value, 0)
    t = np.arange(steps) * step_s
    rng = np.random.default_rng(seed)
    rates: dict[str, FloatArray] = {}
    for i, (name, rate) in enumerate(models.items()):
        factor = np.ones(steps)
        offset = (surge_at_s + i * surge_every_s) % DAY_S
        for day in range(math.ceil(horizon_s / DAY_S) + 1):
            start = day * DAY_S + offset + rng.uniform(-jitter_s, jitter_s)
            rise = _trapezoid(t - start, rise_s, hold_s)
            factor = np.maximum(factor, 1.0 + (surge_factor - 1.0) * rise)
        rates[name] = rate * factor * np.exp(noise * rng.standard_normal(steps))
    return ArrivalSeries(step_s=step_s, rates=rates)


def bursty_series(
    models: Mapping[str, float],
    horizon_s: float,
    step_s: float = 5.0,
    *,
    burst_s: float = 300.0,
    gap_s: float = 420.0,
    quiet: float = 0.05,
    spike_sigma: float = 0.35,
    mix_amplitude: float = 0.7,
    mix_period_s: float = 3600.0,
    surges_per_day: float = 2.0,
    surge_growth: float = 0.5,
    surge_s: float = 900.0,
    seed: int = 0,
) -> ArrivalSeries:
    """Per model (name -> mean req/s), production-like serving traffic: the hard case for
    returns, placement and the lend cap.

    - **Bursts between minutes of near-silence**: each model alternates bursts
      (exponential lengths, mean `burst_s`) and gaps (mean `gap_s`) at `quiet` x the
      burst level: a return after a calm dwell shorter than the gap is lent again at the
      next burst.
    - **Spikes within a burst**: lognormal per-step noise (sigma `spike_sigma`), so
      5-second steps stand above the peak minute a separate pool is sized for.
    - **A model mix that shifts within the hour**: each model's level times 1 +
      `mix_amplitude` x a sine of period `mix_period_s`, the models' phases spread evenly,
      so the heaviest model changes within the hour.
    - **Surges beyond the days before**: `surges_per_day` (Poisson) surges of `surge_s`,
      their factor growing with the day (1 + `surge_growth` x day): each day's highest
      minutes above every earlier day's.

    Each model's series is scaled so that its mean is the model's rate.
    """
    steps = check_series(models, horizon_s, step_s, 0.0, 0.0)
    for name, value in (("burst_s", burst_s), ("gap_s", gap_s), ("surge_s", surge_s)):
        positive(name, value)
    positive("mix_period_s", mix_period_s)
    share("quiet", quiet)
    share("mix_amplitude", mix_amplitude)
    for name, value in (
        ("spike_sigma", spike_sigma),
        ("surges_per_day", surges_per_day),
        ("surge_growth", surge_growth),
    ):
        at_least(name, value, 0)
    t = (np.arange(steps) + 0.5) * step_s
    rng = np.random.default_rng(seed)
    rates: dict[str, FloatArray] = {}
    for i, (name, rate) in enumerate(models.items()):
        on = np.zeros(steps, dtype=bool)
        at = -rng.exponential(burst_s + gap_s)  # under way (or not) at t = 0
        while at < horizon_s:
            end = at + rng.exponential(burst_s)
            on[max(0, math.floor(at / step_s)) : max(0, math.ceil(end / step_s))] = True
            at = end + rng.exponential(gap_s)
        level = np.where(on, 1.0, quiet)
        phase = 2 * np.pi * i / max(1, len(models))
        mix = 1.0 + mix_amplitude * np.sin(2 * np.pi * t / mix_period_s + phase)
        surge = np.ones(steps)
        count = rng.poisson(surges_per_day * horizon_s / DAY_S)
        for start in rng.uniform(0.0, horizon_s, count):
            inside = (t >= start) & (t < start + surge_s)
            surge[inside] = np.maximum(surge[inside], 1.0 + surge_growth * (1 + start // DAY_S))
        spikes = np.exp(spike_sigma * rng.standard_normal(steps) - spike_sigma**2 / 2)
        rates[name] = _scale_to_mean(level * mix * surge * spikes, rate)
    return ArrivalSeries(step_s=step_s, rates=rates)


# --- batch jobs -----------------------------------------------------------------------

__all__ = ["TraceTask", "read_alibaba_tasks"]  # their home is bridge.sim.alibaba


def _shape(gpus: IntArray, gpus_per_node: int) -> tuple[IntArray, IntArray]:
    """(GPUs per node, nodes) for jobs of `gpus` GPUs: one node if they fit, else whole
    nodes (so a job may get a few more GPUs than it asked for)."""
    nodes = -(-gpus // gpus_per_node)
    return np.where(nodes > 1, gpus_per_node, gpus), nodes


def _nearest_cut(work: FloatArray, target: float) -> int:
    """How many leading jobs make the total GPU-seconds nearest `target` (at least 1).
    `work`'s total must exceed `target`."""
    cum = np.cumsum(work)
    k = int(np.searchsorted(cum, target))  # the first prefix reaching the target
    before = float(cum[k - 1]) if k > 0 else 0.0
    return max(1, k + 1 if cum[k] - target <= target - before else k)


#: Share of the Alibaba trace's earliest tasks dropped (see `alibaba_jobs`).
ALIBABA_HEAD_SHARE = 0.01


def alibaba_jobs(
    path: Path,
    horizon_s: float,
    capacity_gpus: int,
    target_load: float,
    *,
    gpus_per_node: int = 8,
    elastic_qos: tuple[str, ...] = ("BE",),
    max_duration_s: float = 2 * DAY_S,
    seed: int = 0,
) -> list[SimJob]:
    """Jobs from the Alibaba GPU trace, replayed at the load asked for.

    Tasks whose qos is in `elastic_qos` become elastic jobs, the rest training jobs.
    Durations are capped at `max_duration_s`: the trace has pods that live for its whole
    149 days (59 run over 2 days and hold 89% of its GPU-seconds uncapped). Its earliest
    1% of tasks (ALIBABA_HEAD_SHARE) are dropped: its first 115 days hold only a few
    dozen tasks, many of them such pods, and its last 34 days the other 6,000 or so.

    The trace (from its first task kept) is rotated by a seeded offset and repeated, each
    copy one period later (its span plus one mean gap), then its submit times scaled by
    one factor (compressed or stretched) so that the jobs falling in [0, horizon_s) offer
    sum(gpus x duration) / horizon_s ~ target_load x capacity_gpus: the cut is the job
    that brings the total nearest the target, so the error is at most half of one job.
    A task of more than `gpus_per_node` GPUs gets whole nodes. Ids a-000000, ... in
    submit order.
    """
    target = check_load(horizon_s, capacity_gpus, target_load, gpus_per_node)
    positive("max_duration_s", max_duration_s)
    tasks = read_alibaba_tasks(path)
    tasks = tasks[int((len(tasks) - 1) * ALIBABA_HEAD_SHARE) :]
    n = len(tasks)
    rel = np.array([t.submit_s for t in tasks]) - tasks[0].submit_s
    period = max(float(rel[-1]) * n / max(n - 1, 1), 1.0)
    rng = np.random.default_rng(seed)
    rotated = (rel - rng.uniform(0.0, period)) % period
    order = np.argsort(rotated, kind="stable")
    rotated, tasks = rotated[order], [tasks[j] for j in order.tolist()]
    gpn, nodes = _shape(np.array([t.gpus for t in tasks], dtype=np.int64), gpus_per_node)
    duration = np.minimum([t.duration_s for t in tasks], max_duration_s)
    work = gpn * nodes * duration
    copies = int(target // work.sum()) + 2  # enough that the total passes the target
    times = (rotated[None, :] + period * np.arange(copies)[:, None]).ravel()
    keep = _nearest_cut(np.tile(work, copies), target)
    end = times[keep]  # trace time of the first job left out: it maps to horizon_s
    if end <= 0:
        return []
    kinds: list[JobKind] = ["elastic" if t.qos in elastic_qos else "training" for t in tasks]
    rows = list(zip(kinds, duration.tolist(), gpn.tolist(), nodes.tolist(), strict=True))
    submits = (times[times < end] * (horizon_s / end)).tolist()
    jobs: list[SimJob] = []
    for i, submit in enumerate(submits):
        kind, dur, g, k = rows[i % n]
        jobs.append(SimJob(f"a-{i:06d}", kind, submit, dur, g, k))
    return jobs


TRAINING_MEDIAN_S = 4 * 3600.0
ELASTIC_MEDIAN_S = 20 * 60.0
#: sigma of the log of job durations (mean = median x 1.65)
DURATION_SIGMA = 1.0
#: generated durations are clipped to this range
DURATION_RANGE_S = (60.0, 2 * DAY_S)
TRAINING_GPUS = np.array([1, 2, 4, 8], dtype=np.int64)

#: draws n jobs: (GPUs per node, nodes, duration)
_Draw = Callable[[int], tuple[IntArray, IntArray, FloatArray]]


def _draw_to_target(draw: _Draw, target: float) -> tuple[IntArray, IntArray, FloatArray]:
    """Jobs drawn until their GPU-seconds reach `target`, cut where the total is nearest."""
    if target <= 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    batches, total = [], 0.0
    while total <= target:
        g, k, d = draw(1024)
        batches.append((g, k, d))
        total += float((g * k * d).sum())
    gpn, nodes, dur = (np.concatenate(b) for b in zip(*batches, strict=True))
    keep = _nearest_cut(gpn * nodes * dur, target)
    return gpn[:keep], nodes[:keep], dur[:keep]


def synthetic_jobs(
    horizon_s: float,
    capacity_gpus: int,
    target_load: float,
    *,
    gpus_per_node: int = 8,
    elastic_share: float = 0.4,
    multi_node_share: float = 0.1,
    seed: int = 0,
) -> list[SimJob]:
    """Generated jobs offering target_load x capacity_gpus GPUs over [0, horizon_s).

    Training jobs: lognormal durations (median 4 h), 1, 2, 4 or 8 GPUs, except a
    `multi_node_share` of them on 2-8 whole nodes. Elastic jobs: median 20 min, 1-8 GPUs.
    Durations are clipped to DURATION_RANGE_S. `elastic_share` is the elastic share of
    the offered GPU-seconds. Jobs of each kind are drawn until their GPU-seconds reach
    that kind's part of the target (the cut nearest it: the error is at most half of one
    job); given that count, submit times are uniform on [0, horizon_s), i.e. Poisson
    arrivals conditioned on their number. Ids t-000000 / e-000000 in submit order.
    """
    target = check_load(horizon_s, capacity_gpus, target_load, gpus_per_node)
    share("elastic_share", elastic_share)
    share("multi_node_share", multi_node_share)
    rng = np.random.default_rng(seed)
    lo, hi = DURATION_RANGE_S

    def durations(median: float, n: int) -> FloatArray:
        return np.clip(rng.lognormal(math.log(median), DURATION_SIGMA, n), lo, hi)

    def training(n: int) -> tuple[IntArray, IntArray, FloatArray]:
        gpn, nodes = _shape(rng.choice(TRAINING_GPUS, n), gpus_per_node)
        multi = rng.random(n) < multi_node_share
        gpn = np.where(multi, gpus_per_node, gpn)
        nodes = np.where(multi, rng.integers(2, 9, n), nodes)
        return gpn, nodes, durations(TRAINING_MEDIAN_S, n)

    def elastic(n: int) -> tuple[IntArray, IntArray, FloatArray]:
        gpn, nodes = _shape(rng.integers(1, 9, n), gpus_per_node)
        return gpn, nodes, durations(ELASTIC_MEDIAN_S, n)

    kinds: list[tuple[JobKind, str, tuple[IntArray, IntArray, FloatArray]]] = [
        ("training", "t", _draw_to_target(training, (1 - elastic_share) * target)),
        ("elastic", "e", _draw_to_target(elastic, elastic_share * target)),
    ]
    drafts = [
        (kind, prefix, int(g), int(k), float(d))
        for kind, prefix, arrays in kinds
        for g, k, d in zip(*arrays, strict=True)
    ]
    submits = rng.uniform(0.0, horizon_s, len(drafts))
    counters = {"t": 0, "e": 0}
    jobs: list[SimJob] = []
    for i in np.argsort(submits, kind="stable"):
        kind, prefix, g, k, d = drafts[i]
        jobs.append(SimJob(f"{prefix}-{counters[prefix]:06d}", kind, float(submits[i]), d, g, k))
        counters[prefix] += 1
    return jobs
