"""`stb load`: open-loop load against Triton endpoints on this machine, with a live
progress line and a final report (rich tables, or JSON with `--json`).

Thin: builds the schedule (`arrivals`), runs it (`runner`), prints the summary
(`report`). Registered in `bridge.cli` as the `load` sub-command.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bridge.cli_text import fail
from bridge.load import arrivals, report, runner, stream_cli
from bridge.paths import traces_dir

load_app = typer.Typer(help="Open-loop load against Triton on this machine.")
out = Console()
err = Console(stderr=True)


def resolve_trace(path: Path) -> Path:
    """`path` as given if it exists, else the file of that name in `$STB_TRACES_DIR`."""
    folder = traces_dir()
    if path.exists() or path.is_absolute() or folder is None:
        return path
    return folder / path


def parse_shape(text: str) -> tuple[int, ...]:
    """`16` -> (16,), `1,16` -> (1, 16)."""
    try:
        dims = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise runner.LoadConfigError(f"bad shape {text!r}: expected e.g. 16 or 1,16") from None
    return dims


def build_schedule(
    *,
    rate: float | None,
    duration: float,
    seed: int | None,
    trace: Path | None,
    speedup: float,
    trace_start: float,
    max_requests: int,
) -> arrivals.Schedule:
    if (rate is None) == (trace is None):
        raise runner.LoadConfigError("give exactly one of --rate or --trace")
    if trace is not None:
        return arrivals.replay(
            arrivals.read_trace(resolve_trace(trace)),
            speedup=speedup,
            start_s=trace_start,
            duration_s=duration,
            max_requests=max_requests,
        )
    assert rate is not None
    return arrivals.poisson(rate, duration, seed, max_requests=max_requests)


async def _run_with_progress(
    schedule: arrivals.Schedule, config: runner.RunConfig, target: float | None, show: bool
) -> runner.RunResult:
    counters = runner.Counters()
    job = asyncio.create_task(runner.run(schedule, config, counters=counters, target_rate=target))
    progress = Progress(
        TextColumn("[bold]load[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not show,
    )
    recent: deque[tuple[float, int]] = deque()
    with progress:
        bar = progress.add_task("load", total=max(len(schedule.offsets), 1), line="")
        while not job.done():
            now = time.monotonic()
            recent.append((now, counters.sent))
            while recent and now - recent[0][0] > 1.0:
                recent.popleft()
            span = now - recent[0][0]
            current = (counters.sent - recent[0][1]) / span if span > 0 else 0.0
            progress.update(
                bar,
                completed=counters.sent + counters.dropped,
                total=max(counters.planned, 1),
                line=(
                    f"sent {counters.sent} ok {counters.ok} err {counters.errors} "
                    f"dropped {counters.dropped} in flight {counters.in_flight} "
                    f"rate {current:.1f}/s"
                ),
            )
            await asyncio.wait({job}, timeout=0.2)
    return job.result()


@load_app.callback(invoke_without_command=True)
def load(
    endpoint: Annotated[
        list[str],
        typer.Option(
            "--endpoint",
            "-e",
            help="Triton HTTP endpoint host[:port], loopback only; repeat for round robin.",
        ),
    ],
    model: Annotated[
        str | None, typer.Option(help="Model name (default busy; with --stream, smol).")
    ] = None,
    rate: Annotated[float | None, typer.Option(help="Poisson arrivals, requests/s.")] = None,
    duration: Annotated[
        float, typer.Option(help="Seconds of load (schedule length, and a hard bound).")
    ] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the Poisson schedule.")] = 0,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay an arrival trace (CSV: Azure LLM or Alibaba GPU format); a bare "
            "name is looked up in $STB_TRACES_DIR.",
        ),
    ] = None,
    speedup: Annotated[float, typer.Option(help="Play the trace this many times faster.")] = 1.0,
    trace_start: Annotated[
        float, typer.Option(help="Skip this many seconds (trace time) of the trace.")
    ] = 0.0,
    max_requests: Annotated[int, typer.Option(help="Hard bound on requests.")] = 10_000,
    concurrency_cap: Annotated[
        int, typer.Option(help="Most requests in flight; more are dropped and counted.")
    ] = 256,
    shape: Annotated[str, typer.Option(help="FP32 INPUT0 shape: 16 (busy), 1,16 (echo).")] = "16",
    timeout: Annotated[
        float | None,
        typer.Option(help="Per-request timeout, seconds (default 10; with --stream, 120)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress display.")] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Token streams to /generate_stream (an LLM) instead of /infer requests; "
            "reports TTFT, TPOT, tokens/s and broken streams.",
        ),
    ] = False,
    prompt_tokens: Annotated[
        int | None, typer.Option(help="--stream: every prompt this many tokens.")
    ] = None,
    output_tokens: Annotated[
        int | None, typer.Option(help="--stream: every answer asked for this many tokens.")
    ] = None,
    lengths: Annotated[
        Path | None,
        typer.Option(
            help="--stream: a trace whose ContextTokens and GeneratedTokens columns give "
            f"the lengths not fixed (default {stream_cli.DEFAULT_LENGTHS} in "
            "$STB_TRACES_DIR).",
        ),
    ] = None,
    prompt_scale: Annotated[
        float, typer.Option(help="--stream: multiply the trace's prompt lengths by this.")
    ] = 1.0,
    output_scale: Annotated[
        float, typer.Option(help="--stream: multiply the trace's output lengths by this.")
    ] = 1.0,
    max_prompt_tokens: Annotated[
        int, typer.Option(help="--stream: clip prompt lengths to this.")
    ] = 2048,
    max_output_tokens: Annotated[
        int, typer.Option(help="--stream: clip output lengths to this.")
    ] = 2048,
    prompt_overhead: Annotated[
        int,
        typer.Option(
            help="--stream: tokens the server adds around the prompt text (its chat "
            "template; 30 for the lab's smol), taken off each prompt's length."
        ),
    ] = 0,
    temperature: Annotated[float, typer.Option(help="--stream: sampling temperature.")] = 1.0,
) -> None:
    """Send open-loop load (Poisson at --rate, or a replayed --trace) and report achieved
    rate, latency percentiles and errors; with --stream, token streams and their TTFT,
    TPOT, tokens/s and broken streams."""
    if stream:
        _stream_load(
            endpoint=endpoint,
            model=model or stream_cli.DEFAULT_MODEL,
            schedule_args={
                "rate": rate,
                "duration": duration,
                "seed": seed,
                "trace": trace,
                "speedup": speedup,
                "trace_start": trace_start,
                "max_requests": max_requests,
            },
            options=stream_cli.StreamOptions(
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                lengths_trace=lengths,
                prompt_scale=prompt_scale,
                output_scale=output_scale,
                max_prompt_tokens=max_prompt_tokens,
                max_output_tokens=max_output_tokens,
                prompt_overhead=prompt_overhead,
                temperature=temperature,
            ),
            concurrency_cap=concurrency_cap,
            timeout=120.0 if timeout is None else timeout,
            as_json=as_json,
            quiet=quiet,
        )
        return
    stream_only = {
        "--prompt-tokens": prompt_tokens is not None,
        "--output-tokens": output_tokens is not None,
        "--lengths": lengths is not None,
        "--prompt-scale": prompt_scale != 1.0,
        "--output-scale": output_scale != 1.0,
        "--max-prompt-tokens": max_prompt_tokens != 2048,
        "--max-output-tokens": max_output_tokens != 2048,
        "--prompt-overhead": prompt_overhead != 0,
        "--temperature": temperature != 1.0,
    }
    given = [name for name, set_ in stream_only.items() if set_]
    if given:
        raise fail(f"{', '.join(given)}: only with --stream", code=2)
    try:
        config = runner.RunConfig(
            endpoints=tuple(runner.parse_endpoint(e) for e in endpoint),
            model=model or "busy",
            shape=parse_shape(shape),
            max_requests=max_requests,
            max_duration_s=duration,
            concurrency_cap=concurrency_cap,
            timeout_s=10.0 if timeout is None else timeout,
        )
        schedule = build_schedule(
            rate=rate,
            duration=duration,
            seed=seed,
            trace=trace,
            speedup=speedup,
            trace_start=trace_start,
            max_requests=max_requests,
        )
    except (runner.LoadConfigError, arrivals.ArrivalError) as exc:
        raise fail(exc, code=2) from None
    result = asyncio.run(_run_with_progress(schedule, config, rate, show=not quiet))
    summary = report.summarize(result)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        report.render(summary, out)


def _stream_load(
    *,
    endpoint: list[str],
    model: str,
    schedule_args: dict[str, Any],
    options: stream_cli.StreamOptions,
    concurrency_cap: int,
    timeout: float,
    as_json: bool,
    quiet: bool,
) -> None:
    """`stb load --stream`: the schedule as for requests, a length pair per request."""
    try:
        endpoints = tuple(runner.parse_endpoint(e) for e in endpoint)
        schedule = build_schedule(**schedule_args)
        trace_path = options.lengths_trace or Path(stream_cli.DEFAULT_LENGTHS)
        spec = stream_cli.length_spec(options, resolve_trace(trace_path))
        config = stream_cli.stream_config(
            options,
            spec,
            endpoints=endpoints,
            model=model,
            count=min(len(schedule.offsets), schedule_args["max_requests"]),
            seed=schedule_args["seed"],
            max_duration_s=schedule_args["duration"],
            concurrency_cap=concurrency_cap,
            timeout_s=timeout,
        )
    except (runner.LoadConfigError, arrivals.ArrivalError) as exc:
        raise fail(exc, code=2) from None
    stream_cli.run_and_report(
        schedule,
        config,
        target_rate=schedule_args["rate"],
        as_json=as_json,
        out=out,
        err=err,
        show=not quiet,
        describe=spec.describe(),
    )
