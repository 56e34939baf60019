"""The capacity plan: which models need long-term replicas, and which are better served by
lending nodes for their bursts. A view of the ledger's serving samples (Triton's counters)
judged by the daemon's own capacity model (`bridge.policy.capacity`), so the plan sizes
replicas exactly as the policy would.

Method, per model and UTC hour of the window (from `accounting.serving.window_increases`,
the counters' increases between consecutive scrapes):

- `held`: replicas held, time-weighted: the seconds of the hour each (job, instance) of the
  model has increases covering (its versions' intervals merged), summed, over the seconds
  of the hour any instance of the model was observed (the daemon may have scraped only
  part of the hour);
- `rate_peak`: each increase's requests spread evenly over its interval into 1-minute bins,
  summed over instances and versions; the largest bin of the hour / 60 (req/s);
  `rate_mean`: the hour's requests / 3600;
- `service_s`: the hour's compute seconds / requests, or the model's whole-window mean when
  the hour has fewer than `MIN_REQUESTS` requests (None when never known);
- `needed`: the fewest replicas n (one `capacity.Group((model,), n, gpus)`) for which
  `capacity.predict` gives a p99 within the SLO at `rate_peak`; 0 with no requests; None
  when the model has no SLO, no service time, cannot meet its SLO (service_s >= SLO), or
  needs more than `MAX_REPLICAS`.

Over the observed hours (those the model was held in): `long_term` is the count needed in
at least 90% of them (the 10th percentile, at least the model's min_replicas), and
`burst_hours` the hours needing more: those are the lending's to cover. An increase is
spread over its real interval and clipped to the window: the part of one straddling the
window's start or end that lies outside is left out (the reader also reads the increases
ending up to `LOOKBEHIND` after the window, for the part before its end). Increases
without a request counter give no requests.

`plan` is the pure method; `plan_section` reads the ledger and renders it as a `Section`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, select

from accounting.report import Window
from accounting.schema import NodeSpan
from accounting.section import Section
from accounting.serving import LOOKBEHIND, Increase, window_increases
from bridge.config import ModelConfig
from bridge.policy import capacity

SPANS = NodeSpan.__table__  # type: ignore[attr-defined]
HOUR_S = 3600
MINUTE_S = 60
#: an hour with fewer requests than this takes the model's whole-window service time
MIN_REQUESTS = 50.0
#: the most replicas the search for `needed` tries
MAX_REPLICAS = 1024
#: the share of observed hours `long_term` replicas must be needed in
LONG_TERM_SHARE = 0.9

SUMMARY_COLUMNS = (
    "model", "slo_s", "hours", "held_mean", "rate_peak", "service_s", "needed_p10",
    "needed_median", "needed_max", "long_term", "burst_hours", "verdict",
)  # fmt: skip
HOURLY_COLUMNS = (
    "model", "hour", "held", "requests", "rate_mean", "rate_peak", "service_s", "needed",
    "status",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Hour:
    """One model's hour. `status`: "ok", or why `needed` is None ("no SLO", "no service
    time", "infeasible", "over cap")."""

    model: str
    hour: datetime
    held: float
    requests: float
    rate_mean: float
    rate_peak: float
    service_s: float | None
    needed: int | None
    status: str


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """One model's summary over the window's observed hours (percentiles: over the hours
    with a `needed` figure; None when there is none)."""

    model: str
    slo_s: float | None
    hours: int
    held_mean: float
    rate_peak: float
    service_s: float | None
    needed_p10: int | None
    needed_median: int | None
    needed_max: int | None
    long_term: int | None
    burst_hours: int
    verdict: str


@dataclass(frozen=True, slots=True)
class Plan:
    models: list[ModelPlan]
    hours: list[Hour]


def _ts(t: datetime) -> float:
    return t.timestamp()


def _spread(s: float, e: float, step: int, lo: float, hi: float) -> Iterator[tuple[int, float]]:
    """(bin index, seconds) of [s, e) clipped to [lo, hi), in bins of `step` seconds."""
    a, b = max(s, lo), min(e, hi)
    while a < b:
        idx = math.floor(a / step)
        nxt = min(b, (idx + 1) * step)
        yield idx, nxt - a
        a = nxt


def _merged(intervals: list[tuple[float, float]]) -> Iterator[tuple[float, float]]:
    intervals.sort()
    cur: tuple[float, float] | None = None
    for s, e in intervals:
        if cur is not None and s <= cur[1]:
            cur = (cur[0], max(cur[1], e))
            continue
        if cur is not None:
            yield cur
        cur = (s, e)
    if cur is not None:
        yield cur


