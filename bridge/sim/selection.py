"""The selection report: shared or separate fleet, for a site's data. Pure functions of a
`SimReport` (the comparison and the trade-off runs of `bridge.sim.policies.tradeoff`):
per set-up, the numbers the choice rests on; a recommendation with its reasons; and the
conditions under which it would flip, found by moving each criterion across the numbers.
Called by `stb simulate` (`bridge.sim.cli`); rendered by `bridge.sim.selection_render`
(markdown, the HTML page's section, tables) and written whole into the JSON. It imports
no plotting (`bridge.sim.render` takes its numbers from here).

The dimensions, per set-up of the comparison and per trade-off run of the bridge
(`bridge@N`), each over the whole simulated run (`DEFINITIONS` holds the same words, which
the reports print beside the numbers):

- reserved nodes (GPUs): the nodes inference owns at the start: its reserved pool, and
  idle-loan's loan pool (owned, loaned to elastic work while idle); GPUs = nodes x GPUs
  per node.
- peak serving nodes: the most nodes serving inference at any sample of the run's series
  (every `series_step_s`), reserved and lent.
- nodes needed to meet the SLO (`Selection.needed`): for a separate set-up, the fewest
  nodes of a separate inference pool whose share of requests within SLO is at least the
  target, among the separate pools run (the trade-off's search finds the exact size: it
  bisects until the sizes either side of it were run); the same number for every separate
  set-up. For the bridge, the fewest reserved nodes among the bridge's runs (the
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

The recommendation (`recommend`), with the thresholds of `Criteria`:

1. The separate reference: the separate set-up of the comparison with the fewest reserved
   nodes among those whose requests within SLO reach the target (ties: the shorter job
   wait); if none does, the separate set-up with the most requests within SLO.
2. Each shared candidate (idle-loan, the bridge, each trade-off run of the bridge at
   another size) passes when all of: its requests within SLO reach the target; it misses
   at most `budget_slack` of the error budget (1 - target) more than the reference; its
   lends per day are at most `max_lends_per_day`; its lost share at most
   `max_lost_share`; its exposure share at most `max_exposure`; and it gains at least one
   of: a mean job wait shorter than the reference's by `min_wait_cut`, or reserved nodes
   fewer by `min_nodes_saved` than the nodes needed by a separate pool (the reference's
   reserved nodes when no separate pool run met the target).
3. Of the shared candidates that pass, the one with the shortest mean job wait (ties: fewer
   reserved nodes) is recommended. If none passes, the separate reference is; with no
   separate set-up in the report, the set-up with the most requests within SLO.

Flips (`flips`): for each criterion, in each direction, the nearest value at which the
recommendation changes: every criterion's outcome changes only where a candidate's number
crosses it, so the rules are run again just beyond each such number (`beyond`), nearest
first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from bridge.sim.result import PolicyResult, QueueOutcome, SimReport

#: the thresholds (`Criteria`' defaults), each with its reason in REASONS
SLO_TARGET = 0.99
BUDGET_SLACK = 0.5
MAX_LENDS_PER_DAY = 288.0
MAX_LOST_SHARE = 0.05
MAX_EXPOSURE = 0.5
MIN_WAIT_CUT = 0.2
MIN_NODES_SAVED = 0.1
#: why each threshold is what it is (the reports print these beside the values)
REASONS: Mapping[str, str] = {
    "target": "the SLO is a p99, so 99% of requests within it, over the run, is what the "
    "SLO itself promises",
    "budget_slack": "a shared set-up may miss more requests than the separate reference, "
    "by at most half of the error budget (1 - target) the target leaves: sharing may cost "
    "service, but never most of the margin (0.5 percentage points of requests at 99%)",
    "max_lends_per_day": "one lend per 5 minutes on average, the policy's return_dwell_s: "
    "faster, leases come and go quicker than the policy means them to, and each cycle "
    "requeues elastic work and reloads routing",
    "max_lost_share": "one elastic GPU-hour in twenty redone: a site's tolerance, not a "
    "measured figure (elastic work is requeueable by contract); the flips show where the "
    "choice changes with it",
    "max_exposure": "beyond half, the nodes batch work shares hold more of the peak than "
    "the reserved pool does, so a fault there (the partition, a drain, the bridge itself) "
    "takes the larger part of serving with it",
    "min_wait_cut": "a fifth (1.25x shorter): a gain users notice, under the 1.53x Lyra "
    "reports for sharing inference's idle nodes",
    "min_nodes_saved": "a tenth of the nodes a separate pool needs: below it the saving is "
    "about one node of a small pool, the sizing's own step",
}

SEPARATE, SHARED = "separate", "shared"
DAY_S = 86400.0

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


# -- numbers of one run -------------------------------------------------------------------

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


def dimensions(result: PolicyResult, days: float, gpus_per_node: int) -> Dimensions:
    """The numbers of one run of `days` simulated days."""
    if not days > 0:
        raise ValueError(f"a run of {days} days has no rates per day")
    reserved_pool = result.pools.get("inference", 0)
    owned = reserved_pool + result.pools.get("loan", 0)
    replicas = [round(v) for v in result.series.get("replicas", [])]
    peak = max(replicas, default=reserved_pool)
    exposed = max(0, peak - reserved_pool)
    elastic_hours = gpu_hours_by_use(result)["elastic"]
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
        lost_share=result.gpu_hours_lost / elastic_hours if elastic_hours > 0 else 0.0,
        utilisation=utilisation(result),
        allocation=allocation(result),
        lends=result.lends,
        lends_per_day=result.lends / days,
        exposure_replicas=exposed,
        exposure_share=exposed / peak if peak else 0.0,
    )


# -- the criteria and the rules -----------------------------------------------------------


@dataclass(frozen=True)
class Criteria:
    """The thresholds the recommendation applies (the module constants by default): what
    the business promises (the target), what the operations team, the batch users and the
    service accept, and what sharing must gain to be worth it."""

    target: float = SLO_TARGET
    budget_slack: float = BUDGET_SLACK
    max_lends_per_day: float = MAX_LENDS_PER_DAY
    max_lost_share: float = MAX_LOST_SHARE
    max_exposure: float = MAX_EXPOSURE
    min_wait_cut: float = MIN_WAIT_CUT
    min_nodes_saved: float = MIN_NODES_SAVED

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise ValueError(f"target {self.target}: give a share of requests in (0, 1]")
        for name in ("budget_slack", "max_lends_per_day"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} {getattr(self, name)}: give a number >= 0")
        for name in ("max_lost_share", "max_exposure", "min_wait_cut", "min_nodes_saved"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} {getattr(self, name)}: give a share in [0, 1]")


def parse_criteria(text: str, base: Criteria | None = None) -> Criteria:
    """`base` (the defaults) with "name=value,..." applied: the names are Criteria's
    fields. ValueError naming a bad one."""
    base = base or Criteria()
    names = {f.name for f in fields(Criteria)}
    changes: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in names:
            raise ValueError(
                f"criterion {part!r}: give name=value with a name from {', '.join(sorted(names))}"
            )
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"criterion {name}: {value.strip()!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"criterion {name}: {value.strip()!r} is not a finite number")
        changes[name] = number
    return replace(base, **changes)


@dataclass(frozen=True)
class Check:
    """One criterion applied to one candidate: its number against the limit."""

    name: str
    value: float
    limit: float
    passed: bool
    #: the sentence the reasons print (numbers and limit)
    text: str


@dataclass(frozen=True)
class Verdict:
    """A shared candidate against the reference: `required` must all pass, and one of
    `gains` (none when there is no separate reference to gain on)."""

    candidate: str
    required: tuple[Check, ...]
    gains: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        gained = not self.gains or any(c.passed for c in self.gains)
        return gained and all(c.passed for c in self.required)

    @property
    def failed(self) -> tuple[Check, ...]:
        """The checks that kept it out (the gains only when none of them passed)."""
        out = [c for c in self.required if not c.passed]
        if self.gains and not any(c.passed for c in self.gains):
            out += self.gains
        return tuple(out)


@dataclass(frozen=True)
class Recommendation:
    choice: str
    kind: str
    #: the separate reference (None: no separate set-up in the report)
    reference: str | None
    #: "shared" (a shared candidate passed), "separate" (none did), "best-service" (none
    #: did and there is no separate set-up)
    rule: str
    reasons: tuple[str, ...]
    verdicts: tuple[Verdict, ...]


def _pct(share: float, digits: int = 2) -> str:
    return f"{100 * share:.{digits}f}%"


def needed_separate(separate: Iterable[tuple[int, float]], target: float) -> int | None:
    """Fewest nodes among separate pools (nodes, requests within SLO) meeting `target`."""
    return min((n for n, within in separate if within >= target), default=None)


def reference(setups: Sequence[Dimensions], target: float) -> Dimensions | None:
    """Rule 1: the separate set-up with the fewest reserved nodes meeting the target
    (ties: shorter job wait), else the one with the most requests within SLO."""
    separate = [d for d in setups if d.kind == SEPARATE]
    meeting = [d for d in separate if d.requests_within >= target]
    if meeting:
        return min(meeting, key=lambda d: (d.reserved_nodes, d.job_wait_mean_s, d.name))
    return max(separate, key=lambda d: (d.requests_within, -d.reserved_nodes), default=None)


def verdict(
    c: Dimensions, ref: Dimensions | None, needed: int | None, criteria: Criteria
) -> Verdict:
    """Rule 2 for one shared candidate `c`; `needed`: the nodes a separate pool needs to
    meet the target (None: no separate pool run met it)."""
    k = criteria
    required = [
        Check(
            "target",
            c.requests_within,
            k.target,
            c.requests_within >= k.target,
            f"{_pct(c.requests_within, 3)} of requests within SLO (target {_pct(k.target)})",
        )
    ]
    gains: list[Check] = []
    if ref is not None:
        short = ref.requests_within - c.requests_within
        allowed = k.budget_slack * (1.0 - k.target)
        required.append(
            Check(
                "slack",
                short,
                allowed,
                short <= allowed,
                f"{_pct(abs(short), 3)} {'below' if short > 0 else 'at or above'} "
                f"{ref.name}'s {_pct(ref.requests_within, 3)} (at most {_pct(allowed, 3)} "
                f"below: {k.budget_slack:.0%} of the error budget)"
                if abs(short) >= 5e-6  # (what 3 decimals of a percentage show)
                else f"level with {ref.name}'s {_pct(ref.requests_within, 3)}",
            )
        )
        base_wait = ref.job_wait_mean_s
        cut = (base_wait - c.job_wait_mean_s) / base_wait if base_wait > 0 else 0.0
        gains.append(
            Check(
                "wait_cut",
                cut,
                k.min_wait_cut,
                cut >= k.min_wait_cut,
                f"mean job wait {human(c.job_wait_mean_s)} against {ref.name}'s "
                f"{human(base_wait)}: {cut:.0%} shorter (at least {k.min_wait_cut:.0%})",
            )
        )
        base = needed if needed is not None else ref.reserved_nodes
        saved = 1.0 - c.reserved_nodes / base if base > 0 else 0.0
        whose = "a separate pool needs to meet the target" if needed else f"{ref.name} holds"
        gains.append(
            Check(
                "nodes_saved",
                saved,
                k.min_nodes_saved,
                saved >= k.min_nodes_saved,
                f"{c.reserved_nodes} reserved nodes against the {base} {whose}: "
                f"{saved:.0%} fewer (at least {k.min_nodes_saved:.0%})",
            )
        )
    required += [
        Check(
            "lends",
            c.lends_per_day,
            k.max_lends_per_day,
            c.lends_per_day <= k.max_lends_per_day,
            f"{c.lends_per_day:.1f} lends a day (at most {k.max_lends_per_day:g})",
        ),
        Check(
            "losses",
            c.lost_share,
            k.max_lost_share,
            c.lost_share <= k.max_lost_share,
            f"{_pct(c.lost_share, 2)} of elastic GPU-hours lost to preemption, "
            f"{c.lost_per_day:,.1f} GPU-h a day (at most {_pct(k.max_lost_share, 1)})",
        ),
        Check(
            "exposure",
            c.exposure_share,
            k.max_exposure,
            c.exposure_share <= k.max_exposure,
            f"{c.exposure_replicas} of {c.peak_serving_nodes} replicas at the peak on "
            f"lendable nodes, {_pct(c.exposure_share, 0)} (at most {_pct(k.max_exposure, 0)})",
        ),
    ]
    return Verdict(c.name, tuple(required), tuple(gains))


def _shared_candidates(
    setups: Sequence[Dimensions], points: Sequence[Dimensions]
) -> list[Dimensions]:
    """The report's shared set-ups, then the trade-off runs of other reserved sizes than
    the report's bridge (that one is the same run)."""
    shared = [d for d in setups if d.kind == SHARED]
    ran = {d.reserved_nodes for d in shared if d.name == "bridge"}
    return shared + [p for p in points if p.reserved_nodes not in ran]


