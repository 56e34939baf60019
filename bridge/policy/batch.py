"""The batch route's gate: whether batch inference may use the serving replicas this pass.
Pure: the reconciler calls `decide_gate` each active pass after `decide` (whose lends it
reads) and publishes the answer with the routing table (`bridge.routing.table.BatchGate`);
tests call it on literal snapshots.

Batch work (jobs tagged `batch-inference`, sending to `/batch/v2/models/<model>/...`)
fills the replicas' spare capacity and yields to online load. Triton counts a batch
request as any other; nginx's batch access log (`bridge.routing.batchlog`) counts the
batch route's. `online_history` takes each sample's batch rate off the model's measured
rate, and the reconciler gives the policy (`decide`, its rate peaks and forecast) and the
gate that history: the policy sizes the fleet for online load and never lends for the
batch work's. Latencies are left as measured: online requests did wait behind batch
work, and that is what closes the gate. Where the batch route's rate is unknown (no log,
a backlog skipped) the whole measured rate counts as online: the gate closes sooner and
lends come sooner, never later.

The gate closes at once, in the pass that sees any of:
- a lend wanted (`decide` returned a `Lend`) or a lease open: batch work never runs on
  lent capacity, nor holds a lend from returning by keeping its model busy;
- a model in sustained breach (`bridge.policy.hysteresis.evaluate_model`);
- a model's newest p99 (and an LLM's TTFT/TPOT) over `close_p99_ratio` x its objective:
  below the policy's breach watermark, so the gate closes before the policy's backstop
  lends for a breach the batch work made;
- a replica busier than `close_utilisation` with online requests: per replica, the sum
  over its models of (the replica's share of the model's online rate, as nginx routes
  it: by the replicas' GPUs, evenly for a model with its own `instances`:
  `bridge.policy.capacity.weight`) x compute time per request, over its GPUs, or for a
  model with its own `instances` over those (the capacity model's pools,
  `bridge.policy.capacity`); the busiest pool counts.

It opens again only after `calm_s` of calm: every replica at most `open_utilisation`
busy with online requests, every model under `open_p99_ratio` x its objective, nothing
lent, every model's rate measured. Between the two bands the gate stays as it is (the
hysteresis that keeps it from flapping). A gate never decided is closed: a daemon that
starts opens it after its first calm dwell.

What the gate does not do (yet): Triton's request priorities (a batch request queued
behind online ones inside one replica) and the third step, suspending or requeueing the
batch jobs themselves through Slurm. Closing the route stops new batch requests within
one pass; those in flight finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bridge.config import BridgeConfig
from bridge.policy import capacity
from bridge.policy.actions import Action, Lend
from bridge.policy.hysteresis import ModelStatus, evaluate_model, service_s, severity
from bridge.policy.snapshot import ModelSample, Snapshot


@dataclass(frozen=True)
class GateState:
    """What the gate's rule carries from one pass to the next."""

    open: bool
    #: when the gate last opened or closed (epoch seconds); None: never decided
    changed_at: float | None = None
    #: since when every signal has been calm without a break; None: not calm now
    calm_since: float | None = None


#: the gate before any decision: closed
CLOSED = GateState(open=False)


@dataclass(frozen=True)
class GateDecision:
    """The gate for this pass and why."""

    state: GateState
    #: what closed it or keeps it closed, or what the calm waits for ("" when open)
    reason: str
    #: whether this pass changed the gate
    changed: bool


def online_utilisation(snap: Snapshot) -> tuple[dict[str, float], set[str]]:
    """Per replica node, how busy its busiest pool of servers is with the requests of the
    snapshot's rates (online ones, where its history is `online_history`'s): the node's
    GPUs for the models that share them, a model's own instances for one that has them;
    and the models whose rate or compute time is not measured (they count for nothing
    here, and keep the gate from opening)."""
    # per model, its replicas' weights in routing summed (`capacity.weight`): a replica
    # takes its weight's share of the model's requests, as nginx sends them
    weights: dict[str, int] = {}
    for r in snap.replicas:
        for m in r.models:
            weights[m] = weights.get(m, 0) + capacity.weight(r.gpus, _instances(snap, m))
    unknown: set[str] = set()
    busy_s: dict[str, float] = {}  # per model: online GPU-seconds per second per weight
    for m, n in weights.items():
        history = snap.history.get(m, ())
        rate = history[-1].request_rate if history else None
        if rate is None:
            unknown.add(m)
            continue
        service = service_s(history)
        if service is None:
            if rate > 0:
                unknown.add(m)
            continue
        busy_s[m] = rate * service / n
    util: dict[str, float] = {}
    for r in snap.replicas:
        # as the capacity model's pools: the models without `instances` share the node's
        # GPUs (a model's share here, its busy time per weight x the replica's GPUs, over
        # those GPUs is its busy time per weight), one with its own instances is a pool
        # of that many (weight 1 here); the busiest pool counts
        own = {m: i for m in r.models if (i := _instances(snap, m)) is not None}
        shared = sum(busy_s.get(m, 0.0) for m in r.models if m not in own)
        util[r.node] = max([shared, *(busy_s.get(m, 0.0) / i for m, i in own.items())])
    return util, unknown