def needed_replicas(
    rate: float, service_s: float, slo_s: float, instances: int | None, gpus: int,
    cv2: float = 0.0, model: str = "m",
) -> int | None:  # fmt: skip
    """The fewest replicas whose predicted p99 is within `slo_s` at `rate` (0 without
    requests; None when infeasible or beyond `MAX_REPLICAS`)."""
    if rate <= 0:
        return 0
    demand = {model: capacity.Demand(rate, service_s, slo_s, instances)}
    if not demand[model].feasible:
        return None

    def ok(n: int) -> bool:
        p99 = capacity.predict([capacity.Group((model,), n, gpus)], demand, cv2)[model]
        return p99 <= slo_s

    hi = 1  # double, then bisect: the p99 does not grow with replicas
    while not ok(hi):
        if hi >= MAX_REPLICAS:
            return None
        hi = min(MAX_REPLICAS, hi * 2)
    return capacity.smallest(hi // 2, hi, ok)  # hi // 2: not ok (or 0)


def long_term_of(needed: list[int]) -> int:
    """The largest count needed in at least `LONG_TERM_SHARE` of the hours (0 if none)."""
    if not needed:
        return 0
    v = sorted(needed)
    return v[math.floor((1.0 - LONG_TERM_SHARE) * len(v) + 1e-9)]


def plan(
    incs: Iterable[Increase],
    start: datetime,
    end: datetime,
    models: Mapping[str, ModelConfig],
    gpus: int,
    cv2: float = 0.0,
) -> Plan:
    """Pure: the plan of the window [start, end) from its increases. Configured models
    without samples get a summary of no hours."""
    lo, hi = _ts(start), _ts(end)
    held_iv: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    minute_req: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    hour_req: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    hour_us: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    total_req: dict[str, float] = defaultdict(float)
    total_us: dict[str, float] = defaultdict(float)
    for i in incs:
        s, e = _ts(i.start), _ts(i.end)
        if e <= s:
            continue
        held_iv[(i.model, i.job_id, i.instance)].append((s, e))
        if i.requests is None:
            continue
        length = e - s
        for m, sec in _spread(s, e, MINUTE_S, lo, hi):
            minute_req[i.model][m] += i.requests * sec / length
        for h, sec in _spread(s, e, HOUR_S, lo, hi):
            hour_req[i.model][h] += i.requests * sec / length
            hour_us[i.model][h] += i.compute_us * sec / length
            total_req[i.model] += i.requests * sec / length
            total_us[i.model] += i.compute_us * sec / length

    # replica-seconds per hour over the seconds of the hour the model was observed at all
    # (any instance scraped): the daemon's samples may cover only part of an hour
    served: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    every: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (model, _, _), ivs in held_iv.items():
        every[model] += ivs
        for s, e in _merged(ivs):
            for h, sec in _spread(s, e, HOUR_S, lo, hi):
                served[model][h] += sec
    held: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for model, ivs in every.items():
        observed: dict[int, float] = defaultdict(float)
        for s, e in _merged(ivs):
            for h, sec in _spread(s, e, HOUR_S, lo, hi):
                observed[h] += sec
        for h, sec in observed.items():
            if sec > 0:
                held[model][h] = served[model][h] / sec

    peak: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for model, bins in minute_req.items():
        for m, r in bins.items():
            h = m * MINUTE_S // HOUR_S
            peak[model][h] = max(peak[model][h], r / MINUTE_S)

    hours: list[Hour] = []
    plans: list[ModelPlan] = []
    for model in sorted(set(held) | set(models)):
        cfg = models.get(model)
        slo = cfg.slo_p99_ms / 1000.0 if cfg is not None else None
        mean_service = total_us[model] / 1e6 / total_req[model] if total_req[model] > 0 else None
        rows: list[Hour] = []
        for h in sorted(held[model]):
            req = hour_req[model].get(h, 0.0)
            service = hour_us[model][h] / 1e6 / req if req >= MIN_REQUESTS else mean_service
            rate_peak = peak[model].get(h, 0.0)
            needed: int | None
            if slo is None or cfg is None:
                needed, status = None, "no SLO"
            elif req <= 0 or rate_peak <= 0:
                needed, status = 0, "ok"
            elif service is None:
                needed, status = None, "no service time"
            elif service >= slo:
                needed, status = None, "infeasible"
            else:
                needed = needed_replicas(rate_peak, service, slo, cfg.instances, gpus, cv2, model)
                status = "ok" if needed is not None else "over cap"
            rows.append(
                Hour(
                    model, datetime.fromtimestamp(h * HOUR_S, UTC), held[model][h], req,
                    req / HOUR_S, rate_peak, service, needed, status,
                )
            )  # fmt: skip
        hours.extend(rows)
        plans.append(_summary(model, cfg, slo, mean_service, rows))
    return Plan(plans, hours)


def _summary(
    model: str,
    cfg: ModelConfig | None,
    slo: float | None,
    service: float | None,
    rows: list[Hour],
) -> ModelPlan:
    n = len(rows)
    held_mean = sum(r.held for r in rows) / n if n else 0.0
    rate_peak = max((r.rate_peak for r in rows), default=0.0)
    needed = sorted(r.needed for r in rows if r.needed is not None)

    def out(verdict: str, long_term: int | None = None, bursts: int = 0) -> ModelPlan:
        return ModelPlan(
            model, slo, n, held_mean, rate_peak, service,
            long_term_of(needed) if needed else None,
            needed[(len(needed) - 1) // 2] if needed else None,
            needed[-1] if needed else None,
            long_term, bursts, verdict,
        )  # fmt: skip

    if cfg is None:
        return out("no SLO configured: no replica figure")
    if not n:
        return out("no samples in the window", cfg.min_replicas)
    if not needed:
        why = {r.status for r in rows} - {"ok"}
        if "infeasible" in why and service is not None and slo is not None:
            return out(f"infeasible: one request takes {service:.3f} s, over the {slo:.3f} s SLO")
        return out("no replica figure: " + ", ".join(sorted(why)))
    long_term = max(long_term_of(needed), cfg.min_replicas)
    top = needed[-1]
    bursts = sum(1 for r in rows if r.needed is not None and r.needed > long_term)
    if bursts:
        verdict = (
            f"bursty: {long_term} long-term replica{'s' if long_term != 1 else ''}, lend up "
            f"to {top - long_term} more for {bursts} hour{'s' if bursts != 1 else ''}"
        )
    elif held_mean >= long_term + 1:
        verdict = f"over-provisioned: holds {held_mean:.1f}, needs {long_term}"
    else:
        verdict = f"needs {long_term} long-term replica{'s' if long_term != 1 else ''}"
    if top > cfg.max_replicas:
        verdict += f" (peak {top} is over max_replicas {cfg.max_replicas})"
    if n > len(needed):
        verdict += f"; {n - len(needed)} hours without a figure"
    return out(verdict, long_term, bursts)


def typical_gpus(ledger: Engine, cluster: str | None = None) -> int:
    """The most common GPUs per node among the cluster's node spans (of all clusters when
    None; the larger count on a tie; 1 when there is none)."""
    q = select(SPANS.c.gpus)
    if cluster is not None:
        q = q.where(SPANS.c.cluster == cluster)
    with ledger.connect() as conn:
        count = Counter(int(g) for (g,) in conn.execute(q) if g and g > 0)
    if not count:
        return 1
    return max(count.items(), key=lambda kv: (kv[1], kv[0]))[0]


def plan_section(
    ledger: Engine,
    window: Window,
    models: Mapping[str, ModelConfig],
    gpus: int,
    cluster: str | None = None,
    hourly: bool = False,
    cv2: float = 0.0,
) -> Section:
    """The capacity plan of `window` as a section (key "capacity_plan"): one row per model,
    or with `hourly` one per model and observed hour. `gpus`: GPUs per replica node (see
    `typical_gpus`); `cv2`: the service time's variability, as the policy's
    `service_cv2`."""
    result = plan(
        # the intervals straddling the window's end too: each is clipped to the window
        window_increases(ledger, window.start, window.end + LOOKBEHIND, cluster),
        window.start, window.end, models, gpus, cv2,
    )  # fmt: skip
    notes = [
        f"needed: fewest replicas (nodes of {gpus} GPUs) whose predicted p99 meets the SLO "
        "at the hour's peak 1-minute rate, by the policy's capacity model",
        f"long_term: needed in at least {LONG_TERM_SHARE:.0%} of the observed hours, at "
        "least min_replicas; burst_hours: hours needing more (lend for them)",
        "held: replicas serving, time-weighted; rates count successful requests only",
    ]
    if hourly:
        rows = [
            {
                "model": h.model, "hour": h.hour.strftime("%Y-%m-%dT%H:%MZ"), "held": h.held,
                "requests": h.requests, "rate_mean": h.rate_mean, "rate_peak": h.rate_peak,
                "service_s": h.service_s, "needed": h.needed, "status": h.status,
            }
            for h in result.hours
        ]  # fmt: skip
        return Section(
            "capacity_plan", f"Capacity plan by hour, {window.label}", HOURLY_COLUMNS, rows,
            notes,
        )  # fmt: skip
    rows = [{c: getattr(p, c) for c in SUMMARY_COLUMNS} for p in result.models]
    return Section("capacity_plan", f"Capacity plan, {window.label}", SUMMARY_COLUMNS, rows, notes)
