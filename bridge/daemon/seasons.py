"""The models' rate history kept for the seasonal forecast (`bridge.policy.seasonal`):
the deciding pass's `SeasonLog` (in `LendMemory`) written to the bridge's database as its
5-minute buckets close, and read back when the daemon starts, so a restart or a failover
keeps the days learned. The reconciler holds one `SeasonKeeper`.

A failed write is logged and the buckets kept for the next pass (a pass never fails for
it); a deposed instance's write is refused by the fence and dropped. Buckets older than
the days the forecast reads are pruned once an hour.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from bridge.leases.leader import Fenced
from bridge.leases.rates import RateStore
from bridge.policy.seasonal import BUCKET_S, DAY_BUCKETS, SeasonLog

log = logging.getLogger(__name__)

#: seconds between two prunes of the stored history
PRUNE_EVERY_S = 3600.0
#: closed buckets kept in memory while the database refuses them (a few hours' worth at
#: a site's thousands of models), the oldest dropped first
PENDING_MAX = 200_000


class SeasonKeeper:
    def __init__(self, seasons: SeasonLog | None, store: RateStore | None) -> None:
        self.seasons = seasons
        self.store = store
        self._pending: list[tuple[str, float, float]] = []
        self._pruned_at = 0.0

    def recall(self, now: datetime) -> None:
        """The buckets stored before this process started (the last `days` days)."""
        if self.seasons is None or self.store is None:
            return
        since = now - timedelta(seconds=(self.seasons.days * DAY_BUCKETS + 1) * BUCKET_S)
        try:
            rows = self.store.since(since)
        except SQLAlchemyError as exc:
            log.warning("model rate history not read back: %s", exc)
            return
        self.seasons.load((m, round(start / BUCKET_S), rate) for m, start, rate in rows)

    def write(self, now: datetime) -> None:
        """The buckets closed since the last pass, into the database; an hourly prune."""
        if self.seasons is None:
            return
        closed = self.seasons.drain()
        if self.store is None:
            return
        self._pending.extend((m, b * BUCKET_S, rate) for m, b, rate in closed)
        del self._pending[:-PENDING_MAX]
        t = now.timestamp()
        try:
            if self._pending:
                self.store.record(self._pending)
                self._pending = []
            if t - self._pruned_at >= PRUNE_EVERY_S:
                keep_s = (self.seasons.days * DAY_BUCKETS + 2) * BUCKET_S
                self.store.prune(now - timedelta(seconds=keep_s))
                self._pruned_at = t
        except (SQLAlchemyError, Fenced) as exc:
            kept = len(self._pending)
            log.warning("model rate history not stored (%d buckets kept): %s", kept, exc)


__all__ = ["SeasonKeeper"]
