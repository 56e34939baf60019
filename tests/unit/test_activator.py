"""The activator on a real HTTP server (uvicorn on loopback) in front of a stand-in
replica (a small threaded HTTP server): a request of a model at zero waits until the
routing table lists a replica, then is forwarded and its answer streamed back; the wait
is bounded (503, Retry-After, the model named), the queue per model too; the waiting
requests are the policy's demand. The real Triton behind nginx: tests/lab/
test_scale_zero_lab.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi import FastAPI

from bridge.http.activator import Activator
from bridge.http.server import HttpServer
from bridge.routing.table import RoutingTable


class Replica(BaseHTTPRequestHandler):
    """Answers infer with the body it got, and generate_stream with three events."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path.endswith("/generate_stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                event = f'data: {{"text_output": "t{i}"}}\n\n'.encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b"0\r\n\r\n")
            return
        out = json.dumps({"path": self.path, "got": json.loads(body or b"{}")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Tables:
    def __init__(self) -> None:
        self.table: RoutingTable | None = RoutingTable.build({"cold": []}, zero=["cold"])


@pytest.fixture
def served() -> Iterator[tuple[Activator, Tables, str]]:
    tables = Tables()
    activator = Activator(lambda: tables.table, timeout_s=3.0, queue=4)
    app = FastAPI()
    app.include_router(activator.routes())
    server = HttpServer(app, ("127.0.0.1", 0)).start()
    yield activator, tables, server.url
    server.stop()


def _until(check: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_request_waits_for_the_first_replica_and_is_answered_by_it(
    served: tuple[Activator, Tables, str], replica: str
) -> None:
    activator, tables, url = served
    with ThreadPoolExecutor(3) as pool:
        answers = [
            pool.submit(httpx.post, f"{url}/v2/models/cold/infer", json={"n": i}, timeout=10)
            for i in range(3)
        ]
        _until(lambda: activator.holding("cold") == 3)
        assert activator.demand() == {"cold": 3}  # what the policy lends from zero for
        time.sleep(0.3)
        tables.table = RoutingTable.build({"cold": [replica]}, zero=["cold"])
        got = [f.result() for f in answers]
    for i, r in enumerate(got):
        assert r.status_code == 200, r.text
        assert r.json() == {"path": "/v2/models/cold/infer", "got": {"n": i}}
        assert r.headers["X-Stb-Replica"] == replica
        assert int(r.headers["X-Stb-Waited-Ms"]) >= 300
    assert activator.demand() == {}


def test_a_token_stream_is_passed_on_as_it_comes(
    served: tuple[Activator, Tables, str], replica: str
) -> None:
    _, tables, url = served
    tables.table = RoutingTable.build({"cold": [replica]}, zero=["cold"])
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{url}/v2/models/cold/generate_stream", json={"text_input": "hi"}, timeout=10
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen.append((time.monotonic() - started, line))
    assert [line for _, line in seen] == [f'data: {{"text_output": "t{i}"}}' for i in range(3)]
    assert seen[0][0] < 0.25 < seen[-1][0] - seen[0][0]  # the first came before the last


def test_no_replica_in_time_is_503_with_retry_after_naming_the_model(
    served: tuple[Activator, Tables, str],
) -> None:
    activator, _, url = served
    started = time.monotonic()
    r = httpx.post(f"{url}/v2/models/cold/infer", json={}, timeout=10)
    assert 3.0 <= time.monotonic() - started < 4.5
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert r.json() == {
        "error": "model cold: no replica ready within 3 s (scale from zero)",
        "model": "cold",
    }
    assert activator.demand() == {"cold": 1}  # turned away, still demand (once)
    assert activator.demand() == {}


def test_a_full_queue_answers_503_at_once(served: tuple[Activator, Tables, str]) -> None:
    activator, _, url = served
    with ThreadPoolExecutor(4) as pool:
        held = [
            pool.submit(httpx.post, f"{url}/v2/models/cold/infer", json={}, timeout=10)
            for _ in range(4)
        ]
        _until(lambda: activator.holding("cold") == 4)
        started = time.monotonic()
        r = httpx.post(f"{url}/v2/models/cold/infer", json={}, timeout=10)
        assert time.monotonic() - started < 1.0
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["model"] == "cold" and "4 requests already wait" in r.json()["error"]
        assert activator.demand() == {"cold": 5}
        for f in held:
            assert f.result().status_code == 503


def test_a_model_not_served_from_zero_is_not_the_activators(
    served: tuple[Activator, Tables, str],
) -> None:
    activator, _, url = served
    r = httpx.post(f"{url}/v2/models/busy/infer", json={}, timeout=5)
    assert r.status_code == 404 and r.json()["model"] == "busy"
    assert activator.demand() == {}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="queue at least 1"):
        Activator(lambda: None, queue=0)
