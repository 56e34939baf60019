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
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bridge.cli_text import fail
from bridge.load import arrivals, report, runner
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
    model: Annotated[str, typer.Option(help="Model name.")] = "busy",
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
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress display.")] = False,
) -> None:
    """Send open-loop load (Poisson at --rate, or a replayed --trace) and report achieved
    rate, latency percentiles and errors."""
    try:
        config = runner.RunConfig(
            endpoints=tuple(runner.parse_endpoint(e) for e in endpoint),
            model=model,
            shape=parse_shape(shape),
            max_requests=max_requests,
            max_duration_s=duration,
            concurrency_cap=concurrency_cap,
            timeout_s=timeout,
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
