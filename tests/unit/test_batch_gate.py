"""The batch route's gate (`bridge.policy.batch`) on literal snapshots with an injected
clock: closed before any decision; opened after `calm_s` of calm; closed in the pass that
sees a lend wanted, an open lease, a breach, a p99 over its share of the SLO or a replica
busy with online requests (the batch route's own rate taken off the history);
the band between the thresholds holds the gate as it is (no flapping)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.config import BatchConfig, BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy import LeaseView, Lend, ModelSample, NodeView, ReplicaView, Snapshot
from bridge.policy.batch import (
    CLOSED,
    GateState,
    decide_gate,
    online_history,
    online_utilisation,
)

T0 = 1_800_000_000.0
TICK = 5.0
CONFIG = BridgeConfig(
    policy=PolicyConfig(breach_evaluations=3),
    batch=BatchConfig(enabled=True, calm_s=20),
)
MODELS = {
    "echo": ModelConfig(slo_p99_ms=100, min_replicas=1),
    "busy": ModelConfig(slo_p99_ms=200, min_replicas=1),
}
RESERVED = NodeView("n4", "inference", True, 4, has_triton=True)


def sample(at: float, p99: float | None, rate: float | None, compute_ms: float = 100.0):
    return ModelSample(at, p99, rate, 0.0, p99 / 2 if p99 else None, compute_ms)


def snap(
    at: float,
    echo: tuple[float | None, float | None] = (30.0, 4.0),
    busy: tuple[float | None, float | None] = (40.0, 4.0),
    *,
    leases: tuple[LeaseView, ...] = (),
    history: int = 3,
) -> Snapshot:
    """One reserved replica of 4 GPUs holding both models; each model's last `history`
    samples at its (p99 ms, rate req/s), compute 100 ms a request."""

    def hist(p99: float | None, rate: float | None) -> tuple[ModelSample, ...]:
        return tuple(sample(at - (history - 1 - i) * TICK, p99, rate) for i in range(history))

    return Snapshot(
        nodes=(RESERVED,),
        replicas=(ReplicaView("n4", ("busy", "echo"), gpus=4),),
        history={"echo": hist(*echo), "busy": hist(*busy)},
        leases=leases,
        models=MODELS,
    )


def run(start: GateState, snaps: list[Snapshot]) -> list[tuple[bool, str]]:
    state, out = start, []
    for s in snaps:
        at = s.history["echo"][-1].at
        d = decide_gate(state, s, CONFIG, at)
        state = d.state
        out.append((state.open, d.reason))
    return out


def test_utilisation_is_the_rates_work_over_the_replicas_gpus() -> None:
    # 4 + 4 req/s x 0.1 s on 4 GPUs: 0.2 busy
    util, unknown = online_utilisation(snap(T0))
    assert util == {"n4": 0.2} and unknown == set()
    # a model of two alike replicas puts half its work on each
    two = replace(
        snap(T0),
        replicas=(
            ReplicaView("n4", ("busy", "echo"), gpus=4),
            ReplicaView("n5", ("echo",), gpus=4),
        ),
    )
    util, _ = online_utilisation(two)
    assert util == {"n4": pytest.approx(0.15), "n5": pytest.approx(0.05)}
    # replicas of 4 and 1 GPUs: nginx sends echo's requests 4 : 1 (its weights,
    # `capacity.weight`), so each is as busy with them, 0.4 s/s over 5 GPUs (split
    # evenly, the one-GPU replica would read 0.2 busy and close the gate at 4x the load)
    small = replace(
        snap(T0),
        replicas=(ReplicaView("n4", ("busy", "echo"), gpus=4), ReplicaView("n5", ("echo",))),
    )
    util, _ = online_utilisation(small)
    assert util == {"n4": pytest.approx(0.1 + 0.08), "n5": pytest.approx(0.08)}
    # a model with its own instances splits evenly whatever the GPUs: 0.2 s/s on each
    # replica's one instance
    own_two = replace(
        small, models={**MODELS, "echo": MODELS["echo"].model_copy(update={"instances": 1})}
    )
    util, _ = online_utilisation(own_two)
    assert util == {"n4": pytest.approx(0.2), "n5": pytest.approx(0.2)}
    # a model with its own instance is a pool of one: 4 req/s x 0.1 s = 0.4 busy
    own = replace(
        snap(T0), models={**MODELS, "echo": MODELS["echo"].model_copy(update={"instances": 1})}
    )
    util, _ = online_utilisation(own)
    assert util == {"n4": pytest.approx(0.4)}
    # no measured rate: unknown
    _, unknown = online_utilisation(snap(T0, echo=(None, None)))
    assert unknown == {"echo"}


def test_online_history_takes_the_batch_routes_rate_off_each_sample() -> None:
    history = snap(T0).history  # echo and busy at 4 req/s, samples at T0-10, T0-5, T0
    online = online_history(history, {T0 - 5: {"echo": 3.0}, T0: {"echo": 9.0, "gone": 1.0}})
    assert [s.request_rate for s in online["echo"]] == [4.0, 1.0, 0.0]  # never below 0
    assert [s.request_rate for s in online["busy"]] == [4.0, 4.0, 4.0]
    # latencies as measured
    assert [s.p99_ms for s in online["echo"]] == [s.p99_ms for s in history["echo"]]
    # a sample without a rate stays without one
    none = snap(T0, echo=(None, None)).history
    assert online_history(none, {T0: {"echo": 2.0}})["echo"][-1].request_rate is None


def test_closed_until_a_calm_dwell_then_open() -> None:
    calm = [snap(T0 + i * TICK) for i in range(6)]
    out = run(CLOSED, calm)
    assert [o for o, _ in out] == [False, False, False, False, True, True]
    assert out[0][1] == "calm for 0 s, opens in 20 s"
    assert out[4] == (True, "")


def test_a_rise_closes_the_gate_in_the_same_pass() -> None:
    opened = GateState(True, T0 - 100, T0 - 100)
    # online utilisation 0.8 of the replica: 16 + 16 req/s x 0.1 s / 4 GPUs
    d = decide_gate(opened, snap(T0, (30, 16), (40, 16)), CONFIG, T0)
    assert (d.state.open, d.changed, d.state.changed_at) == (False, True, T0)
    assert d.reason == "replica n4 is 0.80 busy with online requests (closes over 0.7)"
    # the same measured load, half of it the batch route's own: online, it stays open
    half = snap(T0, (30, 16), (40, 16))
    online = replace(half, history=online_history(half.history, {T0: {"echo": 8, "busy": 8}}))
    d = decide_gate(opened, online, CONFIG, T0)
    assert d.state.open and not d.changed


def test_p99_breach_lend_and_lease_each_close_it() -> None:
    opened = GateState(True, T0 - 100, T0 - 100)
    # echo's p99 85 ms of 100: over 0.8 x SLO, under the breach watermark
    d = decide_gate(opened, snap(T0, echo=(85.0, 4.0)), CONFIG, T0)
    assert not d.state.open and d.reason == "echo's p99 is 0.85 x its SLO (closes over 0.8)"
    # a sustained breach
    d = decide_gate(opened, snap(T0, echo=(150.0, 4.0)), CONFIG, T0)
    assert d.reason == "echo is in breach of its SLO"
    # a lend decided this pass, whatever else says calm
    lend = Lend("n3", "elastic", "preempt", ("echo",), "echo breaching")
    d = decide_gate(opened, snap(T0), CONFIG, T0, (lend,))
    assert not d.state.open and d.reason == "a lend is wanted (n3 for echo)"
    # an open lease
    lease = LeaseView(1, "n3", "elastic", "preempt", "serving", ("echo",), T0 - 60)
    d = decide_gate(opened, snap(T0, leases=(lease,)), CONFIG, T0)
    assert not d.state.open and d.reason.startswith("1 lease(s) open")


def test_the_band_holds_the_gate_and_restarts_the_calm() -> None:
    opened = GateState(True, T0 - 100, T0 - 100)
    # utilisation 0.6: over open (0.5), under close (0.7): an open gate stays open
    band = snap(T0, (30, 12), (40, 12))
    d = decide_gate(opened, band, CONFIG, T0)
    assert d.state.open and not d.changed and d.state.calm_since is None
    # ...and a closed one stays closed, its calm started over
    closed = GateState(False, T0 - 100, T0 - 15)
    d = decide_gate(closed, band, CONFIG, T0)
    assert not d.state.open and d.state.calm_since is None
    assert d.reason == "replica n4 is 0.60 busy (opens at 0.5)"
    # a p99 between the ratios (0.7 of SLO) holds it closed too
    d = decide_gate(closed, snap(T0, echo=(70.0, 4.0)), CONFIG, T0)
    assert not d.state.open and d.reason == "echo's p99 is over 0.6 x its SLO"
    # a model without a measured rate holds it closed
    d = decide_gate(closed, snap(T0, echo=(None, None)), CONFIG, T0)
    assert not d.state.open and d.reason == "no measured rate for echo"


def test_no_flapping_on_a_load_that_swings_inside_the_band() -> None:
    """Load swinging between 0.45 and 0.65 busy never flips an open gate or opens a
    closed one; a spike over 0.7 closes it, and the calm must then last `calm_s` again."""
    loads = [9, 13, 9, 13, 9, 13, 16, 9, 9, 9, 9, 9, 9]
    snaps = [snap(T0 + i * TICK, (30, r), (40, r)) for i, r in enumerate(loads)]
    out = [o for o, _ in run(GateState(True, T0 - 100, T0 - 100), snaps)]
    assert out == [True] * 6 + [False] * 5 + [True, True]