def recommend(
    setups: Sequence[Dimensions],
    points: Sequence[Dimensions],
    separate: Sequence[tuple[int, float]],
    criteria: Criteria,
) -> Recommendation:
    """Rules 1-3 of the module docstring. `setups`: the comparison's set-ups; `points`:
    the bridge's trade-off runs; `separate`: (nodes, requests within SLO) of every
    separate pool run (the comparison's separate set-ups among them)."""
    k = criteria
    ref = reference(setups, k.target)
    needed = needed_separate(separate, k.target)
    candidates = _shared_candidates(setups, points)
    verdicts = tuple(verdict(c, ref, needed, k) for c in candidates)
    by_name = {c.name: c for c in candidates}
    passing = [by_name[v.candidate] for v in verdicts if v.passed]
    if passing:
        best = min(passing, key=lambda d: (d.job_wait_mean_s, d.reserved_nodes, d.name))
        mine = next(v for v in verdicts if v.candidate == best.name)
        gains = [c.text for c in mine.gains if c.passed]
        reasons = (
            f"{best.name} ({best.description}) passes every check, and of the shared "
            f"set-ups that do it has the shortest mean job wait ({human(best.job_wait_mean_s)})",
            *(c.text for c in mine.required),
            *gains,
        )
        return Recommendation(
            best.name, best.kind, ref.name if ref else None, SHARED, reasons, verdicts
        )
    if ref is not None:
        if ref.requests_within >= k.target:
            first = (
                f"{ref.name} ({ref.description}): the separate set-up with the fewest "
                f"reserved nodes ({ref.reserved_nodes}) meeting the target, "
                f"{_pct(ref.requests_within, 3)} of requests within SLO (target {_pct(k.target)})"
            )
        else:
            where = (
                f"a separate pool needs {needed} nodes to meet it"
                if needed is not None
                else "no separate pool run met it"
            )
            first = (
                f"{ref.name} ({ref.description}): no separate set-up of the comparison meets "
                f"the target {_pct(k.target)}; it comes closest with "
                f"{_pct(ref.requests_within, 3)} of requests within SLO, and {where}"
            )
        reasons = (
            first,
            *(
                f"{v.candidate} is kept out: " + "; ".join(c.text for c in v.failed)
                for v in verdicts
            ),
        )
        return Recommendation(ref.name, ref.kind, ref.name, SEPARATE, reasons, verdicts)
    best = max(setups, key=lambda d: (d.requests_within, -d.reserved_nodes))
    reasons = (
        f"no separate set-up in the report to compare with and no shared set-up passes; "
        f"{best.name} serves the most requests within SLO ({_pct(best.requests_within, 3)})",
        *(f"{v.candidate} is kept out: " + "; ".join(c.text for c in v.failed) for v in verdicts),
    )
    return Recommendation(best.name, best.kind, None, "best-service", reasons, verdicts)


