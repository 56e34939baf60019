"""A short-horizon forecast of a model's request rate: the least-squares trend of its recent
samples, extrapolated over the lead time a lend needs. Pure (the samples carry their
times; tests pass literal series), called by `decide` once per model and tick.

Why a trend and not the last value: a lend takes tens of seconds to serve (Slurm start,
Triton start, model load). On a ramp, sizing for the rate seen now leaves the replica
late by exactly that lead; sizing for where the trend will be when it serves does not.
The trend is fitted over `window_s` so one noisy tick does not swing it; it is never
negative, and on a falling rate it is below the current rate (the caller takes the larger
of the two for lending, so a fall never delays a lend). A surge that comes every day at
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
    sx = sy = sxx = sxy = 0.0
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
    if n == 0:
        return None
    den = n * sxx - sx * sx
    if n < 3 or den <= 1e-9:
        return sy / n, 0.0
    slope = (n * sxy - sx * sy) / den
    level = (sy - slope * sx) / n  # the line at x = 0, i.e. at `now`
    return level, slope


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
