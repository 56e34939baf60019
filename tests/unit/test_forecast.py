"""The rate forecast (bridge.policy.forecast) on literal series with an injected clock."""

from __future__ import annotations

import pytest

from bridge.policy import ModelSample
from bridge.policy.forecast import FULL_SLOPE_SAMPLES, forecast_rate, trend

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


def test_a_rising_slope_counts_only_as_far_as_the_samples_show_it() -> None:
    # three samples of a 4 req/s trickle, 2 s apart, Poisson-noisy: fitted alone, their
    # slope (0.5 req/s per s) extrapolated over 30 s said 20.2 req/s: noise (t = 3.5, where
    # Student's t with one degree of freedom is 12.7)
    trickle = series(3.0, 4.5, 5.0, step=2.0)
    level, slope = trend(trickle, NOW, 180) or (0.0, 0.0)
    assert slope == 0.0 and level == pytest.approx(12.5 / 3)
    assert forecast_rate(trickle, NOW, 180, 30) == pytest.approx(12.5 / 3)
    # a clean ramp keeps its whole slope; a noisy one some of it, the more samples the more
    assert shrink_of(series(10, 20, 30, step=2.0)) == pytest.approx(1.0)
    noisy = (10, 21, 29, 41, 50, 59, 71, 80, 91, 99)
    part = shrink_of(series(*noisy[:4], step=2.0))
    assert 0.0 < part < shrink_of(series(*noisy[:8], step=2.0)) < 1.0
    # from FULL_SLOPE_SAMPLES (10) samples on, the slope is whole however noisy
    assert FULL_SLOPE_SAMPLES == 10 and shrink_of(series(*noisy, step=2.0)) == 1.0
    flat = series(4, 3, 5, 4, 3, 6, 4, 5, 3, 6, step=2.0)
    assert (
        shrink_of(flat) == 1.0 and shrink_of(series(*[4, 3, 5, 4, 3, 6, 4, 5, 3], step=2.0)) == 0.0
    )


def test_a_falling_slope_is_kept_whole() -> None:
    # a model whose traffic stopped: the line falls to zero at once, where a mean would
    # hold its only replica for the whole window (scale to zero)
    stopped = series(2.0, 0.0, 0.0)
    level, slope = trend(stopped, NOW, 180) or (0.0, 0.0)
    assert slope == pytest.approx(-0.2) and level < 0.0
    assert forecast_rate(stopped, NOW, 180, 30) == 0.0


def shrink_of(samples: tuple[ModelSample, ...]) -> float:
    """The share of the plain least-squares slope that `trend` keeps."""
    xs = [s.at - NOW for s in samples]
    ys = [s.request_rate or 0.0 for s in samples]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    plain = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    fit = trend(samples, NOW, 180)
    assert fit is not None
    return fit[1] / plain
