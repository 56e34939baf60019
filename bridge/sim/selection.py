"""The selection report: shared or separate fleet, for a site's data. Pure functions of a
`SimReport` (the comparison and the trade-off runs of `bridge.sim.policies.tradeoff`):
per set-up, the numbers the choice rests on; a recommendation with its reasons; and the
conditions under which it would flip, found by moving each criterion across the numbers.
Called by `stb simulate` (`bridge.sim.cli`); rendered by `bridge.sim.selection_render`
(markdown, the HTML page's section, tables) and written whole into the JSON. It imports
no plotting (`bridge.sim.render` takes its numbers from here).

`select` puts the report together from its parts, each a module of its own:
- `bridge.sim.measures`: each run's numbers (`Dimensions`) and what each means;
- `bridge.sim.criteria`: the thresholds (`Criteria`) and why each is what it is;
- `bridge.sim.rules`: the recommendation, rules 1-3, with its reasons;
- `bridge.sim.sensitivity`: the flips, where the recommendation would change.
Here: the separate pools run (`Point`), and the nodes each set-up needs to meet the
target (`needed_nodes`, as `bridge.sim.measures` defines it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bridge.sim.criteria import Criteria
from bridge.sim.measures import DEFINITIONS, SEPARATE, Dimensions, dimensions, kind_of
from bridge.sim.result import SimReport
from bridge.sim.rules import Recommendation, needed_separate, recommend
from bridge.sim.sensitivity import Flip, flips

DAY_S = 86400.0


@dataclass(frozen=True)
class Point:
    """A separate pool of `nodes` run for the trade-off (inference only)."""

    nodes: int
    requests_within: float
    minutes_within: float


@dataclass(frozen=True)
class Selection:
    """The selection report of a comparison (`select`); `as_dict` is its JSON."""

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
