"""What a simulation run reports, per policy: plain dataclasses, JSON-ready through
`as_dict`. Filled by `bridge.sim.engine` (and the trade-off runs of
`bridge.sim.policies.tradeoff`), read by `bridge.sim.render`, `bridge.sim.selection` and
the bench."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: how a pool's GPU-hours were used
USES = ("training", "elastic", "inference", "fenced", "idle")
#: the series a trade-off run keeps (the selection's fault-domain exposure reads them)
TRADEOFF_SERIES = ("replicas",)


@dataclass
class ModelOutcome:
    """One model's service over the run."""

    slo_p99_ms: float
    requests: float = 0.0
    #: requests answered within the SLO (expected value under the latency model)
    within_slo: float = 0.0
    #: minutes in which the model had requests
    minutes: int = 0
    #: of those, minutes whose p99 was within the SLO (>= 99% of the minute's requests)
    minutes_within: int = 0
    #: an LLM model (`Setup.tokens`): requests whose TTFT, and whose TPOT, was within
    #: its token SLO (expected values under the token capacity model)
    tokens: bool = False
    ttft_within: float = 0.0
    tpot_within: float = 0.0

    @property
    def within_share(self) -> float:
        return self.within_slo / self.requests if self.requests else 1.0

    @property
    def minutes_share(self) -> float:
        return self.minutes_within / self.minutes if self.minutes else 1.0

    @property
    def ttft_share(self) -> float:
        return self.ttft_within / self.requests if self.requests else 1.0

    @property
    def tpot_share(self) -> float:
        return self.tpot_within / self.requests if self.requests else 1.0


@dataclass
class QueueOutcome:
    """Jobs of one kind (training or elastic). Times in seconds."""

    submitted: int = 0
    started: int = 0
    finished: int = 0
    #: time pending before each job's first start (jobs never started: until the end)
    wait_mean_s: float = 0.0
    wait_p95_s: float = 0.0
    #: submit to end, finished jobs only
    completion_mean_s: float = 0.0
    completion_p95_s: float = 0.0
    #: GPU-hours of finished runs (useful work)
    gpu_hours_done: float = 0.0


@dataclass
class Decision:
    """One action the policy took, as the lab's tick report would show it."""

    at_s: float
    kind: str  # lend | return | place | baseline
    node: str
    models: tuple[str, ...]
    reason: str


@dataclass
class PolicyResult:
    policy: str
    description: str
    #: nodes per pool at the start (reserved inference, training, elastic, loan)
    pools: dict[str, int]
    models: dict[str, ModelOutcome]
    #: pool -> use -> GPU-hours (USES)
    gpu_hours: dict[str, dict[str, float]]
    queues: dict[str, QueueOutcome]
    #: of the inference GPU-hours, those busy serving requests (the latency model's load)
    inference_used_gpu_hours: float = 0.0
    preemptions: int = 0
    gpu_hours_lost: float = 0.0
    lends: int = 0
    returns: int = 0
    lends_by_pool: dict[str, int] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    #: sampled every `series_step_s`: name -> values (see tally.SERIES)
    series: dict[str, list[float]] = field(default_factory=dict)
    series_step_s: float = 300.0
    #: ticks at which decide ran / all ticks (the engine skips ticks it can prove are quiet)
    decide_calls: int = 0
    ticks: int = 0
    wall_s: float = 0.0
    #: requests, and those within SLO, after `Setup.warmup_s` (0: no warm-up asked)
    warm_requests: float = 0.0
    warm_within: float = 0.0

    @property
    def warm_share(self) -> float | None:
        """The share of the requests after the warm-up that were within SLO (None
        without a warm-up, or no request after it)."""
        return self.warm_within / self.warm_requests if self.warm_requests > 0 else None

    @property
    def requests(self) -> float:
        return sum(m.requests for m in self.models.values())

    @property
    def within_share(self) -> float:
        total = self.requests
        return sum(m.within_slo for m in self.models.values()) / total if total else 1.0

    @property
    def minutes_share(self) -> float:
        minutes = sum(m.minutes for m in self.models.values())
        within = sum(m.minutes_within for m in self.models.values())
        return within / minutes if minutes else 1.0

    def _token_share(self, within: str) -> float | None:
        llm = [m for m in self.models.values() if m.tokens]
        total = sum(m.requests for m in llm)
        if not llm:
            return None
        return sum(getattr(m, within) for m in llm) / total if total else 1.0

    @property
    def ttft_share(self) -> float | None:
        """Share of the LLM models' requests within their TTFT SLO (None: no LLM)."""
        return self._token_share("ttft_within")

    @property
    def tpot_share(self) -> float | None:
        """Share of the LLM models' requests within their TPOT SLO (None: no LLM)."""
        return self._token_share("tpot_within")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["requests"] = self.requests
        out["within_share"] = self.within_share
        out["minutes_share"] = self.minutes_share
        if self.ttft_share is not None:
            out["ttft_share"] = self.ttft_share
            out["tpot_share"] = self.tpot_share
        if self.warm_share is None:  # a run without a warm-up: its record as before
            del out["warm_requests"], out["warm_within"]
        else:
            out["warm_share"] = self.warm_share
        for name, m in self.models.items():
            out["models"][name]["within_share"] = m.within_share
            out["models"][name]["minutes_share"] = m.minutes_share
            if m.tokens:
                out["models"][name]["ttft_share"] = m.ttft_share
                out["models"][name]["tpot_share"] = m.tpot_share
            else:  # a request model's record as it was before LLM models
                for key in ("tokens", "ttft_within", "tpot_within"):
                    del out["models"][name][key]
        return out


@dataclass
class Tradeoff:
    """The runs behind the selection report's trade-off curve, on the comparison's fleet
    and workload (`bridge.sim.policies.tradeoff`). Each run keeps no decisions and only
    the TRADEOFF_SERIES."""

    #: the bridge at each reserved size (`bridge@N`; full runs, jobs included)
    bridge: list[PolicyResult]
    #: separate pools (`separate-N`) run with no jobs (their queues are empty; the
    #: comparison's own separate runs stand for their sizes): the sizes above and those the
    #: search for the smallest one meeting `target` visited, ascending
    separate: list[PolicyResult]
    #: the share of requests within SLO the separate search looked for
    target: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "bridge": [r.as_dict() for r in self.bridge],
            "separate": [r.as_dict() for r in self.separate],
            "target": self.target,
        }


@dataclass
class SimReport:
    """One comparison: the scenario (inputs, fleet, horizon) and each policy's result, and
    the trade-off runs when the selection report asked for them."""

    scenario: dict[str, Any]
    results: list[PolicyResult]
    tradeoff: Tradeoff | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "results": [r.as_dict() for r in self.results],
        }
        if self.tradeoff is not None:
            out["tradeoff"] = self.tradeoff.as_dict()
        return out
