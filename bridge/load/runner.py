"""The open-loop sender: sends each request of a `Schedule` at its scheduled time to
Triton's KServe v2 HTTP API (POST /v2/models/{model}/infer, JSON body), round robin over
the endpoints, and records what happened to each.

Open loop: a request is sent when it is due, whether or not earlier ones have answered,
so a slow server makes latency rise instead of slowing the load down. The number in
flight is capped; a request due while the cap is full is not sent but recorded as
dropped, so coordinated omission shows in the counts instead of hiding in the schedule.
Latency is measured from the scheduled time (what a client of an open system sees) and
from the actual send time.

Bounds, always: at most `max_requests` requests, none due after `max_duration_s` (and
none sent later than LATE_GRACE_S after it), each one given up after `timeout_s`; and
only loopback endpoints (127.0.0.0/8, localhost, ::1): this project sends load only to
the machine it runs on.

The open loop (`open_loop`, `play`: the run's client, bounds and result) is shared with
the sender of token streams (`bridge.load.streams`).

Called by `bridge.load.cli` (`stb load`), by lab tests and by benchmarks; `report`
summarizes its `RunResult`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack
from urllib.parse import quote, urlsplit

import httpx

from bridge.load.arrivals import MAX_ARRIVALS, Schedule
from bridge.triton.ports import HTTP_PORT

DEFAULT_PORT = HTTP_PORT
MAX_DURATION_S = 3600.0
"""Ceiling on `max_duration_s`: an hour of load is more than any demo or test needs."""
LATE_GRACE_S = 1.0
"""A request due inside max_duration_s is still sent if the sender is behind by up to
this much at the end; past that the run stops, so the wall-clock bound holds however
loaded the machine is."""
UPSTREAM_HEADER = "X-Stb-Upstream"
"""The answer header in which the bridge's nginx names the replica it chose."""
MAX_ELEMENTS = 1 << 20
"""Ceiling on the input tensor's element count (4 MiB of FP32), to keep bodies sane."""


class LoadConfigError(ValueError):
    """The run cannot start as asked: a non-loopback or malformed endpoint, or a bound
    out of range. The message names the value."""


