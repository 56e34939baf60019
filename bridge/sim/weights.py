"""The simulated node-local weight caches (issue 31): what each node's cache holds, how a
lent replica's load time depends on it, and the staging of weights ahead of need. Called
by `bridge.sim.engine` (the plan, each tick) and `bridge.sim.cluster` (a Triton job's
start); configured by `WeightCache` (`Timing.weights`, or `Timing.cache_models` alone).

The model:

- A node's cache holds copies of models' weights up to `budget_bytes`. A copy is usable
  (`NodeView.cached`, and a load at the model's `Timing.local_load_s`) once complete; a
  copy being staged holds its room but loads nothing. Every load of a model not held
  complete is from the shared repository at its `Timing.model_load_s`.
- Served copies stay: a replica that loaded a model from the shared repository leaves a
  copy on its node once loaded (the start wrote it beside the GPU's), when room can be
  made by evicting copies the last plan did not want, least recently used first (a copy
  in flight or wanted is never evicted for it). Without staging nothing is wanted: the
  cache keeps the models its node served last (`Timing.cache_models` is this cache with
  every model one unit and a budget of that many).
- With staging (`stage_bytes_s` > 0): every `plan_every_s` the engine runs the policy's
  cache plan (`bridge.policy.weights.plan_cache`) over the lendable nodes in lend order
  (`lend_places`: the order `choose_nodes` would take them, which prefers the nodes
  holding the weights) with the models the forecast expects to lend for and their
  expected lent replicas (`bridge.policy.staging.wanted`, the daemon's rule, at each
  model's highest rate over the last `lookback_s`). Its evictions are carried out at
  once; each stage is copied at `stage_bytes_s` on its node, one copy after another on
  one node, and at most `max_staging` copies fleet-wide are in flight (a throttle on the
  shared file system).
- Staging never delays a job: a copy holds no GPU and no place in the simulated Slurm
  queue, so every job starts, runs and ends as it would without it. It models a
  CPU-only job in a scavenger QOS (or `sbcast`) throttled to `stage_bytes_s`, on nodes
  whose jobs leave it a CPU and the network's spare share; a site whose training jobs
  hold their nodes exclusively would stage only between jobs, which is not modelled.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bridge.config import BridgeConfig
from bridge.policy import Snapshot, staging
from bridge.policy.weights import CachedCopy, NodeCache, lend_places, plan_cache
from bridge.sim.fleet import SimNode

#: defaults, each the figure behind it: a 70B model in 16-bit weights
DEFAULT_MODEL_BYTES = 140e9
#: a throttled copy from the parallel file system, about half of what a 300 s load of
#: 140 GB draws from it (467 MB/s): a staged copy takes about 9 minutes
DEFAULT_STAGE_BYTES_S = 250e6


@dataclass(frozen=True)
class WeightCache:
    """The simulated nodes' local weight caches (the module docstring's model)."""

    #: per model, its weights' size (bytes); a model not listed is `default_bytes`
    model_bytes: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: the size of a model not in `model_bytes` (bytes; default a 70B model's 16-bit
    #: weights)
    default_bytes: float = DEFAULT_MODEL_BYTES
    #: each node's cache budget (bytes; default four such models: 560 GB of a node's
    #: local NVMe)
    budget_bytes: float = 4 * DEFAULT_MODEL_BYTES
    #: staging bandwidth per node (bytes/s; 0: no staging, the cache keeps only what its
    #: node served)
    stage_bytes_s: float = 0.0
    #: seconds between cache plans (a minute: the forecast moves slower than that)
    plan_every_s: float = 60.0
    #: copies in flight fleet-wide at most (four at `stage_bytes_s`: 1 GB/s of the shared
    #: file system at the default)
    max_staging: int = 4
    #: the expected lends are sized at each model's highest rate over this window
    #: (seconds; a day: the day's peaks recur)
    lookback_s: float = 86400.0

    def __post_init__(self) -> None:
        if self.budget_bytes < 0 or self.stage_bytes_s < 0 or self.plan_every_s <= 0:
            raise ValueError("cache budget and staging bandwidth >= 0, plan period > 0")
        if self.max_staging < 0 or self.lookback_s <= 0:
            raise ValueError("max_staging >= 0 and lookback_s > 0")

    def size(self, model: str) -> float:
        return self.model_bytes.get(model, self.default_bytes)


@dataclass(slots=True)
class SimCopy:
    """One model's weights on a node: usable from `ready_at`, last loaded at
    `last_used`."""

    size: float
    ready_at: float
    last_used: float


class NodeCaches:
    """The caches of a run's nodes (each node's copies are its `SimNode.weights`)."""

    def __init__(
        self,
        spec: WeightCache,
        load_s: Mapping[str, float],
        local_load_s: Mapping[str, float],
    ) -> None:
        self.spec = spec
        self.shared = load_s
        self.local = local_load_s
        #: (when a copy becomes usable, node index): the nodes whose view changes then
        self.due: list[tuple[float, int]] = []
        #: per node index, when its staging channel is free again
        self.busy_until: dict[int, float] = {}
        #: the copies the last plan wanted (never evicted for a served copy)
        self.wanted: set[str] = set()
        self.next_plan = 0.0
        #: per model, (time, rate) of its samples within `lookback_s`, and their highest
        self.rates: dict[str, list[tuple[float, float]]] = {}
        self.staged = 0
        self.staged_bytes = 0.0

    @property
    def staging(self) -> bool:
        return self.spec.stage_bytes_s > 0

    # ---- a node's copies ---------------------------------------------------------------

    @staticmethod
    def cached(node: SimNode, now: float) -> frozenset[str]:
        """The models whose copy on `node` is complete at `now`."""
        return frozenset(m for m, c in node.weights.items() if c.ready_at <= now)

    def load_s(self, node: SimNode, models: Sequence[str], now: float) -> float:
        """Seconds the slowest of `models` takes to load on `node` at `now`."""
        weights, local, shared = node.weights, self.local, self.shared
        slowest = 0.0
        for m in models:
            c = weights.get(m)
            if c is not None and c.ready_at <= now and m in local:
                t = local[m]
                c.last_used = now
            else:
                t = shared.get(m, 0.0)
            slowest = max(slowest, t)
        return slowest

    def served(self, node: SimNode, models: Sequence[str], now: float, ready_at: float) -> None:
        """A replica on `node` loaded `models` (from `now`, done at `ready_at`): a model
        with no copy there gets one, usable at `ready_at`, where room can be made (the
        module docstring)."""
        spec, weights = self.spec, node.weights
        for m in models:
            c = weights.get(m)
            if c is not None:
                c.last_used = now
                continue
            size = spec.size(m)
            if size > spec.budget_bytes:
                continue
            used = sum(c.size for c in weights.values())
            spare = sorted(
                (k for k, c in weights.items() if k not in self.wanted and c.ready_at <= now),
                key=lambda k: (weights[k].last_used, k),
            )
            free = spec.budget_bytes - used + sum(weights[k].size for k in spare)
            if size > free + 1e-6:
                continue
            while used + size > spec.budget_bytes + 1e-6:
                k = spare.pop(0)
                used -= weights.pop(k).size
            weights[m] = SimCopy(size, ready_at, now)
            if ready_at > now:
                heapq.heappush(self.due, (ready_at, node.index))

    def ready(self, now: float) -> list[int]:
        """The indexes of the nodes a copy became usable on since the last call."""
        out = []
        while self.due and self.due[0][0] <= now:
            out.append(heapq.heappop(self.due)[1])
        return out

    # ---- staging -----------------------------------------------------------------------

    def observe(self, now: float, rates: Mapping[str, float | None]) -> None:
        """Each model's rate of the tick (the forecast's input)."""
        if not self.staging:
            return
        start = now - self.spec.lookback_s
        for m, r in rates.items():
            if r is None:
                continue
            kept = self.rates.setdefault(m, [])
            # a monotone deque: the highest over the window is its first entry
            while kept and kept[-1][1] <= r:
                kept.pop()
            kept.append((now, r))
            while kept and kept[0][0] < start:
                kept.pop(0)

    def plan_due(self, now: float) -> bool:
        return self.staging and now >= self.next_plan

    def plan(
        self,
        snapshot: Snapshot,
        config: BridgeConfig,
        now: float,
        by_name: Mapping[str, SimNode],
    ) -> list[int]:
        """Run the cache plan on `snapshot` (with its nodes) and carry it out: evictions
        at once, stages queued on their nodes. The indexes of the nodes it changed."""
        spec = self.spec
        self.next_plan = now + spec.plan_every_s
        peaks = {m: kept[0][1] for m, kept in self.rates.items() if kept}
        sizes = {m: ("", int(spec.size(m))) for m in snapshot.models}
        wanted = staging.wanted(snapshot, config, peaks, sizes)
        self.wanted = {w.model for w in wanted}
        if not wanted:
            return []
        order, only = lend_places(snapshot, config, now, [w.model for w in wanted])
        caches = [
            NodeCache(
                n.name,
                int(spec.budget_bytes) if staging.stages_on(config, snapshot, n) else 0,
                tuple(
                    CachedCopy(m, "", int(c.size), c.ready_at <= now, c.last_used)
                    for m, c in sorted(by_name[n.name].weights.items())
                ),
            )
            for n in order
        ]
        in_flight = sum(1 for n in by_name.values() for c in n.weights.values() if c.ready_at > now)
        result = plan_cache(caches, wanted, max(0, spec.max_staging - in_flight), only)
        touched: list[int] = []
        for e in result.evict:
            node = by_name[e.node]
            node.weights.pop(e.model, None)
            touched.append(node.index)
        for st in result.stage:
            node = by_name[st.node]
            start = max(now, self.busy_until.get(node.index, -math.inf))
            done = start + st.size_bytes / spec.stage_bytes_s
            self.busy_until[node.index] = done
            node.weights[st.model] = SimCopy(float(st.size_bytes), done, now)
            heapq.heappush(self.due, (done, node.index))
            self.staged += 1
            self.staged_bytes += st.size_bytes
        return touched
