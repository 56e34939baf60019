"""The capacity model: what p99 a model's replicas give at a request rate, and so how many
replicas it needs. Pure math, one implementation for the policy (`decide`), the
simulator's sizing of pools and its latency model (`bridge.sim.latency`), and the tests.

A replica is a Triton server on one node. Its model instances are parallel servers of a
queue: a model with `instances` set has that many of its own (Triton's instance_group
count); the models without share the node's GPUs, one execution per GPU
(work-conserving). nginx splits a model's traffic over its ready replicas by their weight
(`weight`: a replica's GPUs, or 1 each for a model with its own instances; replicas alike,
evenly), `least_conn` with the daemon's `RoutingTable.weights`. For one
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
objective, until none is: the deficit of a whole tick in one answer; `plan_lends` the same
with each lend sized in GPUs (a replica of k GPUs: the fewest m x k of its node that carry
its models). `carries` asks whether the replicas meet every objective (a return with
`[policy] return_slack`: or stay within `allowance` of a p99 already past it). All take the
demand the caller wants covered (the policy: the current and forecast rate times a
headroom).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

#: the quantile the SLO is stated on
Q = 0.99

_first = itemgetter(0)


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
    """Stationary p99 of the waiting time (inf at or past saturation):
    `queue(...).quantile()`, step for step, without building the `Queue` (`predict` asks
    once per pool, a thousand pools a tick at a site's scale)."""
    if servers <= 0:
        raise ValueError(f"servers must be positive, got {servers}")
    if rate <= 0 or load <= 0:
        return 0.0
    if load >= servers:
        return math.inf
    mean_service = load / rate
    spare = servers / mean_service - rate
    tail = spare * 2.0 / (1.0 + max(0.0, cv2))
    wait_p = erlang_c(servers, load)
    if wait_p > 1.0 - Q and tail > 0:
        return math.log(wait_p / (1.0 - Q)) / tail
    return 0.0


@dataclass(frozen=True, slots=True, init=False)
class Demand:
    """What one model asks of its replicas: a request rate to carry (req/s), its compute
    time per request (s), its objective (p99, s), and its own instances per replica
    (None: it shares the node's GPUs)."""

    rate: float
    service_s: float
    slo_s: float
    instances: int | None = None

    def __init__(
        self, rate: float, service_s: float, slo_s: float, instances: int | None = None
    ) -> None:
        # The frozen dataclass's own __init__ sets each field through
        # object.__setattr__; the slots' setters set the very same fields in half the
        # time (`decide` makes two demands per model each tick: thousands at a site).
        _set_rate(self, rate)
        _set_service_s(self, service_s)
        _set_slo_s(self, slo_s)
        _set_instances(self, instances)

    @property
    def feasible(self) -> bool:
        """More replicas can meet the objective only if one request fits in it."""
        return self.service_s < self.slo_s


_set_rate = Demand.__dict__["rate"].__set__
_set_service_s = Demand.__dict__["service_s"].__set__
_set_slo_s = Demand.__dict__["slo_s"].__set__
_set_instances = Demand.__dict__["instances"].__set__


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


def weight(gpus: int, instances: int | None) -> int:
    """A replica's weight in routing a model's requests: its `gpus` for a model that
    shares them (its executions), 1 for a model with `instances` of its own (as many on
    every replica). The daemon weighs a model's replicas so in nginx (its actuator's
    `RoutingTable.weights`) and a replica takes its weight's share of the model's
    requests (`_worst_waits` writes this rule out on its hot path)."""
    return 1 if instances is not None else max(1, gpus)


def _worst_waits(
    groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float
) -> dict[str, float]:
    """Per model of `demand` that a group of `groups` holds: the largest waiting p99 over
    the pools that serve it (never below 0). `predict`'s p99 is its service time plus
    this; a model not here has no replica."""
    # per model, the weight of its replicas in all (`weight`, written out: a call per
    # group and model costs a third of the pass), then its requests and load per unit of
    # weight, worked out at its first group: a model is in a dozen groups at a site's scale
    own = {m for m, d in demand.items() if d.instances is not None}
    total: dict[str, int] = {}
    get = total.get
    for g in groups:
        if g.nodes > 0:
            units = g.nodes * max(1, g.gpus)
            if own:
                for m in g.models:
                    total[m] = get(m, 0) + (g.nodes if m in own else units)
            else:
                for m in g.models:
                    total[m] = get(m, 0) + units
    per: dict[str, tuple[float, float, int | None] | None] = {}
    # each pool's waiting p99 and the models it serves
    pools: list[tuple[float, Sequence[str]]] = []
    for g in groups:
        if g.nodes <= 0:
            continue
        # the shared models' requests and load per GPU of this replica (its weight)
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
                    unit = d.rate / total[m]
                    p = (unit, unit * d.service_s, d.instances)
                per[m] = p
            if p is None:
                continue
            unit, unit_load, instances = p
            if instances is None:
                shared.append(m)
                shared_rate += unit
                shared_load += unit_load
            else:  # a weight of 1: one unit a replica
                pools.append((wait_p99_s(instances, unit_load, unit, cv2), (m,)))
        if shared:
            gpus = max(1, g.gpus)
            pools.append((wait_p99_s(gpus, shared_load * gpus, shared_rate * gpus, cv2), shared))
    # Each model's largest wait, 0 at least (`max(0.0, w, ...)`: a NaN counts as none):
    # the pools written in ascending order of wait, each model keeps the last, its
    # largest (dict.update in C, where a max per model and pool cost as much as the rest).
    ordered = sorted(((w if w > 0.0 else 0.0, models) for w, models in pools), key=_first)
    worst: dict[str, float] = {}
    for w, models in ordered:
        worst.update(zip(models, repeat(w)))
    return worst


def predict(
    groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0
) -> dict[str, float]:
    """Predicted p99 (seconds) of each model in `demand`; inf for a model with no replica
    or a saturated one."""
    worst = _worst_waits(groups, demand, cv2)
    return {
        m: (d.service_s + worst[m]) if m in worst else (math.inf if d.rate > 0 else d.service_s)
        for m, d in demand.items()
    }


def _late(
    demand: Mapping[str, Demand],
    worst: Mapping[str, float],
    allowed: Mapping[str, float] | None = None,
) -> Iterator[tuple[str, float]]:
    """(model, predicted p99) of each feasible model with requests predicted over its
    objective (or over its `allowed` p99, where that is larger), in `demand`'s order:
    `predict`'s p99 read for those models alone (one pass over a site's thousands of
    models, no dict of them all)."""
    inf = math.inf
    for m, d in demand.items():
        svc, slo = d.service_s, d.slo_s
        # `d.rate > 0 and d.feasible and p99 > slo`, `feasible` written out
        if d.rate > 0 and svc < slo:
            w = worst.get(m)
            p99 = inf if w is None else svc + w
            if p99 > slo and (allowed is None or not p99 <= allowed.get(m, slo)):
                yield m, p99


def over(groups: Sequence[Group], demand: Mapping[str, Demand], cv2: float = 0.0) -> list[str]:
    """The feasible models with requests predicted over their objective, worst first."""
    p99 = dict(_late(demand, _worst_waits(groups, demand, cv2)))
    return sorted(p99, key=lambda m: (-p99[m] / demand[m].slo_s, m))


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


def plan_lends(
    groups: Sequence[Group],
    demand: Mapping[str, Demand],
    gpus: Sequence[int],
    room: Callable[[str, int], bool],
    cv2: float = 0.0,
    replica_gpus: Callable[[tuple[str, ...]], int | None] | None = None,
    small_apart: bool = False,
) -> list[tuple[tuple[str, ...], int]]:
    """`plan_nodes` with each lend sized: the models of each lend to add and the GPUs its
    replica holds. A lend whose models' replica takes `k` GPUs (`replica_gpus(models)`;
    None, or k of the node's GPUs or more: the whole node) holds m x k of its node's GPUs,
    m the fewest replicas' worth after which none of its models is predicted over its
    objective, at most the node's `floor(gpus / k)`; the next lend plans what is still
    late after it. One lease is one Triton server on one node, so a deficit of many
    replicas' worth met one replica per lend would spread over as many nodes, each a
    replica of k GPUs and a lend slot; sized here it takes the fewest nodes and each
    replica its share's GPUs. A lend's models are those late; with `small_apart`, where
    one replica of them all would take a whole node or more while some of theirs take
    less, those go in a lend of their own first and the rest in the next (on a pool
    whose nodes are partly lent no whole node may be left, and the small models would
    wait on the large). Without `replica_gpus` every lend is a whole node
    (`plan_nodes`' answer, each with its node's GPUs)."""
    current = list(groups)
    added: list[tuple[tuple[str, ...], int]] = []
    for node_gpus in gpus:
        replicas = replicas_of(current)
        late = [m for m in over(current, demand, cv2) if room(m, replicas.get(m, 0))]
        if not late:
            break
        models = tuple(sorted(late))
        k = replica_gpus(models) if replica_gpus is not None else None
        if small_apart and k is not None and k >= node_gpus and replica_gpus is not None:
            small = tuple(m for m in models if (replica_gpus((m,)) or node_gpus) < node_gpus)
            if small:
                models, k = small, replica_gpus(small)
        held = node_gpus
        if k is not None and k < node_gpus:
            most = node_gpus // k

            def carried(m: int, models: tuple[str, ...] = models, k: int = k) -> bool:
                trial = [*current, Group(models, 1, m * k)]
                return not set(models).intersection(over(trial, demand, cv2))

            held = k * (smallest(0, most, carried) if carried(most) else most)
        added.append((models, held))
        current.append(Group(models, 1, held))
    return added


def carries(
    groups: Sequence[Group],
    demand: Mapping[str, Demand],
    cv2: float = 0.0,
    allowed: Mapping[str, float] | None = None,
) -> bool:
    """Whether every feasible model is predicted within its objective (`over` is empty).
    `allowed`: per model, a p99 (s) above its objective that still counts as carried (a
    return's slack: `allowance`); never an infinite one."""
    return next(_late(demand, _worst_waits(groups, demand, cv2), allowed), None) is None


def allowance(
    before: Mapping[str, float], demand: Mapping[str, Demand], slack: float
) -> dict[str, float]:
    """Per feasible model of `demand` predicted over its objective in `before` (its p99
    with the replicas as they are, `predict`), at a finite p99: that p99 x (1 + slack),
    the most a return may leave it at (`[policy] return_slack`). Each p99 in `before`
    only grows with the rates, so the allowance made at the highest rates a span may see
    is the largest it gives there (the simulator's quiet proof relies on it)."""
    out: dict[str, float] = {}
    for m, d in demand.items():
        p99 = before.get(m)
        if p99 is not None and d.rate > 0 and d.service_s < d.slo_s and d.slo_s < p99 < math.inf:
            out[m] = p99 * (1.0 + slack)
    return out


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
