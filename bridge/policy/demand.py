"""What the policy reads of a snapshot before it decides (`bridge.policy.decide`'s rules
3 and 4): each model's rates, peaks and forecast at the lend's lead time (`read`), the
demand the replicas left must carry and the demand to lend for (`demands`), the return
dwell of each model (`dwells`), and the replicas counted by (models, GPUs)
(`replica_groups`). Pure; `decide.assess` and the simulator's quiet-tick proof
(`bridge.sim.quiet`, through `capacity_inputs`) call it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bridge.config import BridgeConfig
from bridge.lifecycle import IN_FLIGHT
from bridge.policy import capacity, placement
from bridge.policy.forecast import forecast_rate
from bridge.policy.hysteresis import service_s, ticks, token_ratio
from bridge.policy.returns import break_even_s, dwell_s
from bridge.policy.snapshot import Snapshot
from bridge.policy.timing import lead_s


def dwells(snapshot: Snapshot, config: BridgeConfig, now: float) -> dict[str, float]:
    """Per model with remembered returns, its return dwell when it is longer than
    `return_dwell_s` (`bridge.policy.returns`): the models whose past returns were lent
    again sooner than the break-even."""
    policy = config.policy
    if not snapshot.returns:
        return {}
    even = break_even_s(lead_s(snapshot, config), policy)
    out: dict[str, float] = {}
    for name, history in snapshot.returns.items():
        d = dwell_s(history, now, even, policy)
        if d > policy.return_dwell_s:
            out[name] = d
    return out


@dataclass(frozen=True)
class Reads:
    """What the capacity rules read of each model's samples, in one pass per tick: the
    forecast at the lend's lead time (None without data) and, when a lease may go back,
    the highest rate of the return dwell's samples. One pass because at a site's
    thousands of models the samples are most of a decision's time, and reading a model's
    newest samples twice in a row finds them in the CPU's cache the second time."""

    ahead: dict[str, float | None]
    #: per model, the highest rate of its last `return_dwell_s` of samples (0 without)
    highest: dict[str, float]


def read(
    snapshot: Snapshot, config: BridgeConfig, now: float, horizon: float, returning: bool
) -> Reads:
    policy = config.policy
    window = policy.forecast_window_s
    span = ticks(policy.return_dwell_s, config)
    seasons = snapshot.seasons
    ahead: dict[str, float | None] = {}
    highest: dict[str, float] = {}
    for name in snapshot.models:
        history = snapshot.history.get(name)
        if not history:
            continue
        ahead[name] = forecast_rate(history, now, window, horizon, seasons, name)
        if returning:
            rates = [r for s in history[-span:] if (r := s.request_rate) is not None]
            highest[name] = max(rates) if rates else 0.0
    return Reads(ahead, highest)


def highest(snapshot: Snapshot, config: BridgeConfig) -> dict[str, float]:
    """`_read`'s `highest` alone (per model, the highest rate of its last `return_dwell_s`
    of samples, 0 without), for a tick whose `_read` did not read it: `assess` reads it
    only when a rule uses the return's demand. The same expression as `_read`'s
    (tests/unit/test_policy_fast_paths.py checks that the two agree)."""
    span = ticks(config.policy.return_dwell_s, config)
    highest: dict[str, float] = {}
    for name in snapshot.models:
        history = snapshot.history.get(name)
        if not history:
            continue
        rates = [r for s in history[-span:] if (r := s.request_rate) is not None]
        highest[name] = max(rates) if rates else 0.0
    return highest


@dataclass(frozen=True)
class Demands:
    """`demands`' answer, per model: the rate to carry to lend for (`lend`) and to keep
    when returning (`keep`), and the models whose newest p99 is over high_watermark x SLO
    (`hot`, in the models' order: `evaluate_model`'s first test of a breach, so the
    backstop's candidates)."""

    lend: dict[str, capacity.Demand]
    keep: dict[str, capacity.Demand]
    hot: list[str]


