"""The HTTP server's own bounds (`bridge.http.server`), over raw sockets on loopback: a
client that stalls before its request is in is dropped at the deadline (on a new and on
a kept-alive connection) while others are served; a slow but whole request is answered;
the request head's limit; the connection limit; a taken port fails when the server is
made."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridge.config import BridgeConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.http.app import create_app
from bridge.http.auth import TokenTable
from bridge.http.routes import operator_routes
from bridge.http.server import MAX_HEAD_BYTES, HttpServer
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from tests.unit.helpers import write_tokens

DEADLINE_S = 0.5
TOKEN = "o" * 24


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    routes = operator_routes(BridgeConfig(), RequestQueue(engine), LeaseStore(engine))
    tokens = write_tokens(tmp_path / "tokens", {"olga": ("operator", TOKEN)})
    app = create_app(BridgeMetrics(), 5, tokens=TokenTable(tokens), routers=[routes])
    s = HttpServer(app, ("127.0.0.1", 0), request_timeout_s=DEADLINE_S, max_connections=4)
    s.start()
    yield s
    s.stop()
    engine.dispose()


def _connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(server.address, timeout=10)


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes `sock` without answering (fails if it answers)."""
    start = time.monotonic()
    got = sock.recv(65536)
    assert got == b"", f"the server answered instead of dropping: {got[:200]!r}"
    return time.monotonic() - start


def _response(sock: socket.socket) -> tuple[int, bytes]:
    """One whole response on `sock`: (status, body)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {raw!r}"
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lengths = [
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ]
    while not lengths or len(body) < lengths[0]:  # no length: the body ends at the close
        chunk = sock.recv(65536)
        if not chunk:
            assert not lengths, f"closed mid-body: {body!r}"
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def test_a_client_stalling_in_its_head_is_dropped_and_others_are_served(
    server: HttpServer,
) -> None:
    stalled = _connect(server)
    sent = time.monotonic()
    stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: never whole
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 503  # served meanwhile
    _closed_after(stalled)
    waited = time.monotonic() - sent
    assert DEADLINE_S * 0.9 <= waited < DEADLINE_S + 2, waited


def test_a_client_stalling_in_its_body_is_dropped_and_nothing_is_queued(
    server: HttpServer, tmp_path: Path
) -> None:
    stalled = _connect(server)
    stalled.sendall(
        b"POST /api/lend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 40\r\n\r\n"
        b'{"node": "n3"'  # 13 of the 40 bytes
    )
    assert _closed_after(stalled) < DEADLINE_S + 2
    assert RequestQueue(make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")).pending() == []


def test_a_kept_alive_connection_gets_a_deadline_for_each_request(server: HttpServer) -> None:
    sock = _connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, body = _response(sock)
    assert status == 503 and b"no tick has completed yet" in body
    time.sleep(DEADLINE_S * 1.5)  # idle past the deadline is the keep-alive's business
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _response(sock)[0] == 503  # still open: the deadline was disarmed
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request stalls
    assert _closed_after(sock) < DEADLINE_S + 2


def test_a_slow_but_whole_request_is_answered(server: HttpServer) -> None:
    sock = _connect(server)
    for part in (b"GET /hea", b"lthz HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
        sock.sendall(part)
        time.sleep(DEADLINE_S / 8)
    assert _response(sock)[0] == 503


def _send_head_in_pieces(sock: socket.socket, padding: int, end: bool) -> None:
    """A request head with `padding` bytes of one header, 4 KiB at a time, each read by
    the server before the next (so it buffers an incomplete head); stops sending once
    the server answers (more would be unread at its close, and reset the connection)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: ")
    sent = 0
    while sent < padding:
        sock.sendall(b"p" * 4096)
        sent += 4096
        if select.select([sock], [], [], 0.001 if sent <= MAX_HEAD_BYTES else 2)[0]:
            return
    if end:
        sock.sendall(b"\r\n\r\n")


def test_the_request_head_is_bounded(server: HttpServer) -> None:
    # Half the limit, above h11's own default (16 KiB): answered.
    sock = _connect(server)
    _send_head_in_pieces(sock, MAX_HEAD_BYTES // 2, end=True)
    assert _response(sock)[0] == 503
    # Past the limit and still not whole: refused by uvicorn, the app never asked.
    sock = _connect(server)
    _send_head_in_pieces(sock, MAX_HEAD_BYTES + 16 * 1024, end=False)
    status, body = _response(sock)
    assert status == 400 and body == b"Invalid HTTP request received."
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 503


def test_connections_past_the_limit_are_answered_503(server: HttpServer) -> None:
    idle = [_connect(server) for _ in range(4)]  # max_connections=4
    time.sleep(0.1)
    try:
        got = httpx.get(server.url + "/metrics", timeout=5)
        assert got.status_code == 503 and "Service Unavailable" in got.text
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200


def test_a_taken_port_fails_when_the_server_is_made(server: HttpServer) -> None:
    with pytest.raises(OSError, match="in use"):
        HttpServer(create_app(BridgeMetrics(), 5), server.address)
