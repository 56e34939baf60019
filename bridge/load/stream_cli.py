"""`stb load --stream`: the token-stream half of `stb load` (the options are `bridge.load.cli`'s;
this module builds the lengths and the run, shows progress and prints the report).

Thin: lengths (`lengths`), the run (`streams`), the summary (`stream_report`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bridge.load import arrivals, lengths, stream_report, streams
from bridge.load.runner import Counters, Endpoint

DEFAULT_LENGTHS = "azure_llm_conv_2023.csv"
"""The trace whose token columns give the lengths when neither is fixed (a bare name is
looked up in $STB_TRACES_DIR)."""
DEFAULT_MODEL = "smol"


@dataclass(frozen=True)
class StreamOptions:
    """The stream options of `stb load` as given (see its --help)."""

    prompt_tokens: int | None
    output_tokens: int | None
    lengths_trace: Path | None
    prompt_scale: float
    output_scale: float
    max_prompt_tokens: int
    max_output_tokens: int
    prompt_overhead: int
    temperature: float


def length_spec(options: StreamOptions, trace_path: Path | None) -> lengths.LengthSpec:
    """The lengths as the options say; the trace read only when a length is not fixed."""
    trace = None
    if options.prompt_tokens is None or options.output_tokens is None:
        if trace_path is None:
            raise arrivals.ArrivalError(
                f"no token lengths: give --prompt-tokens and --output-tokens, --lengths "
                f"FILE, or set $STB_TRACES_DIR to a folder holding {DEFAULT_LENGTHS}"
            )
        trace = lengths.read_token_trace(trace_path)
    return lengths.LengthSpec(
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
        trace=trace,
        prompt_scale=options.prompt_scale,
        output_scale=options.output_scale,
        # a trace's prompt shorter than what the server wraps around it cannot be sent
        min_prompt_tokens=options.prompt_overhead + 1,
        max_prompt_tokens=max(options.max_prompt_tokens, options.prompt_overhead + 1),
        max_output_tokens=options.max_output_tokens,
    )


def stream_config(
    options: StreamOptions,
    spec: lengths.LengthSpec,
    *,
    endpoints: tuple[Endpoint, ...],
    model: str,
    count: int,
    seed: int,
    max_duration_s: float,
    concurrency_cap: int,
    timeout_s: float,
) -> streams.StreamConfig:
    return streams.StreamConfig(
        endpoints=endpoints,
        model=model,
        lengths=lengths.draw_lengths(spec, max(count, 1), seed),
        prompt_overhead=options.prompt_overhead,
        temperature=options.temperature,
        seed=seed,
        max_requests=max(count, 1),
        max_duration_s=max_duration_s,
        concurrency_cap=concurrency_cap,
        timeout_s=timeout_s,
    )


async def _with_progress(
    schedule: arrivals.Schedule,
    config: streams.StreamConfig,
    target: float | None,
    console: Console,
    show: bool,
) -> streams.StreamResult:
    counters = Counters()
    job = asyncio.create_task(
        streams.run_streams(schedule, config, counters=counters, target_rate=target)
    )
    progress = Progress(
        TextColumn("[bold]streams[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show,
    )
    with progress:
        bar = progress.add_task("streams", total=max(len(schedule.offsets), 1), line="")
        while not job.done():
            progress.update(
                bar,
                completed=counters.ok + counters.errors + counters.dropped,
                total=max(counters.planned, 1),
                line=(
                    f"sent {counters.sent} ok {counters.ok} not ok {counters.errors} "
                    f"dropped {counters.dropped} open {counters.in_flight}"
                ),
            )
            await asyncio.wait({job}, timeout=0.2)
    return job.result()


def run_and_report(
    schedule: arrivals.Schedule,
    config: streams.StreamConfig,
    *,
    target_rate: float | None,
    as_json: bool,
    out: Console,
    err: Console,
    show: bool,
    describe: str,
) -> stream_report.StreamReport:
    """Run the streams, print the report (tables or JSON); return it."""
    result = asyncio.run(_with_progress(schedule, config, target_rate, err, show))
    summary = stream_report.summarize_streams(result)
    if as_json:
        print(json.dumps({"lengths": describe, **summary.to_dict()}, indent=2))
    else:
        out.print(f"lengths: {describe}", soft_wrap=True)
        stream_report.render(summary, out)
    return summary
