"""What the advisory daemon recorded over a window, as plain figures: decisions per day,
lends per pool and per model, each model's observed minutes and breach minutes, and the
window's arrivals per model as the simulator reads them.

Pure: rows in (`bridge.leases.advice.Advice`, `AdviceSample`), values out. Called by
`stb advise report` (`bridge.advise.cli`) and the replay (`bridge.advise.replay`); tested
with literal rows in tests/unit/test_advise_report.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bridge.config import BridgeConfig, ModelConfig
from bridge.leases.advice import KINDS, Advice, AdviceSample
from bridge.triton.catalog import site_models

#: a gap in the samples longer than this is not filled from the sample before it: the
#: advisory was not running, and nothing is known of the load
HOLD_S = 60.0


@dataclass
class ModelSeen:
    """One model over the window, as the advisory observed it."""

    slo_p99_ms: float
    #: minutes with at least one reading of the model's signal
    minutes: int = 0
    #: of those, minutes in which a reading's p99 was over the SLO
    breach_minutes: int = 0
    p99_max_ms: float | None = None
    rate_max: float | None = None
    rate_mean: float | None = None
    #: the median measured compute time per request (the replay's service time)
    compute_ms: float | None = None


@dataclass
class Summary:
    start: datetime
    end: datetime
    label: str
    #: advice rows in the window
    decisions: int = 0
    #: UTC day (YYYY-MM-DD) -> kind -> decisions
    per_day: dict[str, dict[str, int]] = field(default_factory=dict)
    lends_by_pool: dict[str, int] = field(default_factory=dict)
    lends_by_model: dict[str, int] = field(default_factory=dict)
    returns_by_pool: dict[str, int] = field(default_factory=dict)
    #: decisions taken while a shadow lease served: the latency they read does not show
    #: that lend's replica (see `bridge.advise.advisory`)
    under_shadow: int = 0
    models: dict[str, ModelSeen] = field(default_factory=dict)
    #: ticks with samples, and the first and last of them
    ticks: int = 0
    first_sample: datetime | None = None
    last_sample: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": {"start": self.start.isoformat(), "end": self.end.isoformat(),
                       "label": self.label},
            "decisions": self.decisions,
            "per_day": self.per_day,
            "lends_by_pool": self.lends_by_pool,
            "lends_by_model": self.lends_by_model,
            "returns_by_pool": self.returns_by_pool,
            "under_shadow": self.under_shadow,
            "models": {m: vars(s) for m, s in self.models.items()},
            "ticks": self.ticks,
            "first_sample": self.first_sample.isoformat() if self.first_sample else None,
            "last_sample": self.last_sample.isoformat() if self.last_sample else None,
        }  # fmt: skip


def summarise(
    advice: Sequence[Advice],
    samples: Sequence[AdviceSample],
    config: BridgeConfig,
    start: datetime,
    end: datetime,
    label: str = "",
    models: Mapping[str, ModelConfig] | None = None,
) -> Summary:
    """`models`: the models the advisory scaled, with their SLOs (default: `config`'s
    repository merged with its TOML, as the daemon reads them)."""
    specs = site_models(config).scaled if models is None else models
    out = Summary(start, end, label or f"{start.isoformat()}..{end.isoformat()}")
    for row in advice:
        out.decisions += 1
        day = out.per_day.setdefault(row.at.strftime("%Y-%m-%d"), dict.fromkeys(KINDS, 0))
        day[row.kind] = day.get(row.kind, 0) + 1
        if row.kind == "lend":
            out.lends_by_pool[row.pool] = out.lends_by_pool.get(row.pool, 0) + 1
            for m in row.models:
                out.lends_by_model[m] = out.lends_by_model.get(m, 0) + 1
        elif row.kind == "return":
            out.returns_by_pool[row.pool] = out.returns_by_pool.get(row.pool, 0) + 1
        if row.shadow_serving:
            out.under_shadow += 1
    by_model: dict[str, list[AdviceSample]] = {m: [] for m in specs}
    ticks: set[datetime] = set()
    for s in samples:
        by_model.setdefault(s.model, []).append(s)
        ticks.add(s.at)
    out.ticks = len(ticks)
    out.first_sample = min(ticks) if ticks else None
    out.last_sample = max(ticks) if ticks else None
    for model, mine in by_model.items():
        cfg = specs.get(model)
        if cfg is None:
            continue
        seen = ModelSeen(cfg.slo_p99_ms)
        minutes: dict[int, bool] = {}
        for s in mine:
            if s.p99_ms is None and s.request_rate is None:
                continue
            minute = int(s.at.timestamp() // 60)
            over = s.p99_ms is not None and s.p99_ms > cfg.slo_p99_ms
            minutes[minute] = minutes.get(minute, False) or over
        seen.minutes = len(minutes)
        seen.breach_minutes = sum(minutes.values())
        p99s = [s.p99_ms for s in mine if s.p99_ms is not None]
        rates = [s.request_rate for s in mine if s.request_rate is not None]
        computes = [s.compute_ms for s in mine if s.compute_ms is not None and s.compute_ms > 0]
        seen.p99_max_ms = max(p99s) if p99s else None
        seen.rate_max = max(rates) if rates else None
        seen.rate_mean = sum(rates) / len(rates) if rates else None
        seen.compute_ms = statistics.median(computes) if computes else None
        out.models[model] = seen
    return out


@dataclass(frozen=True)
class Arrivals:
    """Per model, the arrival rate (req/s) in `steps` steps of `step_s` from `start`."""

    start: datetime
    step_s: float
    rates: Mapping[str, list[float]]
    #: steps with a reading of at least one model
    covered: int
    steps: int


def arrivals(
    samples: Sequence[AdviceSample],
    models: Sequence[str],
    start: datetime,
    end: datetime,
    step_s: float,
    hold_s: float = HOLD_S,
) -> Arrivals:
    """The window's arrivals per model from the advisory's samples. A sample's arrivals are
    what Triton answered over its tick plus the growth of its queue (`pending`, the
    requests waiting in Triton): under overload the answers alone are capped at what the
    replicas serve. A sample at time `a` reads the step that ends at `a` (its tick); several
    in one step are averaged. A step without a sample takes the last one's value while the gap is at
    most `hold_s`, else 0 (nothing is known: the advisory was not running)."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s!r}")
    span = (end - start).total_seconds()
    steps = max(1, math.ceil(span / step_s - 1e-9))
    t0 = start.timestamp()
    sums: dict[str, list[float]] = {m: [0.0] * steps for m in models}
    counts: dict[str, list[int]] = {m: [0] * steps for m in models}
    seen = [False] * steps
    previous: dict[str, tuple[float, float | None]] = {}
    for s in sorted(samples, key=lambda x: (x.at, x.model)):
        at = s.at.timestamp()
        k = math.ceil((at - t0) / step_s - 1e-9) - 1  # the step ending at `at`
        if not 0 <= k < steps or s.model not in sums:
            continue
        seen[k] = True
        if s.request_rate is None:
            continue
        rate = s.request_rate
        before = previous.get(s.model)
        if before is not None and s.pending is not None and before[1] is not None:
            dt = at - before[0]
            if 0 < dt <= hold_s:
                rate += (s.pending - before[1]) / dt
        previous[s.model] = (at, s.pending)
        sums[s.model][k] += max(0.0, rate)
        counts[s.model][k] += 1
    hold = max(0, int(hold_s // step_s))
    rates: dict[str, list[float]] = {}
    for m in models:
        out = [0.0] * steps
        last: float | None = None
        gap = 0
        for k in range(steps):
            if counts[m][k]:
                last = sums[m][k] / counts[m][k]
                gap = 0
                out[k] = last
            elif last is not None and gap < hold:
                gap += 1
                out[k] = last
            else:
                last = None
        rates[m] = out
    return Arrivals(start, step_s, rates, sum(seen), steps)


__all__ = ["HOLD_S", "Arrivals", "ModelSeen", "Summary", "arrivals", "summarise"]
