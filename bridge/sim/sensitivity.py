"""The selection report's flips (`flips`): for each criterion, in each direction, the
nearest value at which the recommendation changes: every criterion's outcome changes only
where a candidate's number crosses it, so the rules are run again just beyond each such
number (`beyond`), nearest first.


Each criterion is a `Knob` (its field of `bridge.sim.criteria.Criteria`, its words, its
domain); the rules are `bridge.sim.rules.recommend`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bridge.sim.criteria import Criteria
from bridge.sim.measures import SEPARATE, Dimensions, pct
from bridge.sim.rules import recommend, shared_candidates


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
    return pct(v, 3)


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
    cands = shared_candidates(setups, points)
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