# -- the flips ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """One criterion the flips move: its field, what it stands for, its domain and how
    its values read."""

    name: str
    label: str
    low: float
    high: float
    show: Callable[[float], str]


def _share3(v: float) -> str:
    return _pct(v, 3)


def _share(v: float) -> str:
    """A share in three significant figures (a small one keeps its digits: 0.0134%)."""
    return f"{100 * v:.3g}%"


KNOBS: tuple[Knob, ...] = (
    Knob("target", "the SLO attainment target (share of requests within SLO)", 0.0, 1.0, _share3),
    Knob(
        "budget_slack",
        "the slack a shared set-up gets below the separate reference (share of the error budget)",
        0.0,
        math.inf,
        _share,
    ),
    Knob(
        "max_lends_per_day",
        "the most lends a day the operations team accepts",
        0.0,
        math.inf,
        lambda v: f"{v:.1f}",
    ),
    Knob(
        "max_lost_share",
        "the most elastic GPU-hours lost to preemption the batch users accept",
        0.0,
        1.0,
        _share,
    ),
    Knob(
        "max_exposure",
        "the largest share of the peak's replicas on lendable nodes the service accepts",
        0.0,
        1.0,
        _share,
    ),
    Knob("min_wait_cut", "the least cut of the mean job wait worth sharing", 0.0, 1.0, _share),
    Knob(
        "min_nodes_saved",
        "the least share of a separate pool's nodes that sharing must free",
        0.0,
        1.0,
        _share,
    ),
)


@dataclass(frozen=True)
class Flip:
    """The recommendation becomes `to` if criterion `knob` were `direction` `value`."""

    knob: str
    direction: str  # "above" | "below"
    value: float
    to: str
    text: str


def _breakpoints(
    knob: str,
    setups: Sequence[Dimensions],
    points: Sequence[Dimensions],
    separate: Sequence[tuple[int, float]],
    criteria: Criteria,
) -> set[float]:
    """Every value of `knob` at which some check's outcome can change: the candidates'
    own numbers (against every separate set-up that could be the reference)."""
    cands = _shared_candidates(setups, points)
    refs = [d for d in setups if d.kind == SEPARATE]
    k = criteria
    out: set[float] = set()
    if knob == "target":
        out |= {d.requests_within for d in [*setups, *points]} | {w for _, w in separate}
        if k.budget_slack > 0:
            out |= {
                1.0 - (r.requests_within - c.requests_within) / k.budget_slack
                for r in refs
                for c in cands
            }
    elif knob == "budget_slack":
        if k.target < 1:
            out |= {
                (r.requests_within - c.requests_within) / (1 - k.target)
                for r in refs
                for c in cands
            }
    elif knob == "max_lends_per_day":
        out |= {c.lends_per_day for c in cands}
    elif knob == "max_lost_share":
        out |= {c.lost_share for c in cands}
    elif knob == "max_exposure":
        out |= {c.exposure_share for c in cands}
    elif knob == "min_wait_cut":
        out |= {
            (r.job_wait_mean_s - c.job_wait_mean_s) / r.job_wait_mean_s
            for r in refs
            for c in cands
            if r.job_wait_mean_s > 0
        }
    elif knob == "min_nodes_saved":
        bases = {n for n, _ in separate} | {r.reserved_nodes for r in refs}
        out |= {1.0 - c.reserved_nodes / b for b in bases if b > 0 for c in cands}
    return {v for v in out if math.isfinite(v)}


#: how far past a breakpoint the flips probe, relative (a breakpoint derived by a division,
#: as the slack's, can sit an ulp off the value where its check changes)
NUDGE = 1e-9


def beyond(value: float, direction: str) -> float:
    """A value just past `value`, "above" or "below" it (by NUDGE, relative)."""
    step = max(abs(value) * NUDGE, 1e-12)
    return value + step if direction == "above" else value - step


def flips(
    setups: Sequence[Dimensions],
    points: Sequence[Dimensions],
    separate: Sequence[tuple[int, float]],
    criteria: Criteria,
) -> tuple[Flip, ...]:
    """For each criterion (KNOBS) and direction, the nearest value beyond which the
    recommendation changes, and to what; criteria that change nothing within their domain
    give none."""
    now = recommend(setups, points, separate, criteria).choice
    out = []
    for knob in KNOBS:
        current = float(getattr(criteria, knob.name))
        marks = _breakpoints(knob.name, setups, points, separate, criteria)
        for direction in ("above", "below"):
            ahead = sorted(
                (b for b in marks if (b >= current if direction == "above" else b <= current)),
                key=lambda b: abs(b - current),
            )
            for b in ahead:
                probe = beyond(b, direction)
                if not knob.low <= probe <= knob.high or (knob.name == "target" and probe <= 0):
                    continue
                to = recommend(setups, points, separate, replace(criteria, **{knob.name: probe}))
                if to.choice != now:
                    text = (
                        f"{to.choice} instead of {now} if {knob.label} were {direction} "
                        f"{knob.show(b)} (now {knob.show(current)})"
                    )
                    out.append(Flip(knob.name, direction, b, to.choice, text))
                    break
    return tuple(out)


# -- the whole report -----------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A separate pool of `nodes` run for the trade-off (inference only)."""

    nodes: int
    requests_within: float
    minutes_within: float


