"""How fast the demo's load step was met (`ScenarioResult.step_times`), from literal
request records: the lend, the replica serving, and the first second from which every
5 s window's p99 stays under the SLO."""

from __future__ import annotations

from bridge.lab.showcase import ScenarioResult
from bridge.load.runner import RequestRecord

STEP = 1_800_000_000.0


def record(i: int, at: float, latency: float, error: str | None = None) -> RequestRecord:
    return RequestRecord(i, "127.0.0.1:8080", at, at, at + latency, 200, error)


def test_step_times_find_the_last_slow_window() -> None:
    records = [record(i, i * 0.1, 0.02) for i in range(100)]  # 10 s of fast answers
    records += [record(100 + i, 10 + i * 0.1, 2.0) for i in range(50)]  # 10-15 s: slow
    records += [record(150 + i, 15 + i * 0.1, 0.03) for i in range(100)]  # fast again
    records.append(record(999, 20.0, 30.0, error="timeout"))  # failures are not latency
    res = ScenarioResult(
        heavy_records=records, step_at=STEP, lend_at=STEP + 2.0, serving_at=STEP + 9.5
    )
    times = res.step_times(100.0)
    assert times is not None
    assert (times.lend_s, times.serving_s) == (2.0, 9.5)
    assert times.p99_under_slo_s == 15.0  # the 10-15 s window was the last over the SLO
    assert times.worst_p99_ms == 2000.0
    fast = ScenarioResult(
        heavy_records=records[:100], step_at=STEP, lend_at=STEP + 2.0, serving_at=STEP + 9.5
    )
    assert fast.step_times(100.0).p99_under_slo_s == 0.0  # type: ignore[union-attr]
    assert ScenarioResult().step_times(100.0) is None
