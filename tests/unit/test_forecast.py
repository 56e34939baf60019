"""The rate forecast (bridge.policy.forecast) on literal series with an injected clock."""

from __future__ import annotations

import pytest

from bridge.policy import ModelSample
from bridge.policy.forecast import forecast_rate, trend

NOW = 1_800_000_000.0


def series(*rates: float | None, step: float = 5.0) -> tuple[ModelSample, ...]:
    n = len(rates)
    return tuple(ModelSample(NOW - (n - 1 - i) * step, None, r) for i, r in enumerate(rates))


def test_a_line_is_extrapolated_exactly() -> None:
    ramp = series(10, 15, 20, 25, 30)  # +1 req/s per second, over 20 s
    assert trend(ramp, NOW, 40) == pytest.approx((30.0, 1.0))
    assert forecast_rate(ramp, NOW, 40, 30) == pytest.approx(60.0)


def test_no_slope_until_the_samples_span_half_the_window() -> None:
    # a daemon that has just started: three 2 s samples of a trickle's noise
    young = series(2, 4, 6, step=2.0)
    assert trend(young, NOW, 180) == pytest.approx((4.0, 0.0))
    assert forecast_rate(young, NOW, 180, 60) == pytest.approx(4.0)
    # the same slope over half the window counts
    grown = series(*(2.0 + i for i in range(46)), step=2.0)  # 90 s of +0.5 req/s per s
    level, slope = trend(grown, NOW, 180) or (0.0, 0.0)
    assert slope == pytest.approx(0.5) and level == pytest.approx(47.0)
    assert trend(grown[1:], NOW, 180) == pytest.approx((25.0, 0.0))  # 88 s: the mean


def test_a_flat_series_forecasts_its_level_and_noise_averages_out() -> None:
    assert forecast_rate(series(40, 40, 40, 40), NOW, 60, 30) == pytest.approx(40.0)
    noisy = series(30, 50, 30, 50, 30, 50, 30, 50, 30, 50, 30, 50, 40)
    level, slope = trend(noisy, NOW, 60) or (0.0, 0.0)
    assert abs(slope) < 0.2 and 35 < level < 45


def test_the_window_bounds_what_is_fitted() -> None:
    # an old ramp, then flat for the last 20 s: a 20 s window sees no trend
    s = series(0, 10, 20, 30, 40, 40, 40, 40, 40)
    assert forecast_rate(s, NOW, 20, 30) == pytest.approx(40.0)
    assert forecast_rate(s, NOW, 60, 30) > 40.0  # 40 s of samples: over half of 60 s


def test_never_negative_and_no_data_is_none() -> None:
    falling = series(50, 40, 30, 20, 10)
    assert forecast_rate(falling, NOW, 40, 30) == 0.0
    assert forecast_rate(series(None, None), NOW, 60, 30) is None
    assert forecast_rate((), NOW, 60, 30) is None
    # gaps are skipped; one or two samples give their mean, no slope
    assert forecast_rate(series(None, 10, None), NOW, 60, 30) == 10.0
    assert forecast_rate(series(10, 20), NOW, 60, 30) == 15.0
