"""Running the HTTP app: uvicorn on a thread of its own, over HTTP or HTTPS, with the
bounds a server on an operator's network needs.

- The socket is bound when the `HttpServer` is made (a taken port fails there, and a
  client that connects before `start` waits in the backlog); `start` returns once
  uvicorn serves; `stop` stops accepting, lets requests in flight finish for up to
  `STOP_GRACE_S`, and closes the socket.
- A client has `REQUEST_TIMEOUT_S` from its connection (or, kept alive, from its next
  request's first byte) to send the whole request, head and body; one that stalls is
  dropped (`DeadlineProtocol`). An idle kept-alive connection closes after
  `KEEP_ALIVE_S`.
- A request's head (request line and headers) is at most `MAX_HEAD_BYTES` (uvicorn
  answers 400 past it); at most `MAX_CONNECTIONS` connections are served at once
  (uvicorn answers 503 past it), so stalled clients cannot take every slot for long.
- TLS (`tls_context`): TLS 1.2 or newer; the handshake runs on the event loop, so a
  client that never finishes it holds no thread.

The bounds on a request's content (query, body) are the app's (`bridge.http.guard`).
Called by the daemon's service and by tests (any ASGI app).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

#: seconds a client has to send its request, head and body
REQUEST_TIMEOUT_S = 10.0
#: seconds an idle kept-alive connection stays open
KEEP_ALIVE_S = 5
#: the longest request head (request line and headers), bytes
MAX_HEAD_BYTES = 64 * 1024
#: connections served at once; more are answered 503
MAX_CONNECTIONS = 128
#: seconds `stop` waits for requests in flight
STOP_GRACE_S = 5
#: seconds `start` waits for uvicorn to serve
START_TIMEOUT_S = 10.0


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on receiving each request: armed when the
    connection is made and when a kept-alive connection's next request begins,
    disarmed once the request is in; at the deadline the connection is closed (as the
    old server's socket timeout did: no answer). `request_timeout_s` is set per server
    (`_deadline_protocol`)."""

    request_timeout_s = REQUEST_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request of a kept-alive connection
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # in whole (DONE), or closing

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.debug("dropped %s: no whole request in %ss", self.client, self.request_timeout_s)
            self.transport.close()


def _deadline_protocol(timeout_s: float) -> type[DeadlineProtocol]:
    class Deadline(DeadlineProtocol):
        request_timeout_s = timeout_s

    return Deadline


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for `cert` and `key` (TLS 1.2 or newer)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class HttpServer:
    """An ASGI app served by uvicorn on `address`, over HTTPS with `tls`, in a daemon
    thread."""

    def __init__(
        self,
        app: Any,
        address: tuple[str, int],
        *,
        tls: ssl.SSLContext | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.scheme = "https" if tls is not None else "http"
        self._socket = socket.create_server(address)
        factory: Callable[..., ssl.SSLContext] | None = None
        if tls is not None:
            context = tls

            def factory(*_: object) -> ssl.SSLContext:
                return context

        config = uvicorn.Config(
            app,
            loop="asyncio",
            http=_deadline_protocol(request_timeout_s),
            lifespan="off",
            log_config=None,  # the daemon's logging stays as it set it
            log_level="warning",
            access_log=False,
            server_header=False,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            limit_concurrency=max_connections,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=STOP_GRACE_S,
            ssl_context_factory=factory,
        )
        self._server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="stb-http")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{self.scheme}://{host}:{port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except BaseException as exc:  # SystemExit included: kept for start() to report
            self._error = exc
            log.exception("the HTTP server on %s stopped", self.url)

    def start(self) -> HttpServer:
        """Serve; returns once uvicorn accepts (a `RuntimeError` if it could not)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server on {self.url} did not start: {self._error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on {self.url} did not start in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop accepting, let requests in flight finish (`STOP_GRACE_S`), close."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(STOP_GRACE_S + 5)
        self._socket.close()


__all__ = ["HttpServer", "tls_context"]
