"""A gradual rollout's policy, pure: the step plan (`parse_plan`) and, at each step, the
verdict on the new version against the old on the same live traffic (`judge`).

Not yet driven by anything: issue 19's rollout controller (the routing split, the
persisted rollout, the daemon's tick) is to call `judge` each tick with the two versions'
figures over the step so far and carry out the verdict. Kept here so that the rule is
one pure function the simulator and the tests can run as they run `decide`.

The rule, in order (the first that applies wins):
1. too little evidence (fewer than `min_requests` to the new version in this step): hold;
2. the new version fails more: its failure rate is above the old one's by more than
   chance (a one-sided binomial bound at `z` standard deviations over the old rate, and
   at least `min_failure_rate` absolute): roll back;
3. the new version breaks the SLO: its p99 is over the model's SLO while the old one's is
   not: roll back;
4. the new version is slower: its p99 is over the old one's by more than
   `p99_margin` (relative) and `p99_floor_ms` (absolute): roll back;
5. the step's hold time is not over: hold;
6. otherwise: advance (to the next step, or promote after the last).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["hold", "advance", "rollback"]

_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*(?::\s*(\d+(?:\.\d+)?)\s*([smh]?))?\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


class PlanError(ValueError):
    """A step plan that cannot be run; says which step and why."""


@dataclass(frozen=True)
class Step:
    #: the share of the model's unversioned requests the new version gets, 0 < x <= 100
    percent: float
    #: how long the step runs before it may advance (the verdict may roll back earlier)
    hold_s: float


def parse_plan(text: str, default_hold_s: float) -> tuple[Step, ...]:
    """`"10%"`, `"10%,50%"` or `"10%:5m,50%:10m,100%"` -> the steps, each with its hold
    (`default_hold_s` where a step names none). Shares must rise; 100% is the end (the
    new version serves alone) and is added when the plan stops short of it."""
    if not math.isfinite(default_hold_s) or default_hold_s < 0:
        raise PlanError(f"hold time must be >= 0 seconds, got {default_hold_s:g}")
    parts = text.split(",")
    if not text.strip():
        raise PlanError("empty step plan: give shares such as 10%,50%")
    steps: list[Step] = []
    for i, part in enumerate(parts, 1):
        m = _STEP.match(part)
        if m is None:
            raise PlanError(f"step {i} {part.strip()!r}: not a share such as 10% or 10%:5m")
        percent = float(m.group(1))
        hold = float(m.group(2)) * _UNIT_S[m.group(3) or ""] if m.group(2) else default_hold_s
        if not 0 < percent <= 100:
            raise PlanError(
                f"step {i} {part.strip()!r}: the share must be over 0% and at most 100%"
            )
        if steps and percent <= steps[-1].percent:
            raise PlanError(
                f"step {i} {part.strip()!r}: shares must rise (after {steps[-1].percent:g}%)"
            )
        steps.append(Step(percent, hold))
    if steps[-1].percent < 100:
        steps.append(Step(100.0, 0.0))
    return tuple(steps)


@dataclass(frozen=True)
class VersionFigures:
    """One version's requests over the step so far (both versions over the same time)."""

    requests: int
    failures: int
    #: p99 of its successful requests, ms (None: too few to say)
    p99_ms: float | None

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    why: str


@dataclass(frozen=True)
class Thresholds:
    min_requests: int = 200
    z: float = 3.0
    min_failure_rate: float = 0.001
    p99_margin: float = 0.25
    p99_floor_ms: float = 5.0


def judge(
    new: VersionFigures,
    old: VersionFigures,
    slo_p99_ms: float,
    held_s: float,
    step: Step,
    limits: Thresholds = Thresholds(),
) -> Judgement:
    """The verdict on the new version at this step (the module's rule)."""
    if new.requests < limits.min_requests:
        return Judgement(
            "hold", f"{new.requests} of {limits.min_requests} requests to the new version"
        )
    base = old.failure_rate
    bound = base + limits.z * math.sqrt(max(base, 1.0 / max(old.requests, 1)) / new.requests)
    rate = new.failure_rate
    if rate > bound and rate - base >= limits.min_failure_rate:
        return Judgement(
            "rollback",
            f"fails {rate:.2%} of {new.requests} requests against the old version's "
            f"{base:.2%} of {old.requests}",
        )
    if new.p99_ms is not None:
        old_ok = old.p99_ms is None or old.p99_ms <= slo_p99_ms
        if new.p99_ms > slo_p99_ms and old_ok:
            return Judgement(
                "rollback",
                f"p99 {new.p99_ms:.0f} ms over the SLO {slo_p99_ms:g} ms"
                + (f" (the old version: {old.p99_ms:.0f} ms)" if old.p99_ms is not None else ""),
            )
        if old.p99_ms is not None:
            limit = max(old.p99_ms * (1 + limits.p99_margin), old.p99_ms + limits.p99_floor_ms)
            if new.p99_ms > limit:
                return Judgement(
                    "rollback",
                    f"p99 {new.p99_ms:.0f} ms against the old version's {old.p99_ms:.0f} ms "
                    f"(more than {limits.p99_margin:.0%} slower)",
                )
    if held_s < step.hold_s:
        return Judgement("hold", f"{held_s:.0f} of {step.hold_s:.0f} s at {step.percent:g}%")
    return Judgement(
        "advance",
        f"{new.requests} requests at {step.percent:g}%: failures {rate:.2%} "
        f"(old {base:.2%}), p99 {_ms(new.p99_ms)} (old {_ms(old.p99_ms)}), SLO {slo_p99_ms:g} ms",
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