@dataclass(frozen=True)
class Selection:
    criteria: Criteria
    days: float
    gpus_per_node: int
    #: the comparison's set-ups, in the report's order
    setups: tuple[Dimensions, ...]
    #: the bridge's trade-off runs, by reserved nodes
    points: tuple[Dimensions, ...]
    #: separate pools run (the trade-off's, and the comparison's), by nodes
    separate: tuple[Point, ...]
    #: set-up name -> nodes needed to meet the target (module docstring; None: not met)
    needed: Mapping[str, int | None]
    recommendation: Recommendation
    flips: tuple[Flip, ...]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["definitions"] = dict(DEFINITIONS)
        out["recommendation"]["verdicts"] = [
            {**asdict(v), "passed": v.passed} for v in self.recommendation.verdicts
        ]
        return out


def needed_nodes(
    setups: Sequence[Dimensions],
    points: Sequence[Dimensions],
    separate: Sequence[tuple[int, float]],
    target: float,
) -> dict[str, int | None]:
    """Per set-up, the nodes needed to meet `target` (module docstring)."""
    sep = needed_separate(separate, target)
    bridge_runs = [
        d for d in [*setups, *points] if d.name == "bridge" or d.name.startswith("bridge@")
    ]
    bridge = min(
        (d.reserved_nodes for d in bridge_runs if d.requests_within >= target), default=None
    )
    names = {d.name for d in bridge_runs}
    out: dict[str, int | None] = {}
    for d in [*setups, *points]:
        if d.kind == SEPARATE:
            out[d.name] = sep
        elif d.name in names:
            out[d.name] = bridge
        else:
            out[d.name] = d.reserved_nodes if d.requests_within >= target else None
    return out


