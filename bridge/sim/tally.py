"""What a simulated run counts for its result: the decisions, lends and returns, the calls
to decide, the time series sampled every `Setup.series_step_s` (`SERIES`), and, at the
end, the `PolicyResult` (GPU-hours per pool and use, each job kind's queue, each model's
outcome). Kept by `bridge.sim.engine.Engine`, which owns the fleet and the replicas it
reads them from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bridge.sim.fleet import Fleet, JobRun, SimNode
from bridge.sim.result import Decision, PolicyResult, QueueOutcome
from bridge.sim.serving import Serving
from bridge.sim.setup import Setup

#: the time series kept for the report, sampled every `series_step_s`
SERIES = (
    "requests_per_s",
    "worst_p99_over_slo",
    "replicas",
    "lent_nodes",
    "gpus_training",
    "gpus_elastic",
    "gpus_inference",
    "gpus_idle",
    "pending_training",
    "pending_elastic",
)
#: the job kinds whose queues the result reports
_KINDS = ("training", "elastic")


@dataclass
class Tally:
    """The run's counts so far (the engine adds to them as it acts)."""

    decisions: list[Decision] = field(default_factory=list)
    lends: int = 0
    returns: int = 0
    lends_by_pool: dict[str, int] = field(default_factory=dict)
    decide_calls: int = 0
    series: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SERIES})
    #: (requests, within SLO) at the end of `Setup.warmup_s` (`warm`); None before
    warm_at: tuple[float, float] | None = None

    def sample(self, fleet: Fleet, serving: Serving, lent_nodes: int) -> None:
        """One point of each series, now."""
        usage = fleet.usage.gpus
        totals = {
            use: sum(u[use] for u in usage.values())
            for use in ("training", "elastic", "inference", "idle")
        }
        totals["idle"] += sum(u["fenced"] for u in usage.values())
        values = {
            "requests_per_s": serving.tick_requests,
            "worst_p99_over_slo": min(serving.tick_worst, 99.0),
            "replicas": float(sum(g.nodes for g in serving.groups.values())),
            "lent_nodes": float(lent_nodes),
            "gpus_training": float(totals["training"]),
            "gpus_elastic": float(totals["elastic"]),
            "gpus_inference": float(totals["inference"]),
            "gpus_idle": float(totals["idle"]),
            "pending_training": float(fleet.pending_count("training")),
            "pending_elastic": float(fleet.pending_count("elastic")),
        }
        for key in SERIES:
            self.series[key].append(values[key])

    def result(
        self,
        setup: Setup,
        nodes: Sequence[SimNode],
        fleet: Fleet,
        serving: Serving,
        ticks: int,
        now: float,
        wall_s: float,
    ) -> PolicyResult:
        """The run's result, at its end (`now`)."""
        pools: dict[str, int] = {}
        for node in nodes:
            pools[node.pool] = pools.get(node.pool, 0) + 1
        gpu_hours = {
            pool: {use: s / 3600.0 for use, s in uses.items()}
            for pool, uses in fleet.usage.seconds.items()
        }
        of_kind: dict[str, list[JobRun]] = {kind: [] for kind in _KINDS}
        for run in fleet.runs.values():  # one pass over the runs, in their order
            mine = of_kind.get(run.job.kind)
            if mine is not None:
                mine.append(run)
        queues = {kind: _queue(of_kind[kind], now) for kind in _KINDS}
        return PolicyResult(
            policy=setup.name,
            description=setup.description,
            pools=pools,
            models=serving.outcome,
            gpu_hours=gpu_hours,
            queues=queues,
            inference_used_gpu_hours=serving.inference_used_s / 3600.0,
            preemptions=fleet.preemptions,
            gpu_hours_lost=fleet.lost_gpu_s / 3600.0,
            lends=self.lends,
            returns=self.returns,
            lends_by_pool=self.lends_by_pool,
            decisions=self.decisions,
            series=self.series,
            series_step_s=setup.series_step_s,
            decide_calls=self.decide_calls,
            ticks=ticks,
            wall_s=wall_s,
            **self._warm(setup, serving),
        )

    def _warm(self, setup: Setup, serving: Serving) -> dict[str, float]:
        """The requests and those within SLO after `Setup.warmup_s` (`warm_at`)."""
        if self.warm_at is None or not setup.warmup_s:
            return {}
        requests = sum(o.requests for o in serving.outcome.values())
        within = sum(o.within_slo for o in serving.outcome.values())
        return {
            "warm_requests": requests - self.warm_at[0],
            "warm_within": within - self.warm_at[1],
        }

    def warm(self, serving: Serving) -> None:
        """The warm-up ends now: the totals so far are left out of the warm share."""
        requests = sum(o.requests for o in serving.outcome.values())
        within = sum(o.within_slo for o in serving.outcome.values())
        self.warm_at = (requests, within)


def _queue(mine: Sequence[JobRun], now: float) -> QueueOutcome:
    """The queue outcome of one kind's runs (one pass over them: a month's run has
    millions; each mean and percentile reads one array)."""
    waits: list[float] = []
    completion: list[float] = []
    work: list[float] = []
    started = 0
    for r in mine:
        job = r.job
        waits.append(r.wait_s if r.wait_s is not None else now - job.submit_s)
        if r.first_started_at is not None:
            started += 1
        if r.ended_at is not None:
            completion.append((r.ended_at or now) - job.submit_s)
            work.append(job.gpus_per_node * job.nodes * job.duration_s)
    wait_at = np.asarray(waits, dtype=float)
    done_at = np.asarray(completion, dtype=float)
    return QueueOutcome(
        submitted=len(mine),
        started=started,
        finished=len(completion),
        wait_mean_s=float(np.mean(wait_at)) if waits else 0.0,
        wait_p95_s=float(np.percentile(wait_at, 95)) if waits else 0.0,
        completion_mean_s=float(np.mean(done_at)) if completion else 0.0,
        completion_p95_s=float(np.percentile(done_at, 95)) if completion else 0.0,
        gpu_hours_done=sum(work) / 3600.0,
    )
