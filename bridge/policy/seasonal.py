"""The seasonal part of the rate forecast: what each model's rate did at this time of day
on earlier days, so that a surge that comes every day at the same time (the morning's
logins, a nightly batch of evaluations) is lent for before it starts, not once the trend
has seen it. Pure: the memory (`SeasonLog`, fed one sample at a time by the pass that
decides: the daemon's `LendMemory`, the simulator's engine) and the rule (`growth`) over
literal per-bucket rates.

The rule, per model, at `now` with a lead of `horizon_s` (`decide` reads it beside the
trend, `bridge.policy.forecast`):
- Rates are kept as means per `BUCKET_S` (5 minutes), by bucket index (epoch seconds //
  `BUCKET_S`), for `seasonal_days` days.
- On each earlier day d (1..`seasonal_days`), the growth that day saw from this time of
  day to `horizon_s` later: the highest bucket mean from this bucket to the one holding
  `now + horizon_s`, over this bucket's mean.
- The model's growth is the smallest of those days' (a surge counts only if every day
  remembered had it: one day's random burst at this hour is not a season), and only
  with at least `MIN_DAYS` days remembered; None otherwise, or below 1 (a fall is left
  to the trend).
- The forecast is the trend's level now times that growth; `decide` takes the larger of
  it and the trend's own forecast. A return reads the same forecast (`_demand`), so a
  lease is not given back minutes before the day's surge.

Why means per 5 minutes: a season is a shape over tens of minutes; per-tick samples are
noise at that scale, and 288 buckets a day per model keeps a site's thousands of models
in memory (and in the database: `bridge.leases.rates`) at a few MB a day.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

#: seconds of one bucket of the rate history
BUCKET_S = 300.0
#: buckets a day
DAY_BUCKETS = round(86400.0 / BUCKET_S)
#: the fewest earlier days whose shape makes a season
MIN_DAYS = 2
#: a bucket mean below this (req/s) is no base to grow from: the growth from near-silence
#: is not a proportion
MIN_BASE = 1e-3


def bucket_of(at: float) -> int:
    """The index of the bucket holding `at` (epoch seconds)."""
    return math.floor(at / BUCKET_S)


def growth(rates: Mapping[int, float], now: float, horizon_s: float, days: int) -> float | None:
    """The model's seasonal growth over the next `horizon_s` (the module docstring's rule)
    from its bucket means `rates` (bucket index -> req/s); None without a season (fewer
    than `MIN_DAYS` earlier days with this bucket and those ahead of it remembered, or no
    growth)."""
    here = bucket_of(now)
    ahead = max(0, bucket_of(now + max(0.0, horizon_s)) - here)
    smallest: float | None = None
    seen = 0
    for d in range(1, days + 1):
        then = here - d * DAY_BUCKETS
        here_then = rates.get(then)
        if here_then is None:
            continue
        # the lower of this bucket and the one before: a bucket holding the rise's start
        # averages part of it in, and the level now is the rate before the rise
        before = rates.get(then - 1)
        base = here_then if before is None else min(before, here_then)
        if base < MIN_BASE:
            continue
        highest = here_then
        complete = True
        for k in range(1, ahead + 1):
            r = rates.get(then + k)
            if r is None:
                complete = False
                break
            highest = max(highest, r)
        if not complete:
            continue
        seen += 1
        ratio = highest / base
        smallest = ratio if smallest is None else min(smallest, ratio)
    if seen < MIN_DAYS or smallest is None or smallest <= 1.0:
        return None
    return smallest


class SeasonLog:
    """Per model, its closed bucket means of the last `days` days, fed one sample at a
    time; the closed buckets not yet handed to a store are kept for `drain`."""

    def __init__(self, days: int) -> None:
        self.days = days
        self._keep = days * DAY_BUCKETS + 1
        self._rates: dict[str, dict[int, float]] = {}
        #: per model, the bucket under way: (index, sum, count)
        self._open: dict[str, tuple[int, float, int]] = {}
        self._closed: list[tuple[str, int, float]] = []
        #: (model, bucket, horizon bucket count) -> growth: a model's growth changes only
        #: with the bucket, so each tick after the first reads it from here
        self._memo: dict[tuple[str, int, int], float | None] = {}
        self._memo_bucket = -1
        self._expired_at = -1

    def add(self, model: str, at: float, rate: float | None) -> None:
        """One sample of `model`'s request rate at `at` (None: no rate, left out)."""
        if rate is None or self.days <= 0:
            return
        b = bucket_of(at)
        cur = self._open.get(model)
        if cur is None or b > cur[0]:
            if cur is not None:
                self._close(model, cur)
            self._open[model] = (b, rate, 1)
        elif b == cur[0]:
            self._open[model] = (b, cur[1] + rate, cur[2] + 1)

    def _close(self, model: str, cur: tuple[int, float, int]) -> None:
        b, total, n = cur
        mean = total / n
        rates = self._rates.setdefault(model, {})
        rates[b] = mean
        self._closed.append((model, b, mean))
        oldest = b - self._keep
        if len(rates) > self._keep:
            for old in [k for k in rates if k <= oldest]:
                del rates[old]

    def load(self, rows: Iterable[tuple[str, int, float]]) -> None:
        """Bucket means stored before (model, bucket index, req/s): a restart keeps its
        seasons. Those older than `days` are left out."""
        rows = list(rows)
        if not rows:
            return
        newest = max(b for _, b, _ in rows)
        for model, b, mean in rows:
            if b > newest - self._keep:
                self._rates.setdefault(model, {})[b] = mean
        self._memo.clear()

    def drain(self) -> list[tuple[str, int, float]]:
        """The buckets closed since the last drain (model, bucket index, mean): a store's
        to write."""
        out, self._closed = self._closed, []
        return out

    def expire(self, now: float) -> None:
        """Drop the models with no bucket within the kept days (retired, renamed): once a
        bucket, however often called. A model merely without a sample for a while keeps
        its days."""
        here = bucket_of(now)
        if here == self._expired_at:
            return
        self._expired_at = here
        oldest = here - self._keep
        for m in [m for m, rates in self._rates.items() if max(rates, default=oldest) <= oldest]:
            del self._rates[m]
            self._open.pop(m, None)

    def growth(self, model: str, now: float, horizon_s: float) -> float | None:
        """`growth` of `model` from what this log holds (memoised per bucket)."""
        rates = self._rates.get(model)
        if rates is None:
            return None
        here = bucket_of(now)
        if here != self._memo_bucket:
            self._memo.clear()
            self._memo_bucket = here
        key = (model, here, bucket_of(now + max(0.0, horizon_s)) - here)
        if key not in self._memo:
            self._memo[key] = growth(rates, now, horizon_s, self.days)
        return self._memo[key]

    def rates(self, model: str) -> Mapping[int, float]:
        """`model`'s closed bucket means (a read-only view for tests and reports)."""
        return self._rates.get(model, {})

    def models(self) -> Iterator[str]:
        return iter(self._rates)
