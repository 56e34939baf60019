"""The summary of a load run: offered, sent and answered rates, latency p50/p95/p99/max,
errors by kind, overall and per endpoint; as rich tables or as a JSON-ready dict.

Pure: reads a `runner.RunResult`, does no I/O except `render` printing to a console.
Called by `bridge.load.cli` after a run, and by tests and benchmarks that assert on the
figures (`summarize`). The report of token streams (`stream_report`) shares its run
summary, heading and latency figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.load.runner import Played, RequestRecord, RunResult


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

    def cells(self) -> tuple[str, ...]:
        """The figures as a table's cells, in `LATENCY_COLUMNS`' order ("-": none)."""
        values = (self.p50_ms, self.p95_ms, self.p99_ms, self.max_ms, self.mean_ms)
        return tuple("-" if v is None else f"{v:.1f}" for v in values)


#: the columns of `LatencyStats.cells`
LATENCY_COLUMNS = ("p50", "p95", "p99", "max", "mean")


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
class RunSummary:
    """What a load report says first, of the run as a whole (`runner.Played`'s figures):
    the schedule's source, the target rate, the window played, the time taken, what
    stopped it. `Report` (requests) and `stream_report.StreamReport` (streams) go on."""

    source: str
    target_rate: float | None
    window_s: float
    elapsed_s: float
    stopped_by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_fields(result: Played[Any, Any]) -> dict[str, Any]:
    """`RunSummary`'s fields of a report of `result`: the run's own."""
    return {f.name: getattr(result, f.name) for f in fields(RunSummary)}


def render_heading(report: RunSummary, console: Console) -> None:
    """Print the line above a report's tables: the run as a whole."""
    target = f"target {report.target_rate:g}/s, " if report.target_rate else ""
    console.print(
        f"[bold]{escape(report.source)}[/bold]: {target}window {report.window_s:.2f}s, "
        f"elapsed {report.elapsed_s:.2f}s, stopped by {escape(report.stopped_by)}",
        soft_wrap=True,
    )


@dataclass(frozen=True)
class Report(RunSummary):
    """One run of requests: the whole run, then its requests all together and per
    endpoint."""

    total: GroupReport
    endpoints: tuple[GroupReport, ...]


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
        **run_fields(result),
        total=_group("all", result.records, result.window_s, result.elapsed_s),
        endpoints=tuple(
            _group(name, recs, result.window_s, result.elapsed_s)
            for name, recs in by_endpoint.items()
        ),
    )


def render(report: Report, console: Console) -> None:
    """Print the report as two rich tables: rates and counts, then latency."""
    render_heading(report, console)
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
    for col in LATENCY_COLUMNS:
        lat.add_column(col, justify="right")
    for g in groups:
        for label, st in (("scheduled time", g.latency), ("send", g.service_latency)):
            lat.add_row(escape(g.name) if label == "scheduled time" else "", label, *st.cells())
    console.print(lat)
