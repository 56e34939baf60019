"""The replica latency model: queueing on a Triton server's service time. Pure math,
called by `bridge.sim.engine` once per tick for each group of identical replicas.

A Triton server on a node of `c` GPUs is `c` parallel servers (one model instance per
GPU); every model on it shares them (work-conserving), each request of model m takes its
measured service time `s_m` (the lab's `busy` model: 20 ms). A model's traffic is split
evenly over its ready replicas (nginx). Per tick of length `dt`, with offered load
`a = sum(rate_m * s_m)` busy servers per node:

- below saturation (a < c): the stationary M/G/c queue of `bridge.policy.capacity`, the
  very model the policy sizes replicas with;
- at or above saturation the excess work piles up as a backlog (a fluid queue) that every
  later request waits behind, and drains at the spare rate once load falls.

Latency of a request of model m = s_m + backlog delay + wait. The backlog delay grows or
falls linearly across the tick; the share of requests within an objective integrates over
it exactly. Triton's p99 summary covers 60 s: `window_p99` combines the ticks of that
window (see there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.policy import capacity

Q = capacity.Q


@dataclass(frozen=True, slots=True)
class TickState:
    """One replica group over one tick: what its requests waited beyond their service.

    `delay_lo_s`/`delay_hi_s`: the backlog delay at the tick's start and end; `wait_p`:
    the chance to wait in the stationary queue; `wait_rate`: the exponential tail's rate
    (1/s; inf when nobody waits)."""

    requests: float
    delay_lo_s: float
    delay_hi_s: float
    wait_p: float
    wait_rate: float

    def wait_quantile(self, q: float = Q) -> float:
        """Extra seconds (delay + wait) that a share `q` of this tick's requests stay under
        (taken at the tick's larger backlog: an upper bound)."""
        w = 0.0
        if self.wait_p > 1.0 - q and self.wait_rate > 0:
            w = math.log(self.wait_p / (1.0 - q)) / self.wait_rate
        return max(self.delay_lo_s, self.delay_hi_s) + w

    def mean_extra(self) -> float:
        wait = self.wait_p / self.wait_rate if self.wait_rate > 0 else 0.0
        return (self.delay_lo_s + self.delay_hi_s) / 2.0 + wait

    def share_within(self, budget_s: float) -> float:
        """Share of this tick's requests whose delay + wait is at most `budget_s`."""
        lo, hi = self.delay_lo_s, self.delay_hi_s
        if lo > hi:
            lo, hi = hi, lo
        if hi - lo < 1e-12:
            return self._within_at(budget_s - lo)
        # average of P(W <= budget - D) for D uniform on [lo, hi]: x = budget - D
        x1, x2 = budget_s - hi, budget_s - lo
        if x2 <= 0:
            return 0.0
        x1 = max(0.0, x1)
        covered = x2 - x1
        if self.wait_rate > 0 and self.wait_p > 0 and math.isfinite(self.wait_rate):
            covered -= (self.wait_p / self.wait_rate) * (
                math.exp(-self.wait_rate * x1) - math.exp(-self.wait_rate * x2)
            )
        return max(0.0, min(1.0, covered / (hi - lo)))

    def _within_at(self, x: float) -> float:
        if x < 0:
            return 0.0
        if self.wait_p <= 0 or not math.isfinite(self.wait_rate):
            return 1.0
        return 1.0 - self.wait_p * math.exp(-self.wait_rate * x)


@dataclass(frozen=True, slots=True)
class GroupStep:
    """The outcome of stepping a group: its tick state and the backlog it carries on."""

    state: TickState
    backlog_s: float
    #: requests queued on one node at the tick's end (Triton's pending gauge)
    pending: float


def step(
    servers: int,
    load: float,
    rate: float,
    backlog_s: float,
    dt: float,
    cv2: float = 0.0,
) -> GroupStep:
    """Advance one node of a group over `dt` seconds.

    servers: parallel instances on the node; load: offered busy servers (sum of rate x
    service time of its models' shares); rate: requests per second reaching the node;
    backlog_s: the delay a new request met at the tick's start (seconds of queued work per
    server).
    """
    if servers <= 0:
        raise ValueError(f"servers must be positive, got {servers}")
    mean_service = load / rate if rate > 0 else 0.0
    # the fluid backlog: excess work piles up, spare capacity drains it
    new_backlog = max(0.0, backlog_s + (load - servers) / servers * dt)
    stationary = capacity.queue(servers, load, rate, cv2)
    if stationary is not None and rate > 0:
        p, tail = stationary.wait_p, stationary.tail
        queued = p * load / (servers - load)
    else:
        # saturated: the backlog carries the waiting; the stationary part is not defined
        p, tail, queued = (0.0, math.inf, 0.0)
    pending = queued + (new_backlog * servers / mean_service if mean_service > 0 else 0.0)
    return GroupStep(
        TickState(rate * dt, backlog_s, new_backlog, p, tail), new_backlog, math.floor(pending)
    )


def window_quantile(states: list[TickState], q: float = Q) -> float | None:
    """The extra seconds under which a share `q` of a window's requests stayed: Triton's
    summary over its 60 s window, from the ticks in it. Ticks are taken from the slowest
    (by their own quantile) until they hold the window's slowest `1 - q` of requests; that
    tick's quantile is the answer. Exact when the ticks are alike; after a burst it keeps
    the burst's latency for as long as the burst's requests are over 1% of the window, as
    Triton's summary does. None without requests."""
    return window_quantile_of([(s.requests, s.wait_quantile(q)) for s in states], q)


def window_quantile_of(ticks: Sequence[tuple[float, float]], q: float = Q) -> float | None:
    """`window_quantile` from each tick's (requests, `wait_quantile(q)`), for a caller that
    keeps them (the engine computes a tick's quantile once, not at every window)."""
    total = sum([requests for requests, _ in ticks])
    if total <= 0:
        return None
    budget = (1.0 - q) * total
    # most often the slowest tick alone holds the budget: no need to sort
    top = max(((extra, requests) for requests, extra in ticks if requests > 0), default=None)
    if top is not None and top[1] >= budget:
        return top[0]
    seen = 0.0
    for extra, requests in sorted(
        ((extra, requests) for requests, extra in ticks if requests > 0), reverse=True
    ):
        seen += requests
        if seen >= budget:
            return extra
    return 0.0
