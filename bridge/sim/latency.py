"""The replica latency model: queueing on a Triton server's service time. Pure math,
called by `bridge.sim.engine` once per tick for each group of identical replicas.

A Triton server on a node of `c` GPUs is `c` parallel servers (one model instance per
GPU); every model on it shares them (work-conserving), each request of model m takes its
measured service time `s_m` (the lab's `busy` model: 20 ms). A model's traffic is split
over its ready replicas as nginx's `least_conn` splits it (`bridge.sim.serving`: by GPUs,
a replica past 85% busy steered from). Per tick of length `dt`, with offered load
`a = sum(rate_m * s_m)` busy servers per node:

- below saturation (a < c): the stationary M/G/c queue of `bridge.policy.capacity`, the
  very model the policy sizes replicas with, except for the arrivals: `least_conn` spaces
  a replica's more evenly than Poisson's (`LEAST_CONN_CA2`, below), the capacity model
  keeps Poisson's;
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

#: the squared coefficient of variation of the arrivals nginx's `least_conn` sends a
#: replica of a model it spreads over several (Poisson's is 1): it passes over a replica
#: with requests in flight, so they come more evenly spaced. bench/least_conn_split.py:
#: the p99 of a replica of 1 or 2 executions beside one of 8, at 71-88% busy, fits
#: Allen-Cunneen's M/G/c with 0.25-0.34 (Poisson's 1 gave 2.4-3.3 times its p99)
LEAST_CONN_CA2 = 0.3


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
        return wait_quantile(self.delay_lo_s, self.delay_hi_s, self.wait_p, self.wait_rate, q)

    def mean_extra(self) -> float:
        return mean_extra(self.delay_lo_s, self.delay_hi_s, self.wait_p, self.wait_rate)

    def share_within(self, budget_s: float) -> float:
        """Share of this tick's requests whose delay + wait is at most `budget_s`."""
        return share_within(self.delay_lo_s, self.delay_hi_s, self.wait_p, self.wait_rate, budget_s)


# `TickState`'s methods on its fields as plain numbers (the engine keeps a tick's state as
# these four: lo, hi, wait_p, wait_rate; no object per group and tick)


def wait_quantile(lo: float, hi: float, wait_p: float, wait_rate: float, q: float = Q) -> float:
    """`TickState.wait_quantile`."""
    w = 0.0
    if wait_p > 1.0 - q and wait_rate > 0:
        w = math.log(wait_p / (1.0 - q)) / wait_rate
    return max(lo, hi) + w


def mean_extra(lo: float, hi: float, wait_p: float, wait_rate: float) -> float:
    """`TickState.mean_extra`."""
    wait = wait_p / wait_rate if wait_rate > 0 else 0.0
    return (lo + hi) / 2.0 + wait


def share_within(lo: float, hi: float, wait_p: float, wait_rate: float, budget_s: float) -> float:
    """`TickState.share_within`."""
    if lo > hi:
        lo, hi = hi, lo
    if hi - lo < 1e-12:
        x = budget_s - lo  # `_within_at`
        if x < 0:
            return 0.0
        if wait_p <= 0 or not math.isfinite(wait_rate):
            return 1.0
        return 1.0 - wait_p * math.exp(-wait_rate * x)
    # average of P(W <= budget - D) for D uniform on [lo, hi]: x = budget - D
    x1, x2 = budget_s - hi, budget_s - lo
    if x2 <= 0:
        return 0.0
    x1 = max(0.0, x1)
    covered = x2 - x1
    if wait_rate > 0 and wait_p > 0 and math.isfinite(wait_rate):
        covered -= (wait_p / wait_rate) * (math.exp(-wait_rate * x1) - math.exp(-wait_rate * x2))
    return max(0.0, min(1.0, covered / (hi - lo)))


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
    ca2: float = 1.0,
) -> GroupStep:
    """Advance one node of a group over `dt` seconds.

    servers: parallel instances on the node; load: offered busy servers (sum of rate x
    service time of its models' shares); rate: requests per second reaching the node;
    backlog_s: the delay a new request met at the tick's start (seconds of queued work per
    server); cv2 and ca2: the squared coefficients of variation of the service time and
    of the arrivals (1: Poisson).
    """
    if servers <= 0:
        raise ValueError(f"servers must be positive, got {servers}")
    new_backlog, p, tail, pending = advance(servers, load, rate, backlog_s, dt, cv2, ca2)
    return GroupStep(TickState(rate * dt, backlog_s, new_backlog, p, tail), new_backlog, pending)


def advance(
    servers: int,
    load: float,
    rate: float,
    backlog_s: float,
    dt: float,
    cv2: float,
    ca2: float = 1.0,
) -> tuple[float, float, float, int]:
    """`step` as plain numbers, for the engine's tick (`servers` > 0): the new backlog,
    the stationary queue's wait_p and wait_rate (`capacity.queue`, written out: no
    `Queue` made, with the arrivals' `ca2` where `capacity.queue` takes Poisson's 1:
    Allen-Cunneen's tail rate `spare x 2 / (ca2 + cv2)`), and the pending requests."""
    mean_service = load / rate if rate > 0 else 0.0
    # the fluid backlog: excess work piles up, spare capacity drains it
    new_backlog = max(0.0, backlog_s + (load - servers) / servers * dt)
    if rate <= 0 or load <= 0:  # `capacity.queue`: nobody waits
        p, tail, queued = 0.0, math.inf, 0.0
    elif load >= servers:
        # saturated: the backlog carries the waiting; the stationary part is not defined
        p, tail, queued = (0.0, math.inf, 0.0)
    else:
        p = capacity.erlang_c(servers, load)
        tail = (servers / mean_service - rate) * 2.0 / (ca2 + max(0.0, cv2))
        queued = p * load / (servers - load)
    pending = queued + (new_backlog * servers / mean_service if mean_service > 0 else 0.0)
    return new_backlog, p, tail, math.floor(pending)


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
