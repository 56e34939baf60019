"""The return rule that counts the cost of coming back (`bridge.policy.returns`), on literal
series: the learned dwell, the memories the deciding pass keeps, and decide holding a node
through the silences of a bursty model and giving it back after a long quiet."""

from __future__ import annotations

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.modelfacts import toml_models
from bridge.policy import LeaseView, ModelSample, NodeView, ReplicaView, Return, Snapshot, decide
from bridge.policy.returns import (
    KEEP,
    PEAK_BUCKET_S,
    PeakLog,
    RatePeaks,
    ReturnHistory,
    ReturnLog,
    break_even_s,
    dwell_s,
)

T0 = 1_800_000_000.0
TICK = 5.0
POLICY = PolicyConfig(return_dwell_s=300, return_dwell_max_s=3600, relend_work_s=600)
#: a 6 s lend: a return pays if its node stays out 606 s
EVEN = break_even_s(6.0, POLICY)


def test_the_break_even_is_the_lead_and_the_work_a_lend_throws_away() -> None:
    assert EVEN == 606.0
    assert break_even_s(306.0, POLICY) == 906.0  # five minutes of model load


@pytest.mark.parametrize(
    ("gaps", "open_since", "expected"),
    [
        ((), None, 300.0),  # nothing known: the configured dwell
        ((4000.0,), None, 300.0),  # a return that stayed out an hour paid
        ((120.0,), None, 606.0),  # one regret: hold for the break-even (ski rental)
        ((120.0, 200.0), None, 1212.0),  # each further regret doubles it
        ((120.0, 200.0, 90.0, 60.0, 30.0), None, 3600.0),  # up to return_dwell_max_s
        ((120.0, 200.0, 5000.0), None, 606.0),  # a payoff lowers it a level
        ((120.0, 5000.0, 9000.0), None, 300.0),  # never below the configured dwell
        ((120.0,), T0 - 700.0, 300.0),  # the open return has stayed out past the break-even
        ((120.0,), T0 - 100.0, 606.0),  # an open return still short of it says nothing yet
    ],
)
def test_the_dwell_grows_with_returns_lent_again_too_soon(
    gaps: tuple[float, ...], open_since: float | None, expected: float
) -> None:
    assert dwell_s(ReturnHistory(gaps, open_since), T0, EVEN, POLICY) == expected


def test_no_history_is_the_configured_dwell() -> None:
    assert dwell_s(None, T0, EVEN, POLICY) == 300.0


def test_the_return_log_closes_a_return_at_the_next_lend_of_the_model() -> None:
    log = ReturnLog()
    log.lent(("busy",), T0)  # a lend with no return before it: no gap
    assert log.view() == {}
    log.returned(("busy", "echo"), T0 + 100)
    log.lent(("busy",), T0 + 250)
    view = log.view()
    assert view["busy"] == ReturnHistory((150.0,), None)
    assert view["echo"] == ReturnHistory((), T0 + 100)  # not lent again yet
    for i in range(KEEP + 3):
        log.returned(("busy",), T0 + 1000 * (i + 1))
        log.lent(("busy",), T0 + 1000 * (i + 1) + i)
    gaps = log.view()["busy"].gaps
    assert len(gaps) == KEEP and gaps[-1] == float(KEEP + 2)  # the newest kept


def test_rate_peaks_per_minute_and_the_span_read() -> None:
    log = PeakLog(keep_s=180.0)
    start = 1_800_000_040.0 - 1_800_000_040.0 % PEAK_BUCKET_S
    for i, rate in enumerate([10.0, 50.0, 20.0, 5.0, 7.0, 6.0, 1.0, None, 2.0]):
        log.add("busy", start + i * 30.0, rate)  # two samples a bucket
    peaks = log.view()["busy"]
    assert (peaks.start, peaks.top) == (start + 240.0, 2.0)
    assert [top for _s, top in peaks.closed] == [50.0, 20.0, 7.0, 1.0]
    assert peaks.highest_since(start + 179.0) == 7.0  # ends at 180: still in
    assert peaks.highest_since(start + 241.0) == 2.0  # the bucket under way
    assert peaks.highest_since(start + 125.0) == 7.0  # a bucket partly in counts whole
    assert peaks.highest_since(start) == 50.0
    log.forget(["echo"])
    assert log.view() == {}
    assert RatePeaks().highest_since(T0) == 0.0


