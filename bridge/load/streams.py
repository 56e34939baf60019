"""The open-loop sender of token streams: each request of a `Schedule`, at its scheduled
time, to Triton's generate extension (POST /v2/models/{model}/generate_stream, server-sent
events, one per token), with its own prompt and output length (`lengths`); every event's
arrival is timed on the client.

The requests are shaped as clients of Triton's vLLM backend send them: `text_input`,
`stream: true`, `sampling_parameters` a JSON string with `max_tokens` (the output
length asked for), `temperature`, a `seed` per request (same run, same answers where the
server honours it), and `return_finish_reason` / `return_num_input_tokens`, so the last
event says why the stream ended and each event how many prompt tokens the server counted
(a server that ignores them sends neither; nothing here depends on them). A model may end
its answer before `max_tokens` (an end-of-sequence token): the record keeps what came.

Per stream, client side: TTFT from the scheduled time (what a user of an open system waits)
and from the send; TPOT the mean gap between events after the first; tokens received;
how it ended. "ok": the body ended cleanly after at least one token (and the last event
carried a finish reason, when the server sends them); "broken": the stream started (HTTP
200) and stopped before its end (the connection cut, a timeout, an error event after
tokens, a body ending inside an event); "failed": no stream (a refusal, an HTTP error, a
connect error, an error event before any token); "dropped": the in-flight cap was full.

Bounds as the request sender's (`runner`, whose open loop this plays through): at most
`max_requests` streams, none due after `max_duration_s`, each given up `timeout_s` after
its send; loopback endpoints only.

Called by `stb load --stream` (`bridge.load.stream_cli`), by lab tests and by the LLM
benches; `stream_report` summarizes its `StreamResult`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Unpack
from urllib.parse import quote

import httpx

from bridge.load.arrivals import Schedule
from bridge.load.lengths import prompt_text
from bridge.load.runner import (
    UPSTREAM_HEADER,
    Endpoint,
    LoadConfigError,
    Played,
    PlayOptions,
    Sending,
    check_bounds,
    check_target,
    play,
    span,
)
from bridge.load.sse import SseParser, StreamProtocolError, parse_event


@dataclass(frozen=True)
class StreamConfig:
    """What to send and the bounds of one run of streams.

    endpoints: where to send, round robin by request index; loopback only.
    model: the model's name on Triton.
    lengths: (prompt tokens, output tokens) of request i at i modulo their count
        (`bridge.load.lengths.draw_lengths` makes one per scheduled request).
    prompt_overhead: tokens the server adds around the prompt text (a chat template: 30
        for the lab's smol); the text is target - overhead words, the first one
        distinct by seed + index (`lengths.prompt_text`).
    temperature: sampling temperature sent with every request.
    seed: the first request's sampling seed; request i sends seed + i (and its prompt's
        first word is chosen by it: runs of different seeds do not repeat prompts).
    max_requests, max_duration_s, concurrency_cap: as `runner.RunConfig`'s. The default
        cap is lower: a stream holds its connection for its whole answer.
    timeout_s: a stream not finished this many seconds after its send is given up
        (broken if it had started, else failed with "timeout").
    """

    endpoints: tuple[Endpoint, ...]
    model: str
    lengths: tuple[tuple[int, int], ...]
    prompt_overhead: int = 0
    temperature: float = 1.0
    seed: int = 0
    max_requests: int = 10_000
    max_duration_s: float = 60.0
    concurrency_cap: int = 64
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        check_target(self)
        if not self.lengths:
            raise LoadConfigError("no token lengths given")
        for prompt, output in self.lengths:
            if prompt < 1 or output < 1:
                raise LoadConfigError(f"token lengths must be >= 1, got ({prompt}, {output})")
        if self.prompt_overhead < 0:
            raise LoadConfigError(f"prompt_overhead must be >= 0, got {self.prompt_overhead}")
        if not 0 <= self.temperature <= 10:
            raise LoadConfigError(f"temperature must be in 0..10, got {self.temperature}")
        check_bounds(self)

    def length(self, index: int) -> tuple[int, int]:
        return self.lengths[index % len(self.lengths)]

    def body(self, index: int) -> bytes:
        """The generate request of scheduled request `index`, as a vLLM-backend client
        sends it."""
        prompt, output = self.length(index)
        sampling = {
            "max_tokens": output,
            "temperature": self.temperature,
            "seed": self.seed + index,
            "return_finish_reason": True,
            "return_num_input_tokens": True,
        }
        body = {
            "text_input": prompt_text(prompt, self.prompt_overhead, self.seed + index),
            "stream": True,
            "exclude_input_in_output": True,
            "sampling_parameters": json.dumps(sampling),
        }
        return json.dumps(body).encode()

    def stream_path(self) -> str:
        return f"/v2/models/{quote(self.model, safe='')}/generate_stream"


@dataclass(frozen=True)
class StreamRecord:
    """What happened to one scheduled stream. Times are seconds from the run's start.

    outcome: "ok", "broken", "failed" or "dropped" (see the module's docstring); error:
        None when ok, else why ("timeout", "connect", "http_<status>", "cut" for a body
        ending inside an event or before a final event, "error: <text>" for the server's
        error event, "protocol" for an event that is not JSON, httpx's exception name).
    first_s, last_s: the first and last token event's arrival (None without one).
    tokens: token events received (error events not counted).
    prompt_target, output_target: the lengths asked for; prompt_counted: the prompt's
        tokens as the server counted them, when it said.
    finish_reason: the last event's, when the server sends them ("length": max_tokens
        reached; "stop": the model ended its answer).
    """

    index: int
    endpoint: str
    scheduled_s: float
    sent_s: float | None
    first_s: float | None
    last_s: float | None
    done_s: float | None
    tokens: int
    prompt_target: int
    output_target: int
    outcome: str
    error: str | None = None
    status: int | None = None
    prompt_counted: int | None = None
    finish_reason: str | None = None
    upstream: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def ttft_s(self) -> float | None:
        """From the scheduled time to the first token: includes any lateness in sending."""
        return span(self.scheduled_s, self.first_s)

    @property
    def service_ttft_s(self) -> float | None:
        """From the send to the first token."""
        return span(self.sent_s, self.first_s)

    @property
    def tpot_s(self) -> float | None:
        """The mean gap between token events after the first; None under two tokens."""
        if self.tokens < 2 or self.first_s is None or self.last_s is None:
            return None
        return (self.last_s - self.first_s) / (self.tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        """From the scheduled time to the stream's end."""
        return span(self.scheduled_s, self.done_s)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens: the server's count when it gave one, else the target."""
        return self.prompt_counted if self.prompt_counted is not None else self.prompt_target


@dataclass(frozen=True)
class StreamResult(Played[StreamConfig, StreamRecord]):
    """One run of streams (`run_streams`), as `runner.Played` says."""


@dataclass
class _Reading:
    """One stream as it is read: the events so far."""

    first_s: float | None = None
    last_s: float | None = None
    tokens: int = 0
    status: int | None = None
    counted: int | None = None
    reason: str | None = None
    error: str | None = None
    saw_reasons: bool = False
    upstream: str | None = None

    def outcome(self, clean_end: bool, error: str | None) -> tuple[str, str | None]:
        """(outcome, error) once the body has ended (`clean_end`) or failed (`error`)."""
        started = self.status == 200
        if error is None and self.error is not None:
            error = self.error
        if error is None and not clean_end:
            error = "cut"
        if error is None and self.saw_reasons and self.reason is None:
            error = "cut"  # the server sends finish reasons, and the last event had none
        if error is None and self.tokens == 0:
            error = "cut"
        if error is None:
            return "ok", None
        if started and (self.tokens > 0 or not error.startswith("error")):
            return "broken", error
        return "failed", error


@dataclass
class _Streams(Sending[StreamConfig, StreamRecord]):
    """A run of streams: each one generate request, its events read as they come."""

    readings: dict[int, _Reading] = field(default_factory=dict)

    def record(self, index: int, reading: _Reading, outcome: str, error: str | None) -> None:
        endpoint, scheduled_s, sent_s = self.launched[index]
        prompt, output = self.config.length(index)
        self.records[index] = StreamRecord(
            index=index,
            endpoint=endpoint,
            scheduled_s=scheduled_s,
            sent_s=sent_s,
            first_s=reading.first_s,
            last_s=reading.last_s,
            done_s=self.now(),
            tokens=reading.tokens,
            prompt_target=prompt,
            output_target=output,
            outcome=outcome,
            error=error,
            status=reading.status,
            prompt_counted=reading.counted,
            finish_reason=reading.reason,
            upstream=reading.upstream,
        )
        self.count_done(outcome == "ok")

    def dropped(self, index: int, endpoint: Endpoint, scheduled_s: float) -> StreamRecord:
        prompt, output = self.config.length(index)
        return StreamRecord(
            index, str(endpoint), scheduled_s, None, None, None, None, 0, prompt, output,
            "dropped", "dropped",
        )  # fmt: skip

    def cancelled(self, index: int) -> None:
        reading = self.readings.get(index, _Reading())
        self.record(index, reading, *reading.outcome(False, "cancelled"))

    def event(self, reading: _Reading, data: str) -> None:
        ev = parse_event(data)
        if ev.error is not None:
            reading.error = f"error: {ev.error}"
            return
        at = self.now()
        if reading.first_s is None:
            reading.first_s = at
        reading.last_s = at
        reading.tokens += 1
        if ev.input_tokens is not None:
            reading.counted = ev.input_tokens
        if ev.finish_reason is not None or reading.saw_reasons:
            reading.saw_reasons = True
        reading.reason = ev.finish_reason

    async def send(self, index: int, endpoint: Endpoint) -> None:
        reading = self.readings.setdefault(index, _Reading())
        error: str | None = None
        clean = False
        try:
            async with asyncio.timeout(self.config.timeout_s):
                async with self.client.stream(
                    "POST",
                    endpoint.base_url + self.config.stream_path(),
                    content=self.config.body(index),
                    headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                ) as resp:
                    reading.status = resp.status_code
                    reading.upstream = resp.headers.get(UPSTREAM_HEADER)
                    if resp.status_code != 200:
                        await resp.aread()
                        error = f"http_{resp.status_code}"
                    else:
                        parser = SseParser()
                        async for text in resp.aiter_text():
                            for data in parser.feed(text):
                                self.event(reading, data)
                            if reading.error is not None:
                                break
                        clean = not parser.pending and reading.error is None
        except (TimeoutError, httpx.TimeoutException):
            error = "timeout"
        except httpx.ConnectError:
            error = "connect"
        except StreamProtocolError:
            error = "protocol"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        except asyncio.CancelledError:
            self.record(index, reading, *reading.outcome(False, "cancelled"))
            raise
        self.record(index, reading, *reading.outcome(clean, error))


async def run_streams(
    schedule: Schedule, config: StreamConfig, **options: Unpack[PlayOptions]
) -> StreamResult:
    """Send `schedule` as streams as `config` says; a record per stream that came due.
    `options`: see `runner.PlayOptions` (`stop`: start no more, wait for the open ones)."""
    timeout = httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s))
    return await play(schedule, config, _Streams, StreamResult, timeout=timeout, **options)
