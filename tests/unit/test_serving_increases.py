"""The serving samples as increases: consecutive scrapes of one series subtract, a reset
counter counts from zero, series never mix, and a window takes the intervals that end in
it (reading the previous sample from before the window)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accounting.attribution import ServingPoint
from accounting.db import open_ledger
from accounting.samples import record_serving
from accounting.serving import Sample, increases, window_increases

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
M = timedelta(minutes=1)


def _s(inst: str, version: str, minute: int, us: float, req: float | None) -> Sample:
    return Sample("7", inst, "bert", version, T0 + minute * M, us, req)


def test_consecutive_samples_subtract_and_a_reset_counts_from_zero() -> None:
    got = list(
        increases(
            [
                _s("a", "1", 2, 500.0, 9.0),
                _s("a", "1", 0, 100.0, 1.0),
                _s("a", "1", 1, 300.0, 5.0),
                _s("a", "1", 3, 50.0, 2.0),  # reloaded: counts from zero
            ]
        )
    )
    assert [(i.start, i.end, i.compute_us, i.requests) for i in got] == [
        (T0, T0 + M, 200.0, 4.0),
        (T0 + M, T0 + 2 * M, 200.0, 4.0),
        (T0 + 2 * M, T0 + 3 * M, 50.0, 2.0),
    ]


def test_series_of_other_versions_and_instances_do_not_mix() -> None:
    got = list(
        increases(
            [
                _s("a", "1", 0, 100.0, 1.0),
                _s("a", "2", 1, 10.0, None),
                _s("b", "1", 1, 1000.0, 10.0),
                _s("a", "1", 1, 160.0, 4.0),
                _s("a", "2", 2, 30.0, 3.0),
            ]
        )
    )
    assert [(i.instance, i.version, i.compute_us, i.requests) for i in got] == [
        ("a", "1", 60.0, 3.0),
        ("a", "2", 20.0, None),  # one end lacks the request counter
    ]


def test_a_window_reads_the_sample_before_it(tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    pts = [
        ServingPoint("7", "a", "bert", T0 + k * 20 * M, 1000.0 * k, "1", 10.0 * k)
        for k in range(7)  # 10:00, 10:20, ... 12:00
    ]
    record_serving(engine, "c", pts)
    got = window_increases(engine, T0 + 60 * M, T0 + 120 * M, "c")
    # the intervals ending at 11:00, 11:20 and 11:40; the one ending at 12:00 is outside
    assert [(i.end, i.requests) for i in got] == [
        (T0 + 60 * M, 10.0),
        (T0 + 80 * M, 10.0),
        (T0 + 100 * M, 10.0),
    ]
    assert window_increases(engine, T0 + 60 * M, T0 + 120 * M, "other") == []


def test_the_serving_split_keeps_versions_apart() -> None:
    """Two versions of a model on one instance are two counters: interleaved, neither
    reads as a reset of the other (which would count the larger one twice)."""
    from accounting.attribution import compute_ms_by_bucket

    pts = [
        ServingPoint("7", "a", "bert", T0 + k * M, 1000.0 * k, "1", None) for k in range(1, 4)
    ] + [ServingPoint("7", "a", "bert", T0 + k * M, 10.0 * k, "2", None) for k in range(1, 4)]
    got = compute_ms_by_bucket(pts, T0, T0 + 10 * M)
    assert list(got) == [T0] and got[T0]["bert"] == pytest.approx(3.03)