@dataclass(frozen=True)
class Endpoint:
    """One Triton HTTP endpoint on this machine."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __str__(self) -> str:
        return self.base_url.removeprefix("http://")


def parse_endpoint(text: str) -> Endpoint:
    """`127.0.1.4:8000`, `http://127.0.1.4:8000`, `localhost`, `[::1]:8000` -> Endpoint.

    Refuses (LoadConfigError) any host that is not a loopback address. Names are not
    resolved: `localhost` is taken as 127.0.0.1, any other name is refused.
    """
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        scheme, rest = "http", raw
    if scheme != "http":
        raise LoadConfigError(f"endpoint {text!r}: only http:// is supported")
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise LoadConfigError(f"endpoint {text!r}: {exc}") from None
    host = parts.hostname or ""
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise LoadConfigError(f"endpoint {text!r}: give host[:port] only, no path or user")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise LoadConfigError(
            f"refusing endpoint {text!r}: not a loopback address (127.0.0.0/8, localhost, "
            "::1); stb load sends load only to this machine"
        )
    return Endpoint(host=host, port=port)


class Bounds(Protocol):
    """What the open loop reads of a run's configuration (`RunConfig`,
    `streams.StreamConfig`): where to send, and the bounds of the run."""

    @property
    def endpoints(self) -> tuple[Endpoint, ...]: ...
    @property
    def model(self) -> str: ...
    @property
    def max_requests(self) -> int: ...
    @property
    def max_duration_s(self) -> float: ...
    @property
    def concurrency_cap(self) -> int: ...
    @property
    def timeout_s(self) -> float: ...


def check_target(config: Bounds) -> None:
    """Refuse (LoadConfigError) a run with no endpoint, one off this machine (an
    `Endpoint` built by hand is checked too) or a bad model name."""
    if not config.endpoints:
        raise LoadConfigError("no endpoint given")
    for ep in config.endpoints:
        parse_endpoint(str(ep))
    if not config.model or "/" in config.model:
        raise LoadConfigError(f"bad model name {config.model!r}")


def check_bounds(config: Bounds) -> None:
    """Refuse (LoadConfigError) a run whose bounds are out of range."""
    if not 1 <= config.max_requests <= MAX_ARRIVALS:
        raise LoadConfigError(f"max_requests must be in 1..{MAX_ARRIVALS}")
    if not 0 < config.max_duration_s <= MAX_DURATION_S:
        raise LoadConfigError(f"max_duration_s must be in (0, {MAX_DURATION_S:g}]")
    if config.concurrency_cap < 1:
        raise LoadConfigError("concurrency_cap must be at least 1")
    if not 0 < config.timeout_s <= MAX_DURATION_S:
        raise LoadConfigError(f"timeout_s must be in (0, {MAX_DURATION_S:g}]")


@dataclass(frozen=True)
class RunConfig:
    """What to send and the bounds of one run.

    endpoints: where to send, round robin by request index; loopback only.
    model: the Triton model name.
    shape: the FP32 input tensor's shape (`busy` takes [N], `echo` [1, N]).
    input_name: the model's input tensor.
    max_requests: the most requests sent (or dropped) in the run; at most MAX_ARRIVALS.
    max_duration_s: no request due after this many seconds from the start is sent; at
        most an hour. In-flight requests then get up to timeout_s to finish.
    concurrency_cap: the most requests in flight; a request due when it is full is
        dropped and counted. Default 256: far above what one lab Triton serves at once,
        so drops mean the server is hopelessly behind, not that the cap is tight.
    timeout_s: a request not answered within this many seconds after it was sent is
        an error of kind "timeout".
    """

    endpoints: tuple[Endpoint, ...]
    model: str
    shape: tuple[int, ...] = (16,)
    input_name: str = "INPUT0"
    max_requests: int = 10_000
    max_duration_s: float = 60.0
    concurrency_cap: int = 256
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check_target(self)
        if not self.shape or any(d < 1 for d in self.shape) or math.prod(self.shape) > MAX_ELEMENTS:
            raise LoadConfigError(
                f"bad input shape {list(self.shape)}: dims >= 1, at most {MAX_ELEMENTS} elements"
            )
        check_bounds(self)

    def body(self) -> bytes:
        """The KServe v2 inference request: one FP32 tensor of small, fixed values."""
        n = math.prod(self.shape)
        tensor = {
            "name": self.input_name,
            "shape": list(self.shape),
            "datatype": "FP32",
            "data": [float(i % 8) for i in range(n)],
        }
        return json.dumps({"inputs": [tensor]}).encode()

    def infer_path(self) -> str:
        return f"/v2/models/{quote(self.model, safe='')}/infer"


def span(start: float | None, end: float | None) -> float | None:
    """Seconds from `start` to `end`; None when either is unknown."""
    return None if start is None or end is None else end - start


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one scheduled request. Times are seconds from the run's start.

    sent_s is None for a dropped request (the in-flight cap was full). error is None on
    success (HTTP 200), else its kind: "dropped", "http_<status>", "timeout", "connect",
    "cancelled", or httpx's exception name for other transport errors. upstream: the
    replica a router in between named in its `X-Stb-Upstream` answer header (the
    bridge's nginx sets it to the `$upstream_addr` it chose), None without one.
    """

    index: int
    endpoint: str
    scheduled_s: float
    sent_s: float | None
    done_s: float | None
    status: int | None
    error: str | None
    upstream: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency_s(self) -> float | None:
        """From the scheduled time to the answer: includes any lateness in sending."""
        return span(self.scheduled_s, self.done_s)

    @property
    def service_latency_s(self) -> float | None:
        """From the actual send to the answer."""
        return span(self.sent_s, self.done_s)


@dataclass
class Counters:
    """Live counts during a run, updated by the runner; a progress display reads them."""

    planned: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    dropped: int = 0
    in_flight: int = 0
    elapsed_s: float = 0.0


C = TypeVar("C", bound=Bounds)
R = TypeVar("R")
P = TypeVar("P")


@dataclass(frozen=True)
class Played(Generic[C, R]):
    """One run of the open loop: a record per scheduled request that came due, in
    schedule order (`RunResult` of requests, `streams.StreamResult` of streams).

    window_s: the span of the schedule actually played (shorter than the schedule's when
        a bound stopped it), the denominator of offered and sent rates.
    elapsed_s: from the start to the last answer (or give-up).
    stopped_by: "schedule" (all sent), "max_requests", "max_duration" or "stopped" (the
        caller's `stop` event).
    """

    config: C
    source: str
    records: tuple[R, ...]
    window_s: float
    elapsed_s: float
    stopped_by: str
    target_rate: float | None = None


