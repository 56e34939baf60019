"""The stream sender and `stb load --stream` against a tiny HTTP server this test starts on
127.0.0.1 (its own thread and event loop) that writes server-sent events as Triton's
generate_stream does (chunked, `data: {...}` per token), and cuts streams in the ways a
real one can be cut: the connection closed mid-body, a body ending inside an event, an
error event after tokens. The lab's real LLM is tests/lab/test_load_stream_lab.py's."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.load.arrivals import Schedule
from bridge.load.runner import Endpoint
from bridge.load.stream_report import summarize_streams
from bridge.load.streams import StreamConfig, StreamResult, run_streams

OVERHEAD = 30


def _chunk(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass
class EventServer:
    """POST /v2/models/<name>/generate_stream, by name: `tokens-<gap ms>` streams
    max_tokens events `gap` ms apart, the last with finish_reason "length", each with
    num_input_tokens (words of text_input + 30); `cut` closes the connection after two
    events; `half` ends the body inside an event; `error` sends an error event after
    two; `refuse` answers 400. Keeps each request's arrival time and body."""

    port: int = 0
    received: list[tuple[float, str, dict[str, object]]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                m = re.search(r"(?im)^content-length:\s*(\d+)", head)
                body = json.loads(await reader.readexactly(int(m.group(1)) if m else 0))
                self.received.append((time.monotonic(), path, body))
                name = path.split("/")[3]
                if name == "refuse":
                    msg = b'{"error":"bad request"}'
                    writer.write(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(msg)}\r\n\r\n".encode()
                        + msg
                    )
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                sampling = json.loads(str(body["sampling_parameters"]))
                n = int(sampling["max_tokens"])
                prompt = len(str(body["text_input"]).split()) + OVERHEAD
                gap = int(name.split("-")[1]) / 1000 if name.startswith("tokens-") else 0.01
                for i in range(n):
                    if name in ("cut", "half", "error") and i == 2:
                        break
                    event = {
                        "model_name": name,
                        "text_output": f"t{i}",
                        "finish_reason": "length" if i == n - 1 else "None",
                        "num_input_tokens": prompt,
                    }
                    writer.write(_chunk(f"data: {json.dumps(event)}\n\n"))
                    await writer.drain()
                    await asyncio.sleep(gap)
                if name == "cut":
                    return  # the connection closes with the body unfinished
                if name == "half":
                    writer.write(_chunk('data: {"text_output": "t'))
                if name == "error":
                    writer.write(_chunk('data: {"error": "Request was cancelled"}\n\n'))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._loop = asyncio.get_running_loop()
            ready.set()
            async with server:
                await self._stop.wait()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        assert ready.wait(10), "test server did not start"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)


@pytest.fixture
def server() -> Iterator[EventServer]:
    srv = EventServer()
    srv.start()
    yield srv
    srv.stop()


def streams(server: EventServer, model: str, schedule: Schedule, **kw: object) -> StreamResult:
    config = StreamConfig(
        endpoints=(server.endpoint,),
        model=model,
        lengths=kw.pop("lengths", ((40, 5),)),  # type: ignore[arg-type]
        prompt_overhead=OVERHEAD,
        **kw,  # type: ignore[arg-type]
    )
    return asyncio.run(run_streams(schedule, config))


def test_tokens_are_timed_one_by_one_and_the_stream_ends_cleanly(server: EventServer) -> None:
    schedule = Schedule((0.0, 0.1, 0.2, 0.3), 0.4, "four")
    result = streams(server, "tokens-40", schedule, lengths=((40, 5), (35, 3)))
    assert [r.outcome for r in result.records] == ["ok"] * 4
    assert [r.tokens for r in result.records] == [5, 3, 5, 3]
    assert [r.prompt_counted for r in result.records] == [40, 35, 40, 35]
    assert {r.finish_reason for r in result.records} == {"length"}
    for r in result.records:
        assert r.tpot_s is not None and 0.03 <= r.tpot_s < 0.2  # events 40 ms apart
        assert r.ttft_s is not None and r.ttft_s < 0.2
    # open loop: sent on schedule, however long each stream holds its connection
    sent = [t for t, _, _ in server.received]
    assert sent[-1] - sent[0] == pytest.approx(0.3, abs=0.1)
    rep = summarize_streams(result)
    assert rep.ok == 4 and rep.broken == 0 and rep.tokens_out == 16
    assert rep.prompt_counted_mean == rep.prompt_target_mean == 37.5


