"""The capacity model: what p99 a model's replicas give at a request rate, and so how many
replicas it needs. Pure math, one implementation for the policy (`decide`), the
simulator's sizing of pools and its latency model (`bridge.sim.latency`), and the tests.

A replica is a Triton server on one node. Its model instances are parallel servers of a
queue: a model with `instances` set has that many of its own (Triton's instance_group
count); the models without share the node's GPUs, one execution per GPU
(work-conserving). nginx spreads a model's traffic evenly over its ready replicas. For one
pool of `c` servers with offered load `a = sum(rate_m x service_m)` busy servers:

- below saturation (a < c), M/G/c: Erlang C gives the chance to wait; the waiting time's
  tail is exponential with rate `(c/s - rate) x 2 / (1 + cv2)` (Allen-Cunneen: cv2 is
  the squared coefficient of variation of the service time, 0 deterministic, 1
  exponential), so its quantile q is `ln(C / (1 - q)) / tail`;
- at or above saturation the queue grows without bound: the p99 is infinite.

A model's predicted p99 is its service time plus the largest waiting quantile over the
pools that serve it (an upper bound of the fleet's quantile, as the daemon's signal reads
Triton's). The service time is what Triton measures: its compute time per request
(`nv_inference_compute_*_duration_us` over `nv_inference_request_success`).

`plan_nodes` adds nodes one at a time, each holding the models still predicted over their
objective, until none is: the deficit of a whole tick in one answer. `removable` asks the
reverse for lent nodes. Both take the demand the caller wants covered (the policy: the
current and forecast rate times a headroom).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

#: the quantile the SLO is stated on
Q = 0.99


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load `a` Erlangs."""
    if a <= 0.0:
        return 0.0
    if a >= c:
        return 1.0
    b = 1.0  # Erlang B by the stable recursion
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


@dataclass(frozen=True, slots=True)
class Queue:
    """The stationary waiting of one pool of servers: the chance to wait and the rate of
    the waiting time's exponential tail (1/s; inf when nobody waits)."""

    wait_p: float
    tail: float

    def quantile(self, q: float = Q) -> float:
        """Seconds of waiting that a share `q` of requests stays under."""
        if self.wait_p > 1.0 - q and self.tail > 0:
            return math.log(self.wait_p / (1.0 - q)) / self.tail
        return 0.0

    def mean(self) -> float:
        return self.wait_p / self.tail if self.tail > 0 else 0.0


def queue(servers: int, load: float, rate: float, cv2: float = 0.0) -> Queue | None:
    """The pool's stationary queue, or None at or past saturation (`load >= servers`)."""
    if servers <= 0:
        raise ValueError(f"servers must be positive, got {servers}")
    if rate <= 0 or load <= 0:
        return Queue(0.0, math.inf)
    if load >= servers:
        return None
    mean_service = load / rate
    spare = servers / mean_service - rate  # requests/s the pool could still take
    return Queue(erlang_c(servers, load), spare * 2.0 / (1.0 + max(0.0, cv2)))


def wait_p99_s(servers: int, load: float, rate: float, cv2: float = 0.0) -> float:
    """Stationary p99 of the waiting time (inf at or past saturation)."""
    q = queue(servers, load, rate, cv2)
    return math.inf if q is None else q.quantile()


@dataclass(frozen=True, slots=True)
class Demand:
    """What one model asks of its replicas: a request rate to carry (req/s), its compute
    time per request (s), its objective (p99, s), and its own instances per replica
    (None: it shares the node's GPUs)."""

    rate: float
    service_s: float
    slo_s: float
    instances: int | None = None

    @property
    def feasible(self) -> bool:
        """More replicas can meet the objective only if one request fits in it."""
        return self.service_s < self.slo_s


@dataclass(frozen=True, slots=True)
class Group:
    """`nodes` replicas that hold the same models, each on a node of `gpus` GPUs."""

    models: tuple[str, ...]
    nodes: int
    gpus: int


def replicas_of(groups: Iterable[Group]) -> dict[str, int]:
    """Replicas per model."""
    out: dict[str, int] = {}
    for g in groups:
        for m in g.models:
            out[m] = out.get(m, 0) + g.nodes
    return out


def predict(
    groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0
) -> dict[str, float]:
    """Predicted p99 (seconds) of each model in `demand`; inf for a model with no replica
    or a saturated one."""
    replicas = replicas_of(groups)
    worst: dict[str, float] = {}
    # per model, its rate and load on one replica (the same in every group that holds it),
    # worked out at its first group: a model is in a dozen groups at a site's scale
    per: dict[str, tuple[float, float, Demand] | None] = {}
    for g in groups:
        if g.nodes <= 0:
            continue
        shared_rate = shared_load = 0.0
        shared: list[str] = []
        for m in g.models:
            if m in per:
                p = per[m]
            else:
                d = demand.get(m)
                if d is None:
                    p = None
                else:
                    share = d.rate / replicas[m]
                    p = (share, share * d.service_s, d)
                per[m] = p
            if p is None:
                continue
            share, load, d = p
            if d.instances is None:
                shared.append(m)
                shared_rate += share
                shared_load += load
            else:
                w = wait_p99_s(d.instances, load, share, cv2)
                worst[m] = max(worst.get(m, 0.0), w)
        if shared:
            w = wait_p99_s(max(1, g.gpus), shared_load, shared_rate, cv2)
            for m in shared:
                worst[m] = max(worst.get(m, 0.0), w)
    return {
        m: (d.service_s + worst[m]) if m in worst else (math.inf if d.rate > 0 else d.service_s)
        for m, d in demand.items()
    }


def over(groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0) -> list[str]:
    """The feasible models with requests predicted over their objective, worst first."""
    p99 = predict(groups, demand, cv2)
    late = [m for m, d in demand.items() if d.rate > 0 and d.feasible and p99[m] > d.slo_s]
    return sorted(late, key=lambda m: (-p99[m] / demand[m].slo_s, m))


def plan_nodes(
    groups: Sequence[Group],
    demand: Mapping[str, Demand],
    gpus: Sequence[int],
    room: Callable[[str, int], bool],
    cv2: float = 0.0,
) -> list[tuple[str, ...]]:
    """The models of each node to add (at most one per entry of `gpus`, the candidate
    nodes' GPUs in the order they would be taken) until no feasible model is predicted
    over its objective. `room(model, replicas)` says whether the model may have one more
    replica than `replicas`; a model without room is left out of the next node, and the
    plan stops when no model over its objective has room."""
    current = list(groups)
    added: list[tuple[str, ...]] = []
    for node_gpus in gpus:
        replicas = replicas_of(current)
        late = [m for m in over(current, demand, cv2) if room(m, replicas.get(m, 0))]
        if not late:
            break
        models = tuple(sorted(late))
        added.append(models)
        current.append(Group(models, 1, node_gpus))
    return added


def carries(groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0) -> bool:
    """Whether every feasible model is predicted within its objective (`over` is empty)."""
    p99 = predict(groups, demand, cv2)
    return not any(d.rate > 0 and d.feasible and p99[m] > d.slo_s for m, d in demand.items())


def smallest(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The smallest count in (lo, hi] for which `ok` holds, by bisection: `ok(hi)` holds,
    `ok(lo)` does not (or lo is below every count asked), and `ok` holds for every count
    above one for which it holds (replicas or nodes: more never serve worse)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
