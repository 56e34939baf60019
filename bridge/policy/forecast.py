"""A short-horizon forecast of a model's request rate: the least-squares trend of its recent
samples, extrapolated over the lead time a lend needs. Pure (the samples carry their
times; tests pass literal series), called by `decide` once per model and tick.

Why a trend and not the last value: a lend takes tens of seconds to serve (Slurm start,
Triton start, model load). On a ramp, sizing for the rate seen now leaves the replica
late by exactly that lead; sizing for where the trend will be when it serves does not.
The trend is fitted over `window_s` so one noisy tick does not swing it; it is never
negative, and on a falling rate it is below the current rate (the caller takes the larger
of the two for lending, so a fall never delays a lend).

A rising slope fitted to fewer than `FULL_SLOPE_SAMPLES` samples (a daemon just
started, a model whose traffic just began) counts only as far as they show it
(`shrink`): there the slope of a flat but noisy rate is mostly noise, and extrapolated
over a lend's lead it lent on the lab for a 4 req/s trickle as if it were 24. Such a
slope is scaled by 1 - T^2 / t^2, where t is its t-statistic (the slope over its
standard error from the fit's residuals) and T the two-sided 95% point of Student's t
with n - 2 degrees of freedom, and by 0 where t <= T: a clean ramp keeps its slope (t is
large), noise keeps none, and the forecast moves continuously between the two. The level
is then the line with that slope through the samples' mean. From `FULL_SLOPE_SAMPLES`
samples on the slope is whole, as the noise of the fit is then small beside a lend's
lead: shrunk there too, a step in the traffic (no line, so a t of a few) was extrapolated
short and lent late (the simulator's ramps with 300 s loads: 0.45 pp fewer requests
within SLO after the first hour). A falling slope is always kept whole: it only lowers
the forecast below the current rate, and a model whose traffic stops returns its replica
as soon as the line says so (a mean there held a scale-to-zero model's only replica for
the whole window). A surge that comes every day at
the same hour is seen before it starts by the seasonal part (`bridge.policy.seasonal`):
the trend's level times the growth every remembered day had over the same lead.
"""

from __future__ import annotations

from collections.abc import Sequence

from bridge.policy.snapshot import ModelSample, Seasons


def trend(
    samples: Sequence[ModelSample], now: float, window_s: float
) -> tuple[float, float] | None:
    """(rate at `now` on the fitted line, slope per second) over the samples of the last
    `window_s` seconds with a rate; None without any. One or two samples: their mean, no
    slope."""
    n = 0
    sx = sy = sxx = sxy = syy = 0.0
    # `s.at - now < -window_s` is `now - s.at > window_s` exactly (a float difference
    # only changes sign when its operands swap): one subtraction per sample, not two
    oldest = -window_s
    for s in reversed(samples):
        x = s.at - now
        if x < oldest:
            break
        rate = s.request_rate
        if rate is None:
            continue
        n += 1
        sx += x
        sy += rate
        sxx += x * x
        sxy += x * rate
        syy += rate * rate
    if n == 0:
        return None
    den = n * sxx - sx * sx
    if n < 3 or den <= 1e-9:
        return sy / n, 0.0
    slope = (n * sxy - sx * sy) / den
    if slope > 0.0 and n < FULL_SLOPE_SAMPLES:
        slope *= shrink(n, slope, den, n * syy - sy * sy)
    level = (sy - slope * sx) / n  # the line at x = 0, i.e. at `now`
    return level, slope


#: from this many samples on, a rising slope counts whole (`shrink` below it)
FULL_SLOPE_SAMPLES = 10

#: Student's t, two-sided 95%, by degrees of freedom 1 to FULL_SLOPE_SAMPLES - 3 (the
#: fits `shrink` is asked about: 3 to FULL_SLOPE_SAMPLES - 1 samples)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365)
assert len(_T95) == FULL_SLOPE_SAMPLES - 3


def shrink(n: int, slope: float, den: float, yden: float) -> float:
    """The share of a rising `slope`, fitted to 3 <= `n` < FULL_SLOPE_SAMPLES samples,
    that the samples show:
    max(0, 1 - T^2 / t^2) (see the module docstring), from the fit's sums: `den` is
    n Sxx - Sx^2 and `yden` n Syy - Sy^2 (so n^2 times the residuals' sum of squares is
    yden - slope^2 den). 1 for a perfect line."""
    df = n - 2
    t95 = _T95[df - 1]
    # t^2 = slope^2 den df / (yden - slope^2 den); 1 - T^2/t^2 without dividing by the
    # residuals (0 for a perfect line)
    explained = slope * slope * den
    residual = max(0.0, yden - explained)
    return max(0.0, 1.0 - t95 * t95 * residual / (df * explained))


def forecast_rate(
    samples: Sequence[ModelSample],
    now: float,
    window_s: float,
    horizon_s: float,
    seasons: Seasons | None = None,
    model: str = "",
) -> float | None:
    """The rate the trend reaches `horizon_s` after `now` (never negative), or, with
    `seasons`, the trend's level now times `model`'s seasonal growth over that horizon
    (`bridge.policy.seasonal`) where that is higher; None without data."""
    fit = trend(samples, now, window_s)
    if fit is None:
        return None
    level, slope = fit
    rate = max(0.0, level + slope * horizon_s)
    if seasons is not None:
        grow = seasons.growth(model, now, horizon_s)
        if grow is not None:
            rate = max(rate, level * grow)
    return rate


#: weight of the newest lend in a pool's running estimate of its lend time
LEAD_WEIGHT = 0.2


def next_lead(estimate: float | None, seconds: float) -> float:
    """A pool's lend-time estimate after a lend that took `seconds` from the decision to
    its replica serving (an exponential average; the first lend sets it)."""
    if estimate is None:
        return seconds
    return (1.0 - LEAD_WEIGHT) * estimate + LEAD_WEIGHT * seconds
