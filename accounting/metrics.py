"""Prometheus metrics of the ledger: `stb_ledger_gpu_hours_total{team,workload}` (all GPU
time booked so far; the capacity lines under their own workload: idle, down, ...) and
`stb_ledger_last_ingest_timestamp_seconds`; with budgets, `stb_budget_used_ratio{team}` and
`stb_budget_forecast_ratio{team}` of this month (deploy/prometheus/alerts.yml alerts on
them). A custom collector that reads the ledger at
most once per `ttl_s`, and the GPU-hours from the daily roll-up (`ledger_day`: a few
thousand cells, where the hourly rows of a year are millions).
Registered in the daemon's exporter registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

from accounting.buckets import MS_PER_HOUR
from accounting.budget import BudgetError, budget_status
from accounting.rates import RateBook, list_rates
from accounting.schema import IngestRun, LedgerDay

DAYS = LedgerDay.__table__  # type: ignore[attr-defined]
RUNS = IngestRun.__table__  # type: ignore[attr-defined]
log = logging.getLogger(__name__)


class LedgerCollector(Collector):
    def __init__(
        self, engine: Engine, ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._engine = engine
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._hours: list[tuple[str, str, float]] = []
        self._last_ingest: float | None = None
        self._budgets: list[tuple[str, float, float]] = []

    def invalidate(self) -> None:
        """Read the ledger again at the next scrape (called after an ingest)."""
        with self._lock:
            self._at = None

    def _refresh(self) -> None:
        now = self._clock()
        with self._lock:
            if self._at is not None and now - self._at < self._ttl:
                return
            with self._engine.connect() as conn:
                rows = conn.execute(
                    select(DAYS.c.team, DAYS.c.workload, func.sum(DAYS.c.gpu_ms)).group_by(
                        DAYS.c.team, DAYS.c.workload
                    )
                ).all()
                last = conn.scalar(select(func.max(RUNS.c.finished_at)))
            self._hours = [(t, w, int(ms) / MS_PER_HOUR) for t, w, ms in rows]
            self._last_ingest = last.timestamp() if last is not None else None
            try:
                rates = RateBook(list_rates(self._engine))
                self._budgets = [
                    (b.budget.team, b.used_ratio, b.forecast_ratio)
                    for b in budget_status(self._engine, datetime.now(UTC), rates=rates or None)
                ]
            except BudgetError as exc:  # a money budget without rates: said, not fatal
                log.warning("budget metrics: %s", exc)
                self._budgets = []
            self._at = now

    def collect(self) -> Iterator[Metric]:
        self._refresh()
        hours = CounterMetricFamily(
            "stb_ledger_gpu_hours",
            'GPU-hours booked in the ledger, by team and workload (idle: team "").',
            labels=["team", "workload"],
        )
        for team, workload, value in self._hours:
            hours.add_metric([team, workload], value)
        yield hours
        if self._budgets:
            used = GaugeMetricFamily(
                "stb_budget_used_ratio",
                "Share of the team's budget used this month (1 = all of it).",
                labels=["team"],
            )
            forecast = GaugeMetricFamily(
                "stb_budget_forecast_ratio",
                "Share of the team's budget it will have used at the month's end at its pace.",
                labels=["team"],
            )
            for team, u, f in self._budgets:
                used.add_metric([team], u)
                forecast.add_metric([team], f)
            yield used
            yield forecast
        if self._last_ingest is not None:
            yield GaugeMetricFamily(
                "stb_ledger_last_ingest_timestamp_seconds",
                "When the last ingest into the ledger finished (Unix time).",
                value=self._last_ingest,
            )