def _instances(snap: Snapshot, model: str) -> int | None:
    config = snap.models.get(model)
    return config.instances if config is not None else None


def _pressure(
    snap: Snapshot,
    config: BridgeConfig,
    actions: Sequence[Action],
    util: Mapping[str, float],
) -> str:
    """Why the gate must close now ("" when nothing says so)."""
    b = config.batch
    lends = [a for a in actions if isinstance(a, Lend)]
    if lends:
        return f"a lend is wanted ({lends[0].node} for {', '.join(lends[0].models)})"
    if snap.leases:
        return f"{len(snap.leases)} lease(s) open (batch work does not run on lent nodes)"
    for m, model in sorted(snap.models.items()):
        history = snap.history.get(m, ())
        if not history:
            continue
        if evaluate_model(history, model, config) == ModelStatus.BREACH:
            return f"{m} is in breach of its SLO"
        ratio = severity(history, model)
        if ratio > b.close_p99_ratio:
            return f"{m}'s p99 is {ratio:.2f} x its SLO (closes over {b.close_p99_ratio:g})"
    for node, u in sorted(util.items()):
        if u > b.close_utilisation:
            return (
                f"replica {node} is {u:.2f} busy with online requests "
                f"(closes over {b.close_utilisation:g})"
            )
    return ""


def _unsettled(
    snap: Snapshot, config: BridgeConfig, util: Mapping[str, float], unknown: set[str]
) -> str:
    """What keeps the signals from being calm ("" when calm), short of pressure."""
    b = config.batch
    if unknown:
        return f"no measured rate for {', '.join(sorted(unknown))}"
    for m, model in sorted(snap.models.items()):
        history = snap.history.get(m, ())
        if history and severity(history, model) > b.open_p99_ratio:
            return f"{m}'s p99 is over {b.open_p99_ratio:g} x its SLO"
    for node, u in sorted(util.items()):
        if u > b.open_utilisation:
            return f"replica {node} is {u:.2f} busy (opens at {b.open_utilisation:g})"
    return ""


def decide_gate(
    previous: GateState,
    snap: Snapshot,
    config: BridgeConfig,
    now: float,
    actions: Sequence[Action] = (),
) -> GateDecision:
    """The gate for the pass at `now` (epoch seconds), from the gate as it was, the
    policy's view (its history `online_history`'s) and the actions `decide` returned this
    pass (module docstring)."""
    util, unknown = online_utilisation(snap)
    why = _pressure(snap, config, actions, util)
    if why:
        state = GateState(False, now if previous.open else previous.changed_at, None)
        return GateDecision(state, why, previous.open)
    wait = _unsettled(snap, config, util, unknown)
    if wait:  # between the bands: as it was, and the calm starts again
        state = GateState(previous.open, previous.changed_at, None)
        return GateDecision(state, "" if previous.open else wait, False)
    calm_since = previous.calm_since if previous.calm_since is not None else now
    if previous.open:
        return GateDecision(GateState(True, previous.changed_at, calm_since), "", False)
    left = config.batch.calm_s - (now - calm_since)
    if left > 0:
        state = GateState(False, previous.changed_at, calm_since)
        return GateDecision(
            state, f"calm for {now - calm_since:.0f} s, opens in {left:.0f} s", False
        )
    return GateDecision(GateState(True, now, calm_since), "", True)


def online_history(
    history: Mapping[str, Sequence[ModelSample]],
    batch_rates: Mapping[float, Mapping[str, float]],
) -> dict[str, tuple[ModelSample, ...]]:
    """`history` with each sample's request rate less the batch route's rate of its model
    over the same window (`batch_rates`: per sample time, per model, requests per second;
    a time not there: no batch requests known, the sample as measured); never below
    zero. Latencies and the rest are left as measured."""
    out: dict[str, tuple[ModelSample, ...]] = {}
    for m, samples in history.items():
        fixed = []
        for sample in samples:
            rate = batch_rates.get(sample.at, {}).get(m, 0.0)
            if rate > 0 and sample.request_rate is not None:
                sample = replace(sample, request_rate=max(0.0, sample.request_rate - rate))
            fixed.append(sample)
        out[m] = tuple(fixed)
    return out
