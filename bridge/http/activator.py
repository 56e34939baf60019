"""The activator: where the requests of a model served from zero wait for its first
replica (Knative's activator, on the daemon's HTTP server).

A model with `min_replicas` 0 is served by lent replicas alone (`ModelFacts.from_zero`).
While it has no ready replica, nginx sends its requests here (`bridge.routing.nginx`:
upstream `stb-activator`) instead of answering 503. Each request is:

1. counted as waiting for its model (`Activator.demand`, read by the reconciler once a
   pass: the policy lends a node "from zero" for a model with requests waiting,
   `bridge.policy.decide`), unless `queue` requests of the model wait already: then it
   is answered 503 at once (and still counted as demand);
2. held until the routing table nginx serves (`RoutingPublisher.table`, published after
   the reload took effect) lists a ready replica of the model, at most `timeout_s`
   (`[routing] cold_start_timeout_s`): past it, 503 with `Retry-After` and a JSON error
   naming the model; a client that hangs up stops waiting;
3. forwarded to that replica (round robin over the model's routed replicas: the
   table's endpoints are the only addresses it ever connects to, so a request cannot
   make the daemon reach anywhere else), and the replica's answer streamed back as it
   comes: a plain inference answer and a `generate_stream` event stream alike, with
   `X-Stb-Replica` (where it went) and `X-Stb-Waited-Ms` (how long it was held).

The routes are open (no bearer token), as nginx forwards clients' requests as they
are: they reach nothing but the replicas of a model the routing table lists as served
from zero (any other model: 404). The waiting state is in this process's memory,
guarded by a lock: the handlers run on uvicorn's event loop, the reconciler reads
`demand` from its tick thread. A standby daemon's activator holds requests too and
forwards them once the leader's lend is routed (the standby routes what it observes),
but its demand reaches no policy: lends from zero are the leader's activator's.

Built by the daemon's service (`bridge.daemon.service.build`) and mounted with the
other routes by `bridge.http.app.create_app`.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from bridge.http.guard import json_response
from bridge.routing.table import MODEL_NAME_RE, RoutingTable

#: headers that describe one connection, not the message: never passed on
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
#: seconds between two looks at the routing table while a request waits
POLL_S = 0.05
#: seconds a client is told to wait before it tries again (a full queue; a timeout)
RETRY_FULL_S = 1
RETRY_TIMEOUT_S = 5
#: the methods Triton's HTTP API takes
METHODS = ["GET", "POST", "HEAD"]


class Activator:
    """Holds the requests of models at zero until a replica is routed, and counts them.

    `table`: the routing table nginx serves now (None before the first publish);
    `timeout_s`: the longest hold; `queue`: requests of one model held at once;
    `read_timeout_s`: the longest silence of a replica's answer once forwarded (nginx's
    `read_timeout_s`); `max_body_bytes`: the largest request body (nginx's
    `client_max_body_size`); `clock`: monotonic seconds (tests move it)."""

    def __init__(
        self,
        table: Callable[[], RoutingTable | None],
        *,
        timeout_s: float = 180.0,
        queue: int = 64,
        read_timeout_s: float = 300.0,
        max_body_bytes: int = 64 * 1024 * 1024,
        connect_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0 or queue < 1 or read_timeout_s <= 0 or max_body_bytes < 1:
            raise ValueError(
                "activator: timeout_s, read_timeout_s and max_body_bytes must be positive "
                f"and queue at least 1 (got {timeout_s}, {read_timeout_s}, "
                f"{max_body_bytes}, {queue})"
            )
        self._table = table
        self.timeout_s = timeout_s
        self.queue = queue
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._turned: dict[str, int] = {}
        self._turn = itertools.count()

    # ---- the waiting state (any thread) ---------------------------------------------

    def demand(self) -> dict[str, int]:
        """Per model, the requests held now plus those turned away (queue full, timed
        out) since the last call: what the policy lends from zero for. Resets the
        turned-away counts."""
        with self._lock:
            out = {m: n for m, n in self._held.items() if n > 0}
            for m, n in self._turned.items():
                out[m] = out.get(m, 0) + n
            self._turned.clear()
        return out

    def holding(self, model: str) -> int:
        """Requests of `model` held now."""
        with self._lock:
            return self._held.get(model, 0)

    def _enter(self, model: str) -> bool:
        with self._lock:
            if self._held.get(model, 0) >= self.queue:
                self._turn_away(model)
                return False
            self._held[model] = self._held.get(model, 0) + 1
            return True

    def _leave(self, model: str, *, turned: bool) -> None:
        with self._lock:
            n = self._held.get(model, 0) - 1
            if n > 0:
                self._held[model] = n
            else:
                self._held.pop(model, None)
            if turned:
                self._turn_away(model)

    def _turn_away(self, model: str) -> None:
        # bounded: a standby's activator is never asked, and one lend answers them all
        self._turned[model] = min(self.queue, self._turned.get(model, 0) + 1)

    # ---- one request (the event loop) ----------------------------------------------

    def _endpoints(self, model: str) -> tuple[str, ...]:
        table = self._table()
        return table.endpoints(model) if table is not None else ()

    def _known(self, model: str) -> str | None:
        """Why `model`'s requests are not the activator's to hold (None: they are)."""
        table = self._table()
        if table is None or model not in table.zero:
            if table is not None and table.endpoints(model):
                return None  # routed meanwhile: forwarded at once
            return f"model {model} is not served from zero here"
        return None

    async def _wait(self, model: str, deadline: float, request: Request) -> tuple[str, ...]:
        """The model's routed replicas, once it has any; () at the deadline or when the
        client hung up."""
        polls = 0
        while True:
            endpoints = self._endpoints(model)
            if endpoints or self._clock() >= deadline:
                return endpoints
            polls += 1
            if polls % 10 == 0 and await request.is_disconnected():
                return ()
            await asyncio.sleep(POLL_S)

    async def handle(self, model: str, request: Request) -> Response:
        """Hold, forward and stream back one request of `model` (the module's steps)."""
        if not MODEL_NAME_RE.fullmatch(model):
            return _error(404, f"invalid model name {model!r}", model)
        why = self._known(model)
        if why is not None:
            return _error(404, why, model)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return _error(413, f"body over {self.max_body_bytes} bytes", model)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                return _error(413, f"body over {self.max_body_bytes} bytes", model)
        started = self._clock()
        if not self._enter(model):
            return _error(
                503,
                f"model {model}: {self.queue} requests already wait for its first replica",
                model,
                retry_s=RETRY_FULL_S,
            )
        deadline = started + self.timeout_s
        turned = True  # a request that leaves unanswered is demand turned away
        try:
            while True:
                endpoints = await self._wait(model, deadline, request)
                if not endpoints:
                    return _error(
                        503,
                        f"model {model}: no replica ready within {self.timeout_s:g} s "
                        "(scale from zero)",
                        model,
                        retry_s=RETRY_TIMEOUT_S,
                    )
                endpoint = endpoints[next(self._turn) % len(endpoints)]
                try:
                    response = await self._forward(endpoint, request, bytes(body), started)
                except (httpx.ConnectError, httpx.ConnectTimeout):
                    # the replica went between the table and the connect: wait for another
                    if self._clock() < deadline:
                        await asyncio.sleep(POLL_S)
                        continue
                    return _error(502, f"model {model}: no replica answered", model)
                except httpx.TransportError as exc:  # sent: never sent twice
                    turned = False
                    return _error(502, f"model {model}: replica {endpoint}: {exc!r}", model)
                turned = False
                return response
        finally:
            self._leave(model, turned=turned)

    async def _forward(
        self, endpoint: str, request: Request, body: bytes, started: float
    ) -> StreamingResponse:
        """Send the request to `endpoint` (one of the model's routed replicas) and
        stream its answer back; httpx.TransportError when it cannot be reached."""
        url = f"http://{endpoint}{request.url.path}"
        if request.url.query:
            url += f"?{request.url.query}"
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        timeout = httpx.Timeout(
            self.read_timeout_s, connect=self.connect_timeout_s, pool=self.connect_timeout_s
        )
        client = httpx.AsyncClient(timeout=timeout, trust_env=False)
        try:
            sent = client.build_request(request.method, url, headers=headers, content=body)
            upstream = await client.send(sent, stream=True)
        except BaseException:
            await client.aclose()
            raise
        waited_ms = (self._clock() - started) * 1000.0

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        out: dict[str, Any] = {
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
        }
        out["X-Stb-Replica"] = endpoint
        out["X-Stb-Waited-Ms"] = f"{waited_ms:.0f}"
        out["X-Accel-Buffering"] = "no"  # an event stream passes as it comes
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=out)

    def routes(self) -> APIRouter:
        """`/v2/models/{model}` and everything under it (Triton's HTTP API), open."""
        router = APIRouter(tags=["activator"])

        async def model_root(model: str, request: Request) -> Response:
            """A request of a model at zero: held until its first replica serves it."""
            return await self.handle(model, request)

        async def model_path(model: str, path: str, request: Request) -> Response:
            """A request of a model at zero: held until its first replica serves it."""
            return await self.handle(model, request)

        router.add_api_route("/v2/models/{model}", model_root, methods=METHODS)
        router.add_api_route("/v2/models/{model}/{path:path}", model_path, methods=METHODS)
        return router


def _error(status: int, message: str, model: str, retry_s: int | None = None) -> Response:
    response = json_response(status, {"error": message, "model": model})
    if retry_s is not None:
        response.headers["Retry-After"] = str(retry_s)
    return response


__all__ = ["Activator"]
