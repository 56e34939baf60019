"""The summary of a load run: offered, sent and answered rates, latency p50/p95/p99/max,
errors by kind, overall and per endpoint; as rich tables or as a JSON-ready dict.

Pure: reads a `runner.RunResult`, does no I/O except `render` printing to a console.
Called by `bridge.load.cli` after a run, and by tests and benchmarks that assert on the
figures (`summarize`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.load.runner import RequestRecord, RunResult


@dataclass(frozen=True)
class LatencyStats:
    """Latency over the successful requests, in milliseconds; None when there were none.
    Percentiles interpolate linearly between order statistics (numpy's default)."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None


def latency_stats(seconds: Sequence[float]) -> LatencyStats:
    if not seconds:
        return LatencyStats(0, None, None, None, None, None)
    ms = np.asarray(seconds, dtype=float) * 1000.0
    p50, p95, p99 = (float(v) for v in np.percentile(ms, [50, 95, 99]))
    return LatencyStats(len(ms), p50, p95, p99, float(ms.max()), float(ms.mean()))


@dataclass(frozen=True)
class GroupReport:
    """Counts, rates and latency of one group of requests (all, or one endpoint).

    due: requests whose scheduled time came during the run; sent = due - dropped.
    offered_rate, sent_rate: due and sent per second of the run's window.
    ok_rate: successful answers per second from the start to the last answer.
    latency: from the scheduled time (includes any lateness in sending).
    service_latency: from the actual send.
    errors: sent requests that failed, by kind (dropped ones are counted apart).
    """

    name: str
    due: int
    sent: int
    ok: int
    dropped: int
    errors: dict[str, int]
    offered_rate: float
    sent_rate: float
    ok_rate: float
    latency: LatencyStats
    service_latency: LatencyStats


@dataclass(frozen=True)
class Report:
    source: str
    target_rate: float | None
    window_s: float
    elapsed_s: float
    stopped_by: str
    total: GroupReport
    endpoints: tuple[GroupReport, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _group(
    name: str, records: Sequence[RequestRecord], window_s: float, elapsed_s: float
) -> GroupReport:
    ok = [r for r in records if r.ok]
    dropped = sum(1 for r in records if r.error == "dropped")
    errors = Counter(r.error for r in records if r.error not in (None, "dropped"))
    return GroupReport(
        name=name,
        due=len(records),
        sent=len(records) - dropped,
        ok=len(ok),
        dropped=dropped,
        errors=dict(sorted((str(k), v) for k, v in errors.items())),
        offered_rate=len(records) / window_s if window_s > 0 else 0.0,
        sent_rate=(len(records) - dropped) / window_s if window_s > 0 else 0.0,
        ok_rate=len(ok) / elapsed_s if elapsed_s > 0 else 0.0,
        latency=latency_stats([r.latency_s for r in ok if r.latency_s is not None]),
        service_latency=latency_stats(
            [r.service_latency_s for r in ok if r.service_latency_s is not None]
        ),
    )


def summarize(result: RunResult) -> Report:
    """The report of one run."""
    by_endpoint: dict[str, list[RequestRecord]] = {str(e): [] for e in result.config.endpoints}
    for rec in result.records:
        by_endpoint.setdefault(rec.endpoint, []).append(rec)
    return Report(
        source=result.source,
        target_rate=result.target_rate,
        window_s=result.window_s,
        elapsed_s=result.elapsed_s,
        stopped_by=result.stopped_by,
        total=_group("all", result.records, result.window_s, result.elapsed_s),
        endpoints=tuple(
            _group(name, recs, result.window_s, result.elapsed_s)
            for name, recs in by_endpoint.items()
        ),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(report: Report, console: Console) -> None:
    """Print the report as two rich tables: rates and counts, then latency."""
    target = f"target {report.target_rate:g}/s, " if report.target_rate else ""
    console.print(
        f"[bold]{escape(report.source)}[/bold]: {target}window {report.window_s:.2f}s, "
        f"elapsed {report.elapsed_s:.2f}s, stopped by {escape(report.stopped_by)}",
        soft_wrap=True,
    )
    groups = (*report.endpoints, report.total) if len(report.endpoints) > 1 else (report.total,)
    counts = Table(title="requests")
    for col in ("endpoint", "due", "sent", "ok", "dropped", "errors"):
        counts.add_column(col, justify="left" if col in ("endpoint", "errors") else "right")
    for col in ("offered/s", "sent/s", "ok/s"):
        counts.add_column(col, justify="right")
    for g in groups:
        errs = ", ".join(f"{k}: {v}" for k, v in g.errors.items()) or "0"
        counts.add_row(
            escape(g.name),
            str(g.due),
            str(g.sent),
            str(g.ok),
            str(g.dropped),
            escape(errs),
            f"{g.offered_rate:.1f}",
            f"{g.sent_rate:.1f}",
            f"{g.ok_rate:.1f}",
        )
    console.print(counts)
    lat = Table(title="latency of ok requests, ms")
    lat.add_column("endpoint")
    lat.add_column("measured from")
    for col in ("p50", "p95", "p99", "max", "mean"):
        lat.add_column(col, justify="right")
    for g in groups:
        for label, st in (("scheduled time", g.latency), ("send", g.service_latency)):
            lat.add_row(
                escape(g.name) if label == "scheduled time" else "",
                label,
                *(_ms(v) for v in (st.p50_ms, st.p95_ms, st.p99_ms, st.max_ms, st.mean_ms)),
            )
    console.print(lat)