def select(report: SimReport, criteria: Criteria | None = None) -> Selection:
    """The selection report of a comparison (and its trade-off runs, when it has them).
    The report's scenario gives the horizon (`horizon_s`) and `gpus_per_node`."""
    k = criteria or Criteria()
    s = report.scenario
    if "horizon_s" not in s:
        raise ValueError("the report's scenario has no horizon_s: no rates per day")
    days = float(s["horizon_s"]) / DAY_S
    gpn = int(s.get("gpus_per_node", 1))
    setups = tuple(dimensions(r, days, gpn) for r in report.results)
    trade = report.tradeoff
    points = tuple(
        sorted(
            (dimensions(r, days, gpn) for r in (trade.bridge if trade else [])),
            key=lambda d: d.reserved_nodes,
        )
    )
    runs: dict[int, Point] = {}
    for r in [*(trade.separate if trade else []), *report.results]:
        if kind_of(r.policy) == SEPARATE:
            n = r.pools.get("inference", 0)
            runs.setdefault(n, Point(n, r.within_share, r.minutes_share))
    separate = tuple(runs[n] for n in sorted(runs))
    pairs = [(p.nodes, p.requests_within) for p in separate]
    return Selection(
        criteria=k,
        days=days,
        gpus_per_node=gpn,
        setups=setups,
        points=points,
        separate=separate,
        needed=needed_nodes(setups, points, pairs, k.target),
        recommendation=recommend(setups, points, pairs, k),
        flips=flips(setups, points, pairs, k),
    )
