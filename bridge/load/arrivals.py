"""Arrival schedules for the load generator: when each request is due, in seconds from
the start of a run. Pure: no clock, no network; the only I/O is `read_trace` reading a file.

Two sources, both bounded in count:
- `poisson(rate, duration, seed)`: a Poisson process (exponential inter-arrival times).
- a replayed arrival trace in the public Azure LLM / Alibaba GPU formats (`parse_trace` on its
  lines or `read_trace` on a path, then `replay` to shift, speed up and cap it).

Called by `bridge.load.cli` to build the schedule that `bridge.load.runner` sends, and by
tests and benchmarks that need a reproducible schedule.
"""

from __future__ import annotations

import calendar
import csv
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO, TypeVar

import numpy as np

MAX_ARRIVALS = 1_000_000
"""Hard ceiling on the requests in one schedule, whatever the options say: the runner
keeps one record per request, and a million is already hours of load at the lab's rates."""

NS_PER_S = 1_000_000_000

T = TypeVar("T")


class ArrivalError(ValueError):
    """Bad schedule input: a rate, duration or cap out of range, or a trace that cannot be
    read (unknown columns, no rows, an unparseable timestamp). The message names what."""


@dataclass(frozen=True)
class Schedule:
    """When each request is due.

    offsets: seconds from the start of the run, non-decreasing, at most MAX_ARRIVALS.
    window_s: the span the schedule covers, in seconds (the requested duration, or the
        replayed stretch of a trace); offered rate = len(offsets) / window_s.
    source: one line saying where the schedule came from, for reports.
    """

    offsets: tuple[float, ...]
    window_s: float
    source: str

    @property
    def offered_rate(self) -> float:
        """Requests per second the schedule asks for."""
        return len(self.offsets) / self.window_s if self.window_s > 0 else 0.0


def _check_cap(max_requests: int | None) -> int:
    if max_requests is None:
        return MAX_ARRIVALS
    if max_requests < 1:
        raise ArrivalError(f"max_requests must be at least 1, got {max_requests}")
    return min(max_requests, MAX_ARRIVALS)


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ArrivalError(f"{name} must be a finite number > 0, got {value!r}")


def poisson(
    rate_per_s: float,
    duration_s: float,
    seed: int | None = None,
    *,
    max_requests: int | None = None,
) -> Schedule:
    """Arrivals of a Poisson process of `rate_per_s` over `[0, duration_s)`.

    Inter-arrival times are exponential with mean 1/rate, drawn from numpy's PCG64 seeded
    with `seed` (same seed, same schedule). At most `max_requests` (and MAX_ARRIVALS)
    arrivals; when the cap cuts the schedule short, window_s is the last arrival's offset.
    """
    _check_positive("rate", rate_per_s)
    _check_positive("duration", duration_s)
    cap = _check_cap(max_requests)
    rng = np.random.default_rng(seed)
    expected = rate_per_s * duration_s
    # Draw in chunks sized to cover the expected count with room (6 sigma) to spare.
    chunk = int(min(cap, expected + 6 * math.sqrt(expected) + 16))
    out: list[float] = []
    capped = False
    t = 0.0
    while True:
        times = t + np.cumsum(rng.exponential(1.0 / rate_per_s, size=chunk))
        inside = times[times < duration_s]
        room = cap - len(out)
        if len(inside) > room:
            out.extend(inside[:room].tolist())
            capped = True
            break
        out.extend(inside.tolist())
        if len(inside) < len(times):
            break
        t = float(times[-1])
    window = out[-1] if capped else duration_s
    return Schedule(
        offsets=tuple(out),
        window_s=window,
        source=f"poisson {rate_per_s:g}/s for {duration_s:g}s seed={seed}",
    )


# --- traces ---------------------------------------------------------------------------

_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?$")


def _azure_timestamp_ns(raw: str) -> int:
    """`YYYY-MM-DD HH:MM:SS.fffffff` (up to 9 fractional digits, no zone) as ns since
    the epoch, read as UTC. Exact: 7 digits are more than datetime's microseconds keep."""
    m = _AZURE_TS.match(raw)
    if not m:
        raise ValueError("expected YYYY-MM-DD HH:MM:SS[.fffffff]")
    whole = calendar.timegm(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timetuple())
    frac = (m.group(2) or "").ljust(9, "0")
    return whole * NS_PER_S + int(frac)


def _seconds_ns(raw: str) -> int:
    """A non-negative number of seconds (integer or decimal) as ns."""
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a non-negative number of seconds")
    return round(value * NS_PER_S)


@dataclass(frozen=True)
class TraceFormat:
    """One trace layout: the column holding each request's arrival time and its parser."""

    name: str
    column: str
    describe: str
    parse_ns: Callable[[str], int]


