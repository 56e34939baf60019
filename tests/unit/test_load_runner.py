"""The open-loop sender and `stb load`, against a tiny HTTP server this test starts on
127.0.0.1 in its own thread and event loop: requests go out on schedule however slowly
the server answers, the in-flight cap drops and counts, bounds stop the run, errors are
classified, only loopback endpoints are accepted. The report's arithmetic on literal
records."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.load.arrivals import Schedule
from bridge.load.report import summarize
from bridge.load.runner import (
    Endpoint,
    LoadConfigError,
    RequestRecord,
    RunConfig,
    RunResult,
    parse_endpoint,
    run,
)


@dataclass
class SlowServer:
    """An HTTP/1.1 server speaking just enough of KServe v2 for the sender.

    POST /v2/models/sleep-<ms>/infer answers 200 after <ms> milliseconds; .../fail/infer
    answers 500. Keeps each request's arrival time (time.monotonic) and body. With
    `upstream`, every answer names it in `X-Stb-Upstream`, as the bridge's nginx does.
    """

    host: str = "127.0.0.1"
    port: int = 0
    upstream: str | None = None
    received: list[tuple[float, str, bytes]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                m = re.search(r"(?im)^content-length:\s*(\d+)", head)
                body = await reader.readexactly(int(m.group(1)) if m else 0)
                self.received.append((time.monotonic(), path, body))
                model = path.split("/")[3] if path.count("/") >= 4 else ""
                if model.startswith("sleep-"):
                    await asyncio.sleep(int(model.removeprefix("sleep-")) / 1000)
                status = 500 if model == "fail" else 200
                payload = json.dumps({"model_name": model, "outputs": []}).encode()
                named = f"X-Stb-Upstream: {self.upstream}\r\n" if self.upstream else ""
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{named}"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, self.host, 0, backlog=512)
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
        return Endpoint(self.host, self.port)


@pytest.fixture
def server() -> Iterator[SlowServer]:
    srv = SlowServer()
    srv.start()
    yield srv
    srv.stop()


def regular(n: int, every_s: float) -> Schedule:
    return Schedule(tuple(i * every_s for i in range(n)), n * every_s, f"{n} every {every_s}s")


def send(schedule: Schedule, **kwargs: Any) -> RunResult:
    return asyncio.run(run(schedule, RunConfig(**kwargs)))


# --- open loop ----------------------------------------------------------------------


def test_schedule_does_not_slow_down_when_responses_are_slow(server: SlowServer) -> None:
    # 20 requests due within 0.38 s; each answer takes 1 s. A closed loop (one at a time)
    # would need 20 s; an open loop sends all 20 before the first answer arrives.
    result = send(regular(20, 0.02), endpoints=(server.endpoint,), model="sleep-1000")
    recs = result.records
    assert len(recs) == 20
    assert all(r.ok and r.status == 200 for r in recs), [r.error for r in recs]
    sent = [r.sent_s for r in recs if r.sent_s is not None]
    done = [r.done_s for r in recs if r.done_s is not None]
    assert max(sent) < min(done)  # margin 0.6 s by construction
    # On time, not merely before the first answer: 0.5 s late is 25x the spacing and
    # far beyond scheduling jitter on an idle loop, so only a blocking sender fails it.
    assert all(r.sent_s is not None and r.sent_s - r.scheduled_s < 0.5 for r in recs)
    # The server saw them all arrive before it could have answered any.
    arrivals = sorted(t for t, _, _ in server.received)
    assert len(arrivals) == 20 and arrivals[-1] - arrivals[0] < 1.0
    assert result.elapsed_s < 5.0  # ~1.4 s; a closed loop would take 20 s
    # Latency from the scheduled time is never below latency from the send.
    for r in recs:
        assert r.latency_s is not None and r.service_latency_s is not None
        assert r.latency_s >= r.service_latency_s >= 1.0


def test_in_flight_cap_drops_and_counts(server: SlowServer) -> None:
    # 20 due within 0.19 s, answers take 1 s, cap 5: the first 5 are in flight until
    # well after the last is due, so exactly 15 are dropped, never queued.
    result = send(
        regular(20, 0.01), endpoints=(server.endpoint,), model="sleep-1000", concurrency_cap=5
    )
    dropped = [r for r in result.records if r.error == "dropped"]
    assert len(dropped) == 15
    assert all(r.sent_s is None and r.done_s is None for r in dropped)
    assert [r.index for r in result.records if r.ok] == [0, 1, 2, 3, 4]
    assert len(server.received) == 5
    rep = summarize(result).total
    assert (rep.due, rep.sent, rep.ok, rep.dropped, rep.errors) == (20, 5, 5, 15, {})


def test_body_is_a_kserve_v2_fp32_tensor(server: SlowServer) -> None:
    send(regular(1, 0.01), endpoints=(server.endpoint,), model="sleep-0", shape=(1, 6))
    ((_, path, body),) = server.received
    assert path == "/v2/models/sleep-0/infer"
    (tensor,) = json.loads(body)["inputs"]
    assert tensor["name"] == "INPUT0" and tensor["datatype"] == "FP32"
    assert tensor["shape"] == [1, 6] and len(tensor["data"]) == 6


def test_round_robin_over_endpoints() -> None:
    a, b = SlowServer(), SlowServer(host="127.0.0.2")
    a.start()
    b.start()
    try:
        result = send(regular(10, 0.005), endpoints=(a.endpoint, b.endpoint), model="sleep-0")
    finally:
        a.stop()
        b.stop()
    assert len(a.received) == len(b.received) == 5
    per = {g.name: g.ok for g in summarize(result).endpoints}
    assert per == {str(a.endpoint): 5, str(b.endpoint): 5}


def test_each_record_names_the_replica_a_router_chose(server: SlowServer) -> None:
    routed = SlowServer(host="127.0.0.3", upstream="127.0.1.4:8000")
    routed.start()
    try:
        result = send(
            regular(4, 0.005), endpoints=(routed.endpoint, server.endpoint), model="sleep-0"
        )
    finally:
        routed.stop()
    assert [r.upstream for r in result.records] == ["127.0.1.4:8000", None] * 2


# --- bounds -------------------------------------------------------------------------


def test_max_duration_stops_sending(server: SlowServer) -> None:
    schedule = Schedule((0.0, 0.1, 0.2, 3.0, 6.0), 6.0, "five")
    result = send(schedule, endpoints=(server.endpoint,), model="sleep-0", max_duration_s=0.5)
    assert result.stopped_by == "max_duration"
    assert [r.index for r in result.records] == [0, 1, 2]
    assert result.elapsed_s < 2.0  # did not wait for the 3 s and 6 s arrivals
    assert summarize(result).total.offered_rate == pytest.approx(3 / 0.5)


def test_a_stop_event_stops_sending_and_keeps_what_came_due(server: SlowServer) -> None:
    """Set from another thread (the lab demo's trickle, stopped once every lease is back):
    nothing more is sent, the requests already sent are answered and recorded."""
    schedule = Schedule((0.0, 0.1, 0.2, 3.0, 6.0), 6.0, "five")
    config = RunConfig(endpoints=(server.endpoint,), model="sleep-0", max_duration_s=10.0)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result = asyncio.run(run(schedule, config, stop=stop))
    assert result.stopped_by == "stopped"
    # seen at the next arrival's due time (3 s): that one and the rest are not sent
    assert [r.index for r in result.records] == [0, 1, 2]
    assert len(server.received) == 3
    assert result.elapsed_s < 5.0  # never waited for the 6 s arrival


def test_max_requests_stops_sending(server: SlowServer) -> None:
    result = send(regular(10, 0.01), endpoints=(server.endpoint,), model="sleep-0", max_requests=4)
    assert result.stopped_by == "max_requests"
    assert len(result.records) == len(server.received) == 4


def test_each_request_times_out(server: SlowServer) -> None:
    result = send(regular(2, 0.01), endpoints=(server.endpoint,), model="sleep-3000", timeout_s=0.3)
    assert [r.error for r in result.records] == ["timeout", "timeout"]
    assert result.elapsed_s < 2.0


# --- errors -------------------------------------------------------------------------


def test_errors_are_classified(server: SlowServer) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = Endpoint("127.0.0.1", s.getsockname()[1])
    result = send(regular(6, 0.01), endpoints=(server.endpoint, closed), model="fail")
    rep = summarize(result)
    assert rep.total.errors == {"connect": 3, "http_500": 3}
    assert rep.total.ok == 0 and rep.total.latency.count == 0 and rep.total.latency.p99_ms is None
    assert {g.name: g.errors for g in rep.endpoints} == {
        str(server.endpoint): {"http_500": 3},
        str(closed): {"connect": 3},
    }


@pytest.mark.parametrize(
    "text",
    [
        "10.0.0.1:8000",
        "192.168.1.10",
        "0.0.0.0:8000",
        "example.com:8000",
        "[2001:db8::1]:8000",
        "http://8.8.8.8:8000",
        "https://127.0.0.1:8000",
        "127.0.0.1:8000/v2",
        "127.0.0.1:99999",
        "",
    ],
)
def test_non_loopback_or_malformed_endpoints_are_refused(text: str) -> None:
    with pytest.raises(LoadConfigError):
        parse_endpoint(text)


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("127.0.1.4:8000", Endpoint("127.0.1.4", 8000)),
        ("http://127.0.1.3:8001", Endpoint("127.0.1.3", 8001)),
        ("127.255.0.9", Endpoint("127.255.0.9", 8000)),
        ("localhost:8000", Endpoint("127.0.0.1", 8000)),
        ("[::1]:9000", Endpoint("::1", 9000)),
    ],
)
def test_loopback_endpoints_are_accepted(text: str, endpoint: Endpoint) -> None:
    assert parse_endpoint(text) == endpoint


def test_run_config_refuses_a_hand_built_remote_endpoint() -> None:
    with pytest.raises(LoadConfigError, match="not a loopback"):
        RunConfig(endpoints=(Endpoint("10.1.2.3", 8000),), model="busy")


# --- report -------------------------------------------------------------------------


def test_report_figures_on_literal_records() -> None:
    ep = "127.0.0.1:8000"
    ok = [
        RequestRecord(i, ep, i * 0.1, i * 0.1, i * 0.1 + (i + 1) / 1000, 200, None)
        for i in range(100)
    ]
    bad = [
        RequestRecord(100, ep, 10.0, None, None, None, "dropped"),
        RequestRecord(101, ep, 10.1, 10.1, 10.2, 500, "http_500"),
        RequestRecord(102, ep, 10.2, 10.2, 10.3, 500, "http_500"),
        RequestRecord(103, ep, 10.3, 10.3, 11.0, None, "timeout"),
    ]
    config = RunConfig(endpoints=(parse_endpoint(ep),), model="busy")
    result = RunResult(config, "literal", tuple(ok + bad), 10.4, 13.0, "schedule", 10.0)
    rep = summarize(result)
    t = rep.total
    assert (t.due, t.sent, t.ok, t.dropped) == (104, 103, 100, 1)
    assert t.errors == {"http_500": 2, "timeout": 1}
    assert t.offered_rate == pytest.approx(104 / 10.4)
    assert t.sent_rate == pytest.approx(103 / 10.4)
    assert t.ok_rate == pytest.approx(100 / 13.0)
    # Latencies 1..100 ms: linear interpolation between order statistics.
    assert t.latency.p50_ms == pytest.approx(50.5)
    assert t.latency.p95_ms == pytest.approx(95.05)
    assert t.latency.p99_ms == pytest.approx(99.01)
    assert t.latency.max_ms == pytest.approx(100.0)
    assert rep.to_dict()["total"]["latency"]["count"] == 100
    json.dumps(rep.to_dict())  # JSON-ready


# --- stb load -----------------------------------------------------------------------

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55\r\n"
    "2023-11-16 18:15:51.3910170,91,16"
)


def test_stb_load_poisson_json(server: SlowServer) -> None:
    res = CliRunner().invoke(
        app,
        [
            "load",
            "-e",
            str(server.endpoint),
            *["--model", "sleep-5", "--rate", "50", "--seed", "3"],
            *["--duration", "1", "--json", "--quiet"],
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["total"]["due"] == len(server.received) > 10
    assert rep["total"]["ok"] == rep["total"]["due"]
    assert rep["total"]["latency"]["p50_ms"] >= 5.0
    assert rep["target_rate"] == 50.0


def test_stb_load_replays_a_trace_with_speedup(server: SlowServer, tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(AZURE, newline="")
    res = CliRunner().invoke(
        app,
        [
            "load",
            "-e",
            str(server.endpoint),
            "--trace",
            str(trace),
            *["--model", "sleep-0", "--speedup", "10", "--json", "--quiet"],
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["total"]["ok"] == len(server.received) == 4
    assert "x10" in rep["source"]
    # Replayed 10x faster: the server saw the trace's gaps shrunk tenfold.
    t = [a for a, _, _ in server.received]
    assert t[-1] - t[0] == pytest.approx(0.4710427, abs=0.2)


def test_stb_load_tables_and_refusals(server: SlowServer) -> None:
    res = CliRunner().invoke(
        app,
        [
            "load",
            "-e",
            str(server.endpoint),
            *["--model", "sleep-0", "--rate", "20", "--duration", "0.5", "--quiet"],
        ],
    )
    assert res.exit_code == 0, res.output
    assert "latency of ok requests" in res.stdout
    refused = CliRunner().invoke(app, ["load", "-e", "10.0.0.1:8000", "--rate", "1"])
    assert refused.exit_code == 2 and "not a loopback" in refused.output
    neither = CliRunner().invoke(app, ["load", "-e", "127.0.0.1:1"])
    assert neither.exit_code == 2 and "exactly one of --rate or --trace" in neither.output
