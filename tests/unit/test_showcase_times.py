"""How the demo's load step was met (`bridge.lab.stepfigures`, through
`ScenarioResult.step_figures`), from literal request records: the lend, the replica
serving, the backlog then, when it was worked off, and how the windows after it stood
against the SLO."""

from __future__ import annotations

import pytest

from bridge.lab.showcase import ScenarioResult
from bridge.lab.stepfigures import describe, step_figures
from bridge.load.runner import RequestRecord

STEP = 1_800_000_000.0


def record(i: int, at: float, latency: float, error: str | None = None) -> RequestRecord:
    return RequestRecord(i, "127.0.0.1:8080", at, at, at + latency, 200, error)


def test_step_figures_find_the_last_slow_window() -> None:
    records = [record(i, i * 0.1, 0.02) for i in range(100)]  # 10 s of fast answers
    records += [record(100 + i, 10 + i * 0.1, 2.0) for i in range(50)]  # 10-15 s: slow
    records += [record(150 + i, 15 + i * 0.1, 0.03) for i in range(100)]  # fast again
    records.append(record(999, 20.0, 30.0, error="timeout"))  # failures are not latency
    res = ScenarioResult(
        heavy_records=records, step_at=STEP, lend_at=STEP + 2.0, serving_at=STEP + 9.5
    )
    fig = res.step_figures(100.0)
    assert fig is not None
    assert (fig.lend_s, fig.serving_s) == (2.0, 9.5)
    assert fig.p99_under_slo_s == 15.0  # the 10-15 s window was the last over the SLO
    assert fig.recovered_s == 15.0 and fig.held
    assert fig.worst_p99_ms == 2000.0
    assert (fig.after_windows, fig.after_late) == (2, 0)
    fast = ScenarioResult(
        heavy_records=records[:100], step_at=STEP, lend_at=STEP + 2.0, serving_at=STEP + 9.5
    )
    fig = fast.step_figures(100.0)
    assert fig is not None and fig.p99_under_slo_s == 0.0 and fig.recovered_s == 0.0
    assert ScenarioResult().step_figures(100.0) is None


def backlog_step(after_s: list[float]) -> list[RequestRecord]:
    """The demo's step in miniature: 70/s, one replica answering 45/s until the second
    serves at 10 s, both answering 95/s until the queue is gone (FIFO); then one latency
    per 5 s window from `after_s` (a window each, from the first one with no queue)."""
    records: list[RequestRecord] = []
    free = 0.0  # when the pooled replicas next answer
    i = 0
    while i < 70 * 70:
        at = i / 70
        rate = 45.0 if free < 10.0 else 95.0
        free = max(free, at) + 1 / rate
        records.append(record(i, at, free - at))
        i += 1
        if at > 10.0 and free <= at + 0.05:  # the queue is gone
            break
    start = (int(records[-1].scheduled_s // 5) + 1) * 5
    for w, latency in enumerate(after_s):
        for k in range(350):
            records.append(record(i, start + w * 5 + k / 70, latency))
            i += 1
    return records


def test_backlog_and_rates_come_from_the_records() -> None:
    records = backlog_step([0.08] * 6)
    fig = step_figures(records, lend_s=2.0, serving_s=10.0, slo_ms=100.0)
    # 70/s arriving against 45/s for 10 s: 250 requests queued, less those answered
    # faster at the start, when the first ones found no queue
    assert 230 <= fig.backlog <= 260
    assert fig.one_replica_rate == pytest.approx(45.0, abs=1.0)
    assert fig.two_replicas_rate == pytest.approx(95.0, abs=2.0)
    assert fig.arrival_rate == pytest.approx(70.0, abs=0.5)
    # worked off at 10 + 250 / (95 - 70) = 20 s: the windows up to 20 s are slow
    assert fig.recovered_s == 20.0 == fig.p99_under_slo_s
    # to the request: the queue's wait under 100 ms at 10 + (250 - 2.5) / 25 = 19.9 s
    assert fig.drained_s is not None and 19.0 < fig.drained_s < 20.0
    assert fig.expected_recovered_s == pytest.approx(20.0, abs=1.0)
    assert (fig.after_windows, fig.after_late) == (6, 0)
    assert fig.after_median_p99_ms == pytest.approx(80.0)


def test_a_late_window_after_recovery_is_counted_apart() -> None:
    # the backlog is worked off at 20 s; then one window at 120 ms, the step's last
    records = backlog_step([0.08, 0.08, 0.08, 0.08, 0.08, 0.12])
    fig = step_figures(records, lend_s=2.0, serving_s=10.0, slo_ms=100.0)
    assert fig.recovered_s == 20.0  # what the lend did
    assert fig.p99_under_slo_s == fig.step_s == 50.0 and not fig.held  # what noise did
    assert (fig.after_windows, fig.after_late) == (6, 1)
    assert fig.after_max_p99_ms == pytest.approx(120.0)
    text = "\n".join(describe(fig, 100.0))
    assert "under the SLO 100 ms from 20 s" in text
    assert "1 of 6 windows over the SLO" in text and "the step's last window over it" in text
    assert "= 20 s here" in text


def test_a_backlog_never_worked_off_says_so() -> None:
    # two replicas answer no more than arrives: every window after serving is slow
    records = [record(i, i / 70, 0.5 + i / 70) for i in range(70 * 30)]
    fig = step_figures(records, lend_s=2.0, serving_s=10.0, slo_ms=100.0)
    assert fig.recovered_s is None and fig.after_windows == 0 and not fig.held
    assert fig.drained_s is None
    assert fig.expected_recovered_s is None  # answers/s no more than arrivals
    text = "\n".join(describe(fig, 100.0))
    assert "had not worked the queue off by the step's end (30 s)" in text


def test_the_senders_lateness_is_its_own_figure() -> None:
    late = [
        RequestRecord(i, "e", i * 0.1, i * 0.1 + 0.3, i * 0.1 + 0.35, 200, None) for i in range(50)
    ]
    fig = step_figures(late, lend_s=1.0, serving_s=2.0, slo_ms=100.0)
    assert fig.send_lag_p99_ms == pytest.approx(300.0)
    assert fig.worst_p99_ms == pytest.approx(350.0)  # latency counts from the schedule