@dataclass(frozen=True)
class RunResult(Played[RunConfig, RequestRecord]):
    """One run of requests (`run`), as `Played` says."""


class PlayOptions(TypedDict, total=False):
    """The options of a run (`run`, `streams.run_streams`), none required.

    counters: live counts, for a progress display to read while the run goes on.
    target_rate: the rate the schedule was drawn at, kept on the result for its report.
    stop: set from another thread, the run sends nothing more and waits for what is in
        flight.
    """

    counters: Counters | None
    target_rate: float | None
    stop: threading.Event | None


@dataclass
class Sending(ABC, Generic[C, R]):
    """One run as the open loop plays it (`play`): what was launched when, and the
    records so far. The sender of requests (`_Run`) and that of streams
    (`streams._Streams`) say how one is sent, dropped or given up."""

    config: C
    client: httpx.AsyncClient
    t0: float
    counters: Counters
    records: dict[int, R] = field(default_factory=dict)
    launched: dict[int, tuple[str, float, float]] = field(default_factory=dict)
    """index -> (endpoint, scheduled_s, sent_s) of every request handed to a task."""

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    def launch(self, index: int, endpoint: Endpoint, offset: float) -> Coroutine[Any, Any, None]:
        self.launched[index] = (str(endpoint), offset, self.now())
        return self.send(index, endpoint)

    def drop(self, index: int, endpoint: Endpoint, offset: float) -> None:
        self.records[index] = self.dropped(index, endpoint, offset)

    def count_done(self, ok: bool) -> None:
        """Count a launched request, its record kept, out of flight: ok or in error."""
        self.counters.in_flight -= 1
        if ok:
            self.counters.ok += 1
        else:
            self.counters.errors += 1

    def cancel_unfinished(self) -> None:
        """Record each launched request whose task never finished as cancelled."""
        for index in [i for i in self.launched if i not in self.records]:
            self.cancelled(index)

    @abstractmethod
    async def send(self, index: int, endpoint: Endpoint) -> None:
        """Send launched request `index`; keep its record and `count_done` it, whatever
        happens."""

    @abstractmethod
    def dropped(self, index: int, endpoint: Endpoint, scheduled_s: float) -> R:
        """The record of a request dropped (the in-flight cap was full)."""

    @abstractmethod
    def cancelled(self, index: int) -> None:
        """Record launched request `index`, whose task never finished, as cancelled (and
        `count_done` it)."""


@dataclass
class _Run(Sending[RunConfig, RequestRecord]):
    """A run of requests: each one POST of the same inference body."""

    body: bytes = field(init=False, default=b"")

    def __post_init__(self) -> None:
        self.body = self.config.body()

    def dropped(self, index: int, endpoint: Endpoint, scheduled_s: float) -> RequestRecord:
        return RequestRecord(index, str(endpoint), scheduled_s, None, None, None, "dropped")

    def cancelled(self, index: int) -> None:
        endpoint, scheduled_s, sent_s = self.launched[index]
        self.records[index] = RequestRecord(
            index, endpoint, scheduled_s, sent_s, self.now(), None, "cancelled"
        )
        self.count_done(False)

    async def send(self, index: int, endpoint: Endpoint) -> None:
        _, scheduled_s, sent_s = self.launched[index]
        status: int | None = None
        error: str | None = None
        upstream: str | None = None
        try:
            async with asyncio.timeout(self.config.timeout_s):
                resp = await self.client.post(
                    endpoint.base_url + self.config.infer_path(),
                    content=self.body,
                    headers={"Content-Type": "application/json"},
                )
            status = resp.status_code
            upstream = resp.headers.get(UPSTREAM_HEADER)
            error = None if status == 200 else f"http_{status}"
        except (TimeoutError, httpx.TimeoutException):
            error = "timeout"
        except httpx.ConnectError:
            error = "connect"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        except asyncio.CancelledError:
            error = "cancelled"
            raise
        finally:
            self.records[index] = RequestRecord(
                index, str(endpoint), scheduled_s, sent_s, self.now(), status, error, upstream
            )
            self.count_done(error is None)