@pytest.mark.parametrize(
    ("model", "outcome", "error", "tokens"),
    [
        ("cut", "broken", "RemoteProtocolError", 2),
        ("half", "broken", "cut", 2),
        ("error", "broken", "error: Request was cancelled", 2),
        ("refuse", "failed", "http_400", 0),
    ],
)
def test_streams_stopped_before_their_end_are_broken(
    server: EventServer, model: str, outcome: str, error: str, tokens: int
) -> None:
    result = streams(server, model, Schedule((0.0,), 0.1, "one"))
    (r,) = result.records
    assert (r.outcome, r.error, r.tokens) == (outcome, error, tokens)
    rep = summarize_streams(result)
    assert rep.ok == 0 and rep.errors == {f"{outcome}: {error}": 1}


def test_in_flight_cap_drops_and_counts(server: EventServer) -> None:
    schedule = Schedule((0.0, 0.05, 0.1, 0.15), 0.2, "four")
    result = streams(server, "tokens-100", schedule, concurrency_cap=1)
    assert [r.outcome for r in result.records] == ["ok", "dropped", "dropped", "dropped"]
    assert len(server.received) == 1


def test_a_stream_over_its_timeout_is_broken(server: EventServer) -> None:
    result = streams(server, "tokens-200", Schedule((0.0,), 0.1, "one"), timeout_s=0.5)
    (r,) = result.records
    assert r.outcome == "broken" and r.error == "timeout" and 1 <= r.tokens < 5


def test_stb_load_stream_with_fixed_and_trace_lengths(server: EventServer, tmp_path: Path) -> None:
    fixed = CliRunner().invoke(
        app,
        [
            *["load", "--stream", "-e", str(server.endpoint), "--model", "tokens-5"],
            *["--rate", "20", "--duration", "0.5", "--seed", "2", "--prompt-tokens", "36"],
            *["--output-tokens", "4", "--prompt-overhead", "30", "--json", "--quiet"],
        ],
    )
    assert fixed.exit_code == 0, fixed.output
    rep = json.loads(fixed.stdout)
    assert rep["ok"] == rep["due"] == len(server.received) > 3
    assert rep["tokens_out"] == 4 * rep["ok"] and rep["broken"] == 0
    assert rep["prompt_counted_mean"] == 36.0 and rep["lengths"] == "prompt 36, output 4"
    first = server.received[0][2]
    assert first["text_input"] == " ".join(["stone", *["hello"] * 5])  # seed 2

    trace = tmp_path / "tokens.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,600,80\n")
    scaled = CliRunner().invoke(
        app,
        [
            *["load", "--stream", "-e", str(server.endpoint), "--model", "tokens-1"],
            *["--rate", "10", "--duration", "0.3", "--lengths", str(trace)],
            *["--prompt-scale", "0.1", "--output-scale", "0.05", "--prompt-overhead", "30"],
            "--quiet",
        ],
    )
    assert scaled.exit_code == 0, scaled.output
    assert "TTFT from scheduled time" in scaled.stdout
    # 600 x 0.1 = 60 prompt tokens, 80 x 0.05 = 4 output tokens
    assert json.loads(str(server.received[-1][2]["sampling_parameters"]))["max_tokens"] == 4
    assert len(str(server.received[-1][2]["text_input"]).split()) == 60 - 30


def test_stb_load_stream_refuses_bad_lengths(server: EventServer, tmp_path: Path) -> None:
    args = ["load", "--stream", "-e", str(server.endpoint), "--rate", "1", "--duration", "1"]
    low = CliRunner().invoke(
        app, [*args, "--prompt-tokens", "20", "--output-tokens", "4", "--prompt-overhead", "30"]
    )
    assert low.exit_code == 2 and "prompt tokens 20 is not within 31.." in low.output
    missing = CliRunner().invoke(app, [*args, "--lengths", str(tmp_path / "nope.csv")])
    assert missing.exit_code == 2 and "cannot read trace" in missing.output
    alone = CliRunner().invoke(
        app, ["load", "-e", str(server.endpoint), "--rate", "1", "--prompt-tokens", "40"]
    )
    assert alone.exit_code == 2 and "--prompt-tokens: only with --stream" in alone.output
    assert server.received == []
