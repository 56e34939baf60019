"""The selection report's recommendation (`recommend`), with the thresholds of
`bridge.sim.criteria.Criteria`:

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

Pure: the candidates' `bridge.sim.measures.Dimensions` in, a `Recommendation` with its
reasons (each check's sentence) out. Called by `bridge.sim.selection.select` and, with
moved criteria, by the flips (`bridge.sim.sensitivity`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bridge.sim.criteria import Criteria
from bridge.sim.measures import SEPARATE, SHARED, Dimensions, human, pct


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
            f"{pct(c.requests_within, 3)} of requests within SLO (target {pct(k.target)})",
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
                f"{pct(abs(short), 3)} {'below' if short > 0 else 'at or above'} "
                f"{ref.name}'s {pct(ref.requests_within, 3)} (at most {pct(allowed, 3)} "
                f"below: {k.budget_slack:.0%} of the error budget)"
                if abs(short) >= 5e-6  # (what 3 decimals of a percentage show)
                else f"level with {ref.name}'s {pct(ref.requests_within, 3)}",
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
            f"{pct(c.lost_share, 2)} of elastic GPU-hours lost to preemption, "
            f"{c.lost_per_day:,.1f} GPU-h a day (at most {pct(k.max_lost_share, 1)})",
        ),
        Check(
            "exposure",
            c.exposure_share,
            k.max_exposure,
            c.exposure_share <= k.max_exposure,
            f"{c.exposure_replicas} of {c.peak_serving_nodes} replicas at the peak on "
            f"lendable nodes, {pct(c.exposure_share, 0)} (at most {pct(k.max_exposure, 0)})",
        ),
    ]
    return Verdict(c.name, tuple(required), tuple(gains))


def shared_candidates(
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
    candidates = shared_candidates(setups, points)
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
                f"{pct(ref.requests_within, 3)} of requests within SLO (target {pct(k.target)})"
            )
        else:
            where = (
                f"a separate pool needs {needed} nodes to meet it"
                if needed is not None
                else "no separate pool run met it"
            )
            first = (
                f"{ref.name} ({ref.description}): no separate set-up of the comparison meets "
                f"the target {pct(k.target)}; it comes closest with "
                f"{pct(ref.requests_within, 3)} of requests within SLO, and {where}"
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
        f"{best.name} serves the most requests within SLO ({pct(best.requests_within, 3)})",
        *(f"{v.candidate} is kept out: " + "; ".join(c.text for c in v.failed) for v in verdicts),
    )
    return Recommendation(best.name, best.kind, None, "best-service", reasons, verdicts)