async def open_loop(
    offsets: Sequence[float],
    endpoints: Sequence[Endpoint],
    *,
    max_duration_s: float,
    cap: int,
    grace_s: float,
    counters: Counters,
    now: Callable[[], float],
    launch: Callable[[int, Endpoint, float], Coroutine[Any, Any, None]],
    drop: Callable[[int, Endpoint, float], None],
    stop: threading.Event | None = None,
) -> tuple[str | None, float]:
    """Play `offsets` open loop: at each one's time (seconds on `now`'s clock) hand the
    request to `launch(index, endpoint, offset)` as a task, round robin over
    `endpoints`, or, with `cap` tasks in flight, `drop` it (counted). Stops at
    `max_duration_s` (LATE_GRACE_S late at most) or when `stop` is set; then gives what
    is in flight `grace_s` and cancels the rest. Returns (why it stopped early: None,
    "max_duration" or "stopped"; the last offset played). The sender of requests and
    the sender of token streams (`bridge.load.streams`) both play through it."""
    tasks: set[asyncio.Task[None]] = set()
    stopped_by: str | None = None
    last_due = 0.0
    try:
        for index, offset in enumerate(offsets):
            if offset >= max_duration_s:
                stopped_by = "max_duration"
                break
            delay = offset - now()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop is not None and stop.is_set():
                stopped_by = "stopped"
                break
            if now() >= max_duration_s + LATE_GRACE_S:
                stopped_by = "max_duration"  # the sender fell far behind: stop anyway
                break
            last_due = offset
            counters.elapsed_s = now()
            endpoint = endpoints[index % len(endpoints)]
            if len(tasks) >= cap:
                drop(index, endpoint, offset)
                counters.dropped += 1
                continue
            counters.sent += 1
            counters.in_flight += 1
            task = asyncio.create_task(launch(index, endpoint, offset))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:  # each request gives itself up after its timeout; this is a backstop
            await asyncio.wait(set(tasks), timeout=grace_s)
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    return stopped_by, last_due


async def play(
    schedule: Schedule,
    config: C,
    sending: Callable[[C, httpx.AsyncClient, float, Counters], Sending[C, R]],
    result: Callable[[C, str, tuple[R, ...], float, float, str, float | None], P],
    *,
    timeout: httpx.Timeout | float,
    counters: Counters | None = None,
    target_rate: float | None = None,
    stop: threading.Event | None = None,
) -> P:
    """Play `schedule` open loop as `config` bounds it, each request sent as `sending`
    (the run's state, given the HTTP client: `timeout` its timeouts) says; the `result`
    of the records (`PlayOptions`: `counters`, `target_rate`, `stop`). The sender of
    requests (`run`) and that of token streams (`bridge.load.streams`) both run
    through it."""
    counters = counters if counters is not None else Counters()
    offsets = schedule.offsets[: config.max_requests]
    counters.planned = len(offsets)
    cap = config.concurrency_cap
    limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        state = sending(config, client, loop.time(), counters)
        try:
            early, last_due = await open_loop(
                offsets,
                config.endpoints,
                max_duration_s=config.max_duration_s,
                cap=cap,
                grace_s=config.timeout_s + 1.0,
                counters=counters,
                now=state.now,
                launch=state.launch,
                drop=state.drop,
                stop=stop,
            )
        finally:
            state.cancel_unfinished()
        elapsed = state.now()
    counters.elapsed_s = elapsed
    stopped_by = early or ("max_requests" if len(offsets) < len(schedule.offsets) else "schedule")
    return result(
        config,
        schedule.source,
        tuple(state.records[i] for i in sorted(state.records)),
        played_window(stopped_by, schedule, config.max_duration_s, last_due),
        elapsed,
        stopped_by,
        target_rate,
    )


async def run(schedule: Schedule, config: RunConfig, **options: Unpack[PlayOptions]) -> RunResult:
    """Send `schedule` as `config` says; return a record per request that came due.
    `options`: see `PlayOptions`."""
    return await play(schedule, config, _Run, RunResult, timeout=config.timeout_s, **options)


def played_window(
    stopped_by: str, schedule: Schedule, max_duration_s: float, last_due: float
) -> float:
    """The span of the schedule a run played: all of it, up to the duration bound, or
    up to the last request that came due (stopped, or capped in count)."""
    if stopped_by == "schedule":
        return schedule.window_s
    if stopped_by == "max_duration":
        return max_duration_s
    return last_due
