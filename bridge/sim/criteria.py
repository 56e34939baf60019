"""The selection report's criteria: the thresholds its recommendation applies
(`Criteria`; the module constants are the defaults), why each is what it is (`REASONS`,
which the reports print beside the values), and `parse_criteria`, which reads
`stb simulate --criteria name=value,...`. The rules that apply them are
`bridge.sim.rules`; the flips move them (`bridge.sim.sensitivity`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

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
