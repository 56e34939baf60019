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
    ramp = series(10, 15, 20, 25, 30)  # +1 req/s per second
    assert trend(ramp, NOW, 60) == pytest.approx((30.0, 1.0))
    assert forecast_rate(ramp, NOW, 60, 30) == pytest.approx(60.0)


def test_a_flat_series_forecasts_its_level_and_noise_averages_out() -> None:
    assert forecast_rate(series(40, 40, 40, 40), NOW, 60, 30) == pytest.approx(40.0)
    noisy = series(30, 50, 30, 50, 30, 50, 30, 50, 30, 50, 30, 50, 40)
    level, slope = trend(noisy, NOW, 60) or (0.0, 0.0)
    assert abs(slope) < 0.2 and 35 < level < 45


def test_the_window_bounds_what_is_fitted() -> None:
    # an old ramp, then flat for the last 20 s: a 20 s window sees no trend
    s = series(0, 10, 20, 30, 40, 40, 40, 40, 40)
    assert forecast_rate(s, NOW, 20, 30) == pytest.approx(40.0)
    assert forecast_rate(s, NOW, 60, 30) > 40.0


def test_never_negative_and_no_data_is_none() -> None:
    falling = series(50, 40, 30, 20, 10)
    assert forecast_rate(falling, NOW, 60, 30) == 0.0
    assert forecast_rate(series(None, None), NOW, 60, 30) is None
    assert forecast_rate((), NOW, 60, 30) is None
    # gaps are skipped; one or two samples give their mean, no slope
    assert forecast_rate(series(None, 10, None), NOW, 60, 30) == 10.0
    assert forecast_rate(series(10, 20), NOW, 60, 30) == 15.0
