"""decide(snapshot, config, now) -> actions: when to lend nodes, which nodes, when to give
them back. Pure: the same inputs give the same actions, so tests move the clock instead of
sleeping and the simulator drives the very same code.

Rules, in order, each tick:
1. Every usable reserved node without a Triton job gets its baseline server back (it holds
   every model's minimum replicas).
2. A drain-mode lend still waiting for its training node after `drain_wait_s` is
   abandoned (returned): a training job is never killed, the wait is bounded.
3. Capacity-aware return (`assess`): a serving lease past `scale_in_cooldown_s` whose
   models were calm (p99 under low_watermark x SLO; an LLM with a profile by the part of
   its TTFT and TPOT p99s over their no-load floors) for `return_dwell_s` goes
   back when the replicas left would still carry `return_headroom` x the larger of the
   highest rate of the model's return dwell and the forecast rate, by the capacity model
   (with `return_slack`, a calm model the replicas held now already leave over its SLO
   at that rate may be left at most that fraction above its p99 with them, over the
   tick's returns together: `_allowed`). The dwell is `return_dwell_s`, longer for a
   model whose past returns were lent again sooner than their break-even
   (`bridge.policy.returns`: no flapping on bursts). Several in one tick when load fell
   far; the lowest `cost_rank` first (elastic before training: requeued elastic work
   waits to run again, a drained training node was idle when lent), then the longest
   serving.
4. Capacity-aware lend: each model's demand is `capacity_headroom` x the larger of its
   current rate and its forecast at the lend's lead time (`bridge.policy.forecast`; the
   lead: Slurm, Triton's start, the slowest model's load, `bridge.policy.timing`), its
   service time Triton's measured compute time per request. Lends in flight count as
   replicas (a drain lend still waiting for its node's jobs does not: it serves no time
   soon). While a feasible model is predicted over its SLO, a node is added holding the
   models still over it (`capacity.plan_lends`; with partial lends each sized to the
   fewest replicas' worth of its node's GPUs that carry them, a node that cannot give
   them giving what it can: `_targets`): the whole deficit in one tick, up to
   `max_lent_nodes` leases and each model's `max_replicas` (after rule 5's places); the
   nodes are then taken within each lendable pool's `max_lent_share` (`choose_nodes`: a
   planned node past it is not lent; `assess` reads no nodes, the simulator relies on it).
5. Placement (`bridge.policy.placement`), before the capacity lend's nodes are planned:
   while models are late, a serving lease past `scale_in_cooldown_s` whose models the
   other replicas carry at the return's demand is given the late models (`Place`) in
   place of its own, and one fewer node is lent (a return of this tick becomes a place).
   A lease mid-placement is neither placed again nor returned.
6. Scale from zero: a model served from zero (`min_replicas` 0) with requests waiting at
   the activator (`snapshot.waiting`), no ready replica and no lend or placement of it in
   flight gets a node of its own at once, before the capacity lends (its requests fail
   outright while it waits, and the capacity model has no rate of it to size by), within
   `max_lent_nodes` and, when its node is chosen, the pools' shares and the preemption
   budget; the most requests waiting first. Its replica returns as any lent one does:
   calm (no requests is calm) for the dwell, the others carrying its rate of 0.
7. Backstop: a model in sustained breach of its measured p99 (`breach_evaluations` ticks,
   what the capacity model missed) that no lend of this tick covers, with no lend of it in
   flight and past its `scale_out_cooldown_s`, gets one more node.

Nodes are taken cheapest first (`bridge.policy.nodes`): idle before busy, elastic before
training, within a cost rank the nodes whose weight cache holds the lends' models (issue
31), the least work lost, within the hour's preemption budget; each lend is then given
the node, of those taken, where its own models load soonest (`_match`).

Each model's SLO, replica bounds and instances are `snapshot.models`: the model
repository's facts with the TOML's overrides (`bridge.modelfacts`); a model not there
(served but without an SLO) is never lent for.

Measured-latency hysteresis (`bridge.policy.hysteresis`, for the backstop and the return):
a sustained breach, a calm, or neither; a tick without data is neither.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain

from bridge.config import BridgeConfig
from bridge.lifecycle import IN_FLIGHT, LeaseState
from bridge.policy import capacity, llm, placement, typed
from bridge.policy import demand as reading
from bridge.policy.actions import Action, Lend, Place, Return, StartBaseline
from bridge.policy.gang import gang_lends, lend_gpus, spans
from bridge.policy.hysteresis import (
    ModelStatus,
    evaluate_model,
    severity,
)
from bridge.policy.nodes import (
    LENDABLE,
    choose_beside,
    choose_nodes,
    choose_sized,
    load_on,
    partial,
    victims_count,
)
from bridge.policy.snapshot import NodeView, Snapshot
from bridge.policy.timing import lead_s

#: a drain lend still waiting for its node: decided, or its Triton job pending
WAITING = frozenset({LeaseState.REQUESTED, LeaseState.SUBMITTED})


@dataclass(frozen=True)
class Assessment:
    """What the capacity model and the measured latency ask for, before any node is
    chosen: the leases to return, the models of each node to add, the models in breach
    that the backstop would serve. `acts` is False when decide can only answer nothing
    (the simulator skips such ticks)."""

    returns: list[Return] = field(default_factory=list)
    #: models of each node wanted, in the order they are to be taken
    wanted: list[tuple[str, ...]] = field(default_factory=list)
    backstop: list[str] = field(default_factory=list)
    #: the capacity demand per model (req/s to carry), for the lend's reason
    demand: dict[str, capacity.Demand] = field(default_factory=dict)
    #: models the capacity model found late that the requests' latency contradicts (no
    #: lend for them: `_unconfirmed`)
    unconfirmed: list[str] = field(default_factory=list)
    #: serving leases' replicas given the late models in place of theirs
    #: (`bridge.policy.placement`), each one node fewer to lend
    placements: list[Place] = field(default_factory=list)
    #: the models lent for from zero (rule 6), each with the requests waiting: each has
    #: a node of its own in `wanted`
    from_zero: dict[str, int] = field(default_factory=dict)
    #: per lend of `wanted` the capacity plan sized (a partial lend of m replicas' worth:
    #: `capacity.plan_lends`), its index -> the GPUs its replica is planned to hold
    held: dict[int, int] = field(default_factory=dict)

    @property
    def acts(self) -> bool:
        return bool(self.returns or self.wanted or self.backstop or self.placements)


def assess(snapshot: Snapshot, config: BridgeConfig, now: float) -> Assessment:
    """Rules 2-5 without choosing nodes: reads the history, the replicas and the leases,
    never `snapshot.nodes` (the simulator calls it with none to skip quiet ticks)."""
    policy = config.policy
    returns: list[Return] = []
    for lease in snapshot.leases:
        if (
            lease.lend_mode == "drain"
            and lease.state in WAITING
            and now - lease.created_at > policy.drain_wait_s
        ):
            returns.append(Return(lease.lease_id, f"drain wait over {policy.drain_wait_s:g}s"))
    abandoned = frozenset(r.lease_id for r in returns)
    horizon = lead_s(snapshot, config)

    calm: dict[str, bool] = {}

    def is_calm(m: str) -> bool:
        if m not in calm:
            model = snapshot.models.get(m)
            history = snapshot.history.get(m, ())
            profile = snapshot.token_profiles.get(m)
            calm[m] = (
                model is not None
                and evaluate_model(history, model, config, profile) == ModelStatus.CALM
            )
        return calm[m]

    calm_sets: dict[tuple[str, ...], bool] = {}

    def all_calm(models: Sequence[str]) -> bool:
        key = tuple(models)
        if key not in calm_sets:
            calm_sets[key] = all(is_calm(m) for m in key)
        return calm_sets[key]

    placing = placement.in_placement(snapshot)
    # serving leases past their cooldown, not mid-placement: the return's and the
    # placement's candidates
    settled = [
        lease
        for lease in snapshot.leases
        if lease.state == LeaseState.SERVING
        and lease.lease_id not in abandoned
        and lease.serving_since is not None
        and now - lease.serving_since >= policy.scale_in_cooldown_s
        and lease.models
        and lease.lease_id not in placing
    ]
    serving = [lease for lease in settled if all_calm(lease.models)]
    placeable = policy.placement and bool(settled)
    leaving = set(abandoned)
    count = reading.replica_groups(snapshot, leaving, placing)
    # The return's demand (`keep`, with the highest rates of the dwell it reads) is read
    # only for a rule that uses it: a return candidate here, or a place tested below
    # (`keep_demand`). Most ticks have neither, and it reads every model's samples.
    reads = reading.read(snapshot, config, now, horizon, bool(serving))
    ahead = reads.ahead
    long_dwell = reading.dwells(snapshot, config, now) if serving else {}
    demands = reading.demands(
        snapshot, config, reads, keep=bool(serving), now=now, long_dwell=long_dwell
    )
    demand, keep = demands.lend, demands.keep
    # the LLMs' replicas needed by the token capacity model at the return's demand
    token_keep = (
        llm.needs(snapshot, {m: d.rate for m, d in keep.items()})
        if serving and snapshot.token_profiles
        else {}
    )
    replica_of: dict[int, tuple[tuple[str, ...], int]] = {}
    if serving or placeable:
        replica_of = {
            r.lease_id: (reading.model_set_of(r.models), r.gpus)
            for r in snapshot.replicas
            if r.lease_id is not None
        }
    if serving:
        rank = {name: pool.cost_rank for name, pool in config.pools.items()}
        serving.sort(key=lambda s: (rank.get(s.pool, 0), s.serving_since or 0.0, s.lease_id))
        # a key whose removal did not carry, with `count` as it is now: another lease of the
        # same key asks the very same question (forgotten when a return changes `count`)
        kept: set[tuple[tuple[str, ...], int] | None] = set()
        allowed = _allowed(count, keep, config, is_calm)
        for lease in serving:
            key = replica_of.get(lease.lease_id)  # None: it serves nothing now
            if key in kept:
                continue
            if key is not None:
                count[key] -= 1
            llms = {m: token_keep[m] for m in lease.models if m in token_keep}
            if not capacity.carries(reading.groups(count), keep, policy.service_cv2, allowed) or (
                llms and not llm.carried(reading.groups(count), llms)
            ):
                if key is not None:
                    count[key] += 1
                kept.add(key)
                continue
            kept.clear()
            leaving.add(lease.lease_id)
            dwell = max((long_dwell.get(m, 0.0) for m in lease.models), default=0.0)
            reason = _return_reason(keep, lease.models, max(dwell, policy.return_dwell_s))
            if allowed:  # the models it leaves short, as they were already
                p99 = capacity.predict(reading.groups(count), keep, policy.service_cv2)
                left = [m for m in allowed if p99[m] > keep[m].slo_s]
                if left:
                    reason += f" ({','.join(left)} short as before, within return_slack)"
            returns.append(Return(lease.lease_id, reason))

    groups = reading.groups(count)
    # (nodes, not leases: a gang holds several, leases of some GPUs may share one)
    open_leases = len(
        {n for lease in snapshot.leases if lease.lease_id not in leaving for n in lease.nodes}
    )
    slots = max(0, policy.max_lent_nodes - open_leases)
    late = capacity.over(groups, demand, policy.service_cv2) if slots or placeable else []
    unconfirmed = _unconfirmed(snapshot, config, groups, demand, late, ahead)
    if unconfirmed:
        demand = {m: d for m, d in demand.items() if m not in unconfirmed}
        late = [m for m in late if m not in unconfirmed]
    places: list[Place] = []

    def room(m: str, n: int) -> bool:
        return n < snapshot.models[m].max_replicas

    read_keep = bool(serving)

    def keep_demand() -> Mapping[str, capacity.Demand]:
        """`keep`; on a tick without a return candidate, read when placement first tests a
        place with it (few placement ticks get that far)."""
        nonlocal keep, read_keep
        if not read_keep:
            reads_all = reading.Reads(ahead, reading.highest(snapshot, config))
            dwell = reading.dwells(snapshot, config, now)
            keep = reading.demands(
                snapshot, config, reads_all, lend=False, keep=True, now=now, long_dwell=dwell
            ).keep
            read_keep = True
        return keep

    if late and placeable:
        returning = [r.lease_id for r in returns if r.lease_id not in abandoned]
        candidates = placement.candidates(settled, returning, replica_of, all_calm)
        places = placement.place(
            count, candidates, demand, keep_demand, room, policy.service_cv2, reading.model_set_of
        )
        converted = {p.lease_id for p in places}.intersection(returning)
        if converted:  # placed instead of returned: still open, a slot fewer
            returns = [r for r in returns if r.lease_id not in converted]
            slots = max(0, slots - len(converted))
        if places:
            groups = reading.groups(count)
    zero = _from_zero(snapshot)[:slots] if snapshot.waiting and slots else []
    wanted: list[tuple[str, ...]] = [(m,) for m, _ in zero]
    sized: dict[int, int] = {}  # (`Assessment.held`)
    if late and slots > len(wanted):
        gpus = max((r.gpus for r in snapshot.replicas), default=1)
        planned = capacity.plan_lends(
            groups,
            demand,
            [gpus] * (slots - len(wanted)),
            room,
            policy.service_cv2,
            _replica_size(snapshot, config),
            # the per-GPU ranking leaves few whole nodes: a gang's models lent apart
            small_apart=policy.lend_ranking == "per_gpu",
        )
        sized.update((len(wanted) + i, g) for i, (_, g) in enumerate(planned))
        wanted += [models for models, _ in planned]
    if slots > len(wanted) and snapshot.token_profiles:
        # an LLM short of the replicas its tokens need gets a node of its own for each
        token_need = llm.needs(snapshot, {m: d.rate for m, d in demand.items()})
        held = [*groups, *(capacity.Group(w, 1, 1) for w in wanted)]
        for m, short in llm.deficits(held, token_need).items():
            wanted += [(m,)] * min(short, slots - len(wanted))

    backstop: list[str] = []
    if slots > len(wanted):
        covered = {m for models in (*wanted, *(p.models for p in places)) for m in models}
        history, models = snapshot.history, snapshot.models
        # a breach needs the newest sample over the high watermark (`evaluate_model`'s
        # first test): the models without (`hot` leaves them out) are passed over
        breach = [
            name
            for name in demands.hot
            if name not in covered
            and evaluate_model(history[name], models[name], config) == ModelStatus.BREACH
        ]
        if breach:
            ready, in_flight = _replica_counts(snapshot)
            backstop = [
                name
                for name in breach
                if ready[name] + in_flight[name] < snapshot.models[name].max_replicas
                and now - snapshot.last_lend_at.get(name, -math.inf) >= policy.scale_out_cooldown_s
                and not in_flight[name]
            ]
            backstop.sort(key=lambda m: -severity(snapshot.history.get(m, ()), snapshot.models[m]))
    return Assessment(returns, wanted, backstop, demand, unconfirmed, places, dict(zero), sized)


def _allowed(
    count: Counter[tuple[tuple[str, ...], int]],
    keep: Mapping[str, capacity.Demand],
    config: BridgeConfig,
    is_calm: Callable[[str], bool],
) -> dict[str, float] | None:
    """The return's slack (`[policy] return_slack`; None without): per model the
    replicas held now leave over its objective at `keep` (read before this tick's returns)
    and calm by its latency, the p99 a return may leave it at (`capacity.allowance`)."""
    slack = config.policy.return_slack
    if not slack:
        return None
    before = capacity.predict(reading.groups(count), keep, config.policy.service_cv2)
    allowed = capacity.allowance(before, keep, slack)
    return {m: p99 for m, p99 in allowed.items() if is_calm(m)}


def _replica_size(
    snapshot: Snapshot, config: BridgeConfig
) -> Callable[[tuple[str, ...]], int | None] | None:
    """What `capacity.plan_lends` sizes a lend by: the GPUs one replica of its models takes
    (`lend_gpus`) with `[policy] partial_lends` and `sized_lends`; None without (the
    plan's lends are whole nodes, and a partial lend takes one replica's GPUs)."""
    if not (config.policy.partial_lends and config.policy.sized_lends):
        return None
    models = snapshot.models
    return lambda names: lend_gpus(models, names)


def _sized(k: int | None, planned: int | None) -> int | None:
    """The GPUs a lend takes: the plan's m x k where it sized the lend to m replicas' worth
    (`Assessment.held`), else one replica's `k` (None: whole nodes)."""
    if k is None or planned is None or planned <= k:
        return k
    return planned


def _targets(
    snapshot: Snapshot,
    config: BridgeConfig,
    now: float,
    group: Sequence[tuple[str, ...]],
    gpus: int | None,
    size: Callable[[Sequence[str]], int | None],
    models: Sequence[str],
    *,
    taken: set[str],
    freed: frozenset[int],
    spent: int,
) -> tuple[list[NodeView], dict[str, int]]:
    """The nodes for the lends of `group`, each to take `gpus` GPUs (`choose_nodes`), and
    the GPUs of those that give fewer: a lend sized to several replicas' worth
    (`Assessment.held`) that no node left gives whole takes what the cheapest node can
    give, in steps of one replica (`choose_sized`: the least common multiple of the
    group's replica GPUs), rather than waiting for a node that has them all. With
    `[policy] shared_lends`, lends still short while a model of them is in sustained
    breach take GPUs beside a node's partial leases (`choose_beside`)."""
    one = [size(m) for m in group]
    step = math.lcm(*(k for k in one if k is not None)) if None not in one else None
    if gpus is None or step is None or gpus <= step:
        nodes = choose_nodes(
            snapshot,
            config,
            now,
            len(group),
            freed=freed,
            models=models,
            gpus=gpus,
            taken=frozenset(taken),
            spent=spent,
        )
        return nodes, {}
    found = choose_sized(
        snapshot,
        config,
        now,
        len(group),
        gpus=gpus,
        step=step,
        freed=freed,
        models=models,
        taken=frozenset(taken),
        spent=spent,
    )
    policy = config.policy
    if len(found) < len(group) and policy.shared_lends and _sustained(snapshot, config, models):
        # (the nodes found, and their victims, are this pass's already)
        for node, g in found:
            spent += victims_count(node, g, config.pools[node.pool].lend_mode, now, policy)
        found += choose_beside(
            snapshot,
            config,
            now,
            len(group) - len(found),
            gpus=gpus,
            step=step,
            taken=frozenset(taken | {node.name for node, _ in found}),
            spent=spent,
        )
    return [node for node, _ in found], {node.name: g for node, g in found if g != gpus}


def _sustained(snapshot: Snapshot, config: BridgeConfig, models: Sequence[str]) -> bool:
    """Whether a model of `models` is in sustained breach (`evaluate_model`: the
    `breach_evaluations` newest samples over the high watermark): what a lend beside a
    node's leases (`[policy] shared_lends`) waits for, as a burst does not last."""
    return any(
        evaluate_model(snapshot.history[m], snapshot.models[m], config) == ModelStatus.BREACH
        for m in models
        if snapshot.history.get(m) and m in snapshot.models
    )


def _from_zero(snapshot: Snapshot) -> list[tuple[str, int]]:
    """Rule 6's models, (model, requests waiting), the most waiting first: served from
    zero, requests waiting, no ready replica, no lend or placement of it in flight."""
    ready, in_flight = _replica_counts(snapshot)
    out = [
        (m, n)
        for m, n in snapshot.waiting.items()
        if n > 0
        and (model := snapshot.models.get(m)) is not None
        and model.min_replicas == 0
        and not ready[m]
        and not in_flight[m]
    ]
    return sorted(out, key=lambda mn: (-mn[1], mn[0]))


def _unconfirmed(
    snapshot: Snapshot,
    config: BridgeConfig,
    groups: Sequence[capacity.Group],
    demand: Mapping[str, capacity.Demand],
    late: Sequence[str],
    ahead: Mapping[str, float | None],
) -> list[str]:
    """The models the capacity model finds late that the requests contradict: by the
    model they are late already at the rate now (no headroom, no forecast), yet the tick's
    p99 and mean latency are both under low_watermark x SLO (nothing queues), and the rate
    is not rising; and only when every late model is so (one whose requests queue
    confirms the capacity model's picture). A client whose rate is set by its own
    concurrency (a closed loop: a benchmark, an offline evaluation) saturates any number
    of replicas in the model's arithmetic, never in its latency: such demand is not
    chased. A lend for headroom or for a rising rate is made as before; a real breach
    still lends through the backstop."""
    low = config.policy.low_watermark
    quiet: set[str] = set()
    for m in late:
        history = snapshot.history.get(m, ())
        model = snapshot.models.get(m)
        if not history or model is None:
            continue
        last = history[-1]
        rate, p99, mean = last.request_rate, last.p99_ms, last.mean_ms
        if rate is None or p99 is None or mean is None or (ahead.get(m) or 0.0) > rate:
            continue
        if max(p99, mean) < low * model.slo_p99_ms:
            quiet.add(m)
    if not quiet:
        return []
    # every model at its rate now (a model in `demand` has samples)
    now_demand = {
        m: replace(d, rate=snapshot.history[m][-1].request_rate or 0.0) for m, d in demand.items()
    }
    p99_now = capacity.predict(groups, now_demand, config.policy.service_cv2)
    contradicted = [m for m in late if m in quiet and p99_now[m] > demand[m].slo_s]
    # one late model whose requests do queue confirms the picture (models that share a
    # replica's GPUs wait on each other's load, whatever their own rates)
    return contradicted if len(contradicted) == len(late) else []


def _return_reason(keep: Mapping[str, capacity.Demand], models: Sequence[str], dwell: float) -> str:
    rates = _rates(keep, models)
    carried = f"; the other replicas carry {rates}" if rates else ""
    return f"quiet for {dwell:g}s: {','.join(models)}{carried}"


def _why(demand: Mapping[str, capacity.Demand]) -> Callable[[Sequence[str]], str]:
    """A capacity lend's reason for its models (`gang_lends`'s)."""
    return lambda models: "capacity: " + _rates(demand, models)


def _rates(demand: Mapping[str, capacity.Demand], models: Sequence[str]) -> str:
    return ", ".join(f"{m} {demand[m].rate:.0f} req/s" for m in models if m in demand)


def _breach_reason(snapshot: Snapshot, name: str, ticks_: int) -> str:
    last, model = snapshot.history[name][-1], snapshot.models[name]
    if model.has_request_slo and (last.p99_ms or 0.0) > model.slo_p99_ms:
        what = f"p99 {last.p99_ms or 0.0:.0f} ms over SLO {model.slo_p99_ms:g} ms"
    else:
        what = (
            f"TTFT p99 {last.ttft_p99_ms or 0.0:.0f} ms / TPOT p99 {last.tpot_p99_ms or 0.0:.0f} ms"
        )
        what += f" over SLOs {model.slo_ttft_p99_ms or '-'} / {model.slo_tpot_p99_ms or '-'} ms"
    return f"{what} for {ticks_} ticks"


def _replica_counts(snapshot: Snapshot) -> tuple[Counter[str], Counter[str]]:
    """Per model: the ready replicas that hold it, and the lends in flight that carry it
    (each replica or lease counted once, however often it names the model); a placement
    under way is in flight for the models it gains."""
    placing = placement.in_placement(snapshot)
    # each replica's models once (`_model_set`), counted in one call
    ready = Counter(chain.from_iterable(reading.model_set_of(r.models) for r in snapshot.replicas))
    in_flight: Counter[str] = Counter()
    for lease in snapshot.leases:
        if lease.state in IN_FLIGHT:
            in_flight.update(set(lease.models))
    for replica in snapshot.replicas:
        if replica.lease_id in placing:
            in_flight.update(set(placing[replica.lease_id]) - set(replica.models))
    return ready, in_flight


def decide(snapshot: Snapshot, config: BridgeConfig, now: float) -> list[Action]:
    policy = config.policy
    actions: list[Action] = []
    # the reserved pools by name: one set lookup per node (a site has thousands)
    reserved = {name for name, pool in config.pools.items() if pool.lend_mode == "reserved"}
    for node in snapshot.nodes:
        if node.pool in reserved and node.usable and not node.reserved and not node.has_triton:
            actions.append(StartBaseline(node.name, "no Triton job on reserved node"))

    plan = assess(snapshot, config, now)
    actions.extend(plan.returns)
    actions.extend(plan.placements)
    freed = frozenset(r.lease_id for r in plan.returns)
    taken: set[str] = set()
    spent = 0  # jobs the lends so far requeue, of the hour's budget
    # the lends by the GPUs a replica of theirs takes (None: whole nodes), each size's
    # nodes chosen for it; one size (the usual case) is one choice, as before
    # (a replica that spans nodes is a gang whatever `partial_lends` says)
    lendable = {name for name, pool in config.pools.items() if pool.lend_mode in LENDABLE}

    def size(models: Sequence[str]) -> int | None:
        k = lend_gpus(snapshot.models, models)
        return k if policy.partial_lends or spans(snapshot.nodes, lendable, k) else None

    sizes = [_sized(size(models), plan.held.get(i)) for i, models in enumerate(plan.wanted)]
    # lends of GPUs of one type (MIG slices) by (type, GPUs); None: any GPU, sized above
    keys = [typed.lend_key(snapshot.models, models) for models in plan.wanted]
    lends = 0
    for key in dict.fromkeys(k for k in keys if k is not None):
        group = [m for m, mk in zip(plan.wanted, keys, strict=True) if mk == key]
        made, spent = typed.lends(
            snapshot, config, now, group, key, lambda m: _lend_reason(plan, m), taken, freed, spent
        )
        actions.extend(made)
        lends += len(made)
    for k in dict.fromkeys(s for s, t in zip(sizes, keys, strict=True) if t is None):
        group = [
            models
            for models, s, t in zip(plan.wanted, sizes, keys, strict=True)
            if s == k and t is None
        ]
        lent_for = list(dict.fromkeys(m for models in group for m in models))
        if k is not None and spans(snapshot.nodes, lendable, k):
            gangs = gang_lends(
                snapshot, config, now, k, group, _why(plan.demand), taken, freed, spent
            )
            actions.extend(gangs)
            lends += len(gangs)
            node_of = {n.name: n for n in snapshot.nodes}
            for lend in gangs:
                taken.update(lend.nodes)
                spent += sum(
                    victims_count(node_of[m], None, lend.lend_mode, now, policy) for m in lend.nodes
                )
            continue
        targets, took = _targets(
            snapshot, config, now, group, k, size, lent_for, taken=taken, freed=freed, spent=spent
        )
        for node, models in _match(snapshot, targets, group):
            mode = config.pools[node.pool].lend_mode
            reason = _lend_reason(plan, models)
            g = took.get(node.name, k)  # (a sized lend on a node that gives less)
            share = g if partial(node.gpus, g, mode, config.policy.drain_partial_lends) else None
            actions.append(Lend(node.name, node.pool, mode, models, reason, share))
            lends += 1
            taken.add(node.name)
            spent += victims_count(node, g, mode, now, policy)
    if plan.backstop and lends == len(plan.wanted):
        of_type = typed.lend_key(snapshot.models, plan.backstop)
        if of_type is not None:
            why = _breach_reason(snapshot, plan.backstop[0], policy.breach_evaluations)
            made, _ = typed.lends(
                snapshot,
                config,
                now,
                [tuple(plan.backstop)],
                of_type,
                lambda m: why,
                taken,
                freed,
                spent,
            )
            actions.extend(made)
            return actions
        k = size(plan.backstop)
        if k is not None and spans(snapshot.nodes, lendable, k):
            backstop = (tuple(plan.backstop),)
            actions.extend(
                gang_lends(
                    snapshot, config, now, k, backstop, _why(plan.demand), taken, freed, spent
                )
            )
            return actions
        spare = choose_nodes(
            snapshot,
            config,
            now,
            1,
            waiting=True,
            taken=frozenset(taken),
            freed=freed,
            models=plan.backstop,
            gpus=k,
            spent=spent,
        )
        if spare:
            node, models = spare[0], tuple(plan.backstop)
            mode = config.pools[node.pool].lend_mode
            reason = _breach_reason(snapshot, models[0], policy.breach_evaluations)
            share = k if partial(node.gpus, k, mode, config.policy.drain_partial_lends) else None
            actions.append(Lend(node.name, node.pool, mode, models, reason, share))
    return actions


def _lend_reason(plan: Assessment, models: tuple[str, ...]) -> str:
    """Why a capacity lend of `models` is made, as its lease records it."""
    if len(models) == 1 and models[0] in plan.from_zero:
        n = plan.from_zero[models[0]]
        return f"scale from zero: {models[0]}, {n} request(s) waiting"
    return "capacity: " + _rates(plan.demand, models)


def _match(
    snapshot: Snapshot, targets: Sequence[NodeView], wanted: Sequence[tuple[str, ...]]
) -> list[tuple[NodeView, tuple[str, ...]]]:
    """The nodes taken for the lends of `wanted` (as many as were found, the cheapest
    first), each lend in its order given the node left where its own models load soonest
    (`load_on`; the first of equals): the nodes in their order when none holds weights."""
    if not any(node.cached for node in targets):
        return list(zip(targets, wanted, strict=False))
    left = list(targets)
    pairs: list[tuple[NodeView, tuple[str, ...]]] = []
    for models in wanted[: len(targets)]:
        loads = [load_on(n, models, snapshot.load_s, snapshot.local_load_s) for n in left]
        node = left.pop(loads.index(min(loads)))
        pairs.append((node, models))
    return pairs