def demands(
    snapshot: Snapshot,
    config: BridgeConfig,
    reads: Reads,
    *,
    lend: bool = True,
    keep: bool = False,
    now: float = 0.0,
    long_dwell: Mapping[str, float] | None = None,
) -> Demands:
    """Per model with a known service time, the rate to carry: to lend for (`lend`, with
    `hot`) and to keep when returning (`keep`); each left empty when not asked. Lending:
    headroom x max(now, forecast). Returning: return_headroom x max(the dwell's highest,
    forecast); a model with a longer dwell (`long_dwell`) takes its highest over that
    dwell from the peaks. `reads`: the tick's `_read` (with `returning` for `keep`).
    One pass for all three: at a site's thousands of models a pass costs, mostly in
    reading each model's newest sample."""
    policy = config.policy
    lend_factor, keep_factor = policy.capacity_headroom, policy.return_headroom
    high = policy.high_watermark
    ahead, highest = reads.ahead, reads.highest
    histories, peaks = snapshot.history, snapshot.peaks
    Demand = capacity.Demand
    to_lend: dict[str, capacity.Demand] = {}
    to_keep: dict[str, capacity.Demand] = {}
    hot: list[str] = []
    for name, model in snapshot.models.items():
        history = histories.get(name)
        if not history:
            continue
        last = history[-1]
        compute = last.compute_ms  # `service_s`'s answer at its first step, most ticks
        svc = compute / 1000.0 if compute is not None and compute > 0 else service_s(history)
        forecast = ahead[name] or 0.0
        slo_ms, instances = model.slo_p99_ms, model.instances
        slo = slo_ms / 1000.0
        # a model with load but no compute time measured yet cannot be sized: left out
        # (an LLM without a request objective is sized by its tokens: `llm`)
        tokens_only = not model.has_request_slo
        if lend:
            base = last.request_rate or 0.0
            if svc is not None or not base > 0 or tokens_only:
                rate = max(base, forecast) * lend_factor
                to_lend[name] = Demand(rate, 0.0 if svc is None else svc, slo, instances)
            p99 = last.p99_ms
            if (p99 is not None and p99 > high * slo_ms) or (
                model.has_token_slo and (token_ratio(last, model) or 0.0) > high
            ):
                hot.append(name)
        if keep:
            base = highest[name]
            if long_dwell and name in long_dwell and name in peaks:
                base = max(base, peaks[name].highest_since(now - long_dwell[name]))
            if svc is not None or not base > 0 or tokens_only:
                rate = max(base, forecast) * keep_factor
                to_keep[name] = Demand(rate, 0.0 if svc is None else svc, slo, instances)
    return Demands(to_lend, to_keep, hot)


def replica_groups(
    snapshot: Snapshot, leaving: set[int], placing: Mapping[int, tuple[str, ...]] | None = None
) -> Counter[tuple[tuple[str, ...], int]]:
    """The replicas by (models, GPUs): ready ones (less the leases leaving) and the lends in
    flight that will serve soon (not a drain lend still waiting for its node's jobs). A
    replica mid-placement (`placing`: lease id -> the lease's models; None: looked up)
    counts under its lease's models, as a lend in flight does."""
    if placing is None:
        placing = placement.in_placement(snapshot)
    # counted as given first (C speed), then merged under the sorted model set: the keys
    # come out in the order of their first replica, as one pass over them would give
    raw: Counter[tuple[tuple[str, ...], int]] = Counter(
        (tuple(r.models) if (i := r.lease_id) is None or i not in placing else placing[i], r.gpus)
        for r in snapshot.replicas
        if r.lease_id is None or r.lease_id not in leaving
    )
    count: Counter[tuple[tuple[str, ...], int]] = Counter()
    for (models, gpus), n in raw.items():
        count[model_set_of(models), gpus] += n
    for lease in snapshot.leases:
        if lease.state in IN_FLIGHT and lease.lease_id not in leaving and not lease.waiting:
            count[model_set_of(lease.models), lease.gpus] += 1
    return count


_MODEL_SETS: dict[tuple[str, ...], tuple[str, ...]] = {}


def model_set_of(models: Sequence[str]) -> tuple[str, ...]:
    """`tuple(sorted(set(models)))`, remembered (replicas' model tuples repeat every tick)."""
    models = tuple(models)  # (a tuple as is; a list given as models made hashable)
    key = _MODEL_SETS.get(models)
    if key is None:
        if len(_MODEL_SETS) >= 65536:  # bounded: a long-running daemon sees new ones
            _MODEL_SETS.clear()
        key = _MODEL_SETS[models] = tuple(sorted(set(models)))
    return key


def groups(count: Counter[tuple[tuple[str, ...], int]]) -> list[capacity.Group]:
    return [capacity.Group(models, n, gpus) for (models, gpus), n in count.items() if n > 0]


def capacity_inputs(
    snapshot: Snapshot, config: BridgeConfig, now: float
) -> tuple[
    Counter[tuple[tuple[str, ...], int]], dict[str, capacity.Demand], dict[str, capacity.Demand]
]:
    """What `assess`'s capacity rules read on a tick with no lease abandoned: the replicas
    by (models, GPUs), the demand the replicas left must carry (returning) and the demand
    to lend for. The simulator proves quiet ticks with it (`bridge.sim.quiet`)."""
    reads = read(snapshot, config, now, lead_s(snapshot, config), True)
    count = replica_groups(snapshot, set())
    long_dwell = dwells(snapshot, config, now)
    d = demands(snapshot, config, reads, keep=True, now=now, long_dwell=long_dwell)
    return count, d.keep, d.lend
