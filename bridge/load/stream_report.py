"""The summary of a run of token streams: TTFT and TPOT percentiles (client side), tokens
per second in and out, streams ok, broken, failed and dropped, how close the prompts
landed to their targets and how many answers ended before their output length; as rich
tables or a JSON-ready dict.

Pure: reads a `streams.StreamResult`, does no I/O except `render` printing to a console.
Called by `stb load --stream` after a run, and by tests and benches that assert on the
figures (`summarize_streams`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.load.report import (
    LATENCY_COLUMNS,
    LatencyStats,
    RunSummary,
    latency_stats,
    render_heading,
    run_fields,
)
from bridge.load.streams import StreamResult


@dataclass(frozen=True)
class StreamReport(RunSummary):
    """One run of streams: the whole run (`report.RunSummary`), then its streams.

    due, sent, ok, broken, failed, dropped: streams by outcome (sent = due - dropped).
    errors: broken and failed streams by cause ("broken: cut", "failed: http_503", ...).
    ttft: over ok streams, from the scheduled time; service_ttft: from the send.
    tpot: each ok stream's mean gap between tokens after the first (streams of >= 2).
    e2e: ok streams, scheduled time to the stream's end.
    tokens_in: prompt tokens of the sent streams (the server's count where it gave one,
        else the target); tokens_out: token events received, broken streams included.
    tokens_in_per_s: tokens_in per second of the window played; tokens_out_per_s:
        tokens_out per second from the start to the last event.
    prompt_target_mean, prompt_counted_mean: the sent prompts' mean target and, over
        the streams whose server counted them, the mean of the server's count (None
        without one).
    output_target: output tokens asked for by the ok streams; short_answers: ok streams
        that ended before their output length (the model's end of sequence).
    """

    due: int
    sent: int
    ok: int
    broken: int
    failed: int
    dropped: int
    errors: dict[str, int]
    ttft: LatencyStats
    service_ttft: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    tokens_in: int
    tokens_out: int
    tokens_in_per_s: float
    tokens_out_per_s: float
    prompt_target_mean: float | None
    prompt_counted_mean: float | None
    output_target: int
    short_answers: int


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_streams(result: StreamResult) -> StreamReport:
    """The report of one run of streams."""
    recs = result.records
    ok = [r for r in recs if r.ok]
    sent = [r for r in recs if r.outcome != "dropped"]
    errors = Counter(f"{r.outcome}: {r.error}" for r in recs if r.outcome in ("broken", "failed"))
    counted = [r.prompt_counted for r in sent if r.prompt_counted is not None]
    tokens_in = sum(r.prompt_tokens for r in sent)
    tokens_out = sum(r.tokens for r in recs)
    return StreamReport(
        **run_fields(result),
        due=len(recs),
        sent=len(sent),
        ok=len(ok),
        broken=sum(1 for r in recs if r.outcome == "broken"),
        failed=sum(1 for r in recs if r.outcome == "failed"),
        dropped=len(recs) - len(sent),
        errors=dict(sorted(errors.items())),
        ttft=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        service_ttft=latency_stats([r.service_ttft_s for r in ok if r.service_ttft_s is not None]),
        tpot=latency_stats([r.tpot_s for r in ok if r.tpot_s is not None]),
        e2e=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_in_per_s=tokens_in / result.window_s if result.window_s > 0 else 0.0,
        tokens_out_per_s=tokens_out / result.elapsed_s if result.elapsed_s > 0 else 0.0,
        prompt_target_mean=_mean([r.prompt_target for r in sent]),
        prompt_counted_mean=_mean(counted),
        output_target=sum(r.output_target for r in ok),
        short_answers=sum(1 for r in ok if r.tokens < r.output_target),
    )


def render(report: StreamReport, console: Console) -> None:
    """Print the report: a line of counts and rates, then TTFT, TPOT and e2e."""
    render_heading(report, console)
    counts = Table(title="streams")
    for col in ("due", "sent", "ok", "broken", "failed", "dropped", "tokens in/s",
                "tokens out/s"):  # fmt: skip
        counts.add_column(col, justify="right")
    counts.add_row(
        *(str(v) for v in (report.due, report.sent, report.ok, report.broken, report.failed,
                           report.dropped)),
        f"{report.tokens_in_per_s:.1f}",
        f"{report.tokens_out_per_s:.1f}",
    )  # fmt: skip
    console.print(counts)
    if report.errors:
        console.print(
            "errors: " + escape(", ".join(f"{k} x{v}" for k, v in report.errors.items())),
            soft_wrap=True,
        )
    lat = Table(title="ok streams, ms")
    lat.add_column("")
    for col in LATENCY_COLUMNS:
        lat.add_column(col, justify="right")
    rows = (
        ("TTFT from scheduled time", report.ttft),
        ("TTFT from send", report.service_ttft),
        ("TPOT (mean gap per stream)", report.tpot),
        ("end to end", report.e2e),
    )
    for label, st in rows:
        lat.add_row(label, *st.cells())
    console.print(lat)
    counted = (
        f", server counted {report.prompt_counted_mean:.1f}"
        if report.prompt_counted_mean is not None
        else ""
    )
    target = "-" if report.prompt_target_mean is None else f"{report.prompt_target_mean:.1f}"
    console.print(
        f"tokens: in {report.tokens_in}, out {report.tokens_out} (ok streams asked "
        f"{report.output_target}; {report.short_answers} ended before their length); "
        f"prompt mean target {target}{counted}",
        soft_wrap=True,
    )
