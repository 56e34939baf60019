"""One run's numbers for the selection report (`dimensions`): the dimensions, per set-up
of the comparison and per trade-off run of the bridge (`bridge@N`), each over the whole
simulated run (`DEFINITIONS` holds the same words, which the reports print beside the
numbers):

- reserved nodes (GPUs): the nodes inference owns at the start: its reserved pool, and
  idle-loan's loan pool (owned, loaned to elastic work while idle); GPUs = nodes x GPUs
  per node.
- peak serving nodes: the most nodes serving inference at any sample of the run's series
  (every `series_step_s`), reserved and lent.
- nodes needed to meet the SLO (`bridge.sim.selection.needed_nodes`): for a separate
  set-up, the fewest nodes of a separate inference pool whose share of requests within SLO
  is at least the target, among the separate pools run (the trade-off's search finds the
  exact size: it bisects until the sizes either side of it were run); the same number for
  every separate set-up. For the bridge, the fewest reserved nodes among the bridge's runs (the
  trade-off sizes and the comparison's) meeting the target. For idle-loan, its reserved
  nodes if it meets the target. None: no run met it.
- requests within SLO: the share of requests answered within their model's SLO; minutes
  within SLO: the share of minutes with requests whose p99 met it (all models).
- training and elastic: wait mean and p95 (submit to first start; a job never started
  counts to the end of the run), completion mean (submit to end, finished jobs), and
  finished of submitted. Job wait: the mean wait of all jobs, both kinds.
- preemptions; GPU-hours lost (the work of requeued runs since their start or last
  checkpoint), per day, and as a share of the elastic GPU-hours (all the GPU-hours elastic
  jobs held, lost work included).
- utilisation: GPU-hours at work (jobs', and inference GPUs busy serving requests) / all
  GPU-hours; allocation: GPU-hours held by a job or a replica (not idle, not fenced) / all
  GPU-hours (`PolicyResult.gpu_hours`).
- lends per day: lends / simulated days. The operations load: each lend is a Slurm job,
  a preemption or a drain, a routing change and, later, a return.
- fault-domain exposure: at the sample with the most replicas serving (the peak as
  served; the first of equals), the replicas on lendable nodes (the replicas serving less
  the reserved pool's nodes, each of which always holds a baseline replica) and their
  share of the replicas then: how much of the peak rests on nodes that batch work shares.

Pure functions of a `PolicyResult`; `bridge.sim.render` takes its figures (utilisation,
waits, ...) from here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.sim.result import PolicyResult, QueueOutcome

SEPARATE, SHARED = "separate", "shared"


#: what each dimension means, as the reports print it beside the numbers
DEFINITIONS: Mapping[str, str] = {
    "reserved_nodes": "nodes inference owns at the start (its reserved pool; idle-loan's "
    "loan pool too)",
    "reserved_gpus": "those nodes' GPUs",
    "peak_serving_nodes": "most nodes serving inference at any series sample (reserved and lent)",
    "needed_nodes": "fewest inference nodes meeting the target among the runs: a separate "
    "pool (the trade-off's search, the same for every separate set-up), the bridge's "
    "reserved pool (its trade-off runs), idle-loan's own pool; '-': no run met it",
    "requests_within": "share of requests answered within their model's SLO",
    "minutes_within": "share of minutes with requests whose p99 met the SLO",
    "ttft_within": "LLM models: share of requests whose time to first token met its SLO",
    "tpot_within": "LLM models: share of requests whose time per output token met its SLO",
    "training_wait_mean_s": "training jobs' mean wait, submit to first start (never "
    "started: to the end of the run)",
    "training_wait_p95_s": "training jobs' 95th percentile wait",
    "training_completion_mean_s": "training jobs' mean completion, submit to end (finished jobs)",
    "training_finished": "training jobs finished / submitted",
    "elastic_wait_mean_s": "elastic jobs' mean wait, submit to first start",
    "elastic_wait_p95_s": "elastic jobs' 95th percentile wait",
    "elastic_completion_mean_s": "elastic jobs' mean completion (finished jobs)",
    "elastic_finished": "elastic jobs finished / submitted",
    "job_wait_mean_s": "mean wait of all jobs, both kinds",
    "preemptions": "elastic runs requeued for a lend",
    "gpu_hours_lost": "GPU-hours of requeued runs' work since their start or last checkpoint",
    "lost_per_day": "GPU-hours lost per simulated day",
    "lost_share": "GPU-hours lost / all GPU-hours elastic jobs held",
    "utilisation": "GPU-hours at work (jobs', inference GPUs busy serving) / all GPU-hours",
    "allocation": "GPU-hours held by a job or a replica (not idle, not fenced) / all GPU-hours",
    "lends": "nodes lent to inference over the run",
    "lends_per_day": "lends per simulated day (operations load)",
    "exposure_replicas": "replicas on lendable (not reserved) nodes at the sample with the "
    "most replicas serving",
    "exposure_share": "those replicas / all replicas serving then (fault-domain exposure)",
}


#: the GPU uses the report sums over pools ("idle" includes fenced GPUs)
GPU_USES = ("training", "elastic", "inference", "idle")


def gpu_hours_by_use(result: PolicyResult) -> dict[str, float]:
    """GPU-hours per use (GPU_USES), summed over the pools; fenced counts as idle."""
    out = dict.fromkeys(GPU_USES, 0.0)
    for uses in result.gpu_hours.values():
        for use, hours in uses.items():
            key = "idle" if use == "fenced" else use
            out[key] = out.get(key, 0.0) + hours
    return out


def utilisation(result: PolicyResult) -> float:
    """GPU-hours at work / all GPU-hours (0 for an empty run): jobs' GPU-hours, and of the
    inference GPU-hours only those busy serving requests. An inference pool sized for its
    peak holds its GPUs all day but works them only as hard as the load asks."""
    hours = gpu_hours_by_use(result)
    total = sum(hours.values())
    work = hours["training"] + hours["elastic"] + result.inference_used_gpu_hours
    return work / total if total else 0.0


def allocation(result: PolicyResult) -> float:
    """GPU-hours held by a job or a replica (not idle, not fenced) / all GPU-hours."""
    hours = gpu_hours_by_use(result)
    total = sum(hours.values())
    return (total - hours["idle"]) / total if total else 0.0


def wait_mean_s(result: PolicyResult) -> float:
    """Mean queueing time of all jobs, training and elastic together."""
    qs = result.queues.values()
    jobs = sum(q.submitted for q in qs)
    return sum(q.wait_mean_s * q.submitted for q in qs) / jobs if jobs else 0.0


def lost_share(result: PolicyResult) -> float:
    """GPU-hours lost to preemption / all GPU-hours elastic jobs held (0 without any)."""
    elastic = gpu_hours_by_use(result)["elastic"]
    return result.gpu_hours_lost / elastic if elastic > 0 else 0.0


def completion_mean_s(result: PolicyResult) -> float:
    """Mean job completion time (submit to end) of all finished jobs."""
    qs = result.queues.values()
    jobs = sum(q.finished for q in qs)
    return sum(q.completion_mean_s * q.finished for q in qs) / jobs if jobs else 0.0


def human(seconds: float) -> str:
    """A duration as people read it: 4.2s, 45s, 5m, 12m 05s, 2h 31m, 3d 04h."""
    if not math.isfinite(seconds):
        return "-"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    whole = round(s)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if secs else f"{minutes}m"


def pct(share: float, digits: int = 2) -> str:
    """A share as a percentage with `digits` decimals: 0.995 -> 99.50%."""
    return f"{100 * share:.{digits}f}%"


def kind_of(policy: str) -> str:
    """SEPARATE for the separate set-ups (`separate-*`, which lend nothing), else SHARED."""
    return SEPARATE if policy.startswith("separate-") else SHARED


@dataclass(frozen=True)
class Dimensions:
    """One run's numbers (see the module docstring and DEFINITIONS). Times in seconds,
    shares in 0..1."""

    name: str
    kind: str
    description: str
    reserved_nodes: int
    reserved_gpus: int
    peak_serving_nodes: int
    requests_within: float
    minutes_within: float
    training_wait_mean_s: float
    training_wait_p95_s: float
    training_completion_mean_s: float
    training_finished: int
    training_submitted: int
    elastic_wait_mean_s: float
    elastic_wait_p95_s: float
    elastic_completion_mean_s: float
    elastic_finished: int
    elastic_submitted: int
    job_wait_mean_s: float
    preemptions: int
    gpu_hours_lost: float
    lost_per_day: float
    lost_share: float
    utilisation: float
    allocation: float
    lends: int
    lends_per_day: float
    exposure_replicas: int
    exposure_share: float
    #: the LLM models' TTFT and TPOT attainment (None: no LLM model)
    ttft_within: float | None = None
    tpot_within: float | None = None


def dimensions(result: PolicyResult, days: float, gpus_per_node: int) -> Dimensions:
    """The numbers of one run of `days` simulated days."""
    if not days > 0:
        raise ValueError(f"a run of {days} days has no rates per day")
    reserved_pool = result.pools.get("inference", 0)
    owned = reserved_pool + result.pools.get("loan", 0)
    replicas = [round(v) for v in result.series.get("replicas", [])]
    peak = max(replicas, default=reserved_pool)
    exposed = max(0, peak - reserved_pool)
    empty = QueueOutcome()
    training = result.queues.get("training", empty)
    elastic = result.queues.get("elastic", empty)
    return Dimensions(
        name=result.policy,
        kind=kind_of(result.policy),
        description=result.description,
        reserved_nodes=owned,
        reserved_gpus=owned * gpus_per_node,
        peak_serving_nodes=peak,
        requests_within=result.within_share,
        minutes_within=result.minutes_share,
        training_wait_mean_s=training.wait_mean_s,
        training_wait_p95_s=training.wait_p95_s,
        training_completion_mean_s=training.completion_mean_s,
        training_finished=training.finished,
        training_submitted=training.submitted,
        elastic_wait_mean_s=elastic.wait_mean_s,
        elastic_wait_p95_s=elastic.wait_p95_s,
        elastic_completion_mean_s=elastic.completion_mean_s,
        elastic_finished=elastic.finished,
        elastic_submitted=elastic.submitted,
        job_wait_mean_s=wait_mean_s(result),
        preemptions=result.preemptions,
        gpu_hours_lost=result.gpu_hours_lost,
        lost_per_day=result.gpu_hours_lost / days,
        lost_share=lost_share(result),
        utilisation=utilisation(result),
        allocation=allocation(result),
        lends=result.lends,
        lends_per_day=result.lends / days,
        exposure_replicas=exposed,
        exposure_share=exposed / peak if peak else 0.0,
        ttft_within=result.ttft_share,
        tpot_within=result.tpot_share,
    )