def test_the_peak_log_keeps_only_its_span() -> None:
    log = PeakLog(keep_s=120.0)
    for i in range(10):
        log.add("busy", T0 + i * PEAK_BUCKET_S, 100.0 - i)
    assert len(log.view()["busy"].closed) == log.buckets == 3


# ---- decide on a bursty model -----------------------------------------------------

CONFIG = BridgeConfig(
    models={"busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=6, instances=1)},
    policy=PolicyConfig(
        max_lent_nodes=4,
        return_dwell_s=300,
        return_dwell_max_s=3600,
        relend_work_s=600,
        scale_in_cooldown_s=120,
        forecast_window_s=60,
        lend_lead_s=6,
    ),
)
LENT = LeaseView(1, "e0", "elastic", "preempt", "serving", ("busy",), T0 - 4000, T0 - 3900)
REPLICAS = (ReplicaView("n4", ("busy",), gpus=4), ReplicaView("e0", ("busy",), 1, gpus=4))
NODES = (NodeView("e1", "elastic", True, 4), NodeView("n4", "inference", True, 4, has_triton=True))


def quiet(rate: float = 10.0, n: int = 61) -> tuple[ModelSample, ...]:
    """`n` calm samples (p99 20 ms) at `rate`, one tick apart, ending now."""
    return tuple(
        ModelSample(T0 - (n - 1 - i) * TICK, 20.0, rate, 0.0, 10.0, 20.0) for i in range(n)
    )


def burst_minutes_ago(minutes: float) -> RatePeaks:
    """Per-minute peaks of the last hour: 10 req/s, and 120 req/s `minutes` ago (a burst
    the reserved replica alone could not carry)."""
    now_bucket = T0 - T0 % PEAK_BUCKET_S
    closed = tuple(
        (now_bucket - k * PEAK_BUCKET_S, 120.0 if k == round(minutes) else 10.0)
        for k in range(60, 0, -1)
    )
    return RatePeaks(closed, now_bucket, 10.0)


def snap(returns: ReturnHistory | None, peaks: RatePeaks) -> Snapshot:
    return Snapshot(
        NODES,
        REPLICAS,
        {"busy": quiet()},
        (LENT,),
        models=toml_models(CONFIG),
        returns={"busy": returns} if returns is not None else {},
        peaks={"busy": peaks},
    )


def test_a_model_lent_again_sooner_than_the_break_even_keeps_its_node_through_a_silence() -> None:
    """Calm for the configured dwell (5 min) after a burst 15 minutes ago: without history
    the lease goes back; after two returns lent again within two minutes (the bursts
    recur) its dwell is 1,212 s and covers the burst, so the node stays."""
    peaks = burst_minutes_ago(15)
    (first,) = decide(snap(None, peaks), CONFIG, T0)
    assert isinstance(first, Return) and first.reason.startswith("quiet for 300s")
    flapped = ReturnHistory((120.0, 100.0), None)
    assert decide(snap(flapped, peaks), CONFIG, T0) == []


def test_a_long_quiet_gives_the_node_back_even_after_flapping() -> None:
    """The same model with no burst within its dwell (the last 25 minutes ago): it goes
    back, saying the dwell it waited."""
    flapped = ReturnHistory((120.0, 100.0), None)
    (a,) = decide(snap(flapped, burst_minutes_ago(25)), CONFIG, T0)
    assert isinstance(a, Return) and a.reason.startswith("quiet for 1212s: busy")
