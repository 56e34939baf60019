"""The replica latency model (bridge.sim.latency): queueing formulas against known values
and the model's own consistency (quantile vs share within, backlog build-up and drain)."""

from __future__ import annotations

import math

import pytest

from bridge.sim import latency


def test_share_within_matches_the_quantile_without_backlog() -> None:
    st = latency.step(8, 6.0, 300.0, 0.0, 5.0).state
    q99 = st.wait_quantile(0.99)
    assert q99 > 0
    assert st.share_within(q99) == pytest.approx(0.99, abs=1e-9)
    assert st.share_within(q99 * 2) > 0.99
    assert st.share_within(-0.001) == 0.0


def test_light_load_never_waits_at_p99() -> None:
    st = latency.step(8, 1.0, 50.0, 0.0, 5.0).state
    assert st.wait_quantile() == 0.0
    assert st.share_within(0.0) > 0.99


def test_overload_builds_a_backlog_that_drains_later() -> None:
    backlog = 0.0
    for _ in range(12):  # one minute at 1.5x the capacity of one instance
        backlog = latency.step(1, 1.5, 75.0, backlog, 5.0).backlog_s
    assert backlog == pytest.approx(0.5 * 60.0)
    after = latency.step(1, 0.5, 25.0, backlog, 5.0)
    assert after.backlog_s == pytest.approx(backlog - 2.5)
    assert after.pending > 0
    # everything in that tick waits the backlog: none within a 100 ms objective
    assert after.state.share_within(0.1) == 0.0


def test_share_within_integrates_a_falling_backlog() -> None:
    st = latency.TickState(100.0, 1.0, 0.0, 0.0, math.inf)  # backlog 1 s -> 0 over the tick
    assert st.share_within(0.25) == pytest.approx(0.25)
    assert st.share_within(1.0) == pytest.approx(1.0)


def test_window_quantile_keeps_a_burst_while_it_is_over_one_percent() -> None:
    calm = latency.TickState(100.0, 0.0, 0.0, 0.0, math.inf)
    slow = latency.TickState(50.0, 0.0, 2.0, 0.0, math.inf)
    assert latency.window_quantile([calm] * 11 + [slow]) == pytest.approx(2.0)
    tiny = latency.TickState(5.0, 0.0, 2.0, 0.0, math.inf)  # 5 of 1105 requests
    assert latency.window_quantile([calm] * 11 + [tiny]) == 0.0
    assert latency.window_quantile([latency.TickState(0, 0, 0, 0, math.inf)]) is None