TRACE_FORMATS: tuple[TraceFormat, ...] = (
    # Azure LLM inference trace (Splitwise, ISCA 2024): TIMESTAMP,ContextTokens,GeneratedTokens
    TraceFormat("azure-llm", "TIMESTAMP", "YYYY-MM-DD HH:MM:SS.fffffff", _azure_timestamp_ns),
    # Alibaba GPU cluster trace v2023: creation_time, seconds from the trace's start.
    TraceFormat("alibaba-gpu", "creation_time", "seconds from trace start", _seconds_ns),
)


@dataclass(frozen=True)
class Trace:
    """A parsed arrival trace: arrival times in seconds after its first arrival, sorted."""

    times: tuple[float, ...]
    format: str
    source: str

    @property
    def span_s(self) -> float:
        return self.times[-1] if self.times else 0.0


def parse_trace(lines: Iterable[str], *, source: str = "trace") -> Trace:
    """Parse a trace's CSV lines (header first) into arrival times.

    The format is chosen by the header (see TRACE_FORMATS). Tolerant of CRLF line ends, a
    missing final newline, a byte-order mark, blank lines and empty fields in other
    columns; strict about the time column: a missing or unparseable value raises
    ArrivalError naming the line and quoting the value. Rows are sorted by time.
    """
    reader = csv.reader(lines)
    header: list[str] | None = None
    for row in reader:
        if any(cell.strip() for cell in row):
            header = [cell.strip().lstrip("\ufeff") for cell in row]
            break
    if header is None:
        raise ArrivalError(f"{source}: empty trace (no header, no rows)")
    fmt = next((f for f in TRACE_FORMATS if f.column in header), None)
    if fmt is None:
        known = ", ".join(f"{f.column!r} ({f.name})" for f in TRACE_FORMATS)
        raise ArrivalError(f"{source}: unknown columns {header}; expected a column {known}")
    col = header.index(fmt.column)
    stamps: list[int] = []
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        line = reader.line_num
        raw = row[col].strip() if col < len(row) else ""
        if not raw:
            raise ArrivalError(f"{source}: line {line}: empty {fmt.column}")
        try:
            stamps.append(fmt.parse_ns(raw))
        except ValueError as exc:
            raise ArrivalError(
                f"{source}: line {line}: unparseable {fmt.column} {raw!r} "
                f"(expected {fmt.describe}): {exc}"
            ) from None
    if not stamps:
        raise ArrivalError(f"{source}: trace has a header but no rows")
    stamps.sort()
    first = stamps[0]
    return Trace(
        times=tuple((s - first) / NS_PER_S for s in stamps), format=fmt.name, source=source
    )


def replay(
    trace: Trace,
    *,
    speedup: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> Schedule:
    """The trace as a schedule: skip its first `start_s` seconds (trace time), play the
    rest `speedup` times faster, keep arrivals due before `duration_s` (wall time) and at
    most `max_requests` of them. Offsets count from the start point, so a gap at the
    start point is kept."""
    _check_positive("speedup", speedup)
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ArrivalError(f"start offset must be a finite number >= 0, got {start_s!r}")
    if duration_s is not None:
        _check_positive("duration", duration_s)
    cap = _check_cap(max_requests)
    if start_s > trace.span_s:
        raise ArrivalError(
            f"{trace.source}: start offset {start_s:g}s is past the trace's end "
            f"({trace.span_s:.1f}s)"
        )
    limit = math.inf if duration_s is None else duration_s
    offsets: list[float] = []
    capped = False
    for t in trace.times:
        if t < start_s:
            continue
        off = (t - start_s) / speedup
        if off >= limit:
            break
        if len(offsets) >= cap:
            capped = True
            break
        offsets.append(off)
    if not offsets:
        raise ArrivalError(
            f"{trace.source}: no arrivals within {limit:g}s after start {start_s:g}s"
        )
    # The stretch replayed: up to the duration or the trace's end, or the last arrival
    # kept when the cap cut it short.
    window = offsets[-1] if capped else min(limit, (trace.span_s - start_s) / speedup)
    return Schedule(
        offsets=tuple(offsets),
        window_s=window,
        source=f"trace {trace.source} ({trace.format}) from {start_s:g}s x{speedup:g}",
    )


def read_trace_file(path: Path, parse: Callable[[TextIO], T]) -> T:
    """`parse` over the lines of the trace file at `path`; a file that cannot be read, or
    is not UTF-8 text, is an ArrivalError. `lengths.read_token_trace` reads through it too."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return parse(f)
    except OSError as exc:
        raise ArrivalError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ArrivalError(f"trace {path} is not UTF-8 text: {exc}") from None


def read_trace(path: Path) -> Trace:
    """Parse the trace file at `path` (see `parse_trace`)."""
    return read_trace_file(path, lambda lines: parse_trace(lines, source=path.name))
