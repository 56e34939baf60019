"""How the demo's load step was met, from its requests' own records (client side): pure.

The step sends more than one replica answers, so a backlog builds on the first replica
until the lent one serves; both then work it off at (two replicas' answers/s - the
arrivals/s). So the time until the requests' p99 is back under the SLO is about

    serving x (two replicas' rate - one's) / (two replicas' rate - arrivals)

(about 2.5 times the time to serving on the lab: the step sends 70/s, one replica of
busy answers about 47/s, two about 87/s), and it moves with each of those rates. After
that the two replicas run at arrivals / their rate (about 80% busy on the lab), where
the requests' p99 per window sits close to the SLO: a burst of arrivals or a busy CPU
(other work on the machine, or the lab's Tritons, nginx, the sender and Slurm sharing
two cores) pushes single windows over it. "Under the SLO from" (the last window over
it) then jumps to that window, up to the step's end; so the figures split the two: when
the backlog was worked off, and how the windows after it stood against the SLO.

`step_figures` computes them, `describe` words them for `stb lab demo`; the bench
(`bench/lab_step.py`) and the unit tests read the same figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.load.runner import RequestRecord

#: the span over which the load step's own p99 is measured (client side), in seconds
P99_WINDOW_S = 5.0
#: answers in the step's first second are not yet limited by the replica (no backlog)
_SATURATED_FROM_S = 1.0


@dataclass(frozen=True)
class StepFigures:
    """The load step as its requests saw it; times in seconds after the step."""

    #: the lend was decided / its replica was serving
    lend_s: float
    serving_s: float
    #: from here on every window's p99 is under the SLO (0: it never went over); equal to
    #: step_s when the last window was over it (the p99 never stayed under)
    p99_under_slo_s: float
    #: the worst window's p99, in ms
    worst_p99_ms: float
    #: the step's length (the end of its last window)
    step_s: float
    #: requests sent but not answered when the lent replica began serving (the backlog)
    backlog: int
    #: arrivals/s over the step; answers/s of the first replica alone (from 1 s after the
    #: step to serving) and of both while they worked the backlog off (None: no span)
    arrival_rate: float
    one_replica_rate: float | None
    two_replicas_rate: float | None
    #: the start of the first window under the SLO after the lent replica served: the
    #: backlog worked off (0: no window went over; None: none came back under)
    recovered_s: float | None
    #: the send time of the last request over the SLO before `recovered_s`: the backlog
    #: worked off to the request rather than to a 5 s window (0 when no window went
    #: over, None when none came back under). Not the first request under the SLO after
    #: serving: nginx's least_conn sends the lent replica the new requests while the
    #: first one's queue is long, and they are answered at once.
    drained_s: float | None
    #: the windows from recovered_s on: how many, how many over the SLO, their p99s'
    #: median and maximum in ms (None: no such window)
    after_windows: int
    after_late: int
    after_median_p99_ms: float | None
    after_max_p99_ms: float | None
    #: the sender's own lateness (sent - scheduled), p99 in ms: part of every latency
    send_lag_p99_ms: float

    @property
    def held(self) -> bool:
        """Whether the p99 stayed under the SLO before the step ended."""
        return self.p99_under_slo_s < self.step_s

    @property
    def expected_recovered_s(self) -> float | None:
        """When the backlog should be worked off by the measured rates: serving x (two
        replicas' rate - one's) / (two replicas' rate - arrivals); None without both
        rates, or when two replicas answer no more than arrives (it never drains)."""
        one, two = self.one_replica_rate, self.two_replicas_rate
        if one is None or two is None or two <= self.arrival_rate:
            return None
        return self.serving_s * (two - one) / (two - self.arrival_rate)


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _answers_per_s(records: Sequence[RequestRecord], start: float, end: float) -> float | None:
    if end - start < 1.0:
        return None
    done = sum(1 for r in records if r.ok and r.done_s is not None and start <= r.done_s < end)
    return done / (end - start)


def step_figures(
    records: Sequence[RequestRecord],
    *,
    lend_s: float,
    serving_s: float,
    slo_ms: float,
    window_s: float = P99_WINDOW_S,
) -> StepFigures:
    """The figures of a step whose requests are `records` (times from the step's start),
    the lend decided at `lend_s` and its replica serving at `serving_s`."""
    windows: dict[int, list[float]] = {}
    for r in records:
        if r.ok and r.latency_s is not None:
            windows.setdefault(int(r.scheduled_s // window_s), []).append(r.latency_s)
    p99 = {w: _p99(v) * 1000.0 for w, v in sorted(windows.items())}
    late = [w for w, v in p99.items() if v > slo_ms]
    step_s = (max(p99) + 1) * window_s if p99 else 0.0
    recovered: float | None = 0.0
    if late:
        after = [w for w, v in p99.items() if w >= late[0] and (w + 1) * window_s > serving_s]
        back = next((w for w in after if p99[w] <= slo_ms), None)
        recovered = None if back is None else back * window_s
    steady = [] if recovered is None else [v for w, v in p99.items() if w * window_s >= recovered]
    backlog = sum(
        1
        for r in records
        if r.sent_s is not None and r.sent_s < serving_s and (r.done_s or 0.0) > serving_s
    )
    drained = recovered
    if recovered:
        drained = max(
            (
                r.scheduled_s
                for r in records
                if r.scheduled_s < recovered
                and r.ok
                and r.latency_s is not None
                and r.latency_s * 1000.0 > slo_ms
            ),
            default=recovered,
        )
    due = max((r.scheduled_s for r in records), default=0.0)
    lags = [r.sent_s - r.scheduled_s for r in records if r.sent_s is not None]
    worked = recovered if recovered else step_s
    return StepFigures(
        lend_s=lend_s,
        serving_s=serving_s,
        p99_under_slo_s=(late[-1] + 1) * window_s if late else 0.0,
        worst_p99_ms=max(p99.values(), default=0.0),
        step_s=step_s,
        backlog=backlog,
        arrival_rate=len(records) / due if due > 0 else 0.0,
        one_replica_rate=_answers_per_s(records, _SATURATED_FROM_S, serving_s),
        two_replicas_rate=_answers_per_s(records, serving_s, worked),
        recovered_s=recovered,
        drained_s=drained,
        after_windows=len(steady),
        after_late=sum(1 for v in steady if v > slo_ms),
        after_median_p99_ms=statistics.median(steady) if steady else None,
        after_max_p99_ms=max(steady) if steady else None,
        send_lag_p99_ms=_p99(lags) * 1000.0 if lags else 0.0,
    )


def describe(f: StepFigures, slo_ms: float, window_s: float = P99_WINDOW_S) -> list[str]:
    """The figures in words, a line each: the lend, the backlog and its working off, the
    windows after it, and what the time to the SLO depends on."""
    rate = f"{f.arrival_rate:.0f}/s"
    one = "-" if f.one_replica_rate is None else f"{f.one_replica_rate:.0f}/s"
    two = "-" if f.two_replicas_rate is None else f"{f.two_replicas_rate:.0f}/s"
    lines = [
        f"after the step ({rate}): lend decided at {f.lend_s:.1f} s, the lent replica serving "
        f"at {f.serving_s:.1f} s, when {f.backlog} requests were queued (the first replica "
        f"answered {one})"
    ]
    if f.recovered_s is None:
        lines.append(
            f"the two replicas (answering {two}) had not worked the queue off by the step's "
            f"end ({f.step_s:.0f} s): the requests' p99 (per {window_s:g} s) stayed over the "
            f"SLO {slo_ms:g} ms (worst {f.worst_p99_ms:.0f} ms)"
        )
    else:
        lines.append(
            f"the two replicas answered {two} and worked it off: the requests' p99 (per "
            f"{window_s:g} s) under the SLO {slo_ms:g} ms from {f.recovered_s:.0f} s "
            f"(worst {f.worst_p99_ms:.0f} ms before)"
        )
        if f.after_windows:
            held = (
                f"under the SLO from {f.p99_under_slo_s:.0f} s on"
                if f.held
                else "the step's last window over it"
            )
            lines.append(
                f"then {f.after_late} of {f.after_windows} windows over the SLO "
                f"(p99 median {f.after_median_p99_ms:.0f} ms, max {f.after_max_p99_ms:.0f} ms; "
                f"{held}); the sender's own lateness p99 {f.send_lag_p99_ms:.0f} ms"
            )
    expected = f.expected_recovered_s
    lines.append(
        "what these depend on: the queue grows at arrivals - one replica's rate until the "
        "lent one serves and drains at two replicas' rate - arrivals, so it is worked off "
        "at about serving x (two - one) / (two - arrivals)"
        + ("" if expected is None else f" = {expected:.0f} s here")
        + "; two replicas at this rate run close to the SLO"
        + ("" if not f.two_replicas_rate else f" ({f.arrival_rate / f.two_replicas_rate:.0%} busy)")
        + ", so a burst of arrivals or a busy CPU (other work, or the lab's Tritons, nginx, "
        "the sender and Slurm on two cores) pushes single windows over it"
    )
    return lines
